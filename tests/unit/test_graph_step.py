"""`run.cuda_graph`'s step (recipes/steps.py GraphStep) run eagerly on CPU: the code a CUDA graph captures (static
input buffers, lr and momentum as device tensors, GradScaler unscaling in place, the multistream engine's hooks)
must train exactly like the eager StepRunner, through a skipped non-finite step and a phase change."""

from __future__ import annotations

import copy
from functools import partial

import pytest
import torch
import torch.distributed as td
from support import ROOT, FakeCudaGraphs, NoComm, trap_host_reads
from torch import nn

from base import registry
from base.errors import TrainingError
from recipes.comm.engine import _Engine
from recipes.comm.plan import Settings, build_plan, grad_specs
from recipes.config import load_config
from recipes.memory import accumulation
from recipes.optim import create_optimizer, set_lr_momentum
from recipes.rundir.payload import State
from recipes.schedule import Schedule
from recipes.step_builder import build_step
from recipes.steps import GraphStep, StepRunner, graph_decision, phase_graph_decisions


class _Done:
    def wait(self):
        return True


class _Log:
    def __init__(self):
        self.warnings, self.lines = [], []

    def warn(self, msg):
        self.warnings.append(msg)

    def info(self, msg):
        self.lines.append(msg)


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 5),
    ).to(memory_format=torch.channels_last)


def _runner(cls, model, *, amp: str, engine: bool, config: str = "configs/dawnbench_158s.yaml"):
    cfg = load_config(ROOT / config, ["run.device=cpu"])  # the record: hybrid LARS, tf momentum
    opt = create_optimizer(cfg.optim, model)
    if engine:
        specs, params = grad_specs(model)
        eng = _Engine(build_plan(specs, Settings(0.001, 2, 2), "none"), params, [object(), object()], 1, False, 30.0)
        for i, p in enumerate(params):
            p.register_post_accumulate_grad_hook(partial(lambda i, _p: eng.grad_ready(i), i))
    return cls(
        model=model,
        train_model=model,
        optimizer=opt,
        optim=registry.OPTIMIZERS[cfg.optim.name],
        scaler=torch.amp.GradScaler("cpu", init_scale=2.0**8, enabled=amp == "fp16"),
        comm=NoComm(),
        criterion=nn.CrossEntropyLoss(label_smoothing=0.1),
        device=torch.device("cpu"),
        amp=amp,
        on_nonfinite="skip",
    )


def _batches():
    """Six steps at 8 px, the fourth with a NaN image (a skipped step), then three at 12 px (a phase change)."""
    g = torch.Generator().manual_seed(1)
    out = []
    for step in range(9):
        size = 8 if step < 6 else 12
        x = torch.randn(4, 3, size, size, generator=g).contiguous(memory_format=torch.channels_last)
        if step == 3:
            x[1, 0, 0, 0] = float("nan")
        out.append((x, torch.randint(0, 5, (4,), generator=g)))
    return out


@pytest.mark.parametrize("amp,engine", [("fp16", True), ("none", True), ("none", False)])
def test_graph_step_trains_like_the_eager_step(monkeypatch, amp, engine):
    monkeypatch.setattr(td, "all_reduce", lambda t, group=None, async_op=False: _Done())
    ref_model = _net()
    new_model = copy.deepcopy(ref_model)
    ref = _runner(StepRunner, ref_model, amp=amp, engine=engine)
    new = _runner(partial(GraphStep, capture=False), new_model, amp=amp, engine=engine)
    st_ref, st_new, log_ref, log_new = State(), State(), _Log(), _Log()
    losses = []
    for i, (x, y) in enumerate(_batches()):
        lr, mom = 0.05 + 0.1 * i, 0.98 - 0.01 * i  # a moving schedule, as the trainer sets it each step
        for runner in (ref, new):
            set_lr_momentum(runner.optimizer, lr, mom)
        losses.append((ref(x, y, st_ref), new(x.clone(), y.clone(), st_new)))
        if i in (4, 8):
            ref.settle(st_ref, log_ref)
            new.settle(st_new, log_new)
    for a, b in losses:
        torch.testing.assert_close(b, a, equal_nan=True, rtol=1e-6, atol=1e-7)
    for (name, a), b in zip(ref_model.state_dict().items(), new_model.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, equal_nan=True, msg=name)  # NaN image: BN stats
    with torch.no_grad():
        moved = max(
            float((a - b).abs().max()) for a, b in zip(_net().parameters(), new_model.parameters(), strict=True)
        )
    assert moved > 1e-3  # the steps trained
    assert st_new.step == st_ref.step == 9 and st_new.skipped_steps == st_ref.skipped_steps == 1
    assert len(log_new.warnings) == len(log_ref.warnings) == 1 and "step 3" in log_new.warnings[0]
    # the groups keep plain floats (checkpoints and logs): the device tensors live in the step only
    assert all(isinstance(g["lr"], float) and isinstance(g["momentum"], float) for g in new.optimizer.param_groups)


