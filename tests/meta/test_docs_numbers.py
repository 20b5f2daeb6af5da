"""Figures the README and docs derive from committed data, recomputed here from that data: prose and data cannot
drift apart (a rate change that moves a figure fails until the docs say the new one)."""

from __future__ import annotations

import json

import pytest
from support import ROOT


def _flat(path: str) -> str:
    return " ".join((ROOT / path).read_text().split())


@pytest.fixture(scope="module")
def evidence() -> tuple[dict, dict]:
    """docs/data/timemodel-evidence.json and the model's rows as lab/timemodel_evidence.py computes them now."""
    from lab import timemodel_evidence

    doc = timemodel_evidence.load()
    return doc, timemodel_evidence.model_rows(doc)


@pytest.fixture(scope="module")
def out_of_sample(evidence) -> list[dict]:
    return evidence[1]["out_of_sample"]


def test_the_time_models_evidence_tables_are_the_scripts(evidence):
    """docs/scaling.md's calibration, out-of-sample and step-by-term tables are every table row that
    `python lab/timemodel_evidence.py` prints, as it prints them."""
    from lab import timemodel_evidence

    rows = [line for line in timemodel_evidence.tables(*evidence) if line.startswith("|")]
    assert len(rows) >= 45
    scaling = (ROOT / "docs" / "scaling.md").read_text().splitlines()
    for row in rows:
        assert row in scaling, row


def test_out_of_sample_errors_quoted_in_readme_and_scaling(out_of_sample):
    totals = sorted(round(abs(r["mid"] / r["published_s"] - 1) * 100) for r in out_of_sample)
    phases = [s for r in out_of_sample for s in r["sizes"]]
    worst = max(round(abs(s["mid"] / s["published_s"] - 1) * 100) for s in phases)
    span = f"{totals[0]}-{totals[-1]}% off in total"
    assert f"{span}, up to {worst}% in one phase" in _flat("README.md")
    assert f"is {span} on runs it was not fitted on, and up to {worst}% off in one phase." in _flat("docs/scaling.md")
    fast16, fast8, fast4, huawei = (f"{r['mid'] / r['published_s'] - 1:+.0%}" for r in out_of_sample)
    quoted = f"The totals: fast.ai 16 x 8 {fast16}, 8 x 8 {fast8}, 4 x 8 {fast4}, Huawei {huawei}."
    assert quoted in _flat("docs/scaling.md")


def test_fp16_against_bf16_on_the_h200_is_the_check_files_ratio():
    rows = json.loads((ROOT / "docs" / "data" / "gpu_check-h200-2026-12-04.json").read_text())["rows"]

    def rate(dtype: str, px: int) -> float:
        [r] = [r for r in rows if r["name"].startswith(f"train step resnet50_tweaked {dtype} {px}px")]
        return r["number"]

    at224, at128 = (f"{rate('fp16', px) / rate('bf16', px):.2f}x" for px in (224, 128))
    quoted = f"fp16, which ran {at224} bf16's rate at 224 px and {at128} at 128 px on one H200"
    assert quoted in _flat("README.md")


def test_the_quickstart_is_measured_in_one_place():
    """The README's quickstart table is the one measurement; docs/input.md points to it instead of quoting another
    run of the same command."""
    text = _flat("docs/input.md")
    assert "README.md#two-commands" in text
    for other in ("1:49", "191-221 img/s", "0:00:27"):
        assert other not in text


# --- The network lab: every table row in the docs is recomputed from the bench's JSON (docs/data/lab-*.json), as
# lab/bench_allreduce.py prints it, with the CPU count of the machine that ran it.

LAB_METHODS = ("per-tensor", "ddp", "ddp-flows", "multistream", "tuned")


def _lab(name: str) -> list[dict]:
    return json.loads((ROOT / "docs" / "data" / name).read_text())


