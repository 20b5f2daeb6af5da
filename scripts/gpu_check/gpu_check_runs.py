"""Checks 3 and 4 of gpu_check.py: the allreduce backends on CUDA tensors (gpu_check_worker.py), the
trainer end to end with each backend (train.py under torchrun, horovodrun), evaluate.py on the resulting checkpoint,
and the batch-1 inference modes with their CUDA graphs counted.

Every run starts from nothing: a run directory that did not exist, checkpoint.resume=false, its own rendezvous
port; a row whose backend moved no bytes cannot pass.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from base import registry
from scripts.gpu_check.gpu_check_env import run_logged
from scripts.gpu_check.gpu_check_rows import guard, judged, row

ROOT = Path(__file__).resolve().parents[2]
# A reduced-precision mode fails below this top-1 agreement with fp32 (a 3-epoch model has near-ties to flip).
AGREEMENT_MIN = 90.0
WORKER_STEPS = 10
RUN_TIMEOUT = 240
SETUP_SECONDS = {}  # one-time set-up outside the check's time budget (the Horovod build)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc: int, run_id: str) -> tuple[list[str], int]:
    """torchrun on this host with a rendezvous port of its own (a stale agent on a fixed port cannot join)."""
    port = free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc)]
    cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id]
    return cmd, port


def fresh(path: Path) -> Path:
    """`path`, which must not exist yet: a rerun never reads an earlier run's files."""
    if path.exists():
        raise RuntimeError(f"{path} exists already: the check makes a new folder for every run")
    return path


def weights_atol(backend: str) -> float:
    """The largest |weight| difference from DDP's (and across ranks) that `backend` is held to after WORKER_STEPS
    fp32 SGD steps: its record's `reference_atol` (summation order only for an exact mean; a lossy wire states
    its own)."""
    return registry.ALLREDUCE_BACKENDS[backend].reference_atol


def moved(stats: dict | None, transport: str) -> tuple[str, str]:
    """('', text) when `stats` (CommStats as a dict) moved bytes, else (why it cannot pass, text)."""
    if not stats:
        return "no CommStats recorded", ""
    mb = stats.get("bytes", 0) / 2**20
    text = f"{transport} moved {mb:,.1f} MB in {stats.get('steps', 0)} steps"
    if not stats.get("bytes") or not stats.get("steps"):
        return f"moved 0 bytes over {transport}: the backend was never engaged", text
    return "", text


# --- 3a. the allreduce backends on CUDA tensors ---------------------------------------------------------------------
def check_allreduce(rows: list[dict], work: Path, gpus: int) -> None:
    """Every backend torchrun starts (multistream) vs DDP's weights after WORKER_STEPS steps, each within its own
    record's tolerance (`weights_atol`): 2 ranks on cuda:0 over gloo, and NCCL over all GPUs (one GPU: a world of
    one, engaged)."""
    ref, others = registry.REFERENCE_BACKEND, registry.compared_with_reference()
    cases = [("gloo", 2, "2 ranks on cuda:0 over gloo, CUDA tensors"), ("nccl", gpus, f"{gpus} rank(s) over NCCL")]
    for transport, world, what in cases:
        names = {b: f"{b} vs DDP weights after {WORKER_STEPS} steps, {what}" for b in others}
        with guard(rows, names[others[0]] if others else what):
            out, log = fresh(work / f"allreduce-{transport}.json"), work / f"allreduce-{transport}.log"
            cmd, port = torchrun(world, f"gpu-check-{transport}-{os.getpid()}")
            cmd += ["-m", "scripts.gpu_check.gpu_check_worker", str(out), transport, str(WORKER_STEPS)]
            rc = run_logged(cmd, log, RUN_TIMEOUT, ROOT)
            if rc != 0 or not out.is_file():
                err = json.loads(out.read_text()).get("error", "") if out.is_file() else ""
                rows += [row(names[b], f"fail: exit {rc} {err} (see {log})") for b in others]
                continue
            r = json.loads(out.read_text())
            for b in others:
                atol = weights_atol(b)
                ref_why, ref_text = moved(r.get(ref), transport)
                why, text = moved(r.get(b), transport)
                spread = r["rank_spread"][b]
                shown = f"DDP: {ref_text}; {b}: {text}; ranks agree within {spread:.1e}; port {port}"
                if world == 1:
                    shown += "; one rank: the communicator's kernels, streams and events ran, no data crossed a link"
                if not why and spread > atol:
                    why = f"ranks disagree by {spread:.2e}"
                rows.append(
                    judged(
                        names[b],
                        r["max_diff"][b],
                        "max |w| diff",
                        at_most=atol,
                        reference=shown + f"; {b}'s reference_atol",
                        why=ref_why or why,
                    )
                )