def test_graph_step_reads_nothing_on_the_host(monkeypatch):
    monkeypatch.setattr(td, "all_reduce", lambda t, group=None, async_op=False: _Done())
    runner = _runner(partial(GraphStep, capture=False), _net(), amp="fp16", engine=True)
    st = State()
    (x, y), *_ = _batches()
    runner(x, y, st)
    trap_host_reads(monkeypatch)
    for _ in range(2):
        runner(x, y, st)
    monkeypatch.undo()
    assert len(runner.pending) == 3


def _decide(*overrides, device="cuda", world=1, optimizer="hybrid", micro_batches=1):
    cfg = load_config(None, [f"optim.name={optimizer}", *overrides])
    return graph_decision(
        cfg.run, cfg.comm, optim=optimizer, device_type=device, world_size=world, micro_batches=micro_batches
    )


def test_graph_decision_says_why_it_stays_eager():
    assert _decide("run.cuda_graph=true") == (True, "")
    assert _decide("run.cuda_graph=true", "comm.backend=multistream", world=8) == (True, "")
    # the hop ring, flat or between hosts (comm.hierarchy=host), waits on the host: the phase stays eager
    hier = ("comm.backend=multistream", "comm.balance=true", "comm.balance_level=hop", "comm.hierarchy=host")
    assert _decide("run.cuda_graph=true", *hier, world=8) == (
        False,
        "comm.balance_level=hop: its ring runs on helper threads that wait on the host",
    )
    assert _decide("run.cuda_graph=false") == (False, "run.cuda_graph=false")
    assert _decide("run.cuda_graph=true", device="cpu") == (False, "no CUDA device (cpu)")
    assert "gradient accumulation (2 micro-batches" in _decide("run.cuda_graph=true", micro_batches=2)[1]
    assert "optim.name=lamb decides on the host" in _decide("run.cuda_graph=true", optimizer="lamb")[1]
    # torch's SGD reads its tensor momentum on the host: a capture would refuse it (or freeze it)
    assert _decide("run.cuda_graph=true", optimizer="sgd") == (False, "optim.name=sgd reads lr/momentum on the host")
    assert "comm.backend=horovod wraps the model" in _decide("run.cuda_graph=true", "comm.backend=horovod", world=2)[1]
    assert "comm.backend=ddp wraps the model" in _decide("run.cuda_graph=true", world=2)[1]
    # engaged on one rank, DDP still wraps the model: the decision follows the wrapping, not the world size
    engaged = _decide("run.cuda_graph=true", "comm.engage_single_rank=true", world=1)
    assert engaged[0] is False and "comm.backend=ddp wraps the model" in engaged[1]
    # auto: only what a GPU run proved; none has yet
    ok, why = _decide()
    assert not ok and why.startswith("no GPU proof covers this run (optim.name=hybrid: no GPU run has proven it")
    with pytest.raises(TrainingError, match="decides on the host"):
        GraphStep(
            capture=False,
            model=nn.Linear(2, 2),
            train_model=nn.Linear(2, 2),
            optimizer=torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1),
            optim=registry.OPTIMIZERS["lamb"],
            scaler=torch.amp.GradScaler("cpu", enabled=False),
            comm=NoComm(),
            criterion=nn.CrossEntropyLoss(),
            device=torch.device("cpu"),
        )


def _phases(cfg, plan, world):
    return phase_graph_decisions(
        cfg.run,
        cfg.comm,
        optim=cfg.optim.name,
        micro_batches=plan.phase_micro_batches(),
        device_type="cuda",
        world_size=world,
    )


def test_run_max_gpu_batch_keeps_the_accumulating_phases_eager():
    cfg = load_config(ROOT / "configs/dawnbench_158s.yaml", ["run.cuda_graph=true", "run.max_gpu_batch=128"])
    plan = Schedule(cfg.phases, cfg.optim, num_images=1_281_167, world_size=128, **accumulation(cfg))
    decisions = _phases(cfg, plan, 128)
    # 256 images per GPU at 96-224 px: 2 micro-batches; 128 at 288 px: one
    assert [ok for ok, _ in decisions] == [False, False, False, True]
    assert "gradient accumulation (2 micro-batches" in decisions[0][1]