def _comm(rec: dict) -> dict[str, float]:
    """Communication seconds per step of every contender that ran: step minus the compute-only step."""
    res = rec["torch"]
    entries = {m: res[m] for m in LAB_METHODS if isinstance(res.get(m), dict)}
    if isinstance(rec["horovod"], dict):
        entries["horovod"] = rec["horovod"]
    return {m: max(r["step_s"] - res["compute_s"], 1e-6) for m, r in entries.items()}


def _lab_rows(name: str, *, flows_column: bool) -> list[str]:
    rows = []
    for rec in _lab(name):
        res, n, comm = rec["torch"], rec["hosts"], _comm(rec)
        for m, c in comm.items():
            r = rec["horovod"] if m == "horovod" else res[m]
            bus = 2 * (n - 1) / n * res["bytes"] * 8 / c / 1e9
            cells = [str(n), m, r["settings"], f"{r['step_s'] * 1000:.0f}", f"{c * 1000:.0f}", f"{bus:.2f}"]
            cells += [f"{100 * bus * 1000 / rec['link_mbit']:.0f}%", f"{comm['ddp'] / c:.2f}x"]
            if flows_column:
                cells.append(f"{comm['ddp-flows'] / c:.2f}x")
            cells += [f"{max(r['cpu_s']) * 1000:.0f}", f"{100 * sum(r['cpu_s']) / (rec['cpus'] * r['step_s']):.0f}%"]
            rows.append("| " + " | ".join(cells) + " |")
    return rows


def _tuner_lines(name: str) -> list[str]:
    lines = []
    for rec in _lab(name):
        t = rec["torch"]["tuned"]["tuning"]
        cands = ", ".join(
            f"{c['bucket_mb']:g}/{c['streams']}/{c['slices']}: {c['median_step_s'] * 1000:.0f}" for c in t["candidates"]
        )
        lines.append(
            f"- {rec['hosts']} hosts: auto-tuner, {len(t['candidates'])} candidates in {t['seconds']:.0f} s; "
            f"{t['start']} (bucket MB/K/S: median backward+sync ms): {cands}"
        )
    return lines


def _link_lines(name: str) -> list[str]:
    return [
        f"- network lab, {r['hosts']} hosts: link cap {r['link_mbit']:g} Mbit/s per host and direction, per-flow cap "
        f"{r['flow_mbit']:.0f} Mbit/s; measured TCP host 1 -> 0: 1 flow {r['measured_1flow_mbit']:.0f} Mbit/s, "
        f"4 flows {r['measured_4flows_mbit']:.0f} Mbit/s"
        for r in _lab(name)
    ]


@pytest.mark.parametrize(
    "name, flows_column, tuner, links",
    [
        ("lab-40mbit.json", False, True, False),
        ("lab-100mbit.json", False, True, True),
        ("lab-1000mbit.json", True, True, True),
        ("lab-multiflow-2-4.json", True, False, True),
        ("lab-multiflow-8-16.json", True, False, True),
    ],
)
def test_every_lab_table_row_is_its_data_files(name, flows_column, tuner, links):
    doc = (ROOT / "docs" / "allreduce.md").read_text().splitlines()
    rows = _lab_rows(name, flows_column=flows_column)
    assert len(rows) >= 8
    for row in rows:
        assert row in doc, row
    for line in _tuner_lines(name) if tuner else []:  # the auto-tuner's candidates, where the docs list them
        assert line in doc, line
    for line in _link_lines(name) if links else []:  # the lab's caps and its measured TCP, where listed
        assert line in doc, line


