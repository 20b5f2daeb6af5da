"""lab/lab_methods.py: the network lab's methods point at registered backends or bring their own step
model and builder, and the lab's bench and `lab/predict_lab.py` take their methods from them."""

from __future__ import annotations

import json

import pytest

from base import registry
from lab import bench_allreduce, predict_lab
from lab.lab_methods import LAB_METHODS
from recipes.comm import stepmodel


def test_every_lab_method_is_a_registered_backend_or_brings_its_model_and_builder():
    for m in LAB_METHODS.values():
        assert bool(m.backend) != bool(m.step_model and m.build), m.name
        if m.backend:
            assert m.backend in registry.ALLREDUCE_BACKENDS, m.name
        else:  # a lab-only baseline: the step model predict_step knows it by, and the bench's builder
            assert registry.resolve(m.step_model) is stepmodel.pattern(m.name), m.name
            assert callable(registry.resolve(m.build)), m.name
        assert m.model in stepmodel.BACKENDS


def test_a_backends_plain_method_is_measured_by_default():
    """A backend the lab measures has one method at its defaults (no flows, tuner or overrides), measured by default;
    a backend without a method is simply not in the lab's tables."""
    for name in {m.backend for m in LAB_METHODS.values() if m.backend}:
        plain = [m for m in LAB_METHODS.values() if m.backend == name and not (m.flows or m.tuned or m.overrides)]
        assert [m.name for m in plain] == [name] and plain[0].default, name


def test_the_bench_and_validate_take_their_methods_from_the_lab():
    """predict_lab.py checks the default methods, the lab's ranks run those without a launcher of their own
    (in the table's order) and the own-launcher one runs apart."""
    assert list(predict_lab.LAB_METHODS) == [n for n, m in LAB_METHODS.items() if m.default]
    assert bench_allreduce.METHODS + [bench_allreduce.APART] == sorted(
        LAB_METHODS, key=lambda n: LAB_METHODS[n].own_launcher
    )


def test_the_bench_help_lists_every_lab_method(capsys):
    with pytest.raises(SystemExit):
        bench_allreduce.main(["--help"])
    text = capsys.readouterr().out
    for name, m in LAB_METHODS.items():
        assert f"  {name:<12} {m.what}\n" in text
    assert "  ddp-flows    the same DDP on a gloo group of --flows devices (comm.gloo_devices)" in text


def test_workers_past_the_timeout_are_stopped_and_said_to_be_so():
    """The bench's workers that run past --timeout are stopped with one error naming the timeout (the first one
    stopped would otherwise read as a dead peer in the others' tracebacks)."""
    import sys

    sleeper = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"]
    with pytest.raises(RuntimeError, match=r"ran past --timeout 1.5 s and were stopped: give a longer --timeout") as e:
        bench_allreduce._launch(2, sleeper, lambda i: {}, None, 1.5)
    assert "started" in str(e.value)
    assert bench_allreduce._launch(2, [sys.executable, "-c", "pass"], lambda i: {}, None, 30) == [(0, ""), (0, "")]


@pytest.mark.parametrize(
    "flag, value, said",
    [
        ("--packet-segs", "0", "packet_segs: expected 1 to 64 MSS per packet, got 0"),
        ("--burst-ms", "0", "burst_ms: expected 0.1 to 1000 ms, got 0.0"),
        ("--contenders", "ddp-flows,hop-balanced", "--contenders hop-balanced in the lab needs --profile (even for"),
    ],
)
def test_a_bad_lab_shaping_flag_is_one_line_before_anything_runs(capsys, flag, value, said):
    with pytest.raises(SystemExit) as e:
        bench_allreduce.main(["--no-loopback", "--worlds", "2", flag, value])
    assert e.value.code == 2
    assert f": error: {said}" in capsys.readouterr().err.splitlines()[-1]


def test_timed_meters_only_the_timed_steps_and_reads_after_the_closing_sync():
    sent = {"c": 0}
    order = []

    def step():
        sent["c"] += 100  # every step, warm-up ones too, sends 100 bytes
        order.append("step")

    def sync():
        order.append("sync")
        sent["c"] += 7  # what was still in flight when the last step ended arrives before the barrier is through

    def meter():
        order.append("meter")
        return dict(sent)

    times, cpu, grew = bench_allreduce._timed(step, 2, 3, sync, meter)
    assert len(times) == len(cpu) == 3
    assert grew == {"c": 307}  # the 3 timed steps and what arrived by the closing sync; not the 2 warm-up steps
    assert order == ["step", "step", "sync", "meter", "step", "step", "step", "sync", "meter"]


