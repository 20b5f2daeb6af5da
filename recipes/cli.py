"""What train.py does with its arguments; kept here so that it can be imported and tested."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from base.errors import CheckpointError, ConfigError, DataError, Preempted, TrainingError
from recipes.config import load_config, reference_table
from recipes.config.inert import inert_settings, marked_yaml
from recipes.exit_codes import BAD_INPUT, TRAINING_STOPPED
from recipes.preemption import EXIT_PREEMPTED, ignore_stop_signals
from recipes.rundir import files

USER_ERRORS = (ConfigError, CheckpointError, DataError)


def run_cli(args) -> int:
    try:
        if args.help_config:
            print(reference_table())
            return 0
        cfg = load_config(args.config, args.overrides)
        if os.environ.get("RANK", "0") == "0":  # once per run, not once per process
            for line in inert_settings(cfg):
                print(f"warning: {line}", file=sys.stderr)
        if args.print_config:
            print(marked_yaml(cfg), end="")
            return 0
        if args.plan:
            from recipes.schedule_report import print_plan

            gpu = getattr(args, "gpu", None) or cfg.run.gpu or None
            if gpu is not None:
                where = "--gpu" if getattr(args, "gpu", None) else "run.gpu of the config"
                dtype = cfg.run.amp if cfg.run.amp != "none" else "fp32 (run.amp=none)"
                print(f"GPU: {gpu} ({where}), dtype: {dtype}" + (" (run.amp)" if cfg.run.amp != "none" else ""))
            return print_plan(cfg, args.num_images, args.world_size, gpu=gpu)
        from recipes.trainer import run_dir_for, train

        run_dir = Path(args.run_dir) if args.run_dir else run_dir_for(cfg)
        resume = None
        if args.resume == "auto":
            resume = str(run_dir / files.CHECKPOINT)  # on some rank's host; the trainer asks all ranks
        elif args.resume:
            resume = args.resume
        train(cfg, run_dir, resume, args.stop_after_epochs)
        return 0
    except USER_ERRORS as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return BAD_INPUT
    except TrainingError as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return TRAINING_STOPPED
    except Preempted as e:  # not an error: the run can go on from its checkpoint (exit 75, EX_TEMPFAIL)
        ignore_stop_signals()  # torchrun stops the other ranks with SIGTERM when one exits: they exit 75 too
        print(f"preempted: {e}", file=sys.stderr, flush=True)
        return EXIT_PREEMPTED
