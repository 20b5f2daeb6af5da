"""`train.py --plan` (recipes/schedule_report.py) and the record configs: phase table, iteration count, PNG."""

from __future__ import annotations

from PIL import Image
from support import ROOT

import train
from recipes.config import load_config


def test_158s_plan_prints_1159_iterations_and_writes_the_plot(tmp_path, capsys):
    rc = train.main(
        [
            "-c",
            str(ROOT / "configs/dawnbench_158s.yaml"),
            "--plan",
            f"run.out_dir={tmp_path}",
            f"data.root={tmp_path / 'no-imagenet-here'}",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "1,281,167 training images" in out and "128 processes" in out
    assert "total: 1159 iterations in 28 epochs" in out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit() and "-" in line.split()[1]]
    # phase, epochs, size, val, batch, steps/epoch, steps
    assert [r[:7] for r in rows] == [
        ["0", "0-12", "96", "96", "32768", "40", "520"],
        ["1", "13-23", "128", "128", "32768", "40", "440"],
        ["2", "24-26", "224", "224", "32768", "40", "120"],
        ["3", "27-27", "288", "288r", "16384", "79", "79"],
    ]
    png = tmp_path / "dawnbench_158s_plan.png"
    assert f"plot: {png}" in out
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size[0] >= 600 and im.size[1] >= 600
    assert not (tmp_path / "no-imagenet-here").exists()
    # which allreduce, and where the probe's uneven flows point
    assert (
        "allreduce, all 4 phases: multistream over comm.streams=4 nccl communicators, even striping "
        "(comm.balance=false); where the link probe finds uneven flows on multi-GPU hosts, "
        "OVERRIDES='comm.balance=true comm.balance_level=hop comm.hierarchy=host' (docs/allreduce.md)"
    ) in out


def test_158s_plan_says_which_allreduce_runs_and_a_refused_one(tmp_path, capsys):
    """The record's config under the hierarchical ring: its line, every phase eager; the flat hop ring on NCCL is
    said to be refused at start-up, with the engine's own reason."""
    base = ["-c", str(ROOT / "configs/dawnbench_158s.yaml"), "--plan", "--num-images", "1281167"]
    base += [f"run.out_dir={tmp_path}", "comm.balance=true", "comm.balance_level=hop"]
    assert train.main([*base, "comm.hierarchy=host"]) == 0
    out = capsys.readouterr().out
    assert (
        "allreduce, all 4 phases: the hierarchical ring (comm.hierarchy=host): a reduce-scatter and an all-gather on "
        "nccl inside each of 16 hosts (8 ranks), between them a hop-balanced gloo ring per local rank of 16 members"
    ) in out
    assert out.count("eager: comm.balance_level=hop: its ring runs on helper threads that wait on the host") == 4
    assert train.main(base) == 0
    out = capsys.readouterr().out
    assert (
        "allreduce, every phase: refused at start-up: comm.balance_level=hop: the hop-balanced ring runs on gloo "
        "process groups, not nccl. On GPU hosts set comm.hierarchy=host"
    ) in out


def test_8gpu_plan_and_explicit_sizes(tmp_path, capsys):
    assert (
        train.main(
            [
                "-c",
                str(ROOT / "configs/dawnbench_8gpu.yaml"),
                "--plan",
                f"run.out_dir={tmp_path}",
                "data.root=/nonexistent",
            ]
        )
        == 0
    )
    assert "total: 13772 iterations in 21 epochs" in capsys.readouterr().out
    assert (
        train.main(
            [
                "-c",
                str(ROOT / "configs/dawnbench_158s.yaml"),
                "--plan",
                f"run.out_dir={tmp_path}",
                "--num-images",
                "1000000",
                "--world-size",
                "256",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    # ceil(ceil(1e6 / 256) / 128) = 31 per epoch at 32768, 62 at 16384
    assert "256 processes (--world-size)" in out and "total: 899 iterations in 28 epochs" in out


def test_plan_counts_a_local_dataset(tiny_root, tmp_path, capsys):
    assert (
        train.main(
            ["-c", str(ROOT / "configs/quickstart.yaml"), "--plan", f"run.out_dir={tmp_path}", f"data.root={tiny_root}"]
        )
        == 0
    )
    out = capsys.readouterr().out
    # 48 images on 2 processes, local batch 32: 1 step per epoch, 9 epochs
    assert f"48 training images (counted in {tiny_root})" in out and "total: 9 iterations in 9 epochs" in out


def test_plan_bad_world_size_is_a_clear_error(tmp_path, capsys):
    rc = train.main(
        ["-c", str(ROOT / "configs/dawnbench_158s.yaml"), "--plan", "--world-size", "100", f"run.out_dir={tmp_path}"]
    )
    assert rc == 2
    assert "phases.0.batch_size: 32768 is not divisible by the world size 100" in capsys.readouterr().err


def test_record_configs_hold_the_published_values():
    r = load_config(ROOT / "configs/dawnbench_158s.yaml")
    assert (r.run.nodes, r.run.procs_per_node) == (16, 8)
    assert [(p.epochs, p.image_size, p.batch_size, p.rect_val) for p in r.phases] == [
        (13, 96, 32768, False),
        (11, 128, 32768, False),
        (3, 224, 32768, False),
        (1, 288, 16384, True),
    ]
    o = r.optim
    assert (o.name, o.nesterov, o.eta, o.trust_clip_min, o.trust_clip_max) == ("hybrid", True, 8e-4, 1e-5, 1.0)
    assert (o.lr, o.final_lr, o.warmup_epochs) == (25.0, 0.2, 14.0)
    assert (o.momentum, o.momentum_end, o.momentum_schedule) == (0.98, 0.90, "cyclic")
    assert (o.label_smoothing, o.weight_decay, o.no_bn_decay, o.adapt_bn_bias) == (0.1, 1e-4, True, False)
    assert r.model.name == "resnet50" and r.model.zero_init_last_bn  # the entry's ResNet50-v1.5
    assert [(p.min_scale, p.min_object_area) for p in r.phases] == [(0.11, 0.15)] * 3 + [(0.5, 0.15)]

    e = load_config(ROOT / "configs/dawnbench_8gpu.yaml")
    assert (e.run.nodes, e.run.procs_per_node) == (1, 8)
    assert [(p.epochs, p.image_size, p.batch_size, p.rect_val) for p in e.phases] == [
        (12, 96, 2048, False),
        (6, 128, 2048, False),
        (2, 224, 2048, False),
        (1, 288, 1024, True),
    ]
    o = e.optim
    assert (o.name, o.nesterov, o.lr, o.final_lr, o.warmup_epochs) == ("sgd", True, 1.2, 1e-4, 5.0)
    assert (o.momentum, o.momentum_end, o.momentum_schedule) == (0.96, 0.90, "linear")
    assert [(p.min_scale, p.min_object_area) for p in e.phases] == [(0.08, 0.1)] * 3 + [(0.5, 0.1)]


def test_quickstart_stays_cpu_sized():
    q = load_config(ROOT / "configs/quickstart.yaml")
    assert q.model.name == "resnet18" and max(p.image_size for p in q.phases) <= 96 and q.epochs <= 10


def test_exponent_without_a_dot_is_a_number(tmp_path):
    """YAML 1.1 reads 8e-4 as a string; the config accepts it as the number users mean."""
    f = tmp_path / "c.yaml"
    f.write_text("optim:\n  name: hybrid\n  eta: 8e-4\n  trust_clip_min: 1E-5\n")
    cfg = load_config(f, ["optim.final_lr=2e-1"])
    assert (cfg.optim.eta, cfg.optim.trust_clip_min, cfg.optim.final_lr) == (8e-4, 1e-5, 0.2)


def test_the_plan_plot_is_never_written_through_a_link(tmp_path, capsys):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "quick_plan.png").symlink_to(victim)
    args = ["-c", "configs/quickstart.yaml", "--plan", f"run.out_dir={tmp_path}", "run.name=quick"]
    assert train.main(args) == 2
    err = capsys.readouterr().err
    assert "quick_plan.png' is a symbolic link" in err and err.count("\n") == 1
    assert victim.read_text() == "precious\n"


def test_every_shipped_config_plans_its_cuda_graph_decision_per_phase(tmp_path, capsys, monkeypatch):
    """--plan states, for each phase of every shipped config and preset, whether its step will be captured and why
    not: by default (auto) nothing is captured until a GPU run has proven the parts."""
    import recipes.schedule_report as report

    monkeypatch.setattr(report, "plot_plan", lambda *a, **k: b"")  # the plot is tested above
    configs = sorted([*ROOT.glob("configs/*.yaml"), *ROOT.glob("configs/presets/*.yaml")])
    assert len(configs) >= 20
    for path in configs:
        cfg = load_config(path)
        args = ["-c", str(path), "--plan", f"run.out_dir={tmp_path}", f"data.root={tmp_path / 'none'}"]
        assert train.main(args) == 0, path
        lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("run.cuda_graph=")]
        want = [f"run.cuda_graph=auto: phase {i} ({p.image_size} px): eager: " for i, p in enumerate(cfg.phases)]
        assert [ln[: len(w)] for ln, w in zip(lines, want, strict=True)] == want, path
        assert len(lines) == len(cfg.phases)
        reason = "optim.name=sgd reads lr/momentum on the host" if cfg.optim.name == "sgd" else "no GPU run has"
        assert all(reason in ln or "eager: gradient accumulation" in ln for ln in lines), (path, lines)


def test_plan_and_summary_of_a_synthetic_run_read_no_folder_key(tmp_path, capsys):
    """The synthetic input reads no data.root or data.val_blacklist: --plan counts data.synthetic_size and the
    summary records no blacklist, instead of asking the section for a key its plug-in does not read."""
    from support import tiny_config

    from recipes.trainer import train as run

    args = ["-c", "configs/quickstart.yaml", "data.backend=synthetic", "--plan", f"run.out_dir={tmp_path}"]
    assert train.main(args) == 0
    assert "1,281,167 training images (data.synthetic_size)" in capsys.readouterr().out
    cfg = tiny_config(
        tmp_path, tmp_path, "data.backend=synthetic", "data.synthetic_size=24", "data.synthetic_classes=4"
    )
    summary = run(cfg)
    assert summary["val_blacklist"] == ""
