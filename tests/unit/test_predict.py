"""scripts/predict.py: the record prediction runs and reports every backend (the model against the network lab:
tests/lab/test_predict_lab.py)."""

from __future__ import annotations

import json

import pytest
from support import ROOT

from base import registry
from scripts import predict


def test_bad_input_exits_2(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:  # refused at the argument, one line
        predict.main(["--link-gbit", "-1"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: argument --link-gbit: ") and err.count("\n") == 1
    bad = tmp_path / "gpu.json"
    bad.write_text('{"gpu": "x"}')
    assert predict.main(["--gpu-profile", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(bad) in err and "torch" in err
    with pytest.raises(SystemExit) as e:  # refused at the argument: argparse names the choices
        predict.main(["--gpu", "k80"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "argument --gpu: invalid choice: 'k80'" in err and "h200" in err


def test_json_has_every_backend_phase_and_term(tmp_path, capsys):
    out = tmp_path / "p.json"
    argv = ["-c", str(ROOT / "configs" / "dawnbench_8gpu.yaml"), "--gpu", "v100", "--json", str(out)]
    assert predict.main(argv) == 0
    text = capsys.readouterr().out
    assert "Calibration (fitted, not predicted)" in text and "residual" in text
    doc = json.loads(out.read_text())
    rows = [r.row_label(f) for r in registry.ALLREDUCE_BACKENDS.values() for f in r.time_flows]
    assert [b["backend"] for b in doc["backends"]] == rows  # the registry's order; one host: no tuning row
    for b in doc["backends"]:
        assert b["train_s"]["low"] < b["train_s"]["mid"] < b["train_s"]["high"] <= b["wall_s"]["high"]
        assert [p["image_size"] for p in b["phases"]] == [96, 128, 224, 288]
        for p in b["phases"]:
            names = [t["name"] for t in p["terms"]]
            assert names[:6] == ["compute", "step floor", "intra-host", "exposed comm", "sync", "small collectives"]
            assert sum(t["mid"] for t in p["terms"] if t["clock"] == "train") == pytest.approx(p["train_s"])
        assert b["phases"][0]["step_ms"]["exposed comm"] == 0.0  # one host: no inter-host communication


def test_gpu_profile_prints_the_step_floor_per_phase(tmp_path, capsys):
    """--gpu-profile with the H200's measured file: the floor line, a floor column, and at 96 and 128 px a step of
    compute + floor no shorter than the floor (the GPU's arithmetic alone would be 10-18 ms)."""
    out = tmp_path / "h200.json"
    profile = ROOT / "docs" / "data" / "gpu_profile-h200-2026-12-04.json"
    assert predict.main(["--gpu-profile", str(profile), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "step floor: 36.2 ms (34.7-37.6): docs/data/gpu_profile-h200-2026-12-04.json" in text
    assert "| floor ms |" in text
    for b in json.loads(out.read_text())["backends"]:
        for p in b["phases"]:
            step = p["step_ms"]["compute"] + p["step_ms"]["step floor"]
            assert step >= 34.7
            if p["image_size"] in (96, 128):
                assert p["step_ms"]["step floor"] > 15.0
            else:
                assert p["step_ms"]["step floor"] == 0.0
    assert predict.main(["--gpu", "h200"]) == 0 and "step floor: 35.0 ms (25.9-41.6)" in capsys.readouterr().out


def test_network_file_gives_the_link_figures(tmp_path, capsys):
    """--network reads what `launch.py --probe-network` writes (scripts/launcher/netprobe.py's summarize())."""
    from scripts.launcher.netprobe import summarize

    pair = {"a": "h0", "b": "h1", "ranks": [0, 1], "one_flow_gbit": 2.0, "n_flows_gbit": 6.0, "latency_us": 80.0}
    f = tmp_path / "network.json"
    f.write_text(json.dumps(summarize(["h0", "h1"], [pair], 4, 1.0)))
    out = tmp_path / "p.json"
    argv = ["--hosts", "2", "--gpus-per-host", "8", "--gpu", "v100", "--record-s", "0", "--json", str(out)]
    assert predict.main([*argv, "--network", str(f)]) == 0
    text = capsys.readouterr().out
    assert "link 6 Gbit/s per host, per-flow cap 2 Gbit/s" in text
    assert f"link figures: link probe {f} (2 hosts, measured " in text
    probed = json.loads(out.read_text())
    assert probed["link_figures"].startswith(f"link probe {f}")
    assert predict.main([*argv, "--link-gbit", "6", "--flow-gbit", "2", "--latency-us", "80"]) == 0
    assert "link figures: given (--link-gbit" in capsys.readouterr().out
    given = json.loads(out.read_text())
    assert [b["train_s"] for b in given["backends"]] == [b["train_s"] for b in probed["backends"]]
    assert predict.main([*argv, "--link-gbit", "32"]) == 0
    capsys.readouterr()
    fast = json.loads(out.read_text())["backends"][0]["train_s"]["mid"]
    assert fast < probed["backends"][0]["train_s"]["mid"]  # ddp on 6 Gbit/s with a 2 Gbit/s flow is slower


@pytest.mark.parametrize(
    ("text", "extra", "key"),
    [
        ("{nope", [], "not valid JSON"),
        (json.dumps({"link_gbit": 1e308, "flow_gbit": None, "latency_us": 5}), [], "link_gbit"),
        (json.dumps({"hosts": ["h0"], "pairs": []}), [], "no host pair"),
        (json.dumps({"link_gbit": 0, "flow_gbit": None, "latency_us": 5}), [], "link_gbit"),
        (json.dumps({"link_gbit": 3, "flow_gbit": None, "latency_us": 5}), ["--link-gbit", "3"], "drop --link-gbit"),
        (
            json.dumps({"link_gbit": 3, "flow_gbit": None, "latency_us": 5, "pairs": [{"connections_gbit": {}}]}),
            [],
            "connections_gbit.a_to_b",
        ),
    ],
)
def test_bad_network_file_is_one_line_exit_2(tmp_path, capsys, text, extra, key):
    f = tmp_path / "network.json"
    f.write_text(text)
    assert predict.main(["--network", str(f), *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --network: ") and key in err


def test_the_per_flow_cap_is_printed_as_an_assumption_with_the_command_that_measures_it(tmp_path, capsys):
    from scripts.launcher.netprobe import summarize

    argv = ["--hosts", "2", "--gpus-per-host", "8", "--gpu", "v100", "--record-s", "0"]
    assert predict.main(argv) == 0
    out = capsys.readouterr().out
    assert "per-flow cap 10 Gbit/s: an assumption (--flow-gbit)" in out
    assert "`python scripts/launch.py --hostfile hosts.txt -c CONFIG --probe-network`" in out
    pair = {"a": "h0", "b": "h1", "ranks": [0, 1], "one_flow_gbit": 2.0, "n_flows_gbit": 6.0, "latency_us": 80.0}
    f = tmp_path / "network.json"
    f.write_text(json.dumps(summarize(["h0", "h1"], [pair], 4, 1.0)))
    assert predict.main([*argv, "--network", str(f)]) == 0
    assert "an assumption" not in capsys.readouterr().out  # measured: no assumption left to name


def test_the_input_line_sets_what_the_steps_consume_against_what_dali_decodes(capsys):
    assert predict.main(["-c", str(ROOT / "configs/presets/h100_1gpu.yaml"), "--record-s", "0"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("input: "))
    assert "DALI decodes with data.workers=8 threads" in line and "96 px " in line and " of 18.7k (" in line
    need = float(line.split("96 px ")[1].split("k of")[0])
    assert need > 18.7  # one H100 at 96 px, 2048 per step, consumes more than one GPU's pipeline decodes
    assert predict.main(["-c", str(ROOT / "configs/presets/h100_1gpu.yaml"), "data.backend=torch"]) == 0
    assert "input: no term (data.backend=torch" in capsys.readouterr().out


def test_the_plot_marks_the_cluster_keeps_every_line_visible_and_labels_each_axis_once():
    from recipes import timemodel as tm
    from recipes.config import load_config

    one = "phases=[{epochs: 1, image_size: 128, batch_size: 3072}]"  # divides 1-16 hosts of 8 and 3 hosts
    cfg = load_config(str(ROOT / "configs" / "dawnbench_158s.yaml"), [one, "optim.warmup_epochs=0"])
    cluster = tm.Cluster(3, 8)
    fig = predict.figure(cfg, cluster, tm.published("v100-32gb"), tm.profile_model("resnet50", 224), 16)
    ax = fig.axes[0]
    lines = [ln for ln in ax.get_lines() if not ln.get_label().startswith("this cluster")]
    assert len({(str(ln.get_linestyle()), ln.get_marker()) for ln in lines}) == len(lines)  # none hides another
    marks = [ln for ln in ax.get_lines() if ln.get_label() == "this cluster: 3 hosts"]
    assert len(marks) == 1 and list(marks[0].get_xdata()) == [3, 3]
    assert 3 in list(lines[0].get_xdata())  # the cluster's own host count is predicted, not only 1, 2, 4, ...
    fig.canvas.draw()
    assert all(t.get_text() == "" for t in ax.yaxis.get_minorticklabels())
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "3", "4", "8", "16"]


def _probe_file(tmp_path, a_to_b, b_to_a):
    """A 2-host network.json as the probe writes it, with each connection's rate per direction."""
    from scripts.launcher.netprobe import summarize

    pair = {"a": "h0", "b": "h1", "ranks": [0, 1], "one_flow_gbit": 10.0, "n_flows_gbit": 32.0, "latency_us": 80.0}
    pair["connections_gbit"] = {"a_to_b": a_to_b, "b_to_a": b_to_a}
    f = tmp_path / "network.json"
    f.write_text(json.dumps(summarize(["h0", "h1"], [pair], 4, 1.0)))
    return f


def test_uneven_connections_show_even_striping_against_balancing(tmp_path, capsys):
    argv = ["--hosts", "2", "--gpus-per-host", "8", "--gpu", "v100", "--record-s", "0"]
    slow = _probe_file(tmp_path, [10.0, 10.0, 10.0, 3.3], [10.0, 10.0, 3.3, 10.0])
    assert predict.main([*argv, "--network", str(slow)]) == 0
    out = capsys.readouterr().out
    assert (
        "Uneven connections: the slowest at 0.33 of the median (measured by the link probe on 2 hops: each pair" in out
    )
    assert "| even striping (as NCCL and DDP do) | `comm.balance=false` | 13.2 | 62.0 | 1.00x | yes |" in out
    assert "| communicator-level balancing | `comm.balance=true` | 26.6 | 30.7 | 2.02x | yes |" in out
    # the record's config runs on NCCL: the flat hop ring is shown, refused, and the hierarchical ring is named
    hop = "| hop-level balancing | `comm.balance=true comm.balance_level=hop` | 32.0 | 25.6 | 2.42x |"
    assert f"{hop} no: refused at start-up |" in out
    hier = "`comm.balance=true comm.balance_level=hop comm.hierarchy=host` | 32.0 | 25.6 | 2.42x | yes |"
    assert hier in out
    assert "use: comm.balance=true comm.balance_level=hop comm.hierarchy=host (2.42x even striping's rate)" in out
    # 2(H-1)/H x 102.2 MB at 32 Gbit/s between hosts plus 2(G-1)/G x 102.2 MB at 150 GB/s inside: 25.55 + 1.19 ms
    assert "predicted allreduce of one step's gradients: 26.7 ms against even striping's 63.1 ms" in out
    # on CPU hosts (gloo) the flat hop ring runs, and is the cheaper of two equal rates
    assert predict.main([*argv, "--network", str(slow), "run.device=cpu"]) == 0
    out = capsys.readouterr().out
    assert f"{hop} yes |" in out
    assert "use: comm.balance=true comm.balance_level=hop (2.42x even striping's rate)" in out
    even = _probe_file(tmp_path, [8.0, 8.2, 8.0, 7.9], [8.0] * 4)
    assert predict.main([*argv, "--network", str(even)]) == 0
    out = capsys.readouterr().out
    assert "| strategy |" not in out and "connections: even (slowest / median connection 0.99" in out
    # no file: --flow-spread asks for the table; a flag next to the file is refused
    assert predict.main([*argv, "--flow-spread", "0.33"]) == 0
    out = capsys.readouterr().out
    assert "--flow-spread 0.33: one of comm.streams=4 connections per hop at that share of 10" in out
    assert "| hop-level balancing | `comm.balance=true comm.balance_level=hop` | 32.0 |" in out
    assert predict.main([*argv, "--network", str(slow), "--flow-spread", "0.5"]) == 2
    assert "drop --flow-spread" in capsys.readouterr().err


def _probe_doc(**pair_changes):
    from scripts.launcher.netprobe import summarize

    pair = {"a": "h0", "b": "h1", "ranks": [0, 1], "one_flow_gbit": 10.0, "n_flows_gbit": 32.0, "latency_us": 80.0}
    pair["connections_gbit"] = {"a_to_b": [8.0] * 4, "b_to_a": [8.0] * 4}
    doc = summarize(["h0", "h1"], [pair], 4, 1.0)
    doc["pairs"][0].update(pair_changes)  # after summarize, which reads the lists
    return doc


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (
            {"pairs": 5},
            "pairs: expected a list of at most 10,000 host pairs (scripts/launch.py --probe-network), got 5",
        ),
        ({"pairs": {"a": 1}}, "pairs: expected a list of at most 10,000 host pairs"),
        ({"pairs": [5]}, "pairs[0]: expected an object (one host pair)"),
        ({"connections_gbit": [1, 2]}, "pairs[0].connections_gbit: expected an object with a_to_b and b_to_a"),
        ({"connections_gbit": {"a_to_b": [8.0] * 4, "b_to_a": [8.0] * 3}}, "expected 4 rates, as every other"),
        ({"connections_gbit": {"a_to_b": [8.0] * 100_000, "b_to_a": [8.0]}}, "got '100,000 rates'"),
        ({"connections_gbit": {"a_to_b": [1e-300] * 4, "b_to_a": [8.0] * 4}}, "in comm.flow_gbit's domain (>= 0.001"),
        ({"connections_gbit": {"a_to_b": [1e300] * 4, "b_to_a": [8.0] * 4}}, "in comm.flow_gbit's domain"),
        ({"connections_gbit": {"a_to_b": [True] * 4, "b_to_a": [8.0] * 4}}, "in comm.flow_gbit's domain"),
    ],
)
def test_a_network_file_of_another_shape_is_one_line(tmp_path, capsys, change, words):
    """Unequal connection lists or `pairs: 5` were tracebacks, a connection of 1e-300 printed a 300-digit speed-up,
    100,000 connections hung: shapes, lengths and bounds as the probe writes them."""
    doc = _probe_doc(**{k: v for k, v in change.items() if k != "pairs"})
    if "pairs" in change:
        doc["pairs"] = change["pairs"]
    f = tmp_path / "network.json"
    f.write_text(json.dumps(doc))
    assert predict.main(["--network", str(f), "--hosts", "2", "--gpu", "v100", "--record-s", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: --network: {f}: ") and words in err, err


def test_the_measured_time_is_printed_without_terminal_escapes(tmp_path, capsys):
    doc = _probe_doc()
    doc["measured"] = "2026-01-01\x1b]0;pwned\x07\x1b[2J"
    f = tmp_path / "network.json"
    f.write_text(json.dumps(doc))
    assert predict.main(["--network", str(f), "--hosts", "2", "--gpu", "v100", "--record-s", "0"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "measured 2026-01-01\\x1b]0;pwned\\x07\\x1b[2J)" in out


def test_an_old_driver_predicts_multistream_serialized(tmp_path, capsys):
    """--driver 535 (R535, older than R545): the multistream row is the serialized one, and a line says why."""
    rows = {}
    for driver in ([], ["--driver", "535.183.01"]):
        out = tmp_path / f"p{len(driver)}.json"
        assert predict.main(["-c", "configs/presets/h100_16x8.yaml", *driver, "--json", str(out)]) == 0
        rows[bool(driver)] = {b["backend"]: b for b in json.loads(out.read_text())["backends"]}
    text = capsys.readouterr().out
    assert text.count("driver 535.183.01: older than R545 (CUDA 12.3), so multistream with comm.concurrency=auto") == 1
    old, new = rows[True]["multistream"], rows[False]["multistream"]
    assert old["train_s"]["mid"] > 1.5 * new["train_s"]["mid"]  # the flow cap binds: K flows become one
    assert rows[True]["ddp"] == rows[False]["ddp"]
    with pytest.raises(SystemExit):
        predict.main(["--driver", "535;reboot"])
    assert "--driver: expected a driver version such as 535.183.01, got '535;reboot'" in capsys.readouterr().err