def test_the_multiflow_speedups_quoted_are_the_tables():
    recs = _lab("lab-multiflow-2-4.json") + _lab("lab-multiflow-8-16.json")
    comms = [_comm(r) for r in recs]
    assert [r["hosts"] for r in recs] == [2, 4, 8, 16]
    one_flow = [c["ddp"] / c["multistream"] for c in comms]
    defaults, tuned = ([f"{c['ddp-flows'] / c[m]:.2f}x" for c in comms] for m in ("multistream", "tuned"))
    span = f"{min(one_flow):.1f}-{max(one_flow):.1f}x faster"
    text = _flat("docs/allreduce.md")
    assert f"multistream at its defaults is {span} at every host count" in text
    quoted = (
        f"it is {defaults[0]} at 2 hosts, {defaults[1]} at 4, {defaults[2]} at 8 and {defaults[3]} at 16 "
        f"({tuned[0]}, {tuned[1]}, {tuned[2]} and {tuned[3]} after its auto-tuner)"
    )
    assert quoted in text
    lo, hi = (f"{f(float(x[:-1]) for x in defaults):.2f}" for f in (min, max))
    tlo, thi = (f"{f(float(x[:-1]) for x in tuned):.2f}" for f in (min, max))
    readme = _flat("README.md")
    assert f"it is {span} than DDP on one flow" in readme
    assert f"it is {lo}-{hi}x at 2-16 hosts ({tlo}-{thi}x after its auto-tuner)" in readme


# --- The step model against the lab (lab/predict_lab.py): the validation tables and the errors quoted.

MULTIFLOW = ["lab-multiflow-2-4.json", "lab-multiflow-8-16.json"]


def _validate(names: list[str]) -> tuple[list[str], dict[tuple[int, str], str]]:
    from lab import predict_lab

    lines = predict_lab.validate([str(ROOT / "docs" / "data" / n) for n in names], [2, 4])
    rows = [line.split(" | ") for line in lines if line.startswith("| ") and line[2].isdigit()]
    return lines, {(int(r[0][2:]), r[1]): r[5] for r in rows}


@pytest.fixture(scope="module")
def multiflow_validation():
    return _validate(MULTIFLOW)


def test_the_lab_fit_the_record_prediction_uses_is_the_multiflow_runs():
    """LAB_FIT (goodput 93%, 9 us per ring step) is the fit on the committed 2- and 4-host multi-flow rows, and the
    record's cluster assumes the same goodput."""
    from lab import predict_lab
    from recipes.timemodel.estimate import Cluster

    records = predict_lab.load_lab([str(ROOT / "docs" / "data" / n) for n in MULTIFLOW])
    fit = predict_lab.fit_lab([r for r in records if r["hosts"] in (2, 4)])
    assert (round(fit.efficiency, 2), round(fit.latency_s * 1e6)) == (0.93, 9)
    assert (predict_lab.LAB_FIT.efficiency, predict_lab.LAB_FIT.latency_s) == (0.93, 9e-6)
    assert Cluster(hosts=16, gpus_per_host=8).efficiency == 0.93
    assert "93% goodput as fitted in the lab" in _flat("docs/scaling.md")


def test_the_multiflow_prediction_errors_quoted_are_the_validations(multiflow_validation):
    lines, err = multiflow_validation
    assert lines[0].startswith("fitted on 2, 4 hosts: goodput 93% of the caps, 9 us per ring step")
    e = {k: v for k, v in err.items() if k[0] in (8, 16)}
    assert e[8, "ddp-flows"] == e[16, "ddp-flows"]
    slower = sorted(-int(e[h, "per-tensor"][:-1]) for h in (8, 16))
    hvd = sorted(int(e[h, "horovod"][:-1]) for h in (8, 16))
    quoted = (
        f"predicts the 8- and 16-host rows it never saw within {e[8, 'ddp-flows']} (ddp-flows at 8 and 16), "
        f"{e[8, 'multistream']} and {e[16, 'multistream']} (multistream), {e[8, 'tuned']} and {e[16, 'tuned']} "
        f"(tuned), {e[8, 'ddp']} (ddp) and +{hvd[0]}-{hvd[1]}% (Horovod); only per-tensor, whose 161 small "
        f"allreduces per step are CPU-bound here, is {slower[0]}-{slower[1]}% slower than predicted"
    )
    assert e[8, "ddp"] == e[16, "ddp"]
    assert quoted in _flat("docs/allreduce.md")


