"""scripts/predict_balance.py: the balance advice never names a setting the engine refuses at start-up (the advice
in predict's output: tests/unit/test_predict.py)."""

from __future__ import annotations

from support import ROOT

from scripts.predict_balance import balance_lines


def test_the_advice_never_names_a_setting_the_engine_refuses():
    """Whatever the spread, the hosts and the transport: the `use:` line is a setting that flowrates.refusal (the
    engine's start-up rule) lets run on the config's transport; the record's 16 x 8 H100 preset at 0.33 gets the
    hierarchical ring."""
    from recipes import timemodel as tm
    from recipes.comm import flowrates
    from recipes.comm.link_figures import LinkFigures
    from recipes.config import load_config

    figures = LinkFigures(32.0, 10.0, 50.0, "")
    seen = set()
    for device in ("cuda", "cpu"):
        cfg = load_config(str(ROOT / "configs" / "presets" / "h100_16x8.yaml"), [f"run.device={device}"])
        for gpus in (1, 8):
            for spread in (0.2, 0.33, 0.5, 0.8):
                lines = balance_lines(cfg, tm.Cluster(16, gpus), figures, spread, 102_200_000)
                use = next(ln for ln in lines if ln.startswith("use: "))
                seen.add(use.split(" (")[0])
                if "even striping;" in use:
                    continue
                over = dict(kv.split("=", 1) for kv in use.split(" (")[0].removeprefix("use: ").split())
                why = flowrates.refusal(
                    balance=over["comm.balance"] == "true",
                    level=over.get("comm.balance_level", "communicator"),
                    hierarchy=over.get("comm.hierarchy", "none"),
                    transport="gloo" if device == "cpu" else "nccl",
                )
                assert why is None, (device, gpus, spread, use)
                if (device, gpus, spread) == ("cuda", 8, 0.33):
                    assert use.startswith("use: comm.balance=true comm.balance_level=hop comm.hierarchy=host (2.42x")
    # the grid reaches every kind of advice: the flat ring on CPU, the hierarchy on GPUs (at one GPU per host too:
    # NCCL refuses the flat ring), even striping where balancing gains under 5%
    assert seen == {
        "use: comm.balance=true comm.balance_level=hop",
        "use: comm.balance=true comm.balance_level=hop comm.hierarchy=host",
        "use: even striping; balancing gains under 5% on this network",
    }, seen
