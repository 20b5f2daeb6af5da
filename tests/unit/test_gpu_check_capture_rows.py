"""The capture probe's rows can fail (scripts/gpu_check/gpu_check_capture.py): each row's judge is a pure function,
given here the fault it exists to catch, seeded on the CPU: a frozen lr in LARS's adapted group, a partial capture
(a group the step never moved, a graph that launched part of the work), a skipped case."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from scripts.gpu_check import gpu_check_capture as cap
from scripts.gpu_check import gpu_check_capture_cases as cases
from scripts.gpu_check import gpu_check_capture_probe as kit


def _probe():
    """What the probe's small runners need of a Probe, on the CPU (no one-rank group, no capture)."""
    return SimpleNamespace(torch=torch, device=torch.device("cpu"), capture=False, smoke=False, log=kit.StderrLog(),
                           track=lambda r: r, sync=lambda: None, bench=SimpleNamespace(dist=None))  # fmt: skip


def _trained(frozen_group: int | None):
    """hybrid LARS through StepRunner on the probe's own net, batches and schedule; `frozen_group`: that group's lr
    and momentum stay at the capture step's values (what a capture that froze them as floats would do)."""
    probe = _probe()
    cfg = kit.small_cfg(probe, "optim.name=hybrid")
    runner = kit.small_runner(probe, cfg, graph=False, comm=kit.NoComm())
    start = kit.group_weights(runner.optimizer)
    if frozen_group is not None:
        group = runner.optimizer.param_groups[frozen_group]
        at_capture = {"lr": 0.05 + 0.01 * kit.OPTIM_WARMUP, "momentum": 0.95 - 0.02 * kit.OPTIM_WARMUP}  # kit.train

        class Frozen(dict):
            def __setitem__(self, k, v):
                super().__setitem__(k, at_capture.get(k, v))

        runner.optimizer.param_groups[frozen_group] = Frozen(group)
    kit.train(probe, runner, kit.small_batches(probe, cases.OPTIM_STEPS))
    return start, kit.group_weights(runner.optimizer)


def test_a_frozen_lr_in_the_adapted_group_fails_the_optimizers_row_though_all_weights_move_under_1e_4():
    start, ref = _trained(None)
    _, frozen = _trained(0)  # group 0: the adapted weights (recipes/optim.py param_groups)
    overall = max(
        float((a - b).abs().max()) for ga, gb in zip(ref, frozen, strict=True) for a, b in zip(ga, gb, strict=True)
    )
    assert 0 < overall < 1e-4  # the old judgement (|w| diff over all parameters at 1e-4) passed this fault
    worst, problems = kit.judge_groups(start, ref, frozen, rel=cases.OPTIM_REL)
    assert worst > cases.OPTIM_REL and len(problems) == 1 and problems[0].startswith("group 0: |w - eager| ")
    assert kit.judge_groups(start, ref, [[t.clone() for t in g] for g in ref], rel=cases.OPTIM_REL) == (0.0, [])


def test_a_partial_capture_fails_the_phases_and_speedup_rows():
    start = [[torch.zeros(3)], [torch.zeros(2)]]
    eager = [[torch.tensor([1.0, 2.0, 3.0])], [torch.tensor([0.5, 0.5])]]
    unmoved = [[torch.tensor([1.0, 2.0, 3.0])], [torch.zeros(2)]]  # the captured step never updated group 1
    worst, problems = kit.judge_groups(start, eager, unmoved, rel=cases.PHASE_REL)
    assert worst == 1.0 and problems == ["group 1: |w - eager| 0.5 is 1x its own update 0.5"]
    assert cases.speedup_problems({"kernels": 400}, {"kernels": 120}) == [
        "graphed launched 120 kernels per step, eager 400: a partial capture"
    ]
    assert cases.speedup_problems({"kernels": 400}, {"kernels": 396}) == []
    assert cases.speedup_problems({"kernels": None}, {"kernels": 396}) == [
        "kernel counts missing (eager None, graphed 396)"
    ]


def test_a_skipped_case_fails_the_part_unless_allowed():
    rows = [{"name": "capture dali: x", "result": "skip: nvidia.dali does not import"}, {"name": "b", "result": "pass"}]
    allowed = [dict(r) for r in rows]
    assert cap.skip_policy(allowed, allow_skip=True) == ["capture dali: x (skip: nvidia.dali does not import)"]
    assert allowed == rows
    assert cap.skip_policy(rows, allow_skip=False) == ["capture dali: x (skip: nvidia.dali does not import)"]
    assert rows[0]["result"] == "fail: skip: nvidia.dali does not import (--allow-skip accepts a skipped case)"
