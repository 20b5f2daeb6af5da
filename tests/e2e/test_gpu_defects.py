"""Defects on the GPU path that a CPU can show: each test failed before its fix.

The LARS tf step with the trainer's non-finite flag, Horovod with channels_last tensors, cudnn.benchmark on a CUDA
device, the input's per-batch host-to-device copies, a venv switched between CUDA variants, and the allreduce
backends engaged in a world of one process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from support import ROOT, TORCHRUN_BACKENDS, horovodrun, needs_horovod
from torch import nn

from base import registry
from recipes.comm.horovod_backend import Contiguous, broadcast_state
from recipes.lars import LayerAdaptiveSGD
from recipes.steps import StepRunner


# --- optim.lars_momentum: tf with run.amp none / bf16 --------------------------------------------------------------
def _tf_lars(seed: int = 0):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    opt = LayerAdaptiveSGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4, momentum_convention="tf")
    net(torch.randn(5, 4)).sum().backward()
    return net, opt


@pytest.mark.parametrize("bad", [0.0, 1.0])
def test_lars_tf_takes_the_trainers_nonfinite_flag(bad):
    """Without GradScaler the trainer hands `found_inf` as StepRunner.nonfinite_flag makes it: in the shape the
    optimizer's record states (0-dim for LARS, as GradScaler's own)."""
    net, opt = _tf_lars()
    runner = SimpleNamespace(model=net, device=torch.device("cpu"), optim=registry.OPTIMIZERS["lars"])
    flag = StepRunner.nonfinite_flag(runner)
    assert flag.shape == () and float(flag) == 0.0
    ref_net, ref_opt = _tf_lars()
    ref_opt.step()  # no flag at all: the plain step
    before = [p.detach().clone() for p in net.parameters()]
    opt.found_inf = flag + bad
    opt.step()  # raised "scalar tensor expected to be 0 dim" before the fix
    for p, r, b in zip(net.parameters(), ref_net.parameters(), before, strict=True):
        torch.testing.assert_close(p, b if bad else r, rtol=0, atol=0)


# --- Horovod with run.channels_last: true --------------------------------------------------------------------------
class FakeHvd:
    """What rank 1 sees of Horovod 0.28.1: the same contiguity check (horovod/torch/mpi_ops.py, _check_function)
    and rank 0's values arriving in place."""

    def __init__(self, root_values: dict[str, torch.Tensor], root_scalars: dict):
        self.root_values, self.root_scalars, self.sent = root_values, root_scalars, []

    def broadcast_parameters(self, params: dict, root_rank: int) -> None:
        if not all(t.is_contiguous() for t in params.values()):
            raise ValueError("Tensor is required to be contiguous.")
        for name, t in sorted(params.items()):
            self.sent.append(name)
            t.copy_(self.root_values[name].reshape(t.shape))

    def broadcast_object(self, obj, root_rank: int, name: str | None = None):
        assert set(obj) == set(self.root_scalars)
        return dict(self.root_scalars)


def _cl_net():
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Conv2d(8, 4, 1))
    return net.to(memory_format=torch.channels_last)


def test_horovod_broadcast_takes_channels_last_weights_and_state():
    torch.manual_seed(0)
    root, mine = _cl_net(), _cl_net()
    assert not mine[0].weight.is_contiguous()  # a 3x3 weight in channels_last: what Horovod refused
    opt = LayerAdaptiveSGD(mine.parameters(), lr=0.1, momentum=0.9)
    for p in mine.parameters():
        opt.state[p]["momentum_buffer"] = torch.zeros_like(p)  # channels_last too, as LARS makes them
    with pytest.raises(ValueError, match="contiguous"):  # the old call: hvd.broadcast_parameters(state_dict)
        FakeHvd({}, {}).broadcast_parameters(mine.state_dict(), root_rank=0)
    values = {f"model.{k}": v.contiguous() for k, v in root.state_dict().items()}
    values.update(
        {f"optim.{i}.momentum_buffer": torch.full(p.shape, float(i)) for i, p in enumerate(root.parameters())}
    )
    scalars = {f"group.0.{k}": v for k, v in opt.param_groups[0].items() if k != "params"}
    scalars["group.0.lr"] = 0.5
    hvd = FakeHvd(values, scalars)
    broadcast_state(hvd, mine, opt)
    for (k, a), b in zip(mine.state_dict().items(), root.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, msg=k)
    assert not mine[0].weight.is_contiguous()  # still channels_last: copied back in place
    for i, p in enumerate(mine.parameters()):
        assert float(opt.state[p]["momentum_buffer"].abs().max() - i) == 0
    assert opt.param_groups[0]["lr"] == 0.5
    assert any(n.startswith("optim.") for n in hvd.sent)