# --- 3b. the trainer end to end -------------------------------------------------------------------------------------
def train_overrides(sample: Path, run_dir: Path) -> list[str]:
    return [
        "-c",
        "configs/base.yaml",
        "--run-dir",
        str(run_dir),
        "data.backend=dali",
        f"data.root={sample}",
        "model.name=resnet18",
        "dist.backend=nccl",
        "run.amp=fp16",
        "run.channels_last=true",
        "log.tensorboard=false",
        "checkpoint.resume=false",
        "comm.engage_single_rank=true",
        "dist.timeout_s=120",
        "phases=[{epochs: 2, image_size: 96, batch_size: 64}, {epochs: 1, image_size: 128, batch_size: 64}]",
    ]


TUNE = [
    "comm.autotune=true",
    "comm.tune_cache=null",  # a cached winner would skip the tuner
    "comm.tune_max_candidates=3",
    "comm.tune_warmup_steps=1",
    "comm.tune_steps_per_window=1",
    "comm.tune_windows=2",
]


def _tuner_lines(log: Path) -> list[str]:
    return [ln.strip() for ln in log.read_text(errors="replace").splitlines() if "multistream autotune:" in ln]


def judge_run(
    name: str, run_dir: Path, log: Path, rc: int, *, transport: str, classes: int, tuned: bool = False
) -> dict:
    """A trainer run's row: it ran all 3 epochs from nothing, its backend moved bytes, top-1 beat 2x chance."""
    summary = run_dir / "summary.json"
    if rc != 0 or not summary.is_file():
        return row(name, f"fail: exit {rc} (see {log})")
    s = json.loads(summary.read_text())
    why, text = moved(s.get("comm"), transport)
    if not why and (s.get("epochs") != 3 or len(s.get("history", [])) != 3 or s.get("restarts")):
        why = f"trained {len(s.get('history', []))} of 3 epochs in this run (resumed?)"
    ref = f"world {s.get('world_size')}; {text}; {s.get('images_per_s', 0):,.0f} img/s"
    if tuned:
        lines = _tuner_lines(log)
        if not why and not any("candidate" in ln for ln in lines):
            why = "comm.autotune=true but the tuner measured no candidate"
        ref += f"; tuner: {lines[-1] if lines else 'no lines'}"
    chance = 100.0 / classes
    return judged(name, s.get("final_top1"), "% top-1", at_least=2 * chance, reference=ref, why=why)


def check_e2e(rows: list[dict], sample: Path, work: Path, gpus: int) -> Path | None:
    """Train with each allreduce backend; returns the ddp run's checkpoint (for check 4)."""
    classes = len([d for d in (sample / "train").iterdir() if d.is_dir()])
    ckpt = None
    for backend, record in registry.ALLREDUCE_BACKENDS.items():
        if record.launcher != "torchrun":
            continue  # Horovod: check_horovod, under horovodrun
        extra = TUNE if record.autotune else []
        name = f"trainer end to end, NCCL, comm.backend={backend}" + (" + autotune" if extra else "")
        with guard(rows, name):
            run_dir, log = fresh(work / f"run-{backend}"), work / f"run-{backend}.log"
            cmd, port = torchrun(gpus, f"gpu-check-{backend}-{os.getpid()}")
            cmd += ["train.py", *train_overrides(sample, run_dir), f"comm.backend={backend}", *extra]
            rc = run_logged(cmd, log, RUN_TIMEOUT, ROOT)
            rows.append(judge_run(name, run_dir, log, rc, transport="nccl", classes=classes, tuned=bool(extra)))
            rows[-1]["reference"] += f"; rendezvous port {port}"
            if backend == registry.REFERENCE_BACKEND and rows[-1]["result"] == "pass":
                ckpt = run_dir / "checkpoint.pt"
    check_horovod(rows, sample, work, gpus, classes)
    return ckpt


def horovod_ready(work: Path) -> str:
    """'' when horovod.torch imports with NCCL; else why not, after trying `scripts/install_horovod.sh` (what
    `make horovod` runs) once."""
    probe = "import horovod.torch as h; print('nccl' if h.nccl_built() else 'no-nccl')"

    def state() -> str:
        p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
        return p.stdout.strip() if p.returncode == 0 else (p.stderr.strip().splitlines() or ["import failed"])[-1]

    now = state()
    if now not in ("nccl", "no-nccl"):
        log = work / "install_horovod.log"
        env = {**os.environ, "PY": sys.executable, "HOROVOD_GPU_OPERATIONS": "NCCL"}
        t = time.perf_counter()
        rc = run_logged(["bash", str(ROOT / "scripts" / "install_horovod.sh")], log, 900, ROOT, env)
        SETUP_SECONDS["Horovod build"] = time.perf_counter() - t
        if rc == 3:
            return f"skip: Horovod cannot be built here (no cmake/make/C++ compiler; see {log})"
        if rc != 0:
            return f"fail: make horovod failed with exit {rc} (see {log})"
        now = state()
    if now == "no-nccl":
        return (
            "fail: the installed Horovod was built without NCCL: rebuild it here with "
            f"`{sys.executable} -m pip uninstall -y horovod && rm -f .venv/.horovod && make horovod`"
        )
    return "" if now == "nccl" else f"fail: horovod.torch does not import: {now}"


