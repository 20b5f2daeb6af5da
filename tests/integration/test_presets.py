"""configs/presets/: each preset loads, keeps its record recipe's global batch and steps, fits its GPU under
`train.py --plan --gpu`, and is what scripts/gen_presets.py writes (so its predicted-time label is current)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support import ROOT

import train
from recipes import memory
from recipes.config import load_config
from recipes.dawnbench import missing_required
from recipes.schedule import Schedule
from recipes.schedule_report import hardware_table

sys.path.insert(0, str(ROOT / "scripts"))
import gen_presets  # noqa: E402

IMAGES = 1_281_167
PRESETS = [(f, s) for f in gen_presets.FAMILIES for s in gen_presets.SHAPES]


def test_every_family_and_shape_has_a_preset_and_nothing_else_is_there():
    names = sorted(p.stem for p in (ROOT / "configs" / "presets").glob("*.yaml"))
    assert names == sorted(gen_presets.preset_name(f, s) for f, s in PRESETS)
    assert len(names) == 15


@pytest.mark.parametrize(("family", "shape"), PRESETS)
def test_a_preset_keeps_the_recipe_and_fits_its_gpu(family, shape):
    preset = load_config(str(ROOT / "configs" / "presets" / f"{gen_presets.preset_name(family, shape)}.yaml"), [])
    nodes, gpus, base_name = gen_presets.SHAPES[shape]
    base = load_config(str(ROOT / "configs" / base_name), [])
    world = preset.run.nodes * preset.run.procs_per_node
    assert (preset.run.nodes, preset.run.procs_per_node) == (nodes, gpus)
    assert preset.run.amp == "fp16"  # V100 has no bf16; bf16's BatchNorm runs outside cuDNN (slower on Hopper)
    mine, record = (
        Schedule(preset.phases, preset.optim, num_images=IMAGES, world_size=world, **memory.accumulation(preset)),
        Schedule(
            base.phases,
            base.optim,
            num_images=IMAGES,
            world_size=base.run.nodes * base.run.procs_per_node,
            **memory.accumulation(base),
        ),
    )
    assert [p.batch_size for p in preset.phases] == [p.batch_size for p in base.phases]  # global batch kept
    assert preset.optim == base.optim  # the same LR/momentum schedule, per optimizer step
    if world == base.run.nodes * base.run.procs_per_node:
        assert mine.total_steps == record.total_steps
    gpu = gen_presets.FAMILIES[family][0]
    _, problems = hardware_table(preset, mine, gpu)
    assert problems == []
    usable = memory.usable_bytes(memory.gpu_memory_bytes(gpu))
    for e in mine.epochs:  # accumulation keeps every phase's per-GPU batch, in micro-batches that fit
        per_gpu = e.phase.batch_size // world
        assert e.micro_batches * mine.micro_batch(e.epoch) == per_gpu
        n = memory.need(
            preset.model.name,
            image_size=e.phase.image_size,
            micro_batch=mine.micro_batch(e.epoch),
            per_gpu_batch=per_gpu,
            amp=preset.run.amp,
        )
        assert n.total <= usable
        # ... and only where the whole per-GPU batch would not fit (per phase: the 96 px phase of h100_2x8 runs
        # 2048 images whole, its 224 px phase accumulates 2 x 1024)
        whole = memory.need(
            preset.model.name, image_size=e.phase.image_size, micro_batch=per_gpu, per_gpu_batch=per_gpu, amp="fp16"
        )
        assert (e.micro_batches > 1) == (whole.total > usable), (e.phase.image_size, e.micro_batches)


def test_the_one_gpu_v100_preset_accumulates_where_the_recipe_would_not_fit(capsys):
    rc = train.main(["-c", str(ROOT / "configs/presets/v100_1gpu.yaml"), "--plan", "--gpu", "v100-32gb"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "total: 13772 iterations in 21 epochs" in out  # the 8-GPU entry's steps, on one GPU
    rows = [ln.split() for ln in out.split("per GPU on v100-32gb")[1].splitlines()[2:6]]
    # phase, size, global batch, per GPU, accumulation, micro-batch
    assert [r[:6] for r in rows] == [
        ["0", "96", "2048", "2048", "1", "2048"],
        ["1", "128", "2048", "2048", "2", "1024"],
        ["2", "224", "2048", "2048", "4", "512"],
        ["3", "288", "1024", "1024", "4", "256"],
    ]
    assert "predicted training clock" in out


def test_plan_shows_the_time_model_counting_each_micro_batch_against_the_step_floor(capsys):
    def step_rows(*over):
        assert train.main(["-c", str(ROOT / "configs/presets/h100_2x8.yaml"), "--plan", *over]) == 0
        out = capsys.readouterr().out
        assert "time model per step (the step floor once per micro-batch):" in out
        predicted = next(ln for ln in out.splitlines() if ln.startswith("predicted training clock"))
        assert predicted.count("fp16") == 1, predicted  # the rate table's name says the dtype already
        return [ln.split() for ln in out.split("step (all terms)\n")[1].splitlines()[:4]]

    preset = step_rows()  # 96 px whole (2048 per GPU): its compute hides the host's floor
    assert preset[0][:3] == ["0", "96", "1"] and preset[0][5] == "0.0"
    cut = step_rows(
        "run.max_gpu_batch_by_size={96: 512, 224: 1024, 288: 512}"
    )  # 96 px in four: each waits for the host
    assert cut[0][:3] == ["0", "96", "4"] and cut[0][3] == preset[0][3]  # the same compute
    assert float(cut[0][5]) > 0 and float(cut[0][7]) > float(preset[0][7])


def test_plan_refuses_a_recipe_that_does_not_fit_naming_the_phase_and_the_fix(capsys):
    argv = ["-c", str(ROOT / "configs/dawnbench_8gpu.yaml"), "--plan", "--world-size", "1", "--gpu", "a100"]
    rc = train.main([*argv, "run.amp=bf16"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "error: does not fit: phases.2 (224 px, 2048 images per GPU as 1 x 2048)" in err
    assert "set run.accumulate=2 (micro-batch 1024)" in err


@pytest.mark.slow
def test_presets_are_what_the_generator_writes():
    p = subprocess.run(
        [sys.executable, "scripts/gen_presets.py", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert p.returncode == 0, p.stderr


def test_the_check_allows_measurement_noise_but_not_a_stale_label():
    text = (ROOT / "configs" / "presets" / "v100_1x8.yaml").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("# predicted training clock"))
    minutes = float(line.split()[4])
    assert gen_presets.same(text, text.replace(line, line.replace(f" {line.split()[4]} ", f" {minutes * 1.05:.0f} ")))
    assert not gen_presets.same(
        text, text.replace(line, line.replace(f" {line.split()[4]} ", f" {minutes * 1.5:.0f} "))
    )
    assert not gen_presets.same(text, text.replace("amp: fp16", "amp: bf16"))


def test_the_check_names_a_preset_the_generator_does_not_write(tmp_path, monkeypatch, capsys):
    import shutil

    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    out = tmp_path / "configs" / "presets"
    (out / "v100_3x8.yaml").write_text("extends: ../dawnbench_158s.yaml\n")
    monkeypatch.setattr(gen_presets, "OUT", out)
    monkeypatch.setattr(gen_presets, "ROOT", tmp_path)
    assert gen_presets.main(["--check"]) == 1
    assert "configs/presets/v100_3x8.yaml (not written by this script: remove it)" in capsys.readouterr().err


def test_the_plan_plot_names_the_gpu_the_dtype_and_the_accumulation(monkeypatch, tmp_path, capsys):
    from recipes import schedule_report

    titles = []
    monkeypatch.setattr(schedule_report, "plot_plan", lambda plan, title="": titles.append(title) or b"png")
    assert train.main(["-c", str(ROOT / "configs/presets/h100_2x8.yaml"), "--plan", f"run.out_dir={tmp_path}"]) == 0
    capsys.readouterr()
    assert titles == [
        "1159 iterations in 28 epochs, 16 processes\n"
        "GPU: h100, dtype: fp16, micro-batches x images per GPU by phase: 1 x 2048, 1 x 2048, 2 x 1024, 2 x 512"
    ]


def _run_line(name: str) -> list[str]:
    """A preset's `Run:` command (its header) as train.py's arguments."""
    header = (ROOT / "configs" / "presets" / f"{name}.yaml").read_text().splitlines()[1]
    words = header.split("Run: ", 1)[1].split()
    return words[words.index("train.py") + 1 :]


def test_a_presets_run_line_does_not_stop_for_the_entrys_author(sample_root, tmp_path, capsys):
    """A preset is a first run, not a submission: its Run line as written leaves the author out and still starts
    (dawnbench.require: false); the record configs keep refusing without one."""
    argv = _run_line("h100_1gpu")
    assert argv == ["-c", "configs/presets/h100_1gpu.yaml", "data.root=/data/imagenet"]
    cfg = load_config(str(ROOT / argv[1]), argv[2:])
    assert cfg.dawnbench.require is False and missing_required(cfg) == []
    record = load_config(str(ROOT / "configs/dawnbench_8gpu.yaml"), [])
    assert missing_required(record) == ["author", "author_email"]


def test_plan_lists_every_start_up_check_that_would_stop_the_run_at_once(sample_root, tmp_path, capsys):
    """The three rounds a user met one at a time (author, blacklist, the `<root>-160` copy) in one --plan."""
    argv = [*_run_line("h100_1gpu")[:2], f"data.root={sample_root}", f"run.out_dir={tmp_path}", "--num-images", "800"]
    assert train.main([*argv, "--plan", "dawnbench.require=true"]) == 0
    out = capsys.readouterr().out
    lines = out[out.index("start-up checks:") :].splitlines()
    assert lines[0] == "start-up checks: 3 would stop this run here (train.py stops at the first, exit 2):"
    assert lines[1].startswith("  dawnbench.author: the DAWNBench entries format requires it")
    assert lines[2] == (
        f"  data.val_blacklist: '{sample_root}/ILSVRC2012_validation_blacklist.txt' not found (the devkit's "
        "data/ILSVRC2012_validation_blacklist.txt)"
    )
    assert lines[3] == (
        f"  phases.0.root: '160' is not in data.roots (known: full) and '{sample_root}-160' does not exist; make "
        f"it with: python data/prepare.py --src {sample_root} --dst {sample_root}-160 --short-side 160"
    )
    # What --plan lists is what the run stops with: the same line, the first of them.
    assert train.main([*argv[:3], f"run.out_dir={tmp_path}", "run.device=cpu", "dawnbench.require=true"]) == 2
    assert lines[1].strip() in capsys.readouterr().err
    fixed = [f"data.roots={{160: {sample_root}}}", "data.val_blacklist=''"]
    assert train.main([*argv, *fixed, "--plan"]) == 0
    assert "start-up checks: none would stop this run here" in capsys.readouterr().out
