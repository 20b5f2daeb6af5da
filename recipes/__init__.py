"""The training recipe: config, schedules, optimizer, allreduce backends, trainer, logging."""