def check_horovod(rows: list[dict], sample: Path, work: Path, gpus: int, classes: int) -> None:
    name = "trainer end to end, comm.backend=horovod (NCCL, channels_last)"
    with guard(rows, name):
        why = horovod_ready(work)
        if why:
            rows.append(row(name, why))
            return
        local = Path(sys.executable).parent / "horovodrun"
        hvdrun = str(local) if local.is_file() else shutil.which("horovodrun") or "horovodrun"
        run_dir, log = fresh(work / "run-horovod"), work / "run-horovod.log"
        # horovodrun starts its rendezvous server on a free port, and rank 0 picks a free one for torch.distributed
        cmd = [hvdrun, "--gloo", "-np", str(gpus), "-H", f"localhost:{gpus}"]
        cmd += [sys.executable, "train.py", *train_overrides(sample, run_dir)]
        rc = run_logged(cmd + ["comm.backend=horovod"], log, RUN_TIMEOUT, ROOT)
        rows.append(judge_run(name, run_dir, log, rc, transport="horovod/nccl", classes=classes))


# --- 4. evaluate.py and the inference modes ----------------------------------------------------------------------
class GraphCounter:
    """Counts CUDA graph captures (torch.cuda.CUDAGraph.capture_end) per phase named by `phase`."""

    def __init__(self):
        self.phase, self.counts = "", {}

    @contextlib.contextmanager
    def counting(self):
        import torch

        cls = torch.cuda.CUDAGraph
        real = cls.capture_end

        def capture_end(graph, *a, **kw):
            out = real(graph, *a, **kw)
            self.counts[self.phase] = self.counts.get(self.phase, 0) + 1
            return out

        cls.capture_end = capture_end
        try:
            yield self
        finally:
            cls.capture_end = real

    def log(self, msg: str) -> None:
        """The latency protocol's log: 'building MODE ...' starts that mode's phase."""
        if msg.startswith("building ") and msg.endswith(" ..."):
            self.phase = msg[len("building ") : -len(" ...")]
        elif msg.startswith("measuring "):
            self.phase = "protocol"  # a capture while measuring is counted for no mode
        print(msg, file=sys.stderr)


def check_eval(rows: list[dict], ckpt: Path | None, sample: Path, work: Path, bf16: bool) -> None:
    import torch

    from recipes.evaluation.inference import MODES
    from recipes.evaluation.latency import latency_checkpoint

    name = "evaluate.py (DALI) on the ddp run's checkpoint"
    if ckpt is None or not ckpt.is_file():
        rows.append(row(name, "fail: no checkpoint from a passing ddp run"))
        return
    classes = len([d for d in (sample / "train").iterdir() if d.is_dir()])
    with guard(rows, name):
        out, log = fresh(work / "eval.json"), work / "eval.log"
        cmd = [sys.executable, "evaluate.py", str(ckpt), "--data", str(sample), "--backend", "dali", "--out", str(out)]
        rc = run_logged(cmd, log, 120, ROOT)
        if rc != 0 or not out.is_file():
            rows.append(row(name, f"fail: exit {rc} (see {log})"))
        else:
            r = json.loads(out.read_text())
            rows.append(
                judged(
                    name,
                    r.get("top1"),
                    "% top-1",
                    at_least=200.0 / classes,
                    reference=f"{r.get('count')} val images counted once; 2x chance ({classes} classes)",
                )
            )
    modes = [m for m in ("compile", "fp16", "bf16") if m in MODES and "cuda" in MODES[m].devices]
    if not bf16 and "bf16" in modes:
        modes.remove("bf16")
        rows.append(row("batch-1 latency --optimize bf16", "skip: this GPU has no native bf16"))
    with guard(rows, "batch-1 latency (DAWNBench protocol)"):
        counter = GraphCounter()
        with counter.counting():
            res = latency_checkpoint(
                str(ckpt), data_root=str(sample), modes=modes, images=200, device="cuda", log=counter.log
            )
        torch.cuda.synchronize()
        for m in ["none", *modes]:
            r = res["results"].get(m)
            graphs = MODES[m].compile != "never"
            label = f"batch-1 latency --optimize {m}" + (" (CUDA graphs)" if graphs else "")
            if r is None:
                rows.append(row(label, "fail: missing from the results"))
                continue
            ms = r["latency_ms"]["excluding_preprocessing"]["mean"]
            captured = counter.counts.get(m, 0)
            agree = r.get("agreement_top1")
            why = ""
            if graphs and captured == 0:
                why = "no CUDA graph was captured"
            ref = f"{r['images']} images; CUDA graphs captured while building: {captured}"
            if m == "none":
                rows.append(judged(label, ms, "ms/image", at_most=1000.0, reference=ref + "; the fp32 reference"))
                continue
            rows.append(
                judged(
                    label,
                    agree,
                    "% top-1 agreement with fp32",
                    at_least=AGREEMENT_MIN,
                    reference=f"{ms:.3f} ms/image; " + ref,
                    why=why,
                )
            )
