"""Everything about a run's files, in one package (imports only the submodules; this file re-exports nothing).

files.py             every file name in a run directory, declared once, and which names a run makes
writer.py            the run directory's side of the one writer (base/writer.py): stale temps, figures as bytes
directory.py         the run directory: empty or a run's, the lock, the run id all ranks agree on, each directory's
                     leader, `checkpoint.resume=false` moving an old run to previous/<run id>/, stale temps removed
payload.py           what a checkpoint holds, typed (`Checkpoint`, `State`): every reader uses it
checkpoint_files.py  checkpoint I/O: atomic write with a sha256 sidecar, weights-only load, the newest K kept
resume.py            which checkpoint every rank resumes from, and whether the recipe still matches it
checkpointer.py      `Checkpointer`: `save(step)` and `restore(resume_from)` over the objects holding state
state_checks.py      a checkpoint's optimizer and grad-scaler state checked against the run's parts at load
outputs.py           what else a training writes there (config, meta, progress, history, summary, entry)
"""
