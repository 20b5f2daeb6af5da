"""The CUDA-graph step across two gloo ranks on CPU, with the stand-in graphs of tests/support.py: a capture that
fails on one rank stops both ranks with the same line; a peer that dies after a settled window and two more replays
makes the survivor's next settle fail within `dist.timeout_s`, naming the watched check, instead of blocking on
replayed results; a peer that dies between replays stops the survivor in its run-ahead wait within the timeout."""

from __future__ import annotations

import datetime
import os
import time
import traceback

import torch
import torch.distributed as td
import torch.multiprocessing as mp
from support import ROOT, FakeCudaGraphs
from torch import nn

from recipes.config import load_config
from recipes.distributed import DistInfo
from recipes.optim import create_optimizer, set_lr_momentum
from recipes.rundir.payload import State
from recipes.step_builder import build_step

TIMEOUT_S = 3.0
UNWATCHED_S = 60  # how long the stand-in's replayed collective waits for a dead peer: nothing watches it


class _Comm:
    def on_step_end(self, step, log):
        pass


def _install_peer_bound_replays(fake: FakeCudaGraphs, rank: int, store) -> None:
    """A replayed step's results exist once the peer has run the same replay (its captured collective); a host
    read of a tensor waits for that with no watchdog, as a read after NCCL graph replays does, and an event recorded
    after the replay completes only then."""
    pending, original, graph_cls = [], torch.Tensor.tolist, torch.cuda.CUDAGraph
    count = [0]

    class PeerGraph(graph_cls):
        def replay(self):
            super().replay()
            store.set(f"replay{rank}-{count[0]}", "1")
            pending.append(count[0])
            fake.tail = lambda key=f"replay{1 - rank}-{count[0]}": store.check([key])
            count[0] += 1

    def tolist(t):
        while pending:
            store.wait([f"replay{1 - rank}-{pending.pop(0)}"], datetime.timedelta(seconds=UNWATCHED_S))
        return original(t)

    torch.cuda.CUDAGraph = PeerGraph
    torch.Tensor.tolist = tolist


def _worker(rank: int, world: int, tmp: str, mode: str) -> None:
    out = os.path.join(tmp, f"rank{rank}.txt")
    td.init_process_group(
        "gloo",
        init_method=f"file://{tmp}/init",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=TIMEOUT_S),
    )
    fake = FakeCudaGraphs(None, fail_capture=mode == "fail" and rank == 1)
    fake.install(lambda obj, name, value: setattr(obj, name, value))
    if mode != "fail":
        _install_peer_bound_replays(fake, rank, td.FileStore(f"{tmp}/replays", world))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.LazyLinear(3))
    model(torch.zeros(2, 3, 6, 6))
    cfg = load_config(ROOT / "configs/dawnbench_158s.yaml", ["run.device=cpu"])
    runner = build_step(
        cfg,
        model=model,
        train_model=model,
        optimizer=create_optimizer(cfg.optim, model),
        comm=_Comm(),
        scaler=torch.amp.GradScaler("cpu", enabled=False),
        device=torch.device("cpu"),
        graph=True,
        capture=True,
        warmup=1,
        dist=DistInfo(rank, world, 0, 1, torch.device("cpu")),
        amp="none",  # no autocast on the CPU
        timeout_s=TIMEOUT_S,
        on_nonfinite="skip",
    )

    def written():
        state = [t for s in runner.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
        return [*model.parameters(), *model.buffers(), *state]

    fake.written = written
    x, y = torch.randn(2, 3, 6, 6), torch.tensor([0, 1])
    st, start = State(), time.monotonic()
    result = "finished"

    def step():
        set_lr_momentum(runner.optimizer, 0.1, 0.9)
        runner(x, y, st)

    def leave(what: str):
        with open(out, "w") as f:
            f.write(f"{what}\n")
        os._exit(0)  # dies without a word to its peer

    try:
        step()  # warm-up
        step()  # captured, and replayed (that is the step)
        if mode == "settle":  # a settled window, two more replays, then the peer dies: the next settle is watched
            runner.settle(st, None)
            step()
            step()
            if rank == 1:
                leave("left after 3 replays")
            time.sleep(0.5)
            start = time.monotonic()
            runner.settle(st, None)
        elif mode == "ahead":  # the peer dies one replay short; the survivor steps on and never settles
            if rank == 1:
                leave("left after 1 replay")
            time.sleep(0.5)
            start = time.monotonic()
            for _ in range(4):  # step 2 replays, 3 waits for step 1 (done), 4 waits for step 2: the peer's is missing
                step()
        else:
            runner.settle(st, None)
    except Exception as e:
        result = f"{type(e).__name__}: {e}"
        if not result.startswith("TrainingError"):
            result += "\n" + traceback.format_exc()
    with open(out, "w") as f:
        f.write(f"{result}\n{time.monotonic() - start:.1f}\n")
    os._exit(0)


def _run(tmp_path, mode: str) -> list[list[str]]:
    mp.start_processes(_worker, args=(2, str(tmp_path), mode), nprocs=2, start_method="spawn", join=True)
    return [(tmp_path / f"rank{r}.txt").read_text().splitlines() for r in range(2)]


def test_a_capture_that_fails_on_one_rank_stops_both_with_the_same_line(tmp_path):
    (r0, _), (r1, _) = _run(tmp_path, "fail")
    want = (
        "TrainingError: run.cuda_graph: capturing the training step for input [2, 3, 6, 6] failed on rank(s) 1; "
        "set run.cuda_graph=false to run every step eagerly"
    )
    assert r0 == want and r1 == want


def test_a_peer_dead_after_a_settled_window_and_two_replays_fails_the_next_settle_within_the_timeout(tmp_path):
    (r0, seconds), (r1,) = _run(tmp_path, "settle")
    assert r1 == "left after 3 replays"
    assert r0.startswith("TrainingError: the CUDA-graph steps' check (watched all_reduce before reading replayed "), r0
    assert "a peer is dead or hung (dist.timeout_s=3)" in r0
    assert float(seconds) < 5 * TIMEOUT_S  # an unwatched read of the replayed results would wait UNWATCHED_S (60 s)


def test_a_peer_dead_between_replays_stops_the_survivor_in_the_run_ahead_wait_within_the_timeout(tmp_path):
    (r0, seconds), (r1,) = _run(tmp_path, "ahead")
    assert r1 == "left after 1 replay"
    assert r0 == (
        "TrainingError: run.cuda_graph: step 4: the run-ahead wait for step 2 to finish on the device took over "
        "dist.timeout_s=3: a peer is dead or hung in a replayed collective; process groups aborted"
    )
    assert TIMEOUT_S <= float(seconds) < 5 * TIMEOUT_S  # a blocking wait would never return (stand-in: 60 s)