def _validation_in_scaling(name: str) -> tuple[list[str], dict[tuple[int, str], str]]:
    """Every line `lab/predict_lab.py docs/data/<name>` prints is in docs/scaling.md; (lines, errors by (hosts,
    method))."""
    lines, err = _validate([name])
    doc = (ROOT / "docs" / "scaling.md").read_text().splitlines()
    for line in lines:
        assert not line or line in doc, line
    return lines, err


def test_the_40mbit_validation_table_and_its_quotes_are_the_validations():
    _, err = _validation_in_scaling("lab-40mbit.json")
    text = _flat("docs/scaling.md")
    quoted = (
        f"At 16 hosts, predicted against measured: DDP {err[16, 'ddp']}, multistream {err[16, 'multistream']}, "
        f"Horovod {err[16, 'horovod']}: within 15% for the three backends"
    )
    assert quoted in text
    assert f"Per-tensor ({err[16, 'per-tensor']}) is 161 small allreduces" in text
    assert f"The tuned row ({err[16, 'tuned']}) ran the same settings" in text
    assert f"(as in the 4-host multistream row, {err[4, 'multistream']})" in text


def test_the_records_time_and_cost_in_reproduce_are_the_entries():
    """docs/reproduce.md's expected time and cost: the entry's TSV hours at its last epoch x its costPerHour."""
    entries = ROOT / "tests" / "data" / "dawnbench_entries"
    text = _flat("docs/reproduce.md")
    for machines, target in ((16, "make reproduce-158s"), (1, "make reproduce-8gpu")):
        name = f"alibabacloud_resnet50_gn6e_{machines}_machine_tensorflow"
        cost = json.loads((entries / f"{name}.json").read_text())["costPerHour"]
        epoch, hours = (entries / f"{name}.tsv").read_text().split()[-4:-2]  # the last row: epoch, hours, top1, top5
        h = float(hours)
        clock = f"{h * 3600:.1f} s" if machines == 16 else f"{h * 60:.1f} min"
        shape = "16 x 8 V100, 32 Gbps TCP" if machines == 16 else "1 x 8 V100"
        n = int(epoch) + 1  # the TSV counts epochs from 0
        row = f"| `{target}` | {shape} | {h:.5f} h = {clock} (epoch {n} of {n}) | "
        row += f"{cost:.2f} USD/h -> {cost * h:.2f} USD |"
        assert row in text, row


def test_allreduce_md_quotes_the_record_predictions_mid_values():
    """allreduce.md's DDP-with-flows sentence quotes the mid training clocks of scaling.md's record table (which
    tests/meta/test_record_prediction.py holds to the model)."""
    import re

    mids = {}
    for line in (ROOT / "docs" / "scaling.md").read_text().splitlines():
        m = re.match(r"\| (ddp|ddp \(4 flows[^|]*\)|multistream) \| \d+-\*\*(\d+)\*\*-\d+ \|", line)
        if m:
            mids.setdefault(m.group(1).split(" (")[0] + (" 4" if "4 flows" in m.group(1) else ""), m.group(2))
    quoted = (
        f"DDP's predicted training time falls from {mids['ddp']} s to {mids['ddp 4']} s, against "
        f"{mids['multistream']} s for multistream"
    )
    assert quoted in _flat("docs/allreduce.md")


