"""Config loading: inheritance, overrides, type checks and the errors a user sees."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from support import ROOT

from base.errors import ConfigError
from recipes.config import Config, load_config, reference_table, to_yaml


def write(path, text):
    path.write_text(text)
    return path


def test_extends_merges_nested_keys_and_child_wins(tmp_path):
    write(tmp_path / "base.yaml", "optim: {lr: 0.1, momentum: 0.8}\nmodel: {name: resnet18}\n")
    child = write(tmp_path / "child.yaml", "extends: base.yaml\noptim: {lr: 0.5}\n")
    cfg = load_config(child)
    assert cfg.optim.lr == 0.5
    assert cfg.optim.momentum == 0.8  # inherited, not reset to the schema default
    assert cfg.model.name == "resnet18"


def test_extends_chain_and_cycle(tmp_path):
    write(tmp_path / "a.yaml", "extends: b.yaml\n")
    write(tmp_path / "b.yaml", "extends: a.yaml\n")
    with pytest.raises(ConfigError, match="circular"):
        load_config(tmp_path / "a.yaml")


def test_dotted_overrides_are_typed():
    cfg = load_config(ROOT / "configs/quickstart.yaml", ["optim.lr=0.4", "data.root=/my/imagenet", "run.amp=bf16"])
    assert cfg.optim.lr == 0.4 and isinstance(cfg.optim.lr, float)
    assert cfg.data.root == "/my/imagenet"
    assert cfg.run.amp == "bf16"


def test_int_is_accepted_for_float_and_number_for_string():
    cfg = load_config(None, ["optim.lr=2", "data.root=160"])
    assert cfg.optim.lr == 2.0 and isinstance(cfg.optim.lr, float)
    assert cfg.data.root == "160"


def test_override_list_index_and_whole_list():
    cfg = load_config(ROOT / "configs/quickstart.yaml", ["phases.1.image_size=128"])
    assert cfg.phases[1].image_size == 128
    cfg = load_config(None, ["phases=[{epochs: 2, image_size: 32, batch_size: 8}]"])
    assert len(cfg.phases) == 1 and cfg.phases[0].batch_size == 8 and cfg.phases[0].min_scale == 0.35


def test_unknown_key_names_the_closest_valid_key():
    with pytest.raises(ConfigError, match=r"unknown key 'optim.lrr' \(did you mean 'optim.lr'\?\)"):
        load_config(None, ["optim.lrr=3"])


def test_unknown_key_in_file_names_file_and_key(tmp_path):
    f = write(tmp_path / "c.yaml", "model:\n  nmae: resnet18\n")
    with pytest.raises(ConfigError) as e:
        load_config(f)
    assert str(f) in str(e.value) and "model.nmae" in str(e.value) and "model.name" in str(e.value)


@pytest.mark.parametrize(
    "override, expected",
    [
        ("optim.lr=fast", "optim.lr: expected a number, got 'fast'"),
        ("phases.0.epochs=1.5", "phases.0.epochs: expected an integer, got 1.5"),
        ("run.amp=fp8", "run.amp: expected one of 'none', 'bf16', 'fp16', got 'fp8'"),
        ("checkpoint.enabled=maybe", "checkpoint.enabled: expected true/false, got 'maybe'"),
    ],
)
def test_wrong_type_names_key_expected_type_and_value(override, expected):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert expected in str(e.value)


def test_invalid_yaml_reports_line(tmp_path):
    f = write(tmp_path / "bad.yaml", "run:\n  name: x\n  seed: [1, 2\noptim: {}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: line \d+, column \d+: not valid YAML"):
        load_config(f)


def test_semantic_validation():
    with pytest.raises(ConfigError, match=r"phases.0.batch_size: expected an integer > 0, got 0"):
        load_config(None, ["phases=[{epochs: 1, image_size: 32, batch_size: 0}]"])
    with pytest.raises(ConfigError, match="optim.warmup_epochs"):
        load_config(None, ["optim.warmup_epochs=5"])


def test_missing_file_and_malformed_override(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="expected key=value"):
        load_config(None, ["optim.lr"])


def test_resolved_config_round_trips():
    cfg = load_config(ROOT / "configs/quickstart.yaml", ["optim.lr=0.3"])
    tree = yaml.safe_load(to_yaml(cfg))
    again = load_config(None, [f"{k}={yaml.safe_dump(v, default_flow_style=True).strip()}" for k, v in tree.items()])
    assert again == cfg


def test_reference_table_lists_every_key():
    table = reference_table()
    for key in ("optim.lr", "data.backend", "phases[].image_size", "run.target_top1", "comm.backend"):
        assert f"`{key}`" in table
    assert isinstance(Config(), Config)


def test_cli_errors_exit_2_with_message():
    cmd = [sys.executable, "train.py", "-c", "configs/quickstart.yaml", "optim.lrr=3"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert "unknown key 'optim.lrr' (did you mean 'optim.lr'?)" in p.stderr
    assert "Traceback" not in p.stderr


def test_cli_print_config():
    cmd = [sys.executable, "train.py", "-c", "configs/quickstart.yaml", "--print-config", "optim.lr=0.25"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    tree = yaml.safe_load(p.stdout)
    assert tree["optim"]["lr"] == 0.25 and tree["model"]["name"] == "resnet18"


def test_readme_config_reference_is_current():
    p = subprocess.run(
        [sys.executable, "scripts/gen_config_reference.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stdout
