"""What the GPU check (gpu_check.py) finds before it runs anything: which of its three outcomes applies (no GPU, a
GPU that torch cannot use, a run), what the GPU can do natively, the published figure to compare with, and how to stop a
subprocess with everything it started."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

NO_GPU = "gpu-check: no CUDA GPU present: nothing GPU-only ran"

# The oldest Linux driver each CUDA major version runs on (NVIDIA's CUDA toolkit release notes, table 3: "CUDA minor
# version compatibility"; 12.x runs on any 525.60.13 or newer).
MIN_DRIVER = {13: (580, 65, 6), 12: (525, 60, 13), 11: (450, 80, 2)}
CU126_MIN_DRIVER = MIN_DRIVER[12]  # `make install CUDA=cu126`


@dataclass
class Driver:
    """What the NVIDIA kernel driver says, without CUDA: its version and the GPUs it drives."""

    version: str
    gpus: list[str]

    @property
    def version_tuple(self) -> tuple[int, ...]:
        return tuple(int(p) for p in re.findall(r"\d+", self.version))


@dataclass
class Outcome:
    """One of the check's three outcomes: 'none' (exit 0), 'unusable' (exit 1) or 'run'."""

    kind: str
    line: str = ""

    @property
    def exit_code(self) -> int | None:
        return {"none": 0, "unusable": 1}.get(self.kind)


def read_driver(proc: Path = Path("/proc/driver/nvidia")) -> Driver | None:
    """The driver and its GPUs from `nvidia-smi` (on PATH), else from /proc/driver/nvidia; None without either."""
    try:
        p = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        lines = [ln.rsplit(",", 1) for ln in p.stdout.splitlines() if "," in ln]
        if p.returncode == 0 and lines:
            return Driver(lines[0][1].strip(), [name.strip() for name, _ in lines])
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        text = (proc / "version").read_text()
    except OSError:
        return None
    m = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", text)
    gpus = []
    for info in sorted((proc / "gpus").glob("*/information")):
        m2 = re.search(r"^Model:\s*(.+)$", info.read_text(errors="replace"), re.M)
        gpus.append(m2.group(1).strip() if m2 else info.parent.name)
    return Driver(m.group(1) if m else "unknown", gpus)


def _v(t: tuple[int, ...]) -> str:
    return ".".join(f"{x:02d}" if i else str(x) for i, x in enumerate(t))


def classify(
    cuda_available: bool, torch_version: str, torch_cuda: str | None, driver: Driver | None, init_error: str
) -> Outcome:
    """The outcome from what torch and the driver report (a pure function: the tests hand it faked states)."""
    if cuda_available:
        return Outcome("run")
    if driver is None or not driver.gpus:
        return Outcome("none", NO_GPU)
    gpu = f"{driver.gpus[0]}{f' x{len(driver.gpus)}' if len(driver.gpus) > 1 else ''}, driver {driver.version}"
    head = f"gpu-check: FAIL: a GPU is present ({gpu}) but torch {torch_version} cannot use it: "
    have = driver.version_tuple
    if torch_cuda is None:
        return Outcome(
            "unusable",
            head + "this torch is a CPU-only build; fix: make install (CUDA=cu126 for drivers "
            f"older than {_v(MIN_DRIVER[13])})",
        )
    major = int(torch_cuda.split(".")[0])
    need = MIN_DRIVER.get(major)
    if need is not None and have and have < need:
        why = f"it was built for CUDA {torch_cuda}, which needs driver >= {_v(need)}; "
        if major > 12 and have >= CU126_MIN_DRIVER:
            fix = f"fix: make install CUDA=cu126 (CUDA 12.6 runs on driver >= {_v(CU126_MIN_DRIVER)})"
            fix += ", or update the driver"
        else:
            fix = f"fix: update the NVIDIA driver to >= {_v(need)}"
            if major > 12:
                fix += f" (or >= {_v(CU126_MIN_DRIVER)} and make install CUDA=cu126)"
        return Outcome("unusable", head + why + fix)
    first = init_error.strip().splitlines()[0] if init_error.strip() else "torch.cuda.is_available() is False"
    return Outcome(
        "unusable",
        head + f"CUDA {torch_cuda} cannot initialise: {first[:300]} (check CUDA_VISIBLE_DEVICES "
        "and that no other process holds the GPU in exclusive mode)",
    )