def test_the_100mbit_run_its_reading_and_validation_are_its_data():
    recs = _lab("lab-100mbit.json")
    assert [r["hosts"] for r in recs] == [2, 4, 8]
    pct, speed, load = {}, {}, []
    for rec in recs:
        res, n, comm = rec["torch"], rec["hosts"], _comm(rec)
        for m, c in comm.items():
            bus = 2 * (n - 1) / n * res["bytes"] * 8 / c / 1e9
            pct[n, m] = round(100 * bus * 1000 / rec["link_mbit"])
            speed[n, m] = comm["ddp"] / c
            load.append(round(100 * sum(res[m]["cpu_s"]) / (rec["cpus"] * res[m]["step_s"])))
    ours = [k for k in pct if k[1] in ("multistream", "tuned") and k != (2, "multistream")]  # the one artefact row
    held = sorted(pct[k] for k in ours)
    fast = sorted(speed[k] for k in ours)
    ddp = sorted(pct[n, "ddp"] for n in (2, 4, 8))
    text = _flat("docs/allreduce.md")
    reading = (
        f"at 2-8 hosts the lab is network-bound (CPU load {min(load)}-{max(load)}%). Multistream holds "
        f"{held[0]}-{held[-1]}% of the link, {fast[0]:.1f}-{fast[-1]:.1f}x DDP, which stays on one flow "
        f"({ddp[0]}-{ddp[-1]}%), in every row but one: at its defaults at 2 hosts it reached {pct[2, 'multistream']}%."
    )
    assert reading in text
    assert f"the tuned run, with the same settings, reached {pct[2, 'tuned']}%" in text
    assert recs[0]["torch"]["multistream"]["settings"] == recs[0]["torch"]["tuned"]["settings"]
    per_tensor = f"({speed[2, 'per-tensor']:.2f}x DDP at 2 hosts, {speed[8, 'per-tensor']:.2f}x at 8"
    assert per_tensor in text

    lines, err = _validation_in_scaling("lab-100mbit.json")
    scaling = _flat("docs/scaling.md")
    quoted = (
        f"model predicts 8 hosts within {err[8, 'ddp']} for DDP, {err[8, 'multistream']} for multistream and "
        f"{err[8, 'tuned']} for the tuned run; per-tensor, 161 small allreduces through 8 ranks on 2 cores, is "
        f"{-int(err[8, 'per-tensor'][:-1])}% slower than predicted."
    )
    assert quoted in scaling
    assert (
        f"multistream at its defaults at 2 hosts ({err[2, 'multistream']}) reached {pct[2, 'multistream']}%" in scaling
    )
    goodput, latency = lines[0].split("goodput ")[1].split(" of the caps, ")
    assert (
        f"pulls this fit's goodput to {goodput} and its per-message latency to {latency.split(' per ring')[0]}."
        in scaling
    )


def test_the_1000mbit_runs_reading_is_its_data():
    recs = _lab("lab-1000mbit.json")
    assert [r["hosts"] for r in recs] == [2, 4]
    pct, speed, flows = {}, {}, {}
    for rec in recs:
        res, n, comm = rec["torch"], rec["hosts"], _comm(rec)
        for m, c in comm.items():
            pct[n, m] = round(100 * (2 * (n - 1) / n * res["bytes"] * 8 / c / 1e9) * 1000 / rec["link_mbit"])
            speed[n, m], flows[n, m] = comm["ddp"] / c, comm["ddp-flows"] / c

    def span(values, fmt="{}"):
        return f"{fmt.format(min(values))}-{fmt.format(max(values))}"

    one_flow = [pct[n, m] for n in (2, 4) for m in ("per-tensor", "ddp", "horovod")]
    ours = [speed[n, m] for n in (2, 4) for m in ("multistream", "tuned")]
    computes = [f"{r['torch']['compute_s'] * 1000:.0f} ms" for r in recs]
    tuning = [r["torch"]["tuned"]["tuning"] for r in recs]
    reading = (
        f"DDP, Horovod and per-tensor stay on one flow ({span(one_flow)}% of the link), while multistream with 4 "
        f"communicators reaches {span([pct[n, 'multistream'] for n in (2, 4)])}% "
        f"(tuned {span([pct[n, 'tuned'] for n in (2, 4)])}%), {span(ours, '{:.1f}')}x DDP at 2 and 4 hosts. DDP on 4 "
        f"gloo devices gets the same from its flows: multistream is {flows[2, 'multistream']:.2f}x and "
        f"{flows[4, 'multistream']:.2f}x of it ({flows[2, 'tuned']:.2f}x and {flows[4, 'tuned']:.2f}x tuned). The "
        f"2-host rows above 100% come from the subtraction"
    )
    text = _flat("docs/allreduce.md")
    assert reading in text
    assert max(pct.values()) > 100 and all(pct[4, m] <= 100 for m in ("ddp-flows", "multistream", "tuned"))
    assert f"{computes[0]} at 2 hosts on this loaded machine against {computes[1]} at 4" in text
    secs = [round(t["seconds"]) for t in tuning]
    cands = {len(t["candidates"]) for t in tuning}
    assert f"measured {cands.pop()} candidates in {min(secs)}-{max(secs)} s and kept 8 MB with K=4." in text
    assert {(r["torch"]["tuned"]["settings"].split(", S=")[0]) for r in recs} == {"8 MB, K=4"}


