"""recipes/comm/base.py: the step window the backends time their communication with, and who sets up the
process environment."""

from __future__ import annotations

import time

import pytest
import torch

from base.errors import ConfigError
from recipes.comm import backend_class
from recipes.comm.base import StepWindow
from recipes.config import load_config


def test_step_window_spans_first_begin_to_last_end_per_step():
    w = StepWindow(torch.device("cpu"))
    w.begin()
    time.sleep(0.02)
    w.begin()  # a later bucket: the window still starts at the first
    w.end()
    time.sleep(0.03)
    w.end()  # the last completion closes it
    w.close_step()
    w.close_step()  # a step without communication counts nothing
    assert w.steps == 1 and 0.05 <= w.seconds < 0.5
    w.begin()
    time.sleep(0.01)
    w.end()
    w.close_step()
    assert w.steps == 2 and 0.06 <= w.seconds < 0.6


def test_only_the_horovod_backend_reads_horovodrun_environment(monkeypatch):
    monkeypatch.setenv("HOROVOD_RANK", "0")
    monkeypatch.delenv("RANK", raising=False)
    cfg = load_config(None, ["comm.backend=ddp"])
    expected = "comm.backend=ddp: this process was started by horovodrun; set comm.backend=horovod, or launch with"
    with pytest.raises(ConfigError, match=expected):
        backend_class("ddp").process_env(cfg.comm)
    monkeypatch.delenv("HOROVOD_RANK")
    assert backend_class("horovod").process_env(cfg.comm) == {} == backend_class("ddp").process_env(cfg.comm)
    # multistream: only NCCL's implicit launch order (its overlap rule, tests/unit/test_comm_concurrency.py)
    assert backend_class("multistream").process_env(cfg.comm.as_part("multistream")) == {
        "NCCL_LAUNCH_ORDER_IMPLICIT": "1"
    }
