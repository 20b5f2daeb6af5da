"""The link probe (scripts/launcher/netprobe.py, `launch.py --probe-network`): the figures, the matrix, and a real
probe in the network lab that finds a shaped slow pair."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support import ROOT

sys.path.insert(0, str(ROOT / "scripts"))

from launcher.netprobe import matrix, network_overrides, summarize  # noqa: E402

from recipes.comm.link_figures import load_link_figures  # noqa: E402


def _pair(a, b, ranks, one, many, lat=60.0):
    return {"a": a, "b": b, "ranks": ranks, "one_flow_gbit": one, "n_flows_gbit": many, "latency_us": lat}


def test_summary_flags_the_slow_pair_and_gives_the_model_its_figures():
    pairs = [
        _pair("n1", "n2", [0, 1], 10.0, 31.0),
        _pair("n1", "n3", [0, 2], 10.0, 30.0, lat=80.0),
        _pair("n2", "n3", [1, 2], 9.0, 12.0),
    ]
    f = summarize(["n1", "n2", "n3"], pairs, flows=4, seconds=1.0)
    assert f["slow_pairs"] == [["n2", "n3"]] and f["slowest"] == ["n2", "n3"]
    assert (f["link_gbit"], f["flow_gbit"], f["latency_us"]) == (12.0, 10.0, 60.0)  # slowest link, typical flow
    assert network_overrides(f) == ["comm.link_gbit=12", "comm.flow_gbit=10", "comm.latency_us=60"]
    text = "\n".join(matrix(f))
    assert "9.00G/12.00G !" in text and "slow pair: n2 <-> n3: 12.00Gbit/s" in text
    # No per-flow cap (one flow fills the link): the model is told there is none.
    flat = summarize(["a", "b"], [_pair("a", "b", [0, 1], 0.95, 1.0)], flows=4, seconds=1.0)
    assert flat["flow_gbit"] is None and flat["slow_pairs"] == []
    assert "comm.flow_gbit=null" in network_overrides(flat)


def test_each_connections_rate_gives_the_spread_and_names_the_uneven_pair(tmp_path):
    even, slow = [10.0, 10.0, 10.0, 10.0], [13.3, 13.3, 13.3, 4.4]
    pairs = [_pair("n1", "n2", [0, 1], 10.0, 40.0), _pair("n1", "n3", [0, 2], 10.0, 34.0)]
    pairs[0]["connections_gbit"] = {"a_to_b": even, "b_to_a": [10.0, 9.0, 10.0, 8.0]}
    pairs[1]["connections_gbit"] = {"a_to_b": slow, "b_to_a": even}
    f = summarize(["n1", "n2", "n3"], pairs, flows=4, seconds=1.0)
    assert (pairs[0]["flow_spread"], pairs[0]["uneven"]) == (0.8421, False)  # the worse direction's
    assert (pairs[1]["flow_spread"], pairs[1]["uneven"]) == (0.3308, True)
    assert f["flow_spread"] == 0.3308 and f["uneven_pairs"] == [["n1", "n3"]]
    assert f["link_gbit"] == 34.0 and f["flow_gbit"] == 10.0  # the fields older readers use, as before
    lines = matrix(f)
    assert (
        "connections n1 -> n3: 13.30G 13.30G 13.30G 4.40G (spread 0.33); n3 -> n1: 10.00G 10.00G 10.00G 10.00G "
        "(spread 1.00)  uneven: balancing pays (n1 <-> n3)"
    ) in lines
    line = next(x for x in lines if x.startswith("connections n1 -> n2: "))
    assert "(spread 0.84)" in line and "uneven" not in line
    # the reader hands every measured direction to the time model; a probe without them gives none
    (tmp_path / "n.json").write_text(json.dumps(f))
    assert load_link_figures(tmp_path / "n.json").connections_gbit == (
        tuple(even),
        (10.0, 9.0, 10.0, 8.0),
        tuple(slow),
        tuple(even),
    )
    old = summarize(["a", "b"], [_pair("a", "b", [0, 1], 1.0, 3.0)], flows=4, seconds=1.0)
    assert "flow_spread" not in old and not [x for x in matrix(old) if x.startswith("connections")]
    (tmp_path / "o.json").write_text(json.dumps(old))
    assert load_link_figures(tmp_path / "o.json").connections_gbit == ()


def _netlab_missing() -> str | None:
    from lab import netlab

    return netlab.available()


NETLAB_MISSING = _netlab_missing()


@pytest.mark.slow
@pytest.mark.netns
@pytest.mark.skipif(NETLAB_MISSING is not None, reason=NETLAB_MISSING or "")
def test_probe_finds_the_slow_pair_in_the_network_lab(tmp_path):
    """3 hosts, 400 Mbit/s links with 150 Mbit/s per flow; the pair h0 <-> h1 shaped to 80 Mbit/s in the switch.
    The probe, run by the launcher through the netns transport, flags that pair and measures it within 10%."""
    from lab import netlab

    slow_mbit = 80
    with netlab.NetLab(3, link_mbit=400, flow_mbit=150) as lab:
        # The switch's port towards host j sends what host i sent it: a class of its own for the other host of the
        # pair, at the slow rate, whatever the number of flows.
        for j, i in ((1, 0), (0, 1)):
            for rule in (
                f"class add dev p{j} parent 1: classid 1:3 htb rate {slow_mbit}mbit ceil {slow_mbit}mbit "
                "burst 64k cburst 64k quantum 1514",
                f"filter add dev p{j} parent 1: prio 1 protocol ip u32 match ip src {lab.addr(i)}/32 flowid 1:3",
            ):
                subprocess.run(["ip", "netns", "exec", lab.switch, "tc", *rule.split()], check=True)
        hostfile = tmp_path / "hosts"
        hostfile.write_text("".join(f"{lab.names[i]} addr={lab.addr(i)}\n" for i in range(3)))
        run_dir = tmp_path / "run"
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        argv = [sys.executable, str(ROOT / "scripts" / "launch.py"), "--hostfile", str(hostfile)]
        argv += ["--transport", "netns", "--iface", "eth0", "--run-dir", str(run_dir), "--probe-network"]
        argv += ["--probe-seconds", "1", "--probe-flows", "4", "--timeout", "240", "-c", "configs/quickstart.yaml"]
        p = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    f = json.loads((run_dir / "network.json").read_text())
    assert f["hosts"] and sorted(f["hosts"]) == sorted(lab.names)
    assert f["slow_pairs"] == [sorted(lab.names[:2], key=f["hosts"].index)], f
    slow = next(x for x in f["pairs"] if {x["a"], x["b"]} == set(lab.names[:2]))
    assert abs(slow["gbit"] * 1000 - slow_mbit) < 0.1 * slow_mbit, slow
    others = [x for x in f["pairs"] if x is not slow]
    for x in others:  # one flow held to its cap, several fill more of the link
        assert x["one_flow_gbit"] * 1000 < 170 and x["n_flows_gbit"] > 1.5 * x["one_flow_gbit"], x
    assert f["link_gbit"] == slow["gbit"] and 0.12 < f["flow_gbit"] < 0.17  # the per-flow cap of 150 Mbit/s
    assert "slow pair:" in p.stdout and "link figures written to" in p.stdout
    for x in f["pairs"]:  # every connection timed on its own, both directions
        assert all(len(r) == 4 and min(r) > 0 for r in x["connections_gbit"].values()), x
    assert 0 < f["flow_spread"] <= 1 and "connections " in p.stdout
