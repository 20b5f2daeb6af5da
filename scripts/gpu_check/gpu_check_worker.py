"""One rank of gpu_check.py's allreduce check, under torchrun: every allreduce backend that torchrun starts
(base/registry.py: DDP, the reference, and multistream) trains the same small network from the same weights on
the same per-rank batches for N steps, on CUDA tensors, with small buckets; rank 0 writes what each moved
(CommStats, under its name) and, per backend, how far its weights ended from DDP's (`max_diff`) and across ranks
(`rank_spread`): each backend is held to its own record's `reference_atol`.

    torchrun --nproc-per-node W -m scripts.gpu_check.gpu_check_worker OUT.json TRANSPORT STEPS

TRANSPORT cpu: the same on the CPU over gloo (the tests). TRANSPORT gloo: every rank on cuda:0 (gloo reduces CUDA
tensors; NCCL refuses two ranks on one device), so the multistream engine's streams and events run with W > 1 on one
GPU. TRANSPORT nccl: rank r on cuda:r; with one GPU a world of one, engaged by comm.engage_single_rank (a one-rank
communicator still launches its kernels).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import traceback
from pathlib import Path

import torch
from torch import nn

# Started as a file, Python puts only scripts/gpu_check/ on the path: the repository goes first, so the imports
# in main() (the repository's packages) resolve as they do under `python -m`.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def net() -> nn.Module:
    """Odd-sized tensors (unequal slices), BN, 3x3 convolutions that channels_last makes non-contiguous."""
    return nn.Sequential(
        nn.Conv2d(3, 24, 3, padding=1, bias=False),
        nn.BatchNorm2d(24),
        nn.ReLU(),
        nn.Conv2d(24, 37, 3, stride=2, bias=False),
        nn.BatchNorm2d(37),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(37, 10),
    )


def train(cfg, dist, model: nn.Module, steps: int):
    from recipes.comm import create_allreduce

    m = copy.deepcopy(model)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    comm = create_allreduce(cfg.comm, dist, timeout_s=cfg.dist.timeout_s, model_name=cfg.model.name)
    tm, opt = comm.prepare(m, opt)
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * dist.rank + step)
        x = torch.randn(16, 3, 32, 32, generator=g).to(dist.device).contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 10, (16,), generator=g).to(dist.device)
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(tm(x), y).backward()
        opt.step()
        comm.on_step_end(step + 1)
    if dist.device.type == "cuda":
        torch.cuda.synchronize()
    flat = torch.cat([p.detach().double().reshape(-1) for p in m.parameters()])
    return flat, comm.stats()


def main() -> int:
    import torch.distributed as td

    from base import registry
    from base.writer import write_output
    from recipes.config import load_config
    from recipes.distributed import DistInfo, _env_int, teardown

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="where rank 0 writes the result (JSON)")
    ap.add_argument("transport", choices=("cpu", "gloo", "nccl"))
    ap.add_argument("steps", type=int)
    args = ap.parse_args()
    out, transport, steps = args.out, args.transport, args.steps
    rank, world = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    local, local_world = _env_int("LOCAL_RANK", 0), _env_int("LOCAL_WORLD_SIZE", 1)
    if transport == "cpu":  # the same code on the CPU (the tests run it there)
        dev, pg = torch.device("cpu"), "gloo"
    else:
        dev, pg = torch.device("cuda", 0 if transport == "gloo" else local), transport
        torch.cuda.set_device(dev)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    result: dict = {"world": world, "transport": pg, "device": name}
    try:
        td.init_process_group(pg, device_id=dev if pg == "nccl" else None)
        dist = DistInfo(rank, world, local, local_world, dev)
        common = [f"dist.backend={pg}", f"run.device={dev.type}", "comm.engage_single_rank=true", "dist.timeout_s=120"]
        torch.manual_seed(0)
        model = net().to(dev).to(memory_format=torch.channels_last)
        ref, others = registry.REFERENCE_BACKEND, registry.compared_with_reference()
        weights = {}
        for backend in (ref, *others):
            bucket = f"comm.{registry.ALLREDUCE_BACKENDS[backend].bucket_key}=0.01"  # many buckets, odd cuts
            cfg = load_config(None, [*common, f"comm.backend={backend}", bucket])
            weights[backend], stats = train(cfg, dist, model, steps)
            result[backend] = {"steps": stats.steps, "bytes": stats.bytes, "settings": stats.settings}
        result["max_diff"] = {b: float((weights[ref] - weights[b]).abs().max()) for b in others}
        result["rank_spread"] = {}
        for b in others:
            root = weights[b].clone()
            td.broadcast(root, src=0)  # every rank must hold rank 0's weights
            spread = (weights[b] - root).abs().max().reshape(1)
            td.all_reduce(spread, op=td.ReduceOp.MAX)
            result["rank_spread"][b] = float(spread)
        result["scale"] = float(weights[ref].abs().max())
        teardown()
    except Exception as e:  # noqa: BLE001 - reported in the row, with the traceback in the log
        traceback.print_exc()
        result["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    if rank == 0:
        write_output(out, json.dumps(result, indent=1) + "\n", "the worker's result")
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    sys.exit(main())