def test_the_fit_measures_a_step_where_its_last_rank_ends_it():
    from lab import predict_flows

    ranks = [[4.0, 6.0, 4.0, 6.0], [6.0, 6.0, 6.1, 6.0]]
    rec = {"torch": {"compute_s": 0.5, "m": {"step_s": 4.5, "rank_times": ranks}}}
    assert predict_flows.measured_s(rec, "m") == pytest.approx(6.0 - 0.5)  # steps end at 6.0, 6.0, 6.1, 6.0
    del rec["torch"]["m"]["rank_times"]  # an older record: rank 0's median
    assert predict_flows.measured_s(rec, "m") == pytest.approx(4.0)


def test_the_fit_names_the_file_and_run_whose_connections_it_cannot_read(tmp_path):
    from lab import predict_flows

    conns = [[[1, "10.250.0.2", 2, 13.3, 1000]], [[3, "10.250.0.1", 4, None, 1000]]]  # host 1's pin is missing
    t = {"compute_s": 0.0, "bytes": 1000, "ddp-flows": {"step_s": 1.0, "connections": None}}
    rec = {"hosts": 2, "profile": "even", "seed": 0, "link_mbit": 40.0, "flow_mbit": 13.3, "torch": t}
    t["connections"] = {"ddp-flows": conns}
    path = tmp_path / "lab.json"
    path.write_text(json.dumps([rec]))
    with pytest.raises(SystemExit, match=r"lab\.json \(2 hosts, even seed 0, ddp-flows\): connections: host 1's"):
        predict_flows.fit_rows([str(path)], 4, {"ddp-flows": "devices"})


def test_the_fit_models_horovod_by_the_ring_its_connections_carried(tmp_path):
    """Horovod under its own launcher (a top-level entry): its one data connection per host is one ring, at its
    slowest hop; fitted on the even run (0.9 of the model), the one-slow run predicted; a run without it adds no row."""
    from lab import predict_flows

    def rec(profile, ceilings, step_s):
        conns = [
            [[10 + h, "10.250.0.9", 20, c, 1_000_000], [30 + h, "10.250.0.9", 40, 13.3, 3000]]
            for h, c in enumerate(ceilings)
        ]  # the ring's connection, and one carrying only control messages
        hvd = {"step_s": 99.0, "rank_times": [[step_s] * 2] * 2, "connections": conns}
        t = {"compute_s": 0.5, "bytes": 1000, "ddp-flows": {"step_s": 1.0}}
        return {
            "hosts": 2,
            "profile": profile,
            "seed": 0,
            "link_mbit": 40.0,
            "flow_mbit": 13.3,
            "torch": t,
            "horovod": hvd,
        }

    ring = 8.0 / 13.3  # 1 MB per hop at 13.3 Mbit/s
    runs = [rec("even", [13.3, 13.3], 0.5 + ring / 0.9), rec("one-slow", [13.3, 4.4], 0.5 + 8.0 / 4.4 / 0.9)]
    runs.append(dict(runs[1], horovod="not run"))
    path = tmp_path / "lab.json"
    path.write_text(json.dumps(runs))
    rows, worst = predict_flows.fit_rows([str(path)], 4, {"horovod": "rings"})
    assert rows[2:] == ["| 2 | 40 | one-slow | 0 | horovod | rings | 0.90 | 2020 | 2020 | +0% |"]
    assert worst == {"horovod": pytest.approx(0.0, abs=1e-9)}


def test_the_tables_cli_compares_horovod_where_the_records_hold_it(tmp_path, capsys):
    """uneven_tables' summary has Horovod's columns beside the balanced ring's when a record has Horovod's entry,
    and leaves its cells empty in a run without it."""
    from lab import uneven_tables

    def entry(step_s):
        return {"step_s": step_s, "settings": "s", "cpu_s": [0.1, 0.1]}

    def rec(seed, horovod):
        t = {"compute_s": 0.5, "bytes": 1_000_000, "ddp-flows": entry(2.5), "hop-balanced": entry(1.5)}
        return {"hosts": 2, "link_mbit": 40.0, "profile": "even", "seed": seed, "cpus": 2, "torch": t} | horovod

    path = tmp_path / "lab.json"
    path.write_text(json.dumps([rec(0, {"horovod": entry(4.5)}), rec(1, {"horovod": "not run"})]))
    assert uneven_tables.main([str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("| horovod vs ddp-flows (median, worst) | horovod, % of link cap (median) |")
    assert out[2] == "| 2 | 40 | even | 2 | 2.00x (2.00x) | 20% | 0.50x (0.50x) | 5% (1 runs) |"
    assert "| 2 | even | 0 | horovod | s | 4500 | 4000 | 5% | 0.50x | 2% |" in out
