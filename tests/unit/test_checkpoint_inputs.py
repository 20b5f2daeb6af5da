"""What a checkpoint says about itself, held against the run: a training position that is not one of the plan's, a
model_info without its class list, a sidecar that is not a list of digests: one CheckpointError naming the file."""

from __future__ import annotations

import pytest

from base.errors import CheckpointError
from recipes.config import load_config
from recipes.rundir import checkpoint_files as ckpt
from recipes.rundir.checkpointer import position_problem
from recipes.rundir.payload import Checkpoint, ModelInfo, State
from recipes.schedule import Schedule


@pytest.fixture(scope="module")
def plan():
    cfg = load_config("tests/tiny.yaml", [])  # 2 epochs at global batch 12
    return Schedule(cfg.phases, cfg.optim, num_images=48, world_size=1)  # 4 steps per epoch, 8 in all


@pytest.mark.parametrize(
    "state, exact, words",
    [
        (State(epoch=2, step=10**12), True, "beyond this recipe's 2 epochs and 8 steps"),
        (State(epoch=3, step=8), False, "beyond this recipe's 2 epochs"),
        (State(epoch=2, step=8, epoch_step=999), True, "finished every epoch, yet 'epoch_step' is 999"),
        (State(epoch=1, step=5, epoch_step=4), True, "'epoch_step' 4: epoch 2 has 4 steps"),
        (State(epoch=1, step=2, epoch_step=1), True, "has step 2, but epoch 2 + 1 step(s) is step 5"),
    ],
)
def test_a_position_outside_the_plan_is_refused(plan, state, exact, words):
    assert words in position_problem(state, plan, exact=exact)


@pytest.mark.parametrize("state", [State(), State(epoch=1, step=4), State(epoch=1, step=6, epoch_step=2)])
def test_every_position_of_the_plan_is_accepted(plan, state):
    assert position_problem(state, plan, exact=True) is None
    assert position_problem(State(epoch=2, step=8), plan, exact=True) is None  # finished


def test_under_force_another_schedule_keeps_only_the_bounds(plan):
    assert position_problem(State(epoch=1, step=2, epoch_step=1), plan, exact=False) is None


def test_an_evaluation_needs_the_class_list():
    ck = Checkpoint(model={}, config={"run": {}}, model_info=ModelInfo(name="resnet10t", num_classes=4), path="c.pt")
    with pytest.raises(CheckpointError, match=r"^checkpoint 'c.pt': entry 'model_info' has no 'classes'"):
        ck.require_model_info()


@pytest.mark.parametrize("data, words", [(b"\xff\xfe junk\n", "not UTF-8"), (b"hello  ckpt.pt\n", "sha256 digests")])
def test_a_sidecar_that_is_no_digest_list_is_one_line(tmp_path, data, words):
    path = tmp_path / "ckpt-00000004.pt"
    path.write_bytes(b"weights")
    (tmp_path / "ckpt-00000004.pt.sha256").write_bytes(data)
    with pytest.raises(CheckpointError, match=words) as e:
        ckpt.verify(path)
    assert "ckpt-00000004.pt.sha256" in str(e.value) and "\n" not in str(e.value)