def _table(names: list[str]) -> dict[tuple[int, str], dict]:
    """(hosts, method) -> % of link cap, speed vs ddp, CPU load and the busiest rank's CPU share of a step."""
    out = {}
    for rec in (r for n in names for r in _lab(n)):
        res, n, comm = rec["torch"], rec["hosts"], _comm(rec)
        for m, c in comm.items():
            r = rec["horovod"] if m == "horovod" else res[m]
            out[n, m] = {
                "pct": round(100 * (2 * (n - 1) / n * res["bytes"] * 8 / c / 1e9) * 1000 / rec["link_mbit"]),
                "speed": comm["ddp"] / c,
                "load": round(100 * sum(r["cpu_s"]) / (rec["cpus"] * r["step_s"])),
                "busiest": round(100 * max(r["cpu_s"]) / r["step_s"]),
            }
    return out


def test_the_40mbit_and_multiflow_readings_are_their_tables():
    t = _table(["lab-40mbit.json"])
    artefacts = {(4, "multistream"), (16, "tuned")}
    ours = [k for k in t if k[1] in ("multistream", "tuned") and k not in artefacts]
    held = [t[k]["pct"] for k in ours]
    fast = [t[k]["speed"] for k in ours if k[0] != 4]
    busiest = [t[h, "multistream"]["busiest"] for h in (2, 4, 8, 16)]
    text = _flat("docs/allreduce.md")
    assert (
        f"multistream holds {min(held)}-{max(held)}% of the link at every host count, {min(fast):.1f}-{max(fast):.1f}x "
        f"DDP at 2, 8 and 16 hosts"
    ) in text
    assert (
        f"multistream at its defaults at 4 hosts ({t[4, 'multistream']['pct']}%) and the tuned run at 16 hosts "
        f"({t[16, 'tuned']['pct']}%, the same settings as the defaults row at {t[16, 'multistream']['pct']}%)"
    ) in text
    assert f"spends {min(busiest)}-{max(busiest)}% of a multistream step on the CPU" in text

    f = _table(MULTIFLOW)
    flows = [f[h, "ddp-flows"]["pct"] for h in (2, 8, 16)]
    ms, tuned = ([f[h, m]["pct"] for h in (2, 4, 8, 16)] for m in ("multistream", "tuned"))
    assert (
        f"Multi-flow DDP fills {min(flows)}-{max(flows)}% of the link at 2, 8 and 16 hosts; multistream at its "
        f"defaults {min(ms)}-{max(ms)}%, tuned {min(tuned)}-{max(tuned)}%. At 4 hosts multi-flow DDP reached "
        f"{f[4, 'ddp-flows']['pct']}%"
    ) in text
    assert f"At 16 hosts multistream at its defaults kept {f[16, 'multistream']['load']}% of the two cores busy" in text