class NoneCompressor:  # horovod.torch.compression.NoneCompressor
    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor:  # horovod.torch.compression.FP16Compressor
    @staticmethod
    def compress(tensor):
        return (tensor.type(torch.float16) if tensor.dtype.is_floating_point else tensor), tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.type(ctx) if ctx.is_floating_point else tensor


@pytest.mark.parametrize("inner", [NoneCompressor, FP16Compressor])
def test_horovod_gradients_go_contiguous_and_come_back_channels_last(inner):
    grad = torch.randn(8, 3, 3, 3).contiguous(memory_format=torch.channels_last)
    c = Contiguous(inner)
    wire, ctx = c.compress(grad)
    assert wire.is_contiguous()  # what Horovod's allreduce_async_ accepts
    wire.mul_(0.5)  # the reduction, in place on the wire tensor
    out = c.decompress(wire, ctx)
    assert out.stride() == grad.stride()  # laid out as the parameter: the CUDA fused SGD kernel checks it
    torch.testing.assert_close(out, grad * 0.5, atol=1e-3, rtol=1e-3)
    flat = torch.randn(5)
    wire, ctx = c.compress(flat)
    assert c.decompress(wire, ctx).stride() == flat.stride()


# --- torch.backends.cudnn.benchmark ---------------------------------------------------------------------------------
def test_cudnn_benchmark_is_set_on_a_cuda_device_only(monkeypatch):
    from recipes.config import load_config
    from recipes.distributed import setup

    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    setup(load_config(None, ["run.device=cpu"]), env={})
    assert torch.backends.cudnn.benchmark is False
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: None)
    dist = setup(load_config(None, ["run.device=auto"]), env={})
    assert dist.device == torch.device("cuda", 0)
    assert torch.backends.cudnn.benchmark is True


# --- the torch input backend's per-batch copies --------------------------------------------------------------------
def test_normalize_makes_its_constants_once_per_device(monkeypatch):
    """torch.tensor(list, device=cuda) is a blocking host-to-device copy: two per batch before the fix."""
    from data import transforms

    batch = torch.randint(0, 255, (2, 3, 4, 4), dtype=torch.uint8)
    want = transforms.normalize(batch, True)
    made = []
    real = torch.tensor

    def counting(*a, **kw):
        made.append(kw.get("device"))
        return real(*a, **kw)

    monkeypatch.setattr(torch, "tensor", counting)
    for _ in range(3):
        got = transforms.normalize(batch, True)
    assert made == []
    torch.testing.assert_close(got, want)
    assert got.is_contiguous(memory_format=torch.channels_last)