def probe() -> Outcome:
    """The outcome on this machine."""
    import torch

    available = torch.cuda.is_available()
    err = ""
    if not available:
        try:
            torch.cuda.init()
        except Exception as e:  # noqa: BLE001 - the reason CUDA cannot start is what the line reports
            err = str(e)
    return classify(available, torch.__version__, torch.version.cuda, None if available else read_driver(), err)


def native_bf16(capability: tuple[int, int]) -> bool:
    """bf16 tensor cores: Ampere (8.0) and newer; V100 (7.0) and T4 (7.5) emulate it, far slower."""
    return tuple(capability) >= (8, 0)


# NVIDIA DeepLearningExamples, PyTorch ResNet-50 v1.5 (the `resnet50` model here), AMP training images/s per GPU.
NVIDIA_RN50_AMP_8XA100 = 16621.0  # DGX A100 (8x A100 80GB), batch 256 per GPU
NVIDIA_RN50_AMP_V100 = 1200.0  # one V100 16GB (about; batch 256)
# Families newer than A100, for which NVIDIA's page has no PyTorch ResNet-50 figure: A100's is their floor.
NEWER_THAN_A100 = ("H100", "H200", "H800", "H20", "GH200", "B100", "B200", "GB200")
REFERENCE_FRACTION = 0.9  # a row passes at >= 90% of the published figure (or of the floor)


@dataclass
class Reference:
    images_per_s: float | None
    text: str


def rn50_reference(gpu_name: str) -> Reference:
    """NVIDIA's published PyTorch ResNet-50 v1.5 AMP figure per GPU for this GPU's family (None: none published)."""
    a100 = NVIDIA_RN50_AMP_8XA100 / 8
    name = gpu_name.upper()
    if "A100" in name:
        return Reference(
            a100, f"NVIDIA DLE PyTorch RN50 v1.5 AMP, 8x A100: {NVIDIA_RN50_AMP_8XA100:,.0f} img/s = {a100:,.0f}/GPU"
        )
    if "V100" in name:
        return Reference(
            NVIDIA_RN50_AMP_V100, f"NVIDIA DLE PyTorch RN50 v1.5 AMP, 1x V100 16GB: ~{NVIDIA_RN50_AMP_V100:,.0f} img/s"
        )
    if any(re.search(rf"\b{f}\b", name) for f in NEWER_THAN_A100):
        return Reference(
            a100, f"no published NVIDIA PyTorch RN50 figure for {gpu_name}; floor: A100's {a100:,.0f}/GPU (8x A100 AMP)"
        )
    return Reference(None, f"no published NVIDIA PyTorch RN50 v1.5 AMP figure for {gpu_name}")


# --- subprocesses --------------------------------------------------------------------------------------------------
def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        kids.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return kids


def process_tree(pid: int) -> list[int]:
    """`pid` and every process below it (torchrun's ranks run in sessions of their own: killpg misses them)."""
    kids, out, todo = _children(), [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def _alive(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] != "Z"


def kill_tree(pid: int, grace: float = 10.0) -> list[int]:
    """SIGTERM `pid` and all its descendants (found before any dies), SIGKILL what is left after `grace` seconds."""
    tree = process_tree(pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in tree:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_alive(p) for p in tree):
            time.sleep(0.1)
        tree = sorted(set(tree) | {q for p in tree if _alive(p) for q in process_tree(p)})
    return tree


def run_logged(cmd: list[str], log: Path, timeout: float, cwd: Path, env: dict | None = None) -> int:
    """Run `cmd` with its output in `log`; on timeout stop its whole process tree and return 124."""
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            return p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(p.pid)
            p.wait()
            f.write(f"\ngpu-check: timed out after {timeout:.0f} s; stopped the process and everything it started\n")
            return 124
