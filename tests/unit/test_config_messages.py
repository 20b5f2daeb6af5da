"""Messages a user meets while tweaking a config: an index that would append a phase says how to add one, a bad
command-line value is blamed on the command line (not on the YAML file), an `extends:` of a missing file names the
file that extends it, and the plan prints the LR at the end of warm-up and at its peak."""

from __future__ import annotations

import pytest

from base.errors import ConfigError
from recipes.config import load_config
from recipes.schedule import Schedule

PHASES = "phases=[{epochs: 2, image_size: 32, batch_size: 8}, {epochs: 2, image_size: 48, batch_size: 4}]"


def _yaml(tmp_path, text: str):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_an_index_past_the_list_says_that_phases_list_replaces_it(tmp_path):
    path = _yaml(tmp_path, "run: {name: x}\n")
    with pytest.raises(ConfigError) as e:
        load_config(path, [PHASES, "phases.2={epochs: 1, image_size: 64, batch_size: 4}"])
    assert str(e.value) == (
        "phases.2: expected a list index below 2; phases=[...] replaces the whole list (to add an item, give them all)"
    )


def test_a_bad_command_line_value_is_blamed_on_the_command_line_not_the_file(tmp_path):
    path = _yaml(tmp_path, "optim: {lr: 0.1}\n")
    with pytest.raises(ConfigError) as e:
        load_config(path, ["optim.lr=fast"])
    assert str(e.value) == "command line (optim.lr=fast): optim.lr: expected a number, got 'fast'"
    bad = _yaml(tmp_path, "optim: {lr: fast}\n")
    with pytest.raises(ConfigError) as e:  # the same value in the file: the file is named
        load_config(bad, ["run.name=x"])
    assert str(e.value) == f"{bad}: optim.lr: expected a number, got 'fast'"


def test_extends_of_a_missing_file_names_the_file_that_extends_it(tmp_path):
    path = _yaml(tmp_path, "extends: ../presets/nothere.yaml\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    where = path.resolve()
    missing = where.parent / "../presets/nothere.yaml"
    assert str(e.value) == f"{where}: extends: '../presets/nothere.yaml' not found ({missing})"


def test_the_plan_prints_the_lr_at_the_end_of_warm_up_and_at_its_peak(tmp_path):
    cfg = load_config(
        _yaml(tmp_path, "optim: {lr: 0.8, warmup_epochs: 2, warmup_start_lr: 0.1, final_lr: 0.0}\n"), [PHASES]
    )
    plan = Schedule(cfg.phases, cfg.optim, num_images=80, world_size=1)
    # 10 steps per epoch at batch 8, then 20 at batch 4: warm-up ends at step 20, the last step is 59.
    assert plan.table().splitlines()[-1] == (
        "lr: 0.1 at step 0, end of warm-up 0.8 at step 20 (epoch 2.00), peak 0.8 at step 20, 0 at the last step (59)"
    )
    # Warm-up that ends inside a step says so: 0.65 epochs of 10 steps end at step 6.5, not "6".
    half = load_config(_yaml(tmp_path, "optim: {lr: 0.8, warmup_epochs: 0.65, warmup_start_lr: 0.1}\n"), [PHASES])
    line = Schedule(half.phases, half.optim, num_images=80, world_size=1).lr_summary()
    assert ", end of warm-up 0.8 at step 6.5 (epoch 0.65)," in line
    linear = load_config(_yaml(tmp_path, "optim: {lr: 0.8, warmup_epochs: 0, lr_scaling: linear}\n"), [PHASES])
    line = Schedule(linear.phases, linear.optim, num_images=80, world_size=1).lr_summary()
    assert line.startswith("lr: 0.025 at step 0, no warm-up, peak 0.025 at step 0,")  # 0.8 x 8 / 256
