"""recipes/distributed.py's helpers: a peer that dies or hangs during any of them is one TrainingError naming the
collective, never torch's raw timeout traceback (the run-directory and resume set-up run outside the step's guard)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as td

from base.errors import TrainingError
from recipes import distributed

TWO = distributed.DistInfo(rank=1, world_size=2, local_rank=1, local_world_size=2, device=torch.device("cpu"))
HUNG = "[../gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms for recv operation to complete"


def _hang(*args, **kwargs):
    raise RuntimeError(HUNG + "\nmore lines from torch")


@pytest.mark.parametrize(
    "call, torch_fn, words",
    [
        (lambda: distributed.all_gather_object({"a": 1}, TWO), "all_gather_object", "all-gather between ranks"),
        (lambda: distributed.broadcast_object("x", TWO), "broadcast_object_list", "broadcast from rank 0"),
        (lambda: distributed.all_reduce_sum([1.0], TWO), "all_reduce", "all-reduce of run figures"),
        (lambda: distributed.broadcast_bytes(None, 0, TWO), "broadcast", "broadcast of a file from rank 0"),
    ],
)
def test_a_dead_peer_in_a_helper_is_one_line_naming_it(monkeypatch, call, torch_fn, words):
    monkeypatch.setattr(td, torch_fn, _hang)
    monkeypatch.setattr(td, "get_backend", lambda *a: "gloo")
    with pytest.raises(TrainingError) as e:
        call()
    msg = str(e.value)
    assert msg.startswith(f"{words} failed: a peer is dead or hung; underlying error: [../gloo") and "\n" not in msg


def test_other_errors_pass_through(monkeypatch):
    monkeypatch.setattr(td, "all_gather_object", lambda *a: (_ for _ in ()).throw(RuntimeError("bad pickle")))
    with pytest.raises(RuntimeError, match="bad pickle"):
        distributed.all_gather_object(1, TWO)


def _task(root, tid: int, name: str, state: str) -> None:
    d = root / str(tid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "comm").write_text(name + "\n")
    (d / "stat").write_text(f"{tid} ({name}) {state} 1 2 3\n")


def test_teardown_waits_for_gloo_workers_to_sleep(tmp_path):
    """A gloo worker still running (freeing its last collective's tensors) holds the exit back, up to the timeout;
    other threads and ended threads do not."""
    _task(tmp_path, 1, "python", "R")  # the main thread runs: not a gloo worker
    _task(tmp_path, 2, "pt_gloo_runloop", "S")
    (tmp_path / "3").mkdir()  # a thread that ended between the listing and the read
    assert distributed._thread_states(tmp_path, "pt_gloo_runloop") == ["S"]
    assert distributed.wait_for_gloo_workers(1.0, tmp_path) is True
    _task(tmp_path, 4, "pt_gloo_runloop", "R")
    assert distributed.wait_for_gloo_workers(0.1, tmp_path) is False
    assert distributed.wait_for_gloo_workers(1.0, tmp_path / "absent") is False


def test_teardown_destroys_the_groups_then_waits_for_gloo_workers(monkeypatch):
    """The wait is the fix for the abort at exit: a teardown without it must fail here, not only under load."""
    calls = []
    monkeypatch.setattr(td, "is_initialized", lambda: True)
    monkeypatch.setattr(td, "destroy_process_group", lambda: calls.append("destroy"))
    monkeypatch.setattr(distributed, "wait_for_gloo_workers", lambda *a, **k: calls.append("wait") or True)
    distributed.teardown()
    assert calls == ["destroy", "wait"]
    monkeypatch.setattr(td, "is_initialized", lambda: False)
    distributed.teardown()
    assert calls == ["destroy", "wait"]  # nothing to tear down: neither