def test_the_second_h200s_step_table_is_its_check_file():
    """docs/gpu.md's paired-rounds table and recipe.md's fp16/bf16 figures are the rows of the second H200's check."""
    import re

    rows = json.loads((ROOT / "docs" / "data" / "gpu_check-steps-h200-2026-12-04.json").read_text())["rows"]
    gpu = (ROOT / "docs" / "gpu.md").read_text().splitlines()
    trainer = {}
    for r in rows:
        m = re.match(r"train step resnet50_tweaked (fp16|bf16) (\d+)px b(\d+)", r["name"])
        if not m:
            continue
        ref = re.match(
            r"trainer ([\d,]+) img/s per GPU(?: \(rounds ([\d,-]+)\))?, bare loop ([\d,]+)(?: \(([\d,-]+)\))?, .*"
            r"GPU kernels ([\d.]+) of ([\d.]+) ms per step",
            r["reference"],
        )
        dtype, px, batch = m.groups()
        t, t_range, b, b_range, kernels, wall = ref.groups()
        label = f"{px} px b{batch}" if dtype == "fp16" else f"bf16 {px} px b{batch}"
        cells = [
            label,
            t + (f" ({t_range})" if t_range else ""),
            b + (f" ({b_range})" if b_range else ""),
            f"{r['number']:.1f}%",
            f"{kernels} / {wall}",
            r["result"].split(":")[0],
        ]
        assert "| " + " | ".join(cells) + " |" in gpu, cells
        trainer[dtype, px] = t
    quoted = f"this trainer at 224 px: {trainer['fp16', '224']} img/s in fp16 against {trainer['bf16', '224']} in bf16"
    assert quoted in _flat("docs/recipe.md")


def test_the_readme_quickstart_table_is_its_summary_file():
    """The README's quickstart table is the summary.json of the run it quotes, kept in docs/data, as the trainer's own
    summary table prints it (recipes/report.py): a new row in the output shows up as a stale README."""
    from recipes.report import summary_table

    [path] = sorted((ROOT / "docs" / "data").glob("quickstart-summary-*.json"))
    s = json.loads(path.read_text())
    readme = (ROOT / "README.md").read_text()
    block = readme.split("| summary ", 1)[1].split("```", 1)[0]
    assert ("| summary " + block).strip() == summary_table(s).strip()
    assert f"`docs/data/{path.name}`" in readme
    assert s["world_size"] == 2 and s["epochs"] == 9 and s["final_top1"] >= 90.0


def test_the_first_h200s_step_and_dali_rows_are_its_check_file():
    """docs/gpu.md's results table: the train-step, NVIDIA-model and DALI rows of gpu_check-h200-2026-12-04.json."""
    import re

    rows = json.loads((ROOT / "docs" / "data" / "gpu_check-h200-2026-12-04.json").read_text())["rows"]
    gpu = (ROOT / "docs" / "gpu.md").read_text().splitlines()
    dali = []
    for r in rows:
        step = re.match(r"train step resnet50_tweaked (fp16|bf16) (\d+)px b(\d+)", r["name"])
        if step:
            dtype, px, batch = step.groups()
            result = r["result"] + " img/s (3 unpaired rounds)" if r["result"] != "pass" else "pass"
            row = f"| train step {dtype} {px} px b{batch} | {result} | {r['number']:,.0f} img/s |"
            assert row in gpu, row
        elif r["name"].startswith("train step resnet50 (v1.5)"):
            row = f"(floor: A100's 2,078 img/s x 90%) | {r['result']} | {r['number']:,.0f} img/s |"
            assert any(line.endswith(row) for line in gpu), row
        elif r["name"].startswith("DALI mixed decode"):
            dali.append(f"{r['number']:,.0f}")
    assert f"| {' / '.join(dali)} img/s |" in "\n".join(gpu)
    fp, bf = (
        next(r["number"] for r in rows if r["name"].startswith(f"train step resnet50_tweaked {d} 224px"))
        for d in ("fp16", "bf16")
    )
    quoted = (
        f"bf16 ran {100 * (1 - bf / fp):.0f}% slower than fp16 at 224 px on the H200 ({bf:,.0f} against {fp:,.0f} img/s"
    )
    assert quoted in _flat("docs/scaling.md")


def test_every_data_file_is_listed_with_its_command():
    listing = (ROOT / "docs" / "data" / "README.md").read_text()
    files = sorted(p.name for p in (ROOT / "docs" / "data").glob("*.json"))
    assert len(files) >= 9
    for name in files:
        assert f"`{name}`" in listing, name


