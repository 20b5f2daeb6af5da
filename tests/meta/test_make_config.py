"""The reproduce/baseline make targets: CONFIG= runs another config into its own run directory, a dry run builds
nothing, and the documented local files (hosts.txt) neither show in git nor mark a DAWNBench entry's commit dirty."""

from __future__ import annotations

import subprocess

from support import ROOT

from recipes.rundir.outputs import git_commit


def _dry(target: str, *args: str) -> str:
    p = subprocess.run(["make", "-n", target, *args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    return p.stdout


def test_config_names_the_config_and_its_own_run_directory():
    out = _dry("baseline-horovod", "CONFIG=configs/presets/a100_4x8.yaml", "LAUNCH_ARGS=--dry-run")
    assert "-c 'configs/presets/a100_4x8.yaml'" in out and "--run-dir 'runs/a100_4x8-horovod'" in out
    assert "install_horovod.sh" not in out  # a dry run builds nothing
    assert "install_horovod.sh" in _dry("baseline-horovod")
    out = _dry("reproduce-8gpu", "CONFIG=configs/presets/v100_1gpu.yaml")
    assert "--run-dir 'runs/v100_1gpu' -c 'configs/presets/v100_1gpu.yaml'" in out
    out = _dry("reproduce-158s")  # without CONFIG: the record config, as documented
    assert "--run-dir 'runs/dawnbench_158s-multistream' -c 'configs/dawnbench_158s.yaml'" in out
    out = _dry("compare", "CONFIG=configs/presets/a100_4x8.yaml")
    assert "'runs/a100_4x8-multistream' 'runs/a100_4x8-horovod'" in out


def test_hosts_txt_is_ignored_by_git():
    p = subprocess.run(
        ["git", "check-ignore", "hosts.txt", "bad_files.tsv", "compare.png"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.stdout.split() == ["hosts.txt", "bad_files.tsv", "compare.png"]


def test_an_entrys_commit_is_dirty_only_when_a_tracked_file_differs(tmp_path):
    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True, timeout=30)  # fmt: skip

    git("init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", "code.py")
    git("commit", "-qm", "c")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    (tmp_path / "hosts.txt").write_text("node01 slots=8\n")  # untracked, and not in this repository's .gitignore
    assert git_commit(tmp_path) == head
    (tmp_path / "code.py").write_text("x = 2\n")
    assert git_commit(tmp_path) == head + "-dirty"
