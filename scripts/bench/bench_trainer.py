#!/usr/bin/env python
"""Trainer overhead: the trainer's images/s against a bare forward/backward/step loop, same model and batches.

    python -m scripts.bench.bench_trainer [--model resnet18 --image-size 64 --batch 32 --steps 20 --rounds 5] [--quick]
        [--json PATH]

Both contenders run in this process, alternating over rounds; the table reports medians. On a machine with a
GPU the same comparison runs on the GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

# Started as a file, Python puts only scripts/bench/ on the path: the repository goes first, so the imports
# below (the repository's packages) resolve as they do under `python -m`.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from recipes.config import load_config
from recipes.metrics import IMAGES_PER_S
from scripts.bench.record import add_json_arg, check_json, write_json


def bare_loop(model, optimizer, criterion, x, y, steps: int) -> float:
    model.train()
    t = time.perf_counter()
    for _ in range(steps):
        loss = criterion(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    if x.is_cuda:
        import torch

        torch.cuda.synchronize()
    return steps * x.shape[0] / (time.perf_counter() - t)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="3 rounds of 10 steps")
    add_json_arg(ap)
    args = ap.parse_args(argv)
    check_json(args.json)
    if args.quick:
        args.rounds, args.steps = 3, 10
    # torch and the trainer load here, after the arguments: `--help` starts in a fraction of a second.
    import torch

    from recipes.optim import create_optimizer
    from recipes.trainer import Trainer

    cfg = load_config(
        None,
        [
            "data.backend=synthetic",
            f"data.synthetic_size={args.batch * args.steps}",
            "data.synthetic_classes=1000",
            f"model.name={args.model}",
            "log.tensorboard=false",
            "checkpoint.enabled=false",
            "checkpoint.resume=false",
            f"log.every_steps={args.steps}",
            "run.out_dir=/tmp/bench_trainer",
            "optim.name=sgd",
            f"phases=[{{epochs: {args.rounds + 1}, image_size: {args.image_size}, batch_size: {args.batch}}}]",
        ],
    )
    with contextlib.redirect_stdout(sys.stderr):  # keep stdout for the table
        trainer = Trainer(cfg)
    trainer.log.active = False
    # The bare loop gets its own copy of the same model/optimizer and the very same batch.
    from models import create_model

    bare_model = create_model(cfg.model, 1000).to(trainer.dist.device)
    bare_opt = create_optimizer(cfg.optim, bare_model)
    x, y = next(iter(trainer.data.train_batches(trainer.plan.epoch_info(0))))
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=cfg.optim.label_smoothing)
    bare_loop(bare_model, bare_opt, criterion, x, y, steps=3)  # warm-up
    trainer.train_one_epoch(0)
    bare, ours = [], []
    for r in range(args.rounds):
        bare.append(bare_loop(bare_model, bare_opt, criterion, x, y, steps=args.steps))
        res = trainer.train_one_epoch(r + 1)
        ours.append(res[IMAGES_PER_S.name])  # the epoch's images over its training time
    trainer.close()
    b, o = statistics.median(bare), statistics.median(ours)
    dev = str(trainer.dist.device)
    print(
        f"### Trainer overhead ({args.model}, {args.image_size}px, batch {args.batch}, {dev}, "
        f"{torch.get_num_threads()} threads, median of {args.rounds} rounds x {args.steps} steps)\n"
    )
    print("| loop | images/s | relative |")
    print("|---|---|---|")
    print(f"| bare forward/backward/step | {b:.1f} | 1.000 |")
    print(f"| trainer (`Trainer.train_one_epoch`) | {o:.1f} | {o / b:.3f} |")
    print(f"\ntrainer overhead: {100 * (1 - o / b):.1f}% (target <= 3%)")
    results = {
        "model": args.model,
        "image_size": args.image_size,
        "batch": args.batch,
        "steps": args.steps,
        "rounds": args.rounds,
        "device": dev,
        "images_per_s": {"bare": bare, "trainer": ours},  # one value per round, in round order
    }
    write_json(args.json, "scripts.bench.bench_trainer", argv, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
