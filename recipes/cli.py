"""What train.py does with its arguments; kept here so that it can be imported and tested."""

from __future__ import annotations

import sys
from pathlib import Path

from recipes.checkpoint import CheckpointError
from recipes.config import ConfigError, load_config, reference_table, to_yaml

USER_ERRORS = (ConfigError, CheckpointError)


def _user_errors():
    from data.folder import DataError

    return USER_ERRORS + (DataError,)


def _training_errors():
    from recipes.trainer import TrainingError

    return (TrainingError,)


def run_cli(args) -> int:
    try:
        if args.help_config:
            print(reference_table())
            return 0
        cfg = load_config(args.config, args.overrides)
        if args.print_config:
            print(to_yaml(cfg), end="")
            return 0
        if args.plan:
            from recipes.plan import print_plan

            return print_plan(cfg, args.num_images, args.world_size)
        from recipes.trainer import run_dir_for, train

        run_dir = Path(args.run_dir) if args.run_dir else run_dir_for(cfg)
        resume = None
        if args.resume == "auto":
            resume = str(run_dir / "checkpoint.pt")  # on some rank's host; the trainer asks all ranks
        elif args.resume:
            resume = args.resume
        train(cfg, run_dir, resume, args.stop_after_epochs)
        return 0
    except _user_errors() as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except _training_errors() as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 3