def test_the_h200_clusters_predictions_quoted_in_scaling_are_the_models(tmp_path, capsys):
    """scaling.md's record recipe on 16 x 8 H200 / H100: the multistream spans and the per-step terms it quotes are
    what `scripts/predict.py` gives from the committed H200 profile."""
    from scripts import predict

    def multistream(*args: str) -> dict:
        out = tmp_path / "p.json"
        assert predict.main([*args, "--json", str(out)]) == 0
        capsys.readouterr()
        [b] = [b for b in json.loads(out.read_text())["backends"] if b["backend"] == "multistream"]
        return b

    def span(b: dict) -> str:
        return "-".join(f"{b['train_s'][k]:.0f}" for k in ("low", "mid", "high"))

    profile = multistream("--gpu-profile", "docs/data/gpu_profile-h200-2026-12-04.json")
    text = _flat("docs/scaling.md")
    low, mid, high = span(profile).split("-")
    assert f"gives multistream **{low}-{mid}-{high} s** on the training clock" in text
    terms = ("compute", "step floor", "intra-host", "exposed comm", "sync")
    steps = {}
    for ph in profile["phases"]:
        ms = ph["step_ms"]
        steps.setdefault(ph["image_size"], " + ".join("0" if ms[t] == 0 else f"{ms[t]:.1f}" for t in terms))
    quoted = ", ".join(f"{px} px {s}" for px, s in steps.items())
    assert f"compute + step floor + intra-host + exposed comm + sync): {quoted}." in text
    h200, h100, bf16 = (
        multistream(*a) for a in (["--gpu", "h200"], ["--gpu", "h100"], ["--gpu", "h100", "--dtype", "bf16"])
    )
    assert f"gives {span(h200)} s, and `--gpu h100` (fp16, as the H100 presets) {span(h100)} s." in text
    assert f"`--gpu h100 --dtype bf16`: {span(bf16)} s)" in text


def test_the_step_floor_table_is_the_h200_profile():
    """scaling.md's step-floor table: measured rate and step from the profile, the GPU's arithmetic per pixel from
    the 224 px step; the bare-loop and bf16 rates quoted under it from the check file."""
    profile = json.loads((ROOT / "docs" / "data" / "gpu_profile-h200-2026-12-04.json").read_text())["rates"]
    rows = json.loads((ROOT / "docs" / "data" / "gpu_check-h200-2026-12-04.json").read_text())["rows"]

    def check(prefix: str) -> dict:
        return next(r for r in rows if r["name"].startswith(prefix))

    step = {r["image_size"]: r["batch_size"] / r["images_per_s"] * 1000 for r in profile}
    doc = (ROOT / "docs" / "scaling.md").read_text().splitlines()
    for r in profile:
        px, batch = r["image_size"], r["batch_size"]
        rate = check(f"train step resnet50_tweaked fp16 {px}px")["number"]  # the profile keeps it to 0.1 img/s
        assert rate == pytest.approx(r["images_per_s"], abs=0.05)
        arithmetic = step[224] * (px / 224) ** 2 * batch / 256
        row = f"| {px} | {batch} | {rate:,.0f} | {step[px]:.1f} | {arithmetic:.1f} |"
        assert any(line.startswith(row) for line in doc), row

    bare = [check(f"train step resnet50_tweaked fp16 {px}px")["reference"].split(" img/s")[0][10:] for px in (96, 128)]
    text = _flat("docs/scaling.md")
    assert f"gave 34-37 ms there as well ({bare[0]} / {bare[1]} img/s)" in text
    bf16 = [f"{check(f'train step resnet50_tweaked bf16 {px}px')['number']:,.0f}" for px in (128, 224)]
    assert f"The bf16 rows of the same check ({bf16[0]} img/s at 128 px, {bf16[1]} at 224)" in text


def test_the_readmes_step_floor_is_the_time_models():
    from recipes.timemodel import rates

    ms = [s * 1000 for s in rates.HOST_FLOOR_STEPS]
    quoted = f"({sum(ms) / len(ms):.0f} ms; {min(ms):.0f}-{max(ms):.0f} ms on the two H200 hosts measured;"
    assert quoted in _flat("README.md")