def _fake(monkeypatch, **kw) -> FakeCudaGraphs:
    """The stand-in, installed before the runner is built (GraphStep makes its side stream then)."""
    fake = FakeCudaGraphs(None, **kw)
    fake.install(monkeypatch.setattr)
    return fake


def _watch(fake: FakeCudaGraphs, runner, model) -> FakeCudaGraphs:
    """What the step may write, which a capture puts back: weights, buffers, optimizer state, the scaler's."""

    def written():
        opt_state = [t for s in runner.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
        scaler = [getattr(runner.scaler, k, None) for k in ("_scale", "_growth_tracker")]
        out = [*model.parameters(), *model.buffers(), *opt_state, *scaler]
        return [t for t in out if t is not None]

    fake.written = written
    return fake


def test_capture_replay_and_recapture_freeze_what_a_capture_freezes(monkeypatch):
    """The capture path on CPU with the stand-in graph: warm-up steps, a capture per shape into a fresh pool, replays
    of the recorded ops that read the schedule's lr and momentum of their own step, the same weights as the eager
    step through a skipped step and a phase change, one side stream, the host at most 2 steps ahead."""
    monkeypatch.setattr(td, "all_reduce", lambda t, group=None, async_op=False: _Done())
    ref_model, new_model = _net(), _net()
    ref = _runner(StepRunner, ref_model, amp="fp16", engine=True)
    fake = _fake(monkeypatch)
    new = _runner(partial(GraphStep, capture=True, warmup=2), new_model, amp="fp16", engine=True)
    _watch(fake, new, new_model)
    st_ref, st_new, log_ref, log_new = State(), State(), _Log(), _Log()
    for i, (x, y) in enumerate(_batches()):
        for runner in (ref, new):
            set_lr_momentum(runner.optimizer, 0.05 + 0.1 * i, 0.98 - 0.01 * i)
        ref(x, y, st_ref, log_ref)
        new(x.clone(), y.clone(), st_new, log_new)
    ref.settle(st_ref, log_ref)
    new.settle(st_new, log_new)
    # 8 px: 2 eager, captured at step 2 (and replayed: that is the step), 3 more replays incl. the NaN step 3;
    # 12 px: a new shape, 2 eager, captured and replayed at step 8
    assert len(fake.captured) == 2 and fake.replays == 5
    assert [m for m in log_new.lines if "captured" in m] == [
        "run.cuda_graph: step captured for input [4, 3, 8, 8] (torch.float32)",
        "run.cuda_graph: step captured for input [4, 3, 12, 12] (torch.float32)",
    ]
    for (name, a), b in zip(ref_model.state_dict().items(), new_model.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, equal_nan=True, msg=name)
    assert st_new.skipped_steps == st_ref.skipped_steps == 1
    assert fake.streams == 1  # the eager steps' side stream, made once
    assert fake.synced == 9 - 2  # from the third step on, each waits for the one two before it
    assert len(new.inflight) == 2  # the last two steps' batches are held until their events


def test_a_frozen_float_diverges_under_the_stand_in(monkeypatch):
    """The stand-in is strict enough: a step that hands the optimizer a float momentum (what a capture freezes)
    trains differently from the eager step once the schedule moves."""
    monkeypatch.setattr(td, "all_reduce", lambda t, group=None, async_op=False: _Done())
    ref_model, new_model = _net(), _net()
    ref = _runner(StepRunner, ref_model, amp="none", engine=False)
    fake = _fake(monkeypatch)
    new = _runner(partial(GraphStep, capture=True, warmup=1), new_model, amp="none", engine=False)
    new.hp = [{k: v for k, v in hp.items() if k != "momentum"} for hp in new.hp]  # momentum left a float
    _watch(fake, new, new_model)
    st_ref, st_new = State(), State()
    for i, (x, y) in enumerate(_batches()[:3]):
        for runner in (ref, new):
            set_lr_momentum(runner.optimizer, 0.05, 0.98 - 0.2 * i)
        ref(x, y, st_ref)
        new(x.clone(), y.clone(), st_new)
    diff = max(float((a - b).abs().max()) for a, b in zip(ref_model.parameters(), new_model.parameters(), strict=True))
    assert diff > 1e-4


@pytest.mark.parametrize(
    "read,why",
    [
        (float, "(a host read of a tensor)"),
        (lambda t: t.tolist()[0], "(Tensor.tolist: a host read)"),
        (lambda t: float(t.numpy()[0]), "(Tensor.numpy: a host read)"),
    ],
)
def test_a_host_read_inside_the_capture_is_refused(monkeypatch, read, why):
    """The stand-in refuses a host read in the captured body (`.item()`, `.tolist()`, `.numpy()`), as CUDA does on
    a capturing stream."""
    monkeypatch.setattr(td, "all_reduce", lambda t, group=None, async_op=False: _Done())
    model = _net()
    fake = _fake(monkeypatch)
    runner = _runner(partial(GraphStep, capture=True, warmup=0), model, amp="none", engine=False)
    _watch(fake, runner, model)
    orig = runner.grad_norm
    runner.grad_norm = lambda: orig() * read(orig().detach().reshape(1))  # a host read
    (x, y), *_ = _batches()
    log = _Log()
    with pytest.raises(TrainingError, match=r"capturing the training step for input \[4, 3, 8, 8\] failed on rank"):
        runner(x, y, State(), log)
    refused = "RuntimeError: operation not permitted when stream is capturing"
    assert log.warnings == [f"run.cuda_graph: this rank's capture failed: {refused} {why}"]


def test_the_stand_in_streams_hide_a_write_until_another_stream_waits_for_it(monkeypatch):
    """A write on the side stream is NaN to the main stream until `main.wait_stream(side)`; the side stream reads
    its own writes; an event left unfinished stays unfinished."""
    fake = _fake(monkeypatch)
    main, side, t = torch.cuda.current_stream(), torch.cuda.Stream(), torch.ones(2)
    with torch.cuda.stream(side):
        t.add_(1)
    assert torch.isnan(t).all()  # main reads before waiting: not the value written
    with torch.cuda.stream(side):
        assert t.tolist() == [2.0, 2.0]
    main.wait_stream(side)
    assert t.tolist() == [2.0, 2.0]
    fake.tail, fake.block_s = (lambda: False), 0.05
    event = torch.cuda.Event()
    event.record(main)
    assert not event.query()
    with pytest.raises(RuntimeError, match="work unfinished after 0.05 s"):
        event.synchronize()


def test_the_run_ahead_wait_stops_within_the_timeout_when_the_device_never_finishes(monkeypatch):
    """A step the device never finishes (a replayed collective whose peer died): the host's wait for it polls with
    the deadline `dist.timeout_s`, aborts the process groups and stops with one line naming the step and the wait."""
    import time

    monkeypatch.setattr(td, "all_reduce", lambda t, group=None, async_op=False: _Done())
    aborted = []
    monkeypatch.setattr("recipes.steps.abort_process_groups", lambda: aborted.append(True))
    model = _net()
    fake = _fake(monkeypatch)
    runner = _runner(partial(GraphStep, capture=True, warmup=1), model, amp="none", engine=False)
    runner.timeout_s = 0.5
    _watch(fake, runner, model)
    batches, st = _batches(), State()
    for x, y in batches[:2]:  # eager, then captured and replayed
        runner(x, y, st, _Log())
    fake.tail = lambda: False  # the device never finishes what is enqueued from here on
    runner(*batches[2], st, _Log())  # waits for step 0: done
    runner(*batches[3], st, _Log())  # waits for step 1: done
    start = time.monotonic()
    with pytest.raises(TrainingError) as e:
        runner(*batches[4], st, _Log())  # waits for step 2: never done
    assert str(e.value) == (
        "run.cuda_graph: step 4: the run-ahead wait for step 2 to finish on the device took over "
        "dist.timeout_s=0.5: a peer is dead or hung in a replayed collective; process groups aborted"
    )
    assert 0.5 <= time.monotonic() - start < 5.0 and aborted == [True]


def test_a_phase_change_never_captures_into_a_pool_with_a_live_block(monkeypatch):
    """cuBLAS's workspace, made by the first matmul inside the first capture, outlives that graph: the allocator
    refuses a second capture into the same pool. Each capture takes a fresh one."""
    monkeypatch.setattr(td, "all_reduce", lambda t, group=None, async_op=False: _Done())
    model = _net()
    fake = _fake(monkeypatch)
    runner = _runner(partial(GraphStep, capture=True, warmup=1), model, amp="fp16", engine=True)
    _watch(fake, runner, model)
    for x, y in [b for i, b in enumerate(_batches()) if i in (0, 1, 2, 6, 7, 8)]:
        runner(x, y, State(), _Log())
    assert len(fake.captured) == 2
    assert fake.workspaces  # the first capture made the library's workspace


class _Planned(NoComm):
    def __init__(self):
        self.plan = 1

    def capture_key(self):
        return self.plan


def test_a_new_backend_plan_is_captured_again(monkeypatch):
    """A backend whose plan changes (multistream's balancer) gets a new capture: the graph baked the old one."""
    monkeypatch.setattr(td, "all_reduce", lambda t, group=None, async_op=False: _Done())
    model = _net()
    fake = _fake(monkeypatch)
    runner = _runner(partial(GraphStep, capture=True, warmup=1), model, amp="none", engine=False)
    runner.comm = _Planned()
    _watch(fake, runner, model)
    (x, y), *_ = _batches()
    for i in range(6):
        runner.comm.plan = 1 if i < 3 else 2
        runner(x, y, State(), _Log())
    assert len(fake.captured) == 2 and fake.replays == 4


def _inf_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(3, 2)


@pytest.mark.parametrize("kind", ["eager", "graph-eager", "graph-captured"])
def test_an_infinite_gradient_skips_the_step_on_the_fp32_path(monkeypatch, kind):
    """inf (not NaN) gradients are not applied: the fp32 path's flag checks finiteness, not NaN only."""
    model = _inf_model()
    cfg = load_config(ROOT / "configs/dawnbench_158s.yaml", ["run.device=cpu"])
    opt = create_optimizer(cfg.optim, model)
    cls = {
        "eager": StepRunner,
        "graph-eager": partial(GraphStep, capture=False),
        "graph-captured": partial(GraphStep, capture=True, warmup=0),
    }[kind]
    fake = _fake(monkeypatch)
    runner = cls(
        model=model,
        train_model=model,
        optimizer=opt,
        optim=registry.OPTIMIZERS["hybrid"],
        scaler=torch.amp.GradScaler("cpu", enabled=False),
        comm=NoComm(),
        criterion=lambda out, y: (out * 3e38).sum(),  # finite loss terms, gradients of 3e38 * 1e3: inf
        device=torch.device("cpu"),
        on_nonfinite="skip",
    )
    _watch(fake, runner, model)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = torch.full((2, 3), 1e3), torch.zeros(2, dtype=torch.long)
    set_lr_momentum(opt, 0.1, 0.9)
    st = State()
    runner(x, y, st, _Log())
    runner.settle(st, _Log())
    assert st.skipped_steps == 1
    for a, b in zip(before, model.parameters(), strict=True):
        assert torch.equal(a, b)


# Each registered optimizer as its record states it, and torch's fused AdamW kernel (which takes a 0-dim flag only;
# recipes/optim.py builds it on CUDA) held to the adamw record's flags on the CPU.
_OPTIMIZERS = [*registry.OPTIMIZERS, "adamw-fused"]


@pytest.mark.parametrize("name", _OPTIMIZERS)
def test_each_optimizer_steps_and_skips_through_both_step_runners(name):
    """StepRunner and GraphStep's eager body take each optimizer as its record says, skip a non-finite step and
    otherwise train alike; GraphStep refuses one that decides on the host."""
    rec = registry.OPTIMIZERS[name.removesuffix("-fused")]
    cfg = load_config(None, [f"optim.name={rec.name}", "optim.lr=0.05"])
    models, runners = [], []
    for cls in (StepRunner, partial(GraphStep, capture=False)):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
        if name == "adamw-fused":
            opt = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr, fused=True)
        else:
            opt = create_optimizer(cfg.optim, model)
        kw = dict(model=model, train_model=model, optimizer=opt, optim=rec, comm=NoComm(), device=torch.device("cpu"))
        kw.update(scaler=torch.amp.GradScaler("cpu", enabled=False), criterion=nn.CrossEntropyLoss())
        if cls is not StepRunner and not rec.skips_on_device:
            with pytest.raises(TrainingError, match="decides on the host"):
                cls(**kw, on_nonfinite="skip")
            continue
        models.append(model)
        runners.append(cls(**kw, on_nonfinite="skip"))
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(4)]
    batches[1][0][0, 0] = float("nan")
    for runner, model in zip(runners, models, strict=True):
        st = State()
        for x, y in batches:
            set_lr_momentum(runner.optimizer, 0.05, 0.9)
            runner(x.clone(), y, st, _Log())
        runner.settle(st, _Log())
        assert st.skipped_steps == 1, name
        assert all(torch.isfinite(p).all() for p in model.parameters()), name
    for a, b in zip(models[0].parameters(), models[-1].parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def _shipped_configs():
    return sorted(
        p.relative_to(ROOT).as_posix() for p in [*ROOT.glob("configs/*.yaml"), *ROOT.glob("configs/presets/*.yaml")]
    )


def test_every_shipped_config_captures_only_a_body_without_host_reads(monkeypatch):
    """Over every shipped config and preset: where the step would be captured (run.cuda_graph=true, on a GPU, at the
    config's world size), its optimizer and precision run the captured body under the stand-in, which refuses a
    host read; where it would not, the reason is the optimizer's or the backend's record."""
    monkeypatch.setattr(td, "all_reduce", lambda t, group=None, async_op=False: _Done())
    seen = {}
    for path in _shipped_configs():
        cfg = load_config(ROOT / path, ["run.cuda_graph=true"])
        world = cfg.run.nodes * cfg.run.procs_per_node
        plan = Schedule(cfg.phases, cfg.optim, num_images=1_281_167, world_size=world, **accumulation(cfg))
        for ok, why in _phases(cfg, plan, world):
            if not ok:
                assert why, path
                continue
            key = (cfg.optim.name, cfg.optim.lars_momentum, cfg.run.amp)
            if key in seen:
                continue
            model = _net()
            opt_cfg = load_config(ROOT / path, ["run.device=cpu"]).optim
            monkeypatch.undo()
            monkeypatch.setattr(td, "all_reduce", lambda t, group=None, async_op=False: _Done())
            fake = _fake(monkeypatch)
            runner = build_step(
                cfg,
                model=model,
                train_model=model,
                optimizer=create_optimizer(opt_cfg, model),
                comm=NoComm(),
                scaler=torch.amp.GradScaler("cpu", init_scale=2.0**8, enabled=cfg.run.amp == "fp16"),
                device=torch.device("cpu"),
                graph=True,
                capture=True,
                warmup=1,
                amp="none",  # no autocast on the CPU: fp16's scaler and skip run, in fp32
                on_nonfinite="skip",
            )
            _watch(fake, runner, model)
            (x, y), *_ = _batches()
            for _ in range(3):
                set_lr_momentum(runner.optimizer, 0.1, 0.9)
                runner(x, y, State(), _Log())
            assert len(fake.captured) == 1 and fake.replays == 2, path
            seen[key] = path
    assert {k[0] for k in seen} == {"hybrid"}  # the record's optimizer: the shipped configs that can capture


def test_a_backend_that_blocks_capture_for_good_gets_the_step_runner_not_an_eager_graph_step():
    """multistream's hop ring, serialize, or K communicators a graph would serialize with no tuner to change K:
    every phase eager with that reason (the trainer then builds StepRunner); a tuner that may still pick K=1 keeps
    the decision."""
    from types import SimpleNamespace

    from recipes.comm import concurrency as cc
    from recipes.comm.multistream import MultiStreamBackend
    from recipes.distributed import DistInfo
    from recipes.steps import after_backend

    cfg = load_config(None, ["comm.backend=multistream", "run.device=cpu"])
    ms = MultiStreamBackend(cfg.comm, DistInfo(0, 2, 0, 1, torch.device("cpu")), timeout_s=30.0, model_name="x")
    ms.engine = SimpleNamespace(plan=SimpleNamespace(streams=4))
    ms.concurrency, ms.graph_serial, ms.tuner = cc.Decision("overlap", "overlap"), [], None
    decisions = [(True, ""), (False, "gradient accumulation (2 micro-batches: run.accumulate/max_gpu_batch)")]
    assert after_backend(decisions, ms) == decisions  # nothing blocks for good
    ms.graph_serial = ["CUDA driver 12080 < 12090 serializes communicators in a graph"]
    want = (
        "4 communicators would run one at a time inside a graph: CUDA driver 12080 < 12090 serializes communicators "
        "in a graph; capture can never happen in this run"
    )
    assert after_backend(decisions, ms) == [(False, want), (False, want)]
    ms.tuner = object()  # the tuner may still choose one communicator
    assert after_backend(decisions, ms) == decisions
    ms.concurrency = cc.Decision("serialize", "serialize (asked for)")
    serial = "comm.concurrency=serialize (its helper thread waits on the host); capture can never happen in this run"
    assert after_backend(decisions, ms) == [(False, serial)] * 2
    assert after_backend(decisions, NoComm()) == decisions  # a backend that states nothing
