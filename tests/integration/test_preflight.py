"""The pre-flight: recipes.environment.collect() on this machine, every host's report (scripts/launcher/preflight.py)
and their assessment together: a host with fewer GPUs, one with other versions, an old driver, the wrong data."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

from support import ROOT

sys.path.insert(0, str(ROOT / "scripts"))

from launcher.preflight import MARK, Expectation, assess, count_images, instance_env  # noqa: E402

from recipes.environment import Environment, collect, driver_problem  # noqa: E402


def test_collect_on_a_cpu_machine_reports_none_where_absent(monkeypatch):
    import torch

    monkeypatch.delenv("DAWNBENCH_PROVIDER", raising=False)
    monkeypatch.delenv("DAWNBENCH_INSTANCE_TYPE", raising=False)
    env = collect()
    assert env.torch == torch.__version__ and env.cuda == torch.version.cuda
    if not torch.cuda.is_available():
        assert (env.gpu_count, env.gpu_model, env.nccl) == (0, None, None)
        assert "no GPU" in env.describe() and "NCCL none" in env.versions()
    assert env.provider is None and env.instance_type is None
    assert Environment.from_dict(json.loads(json.dumps(env.to_dict()))) == env
    monkeypatch.setenv("DAWNBENCH_PROVIDER", "aws")
    monkeypatch.setenv("DAWNBENCH_INSTANCE_TYPE", "p4d.24xlarge")
    told = collect(metadata_timeout=5)  # told: the metadata services are not asked
    assert (told.provider, told.instance_type) == ("aws", "p4d.24xlarge")
    assert told.describe().endswith("aws p4d.24xlarge")


def test_driver_against_the_cuda_build():
    gpu = Environment("2.14.1", "13.0", "9.10.2", "2.27.7", "1.50.0", "580.82.07", "NVIDIA H100", 8)
    assert driver_problem(gpu) is None
    assert driver_problem(dataclasses.replace(gpu, driver="570.124.06")) == (
        "driver 570.124.06 is older than 580.65.6, the minimum for CUDA 13.0 (torch 2.14.1)"
    )
    assert "no NVIDIA driver was found" in driver_problem(dataclasses.replace(gpu, driver=None))
    assert driver_problem(dataclasses.replace(gpu, cuda=None, driver=None)) is None  # a CPU build needs none


GPU_ENV = Environment("2.14.1", "13.0", "9.10.2", "2.27.7", "1.50.0", "580.82.07", "NVIDIA H100", 8).to_dict()
DIRS = ["/data/imagenet/train", "/data/imagenet/val"]


def _report(env=None, train=(1000, 1_281_167), val=(1000, 50_000), free=500 << 30, blacklist=True):
    return {
        "env": {**GPU_ENV, **(env or {})},
        "data": {DIRS[0]: list(train) if train else None, DIRS[1]: list(val) if val else None},
        "blacklist": blacklist,
        "free_bytes": free,
    }


def _exp(**kw):
    return Expectation(**{"procs_per_host": 8, "input_backend": "dali", "data_dirs": DIRS, "need_bytes": 2 << 30, **kw})


def test_a_pipeline_needs_the_package_its_record_names(monkeypatch):
    """The host's missing package is asked of the pipeline's record (base/registry.py `Input.env_version`), not of
    its name: the torch pipeline needs no DALI, and a record that names none is not refused for it."""
    from base import registry

    no_dali = {"a": _report(env={"dali": None})}
    assert assess(no_dali, _exp(input_backend="torch")).problems == []
    assert assess(no_dali, _exp()).problems == [
        "host a: data.backend=dali, but its package nvidia.dali is not installed (make install)"
    ]
    monkeypatch.setitem(
        registry.INPUT_PIPELINES, "dali", dataclasses.replace(registry.INPUT_PIPELINES["dali"], env_version="")
    )
    assert assess(no_dali, _exp()).problems == []


def test_good_hosts_give_one_line_each_and_a_summary():
    v = assess({"node01": _report(), "node02": _report()}, _exp())
    assert v.problems == []
    assert v.lines[0].startswith("pre-flight [node01] ok: 8 x NVIDIA H100 for 8 slot(s); torch 2.14.1, CUDA 13.0")
    assert "images: imagenet/train 1281167, imagenet/val 50000" in v.lines[0]
    assert v.lines[-1] == (
        "pre-flight: 2 host(s) ok; the same torch 2.14.1, CUDA 13.0, cuDNN 9.10.2, NCCL 2.27.7, DALI 1.50.0 everywhere"
    )


def test_a_host_with_fewer_gpus_and_one_with_other_versions_are_named():
    reports = {
        "node01": _report(),
        "node02": _report(env={"gpu_count": 4}),
        "node03": _report(env={"nccl": "2.21.5", "torch": "2.13.0"}),
    }
    v = assess(reports, _exp())
    assert v.problems == [
        "host node02: 4 GPU(s) visible, but 8 process(es) per host (slots) need one each: give this host's real "
        "slots=N, or check CUDA_VISIBLE_DEVICES and nvidia-smi",
        "host node03: torch 2.13.0, but 2.14.1 on the other host(s): install the same build everywhere "
        "(make install, or one Docker image)",
        "host node03: NCCL 2.21.5, but 2.27.7 on the other host(s): install the same build everywhere "
        "(make install, or one Docker image)",
    ]
    assert v.lines[1].startswith("pre-flight [node02] 1 problem(s): 4 x NVIDIA H100 for 8 slot(s)")
    assert v.lines[-1] == "pre-flight: 3 problem(s) on 3 host(s); nothing was started"


def test_old_driver_missing_dali_wrong_data_and_no_disk_are_named():
    reports = {
        "a": _report(env={"driver": "560.35.03", "dali": None}),
        "b": _report(train=(1000, 1_281_000), val=None, free=1 << 30, blacklist=False),
    }
    v = assess(reports, _exp())
    assert v.problems == [
        "host a: driver 560.35.03 is older than 580.65.6, the minimum for CUDA 13.0 (torch 2.14.1)",
        "host a: data.backend=dali, but its package nvidia.dali is not installed (make install)",
        "host b: data folder /data/imagenet/train has 1281000 images in 1000 classes, expected 1281167",
        "host b: data folder /data/imagenet/val cannot be read",
        "host b: the validation blacklist (data.val_blacklist) cannot be read: data/prepare.py writes it",
        "host b: 1.0 GiB free where the run directory is, checkpoints need about 2.0 GiB: free space, or give "
        "another --run-dir / RUN_DIR",
        "host b: DALI 1.50.0, but none on the other host(s): install the same build everywhere (make install, or "
        "one Docker image)",  # two hosts: the first host's value is the reference
    ]


def test_cpu_hosts_need_no_gpu_but_the_same_data():
    cpu = {"cuda": None, "cudnn": None, "nccl": None, "driver": None, "gpu_model": None, "gpu_count": 0}
    small = {"train": (4, 48), "val": (4, 20)}
    reports = {"x": _report(env=cpu, **small), "y": _report(env=cpu, train=(4, 47), val=(4, 20))}
    v = assess(reports, _exp(procs_per_host=2, input_backend="torch"))
    assert v.problems == ["host y: data folder /data/imagenet/train has 47 images, 48 on the other host(s)"]
    assert "no GPU" in v.lines[0]
    assert assess(reports, _exp(device="cuda", procs_per_host=1)).problems[0].startswith("host x: 0 GPU(s) visible")


def test_the_host_side_report_counts_images(tiny_root, tmp_path):
    assert count_images(tiny_root / "train") == (4, 48) and count_images(tmp_path / "nothing") is None
    p = subprocess.run(
        [sys.executable, "scripts/launcher/preflight.py", "--data", str(tiny_root / "train"), "--data",
         str(tiny_root / "val"), "--blacklist", str(tmp_path / "none.txt"), "--run-dir", str(tmp_path / "r")],
        cwd=ROOT, capture_output=True, text=True, timeout=120, env={"DAWNBENCH_METADATA_TIMEOUT": "0"},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith(MARK))
    r = json.loads(line[len(MARK) :])
    assert r["data"] == {str(tiny_root / "train"): [4, 48], str(tiny_root / "val"): [4, 20]}
    assert r["blacklist"] is False and r["free_bytes"] > 0 and r["env"]["torch"]


def test_the_instance_read_on_every_host_is_passed_to_the_ranks_unless_told():
    aws = {"provider": "aws", "instance_type": "p3dn.24xlarge"}
    reports = {"node01": _report(env=aws), "node02": _report(env=aws)}
    assert instance_env(reports, {}) == {"DAWNBENCH_PROVIDER": "aws", "DAWNBENCH_INSTANCE_TYPE": "p3dn.24xlarge"}
    told = {"DAWNBENCH_INSTANCE_TYPE": "ecs.gn6e-c12g1.24xlarge"}  # --instance-type wins
    assert instance_env(reports, told) == {"DAWNBENCH_PROVIDER": "aws"}
    mixed = {"node01": _report(env=aws), "node02": _report(env={**aws, "instance_type": "p4d.24xlarge"})}
    assert instance_env(mixed, {}) == {"DAWNBENCH_PROVIDER": "aws"}  # one answer per value, or none
    assert instance_env({"node01": _report()}, {}) == {}  # not on a cloud (no metadata service answered)


def test_a_multistream_run_notes_what_an_old_driver_costs():
    """R535 (V100 fleets, a CUDA 12.6 build): multistream's auto concurrency falls back to serialize, and a captured
    step would serialize; noted with the advice, not refused. R580: nothing to note."""
    old = {"cuda": "12.6", "driver": "535.183.01"}
    v = assess({"a": _report(env=old), "b": _report(env={"cuda": "12.6"})}, _exp(multistream=True))
    notes = [ln for ln in v.lines if " note: " in ln]
    assert notes == [
        "pre-flight [a] note: driver 535.183.01 (R535) is older than R545 (CUDA 12.3): multistream's "
        "comm.concurrency=auto falls back to serialize there, one collective in flight and a host round trip per "
        "slice; install R545 or newer for the K connections to carry data together",
        "pre-flight [a] note: driver 535.183.01 (R535) is older than R575 (CUDA 12.9): a captured step would run "
        "multistream's communicators one at a time, so the step stays eager (run.cuda_graph)",
    ]
    assert [ln for ln in assess({"a": _report(env=old)}, _exp()).lines if " note: " in ln] == []  # not multistream