# --- make install CUDA=... on an existing venv ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("installed", "wanted", "clean"), [("cu130", "cu126", True), ("cu126", "cu130", True), ("cu130", "cu130", False)]
)
def test_switching_the_cuda_variant_starts_a_new_venv(tmp_path, installed, wanted, clean):
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".installed").write_text(installed + "\n")
    p = subprocess.run(
        ["make", "-n", "install", f"VENV={venv}", f"CUDA={wanted}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert (f"rm -rf '{venv}'" in lines) == clean, p.stdout
    if clean:
        assert lines.index(f"rm -rf '{venv}'") < next(i for i, ln in enumerate(lines) if "-m venv" in ln)


# --- comm.engage_single_rank ----------------------------------------------------------------------------------------
_ENGAGE = """
import json, sys, torch
from torch import nn
from recipes.comm import create_allreduce, process_env
from recipes.config import load_config
from recipes.distributed import setup
out = {}
for backend in sys.argv[1].split(","):
    cfg = load_config(None, ["run.device=cpu", "dist.backend=gloo", f"comm.backend={backend}", *sys.argv[2:]])
    dist = setup(cfg, env=process_env(cfg.comm))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.Linear(5, 3))
    comm = create_allreduce(cfg.comm, dist, timeout_s=cfg.dist.timeout_s, model_name=cfg.model.name)
    tm, opt = comm.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for step in range(3):
        opt.zero_grad()
        tm(torch.randn(4, 6)).sum().backward()
        opt.step()
        comm.on_step_end(step + 1)
    s = comm.stats()
    out[backend] = {"wrapped": tm is not model, "steps": s.steps, "bytes": s.bytes}
print(json.dumps(out))
"""


@pytest.mark.parametrize("engage", [False, True])
def test_one_process_engages_the_backends_when_asked(engage):
    args = ["comm.engage_single_rank=true"] if engage else []
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    p = subprocess.run(
        [sys.executable, "-c", _ENGAGE, ",".join(TORCHRUN_BACKENDS), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    params = (6 * 5 + 5 + 5 * 3 + 3) * 4
    ddp_like = registry.ALLREDUCE_BACKENDS[registry.REFERENCE_BACKEND].step_model
    for backend in TORCHRUN_BACKENDS:
        record = registry.ALLREDUCE_BACKENDS[backend]
        wire = params // 2 if record.wire_dtype in ("fp16", "bf16") else params  # bytes in its wire format
        if engage:  # hooks, buckets and collectives ran over a one-rank gloo group
            assert out[backend]["wrapped"] == (record.step_model == ddp_like), out  # DDP and its variants wrap
            assert out[backend]["steps"] == 3 and out[backend]["bytes"] == 3 * wire, out
        else:
            assert out[backend] == {"wrapped": False, "steps": 0, "bytes": 0}, out


_HVD = """
import json, sys, torch
from torch import nn
sys.path.insert(0, {root!r})
from recipes.comm import create_allreduce, process_env
from recipes.config import load_config
from recipes.distributed import setup
from recipes.lars import LayerAdaptiveSGD
cfg = load_config(None, ["run.device=cpu", "dist.backend=gloo", "comm.backend=horovod", "run.threads=1", *sys.argv[2:]])
dist = setup(cfg, env=process_env(cfg.comm))
torch.manual_seed(dist.rank)  # different weights per rank: the broadcast must make them rank 0's
net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3))
net = nn.Sequential(*net, nn.Flatten(), nn.Linear(64, 3))
net = net.to(memory_format=torch.channels_last)
opt = LayerAdaptiveSGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
comm = create_allreduce(cfg.comm, dist, timeout_s=cfg.dist.timeout_s, model_name=cfg.model.name)
tm, opt = comm.prepare(net, opt)
for step in range(2):
    opt.zero_grad()
    g = torch.Generator().manual_seed(100 * dist.rank + step)
    x = torch.randn(4, 3, 8, 8, generator=g).contiguous(memory_format=torch.channels_last)
    tm(x).sum().backward()
    layouts = all(p.grad.stride() == p.stride() for p in net.parameters())
    opt.step()
    comm.on_step_end(step + 1)
flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
json.dump({{"layouts": layouts, "w": flat.tolist(), "bytes": comm.stats().bytes,
           "cl": not net[0].weight.is_contiguous()}}, open(sys.argv[1] + f"/rank{{dist.rank}}.json", "w"))
"""


@needs_horovod
def test_horovod_trains_a_channels_last_model(tmp_path):
    """The real Horovod 0.28.1 under horovodrun: it crashed in broadcast_parameters before (non-contiguous weights)."""
    script = tmp_path / "hvd_cl.py"
    script.write_text(_HVD.format(root=str(ROOT)))
    p = horovodrun(2, [str(script), str(tmp_path), "comm.compression=fp16"], timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert r0["cl"] and r0["layouts"] and r1["layouts"]  # averaged gradients laid out as their parameters
    assert r0["bytes"] > 0
    assert max(abs(a - b) for a, b in zip(r0["w"], r1["w"], strict=True)) < 1e-6  # same start, same averages
