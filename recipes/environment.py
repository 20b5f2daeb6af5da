"""What a run ran on: library versions, driver, GPUs and (when told or readable) the cloud instance.

`collect()` returns an `Environment`; the launcher's pre-flight compares it across hosts, and the run's meta.json
and DAWNBench entry record it (both record entries list CUDA, cuDNN, NCCL, DALI and the driver). Every field is
None where the value does not exist on this machine (no GPU, no DALI), never a guess.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import urllib.request
from dataclasses import dataclass

# The versions that must be identical on every host of one job (a mismatch breaks NCCL or changes numerics).
VERSION_LABELS = {"torch": "torch", "cuda": "CUDA", "cudnn": "cuDNN", "nccl": "NCCL", "dali": "DALI"}

# Minimum Linux driver for each CUDA major version's runtime (NVIDIA's CUDA Toolkit release notes, table
# "CUDA Toolkit and Minimum Required Driver Version for CUDA Minor Version Compatibility").
MIN_DRIVER = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580, 65, 6)}

# Where a provider's name for the machine can be read without credentials: (provider, metadata URL, header).
_METADATA = (
    ("aws", "http://169.254.169.254/latest/meta-data/instance-type", {}),
    ("gcp", "http://metadata.google.internal/computeMetadata/v1/instance/machine-type", {"Metadata-Flavor": "Google"}),
    (
        "azure",
        "http://169.254.169.254/metadata/instance/compute/vmSize?api-version=2021-02-01&format=text",
        {"Metadata": "true"},
    ),  # fmt: skip
    ("alibabacloud", "http://100.100.100.200/latest/meta-data/instance/instance-type", {}),
)


@dataclass(frozen=True)
class Environment:
    torch: str
    cuda: str | None  # the CUDA runtime torch was built with
    cudnn: str | None
    nccl: str | None
    dali: str | None
    driver: str | None  # the NVIDIA kernel driver
    gpu_model: str | None
    gpu_count: int  # visible to this process (CUDA_VISIBLE_DEVICES applies)
    provider: str | None = None  # cloud provider, when told (DAWNBENCH_PROVIDER) or read from its metadata service
    instance_type: str | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Environment:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def versions(self) -> str:
        """'torch 2.14.1, CUDA 13.0, cuDNN 9.10.2, NCCL 2.27.7, DALI 1.50.0' ('none' where absent)."""
        return ", ".join(f"{label} {getattr(self, key) or 'none'}" for key, label in VERSION_LABELS.items())

    def describe(self) -> str:
        """versions(), then 'driver 580.82.07, 8 x NVIDIA H100 80GB HBM3' and the instance when known."""
        parts = [self.versions(), f"driver {self.driver or 'none'}"]
        parts.append(f"{self.gpu_count} x {self.gpu_model}" if self.gpu_count else "no GPU")
        if self.provider or self.instance_type:
            parts.append(" ".join(x for x in (self.provider, self.instance_type) if x))
        return ", ".join(parts)


def _cudnn() -> str | None:
    import torch

    if not torch.backends.cudnn.is_available():
        return None
    v = torch.backends.cudnn.version()  # 91002 -> 9.10.2 (cuDNN 9), 8902 -> 8.9.2 (cuDNN 8)
    if v is None:
        return None
    major, rest = (v // 10000, v % 10000) if v >= 90000 else (v // 1000, v % 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def _nccl() -> str | None:
    import torch

    if not torch.distributed.is_available() or not torch.cuda.is_available():
        return None
    try:
        v = torch.cuda.nccl.version()
    except (RuntimeError, AttributeError):
        return None
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def _dali() -> str | None:
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return None
    for dist in ("nvidia-dali-cuda130", "nvidia-dali-cuda120", "nvidia-dali-cuda110", "nvidia-dali"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def _driver() -> str | None:
    """The kernel driver's version: /proc (no subprocess), else nvidia-smi."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            m = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+(?:\.\d+)+)", f.read())
            if m:
                return m.group(1)
    except OSError:
        pass
    try:
        p = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = p.stdout.split()
    return lines[0] if p.returncode == 0 and lines else None


def _instance(timeout: float) -> tuple[str | None, str | None]:
    """(provider, instance type): DAWNBENCH_PROVIDER / DAWNBENCH_INSTANCE_TYPE when set, else the first metadata
    service that answers within `timeout` seconds (0: do not ask)."""
    provider, instance = os.environ.get("DAWNBENCH_PROVIDER") or None, os.environ.get("DAWNBENCH_INSTANCE_TYPE")
    if instance or timeout <= 0:
        return provider, instance or None
    for name, url, headers in _METADATA:
        if provider and provider != name:
            continue
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as r:
                text = r.read(200).decode(errors="replace").strip()
        except (OSError, ValueError):
            continue
        if text:
            return name, text.rsplit("/", 1)[-1]  # GCP answers projects/<n>/machineTypes/<type>
    return provider, None


def collect(metadata_timeout: float = 0.0) -> Environment:
    """This machine's environment. `metadata_timeout` > 0 also asks the cloud metadata services (that many seconds
    each) for the provider and instance type; the default asks nothing over the network."""
    import torch

    cuda_ok = torch.cuda.is_available()
    count = torch.cuda.device_count() if cuda_ok else 0
    provider, instance = _instance(metadata_timeout)
    return Environment(
        torch=torch.__version__,
        cuda=torch.version.cuda,
        cudnn=_cudnn(),  # the build's cuDNN, with or without a GPU
        nccl=_nccl(),
        dali=_dali(),
        driver=_driver(),
        gpu_model=torch.cuda.get_device_name(0) if count else None,
        gpu_count=count,
        provider=provider,
        instance_type=instance,
    )


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text))


def driver_problem(env: Environment) -> str | None:
    """Why this driver cannot run this torch build's CUDA runtime (None: it can, or there is no CUDA build)."""
    if not env.cuda:
        return None
    major = _version_tuple(env.cuda)[0]
    need = MIN_DRIVER.get(major)
    if env.driver is None:
        return f"torch {env.torch} is built for CUDA {env.cuda}, but no NVIDIA driver was found"
    if need and _version_tuple(env.driver) < need:
        want = ".".join(map(str, need))
        return f"driver {env.driver} is older than {want}, the minimum for CUDA {env.cuda} (torch {env.torch})"
    return None


def main() -> None:
    """Print this machine's environment as one JSON line (the launcher's pre-flight runs this on every host)."""
    print(json.dumps(collect(float(os.environ.get("DAWNBENCH_METADATA_TIMEOUT", "0"))).to_dict()))


if __name__ == "__main__":
    main()
