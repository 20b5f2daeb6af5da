"""The network lab's methods: the ways of averaging gradients that lab/bench_allreduce.py measures and
lab/predict_lab.py holds the step-time model against.

A method is a registered allreduce backend (base/registry.py `ALLREDUCE_BACKENDS`) at some settings, or a lab-only
baseline with its own step model and builder. They serve the lab's research, not a training run: a backend without a
method here trains, is predicted and is checked on a GPU all the same, and is simply not in the lab's tables.
"""

from __future__ import annotations

from dataclasses import dataclass

from base import registry


@dataclass(frozen=True)
class LabMethod:
    """A way of averaging gradients that the network lab measures (bench_allreduce) and the step-time model
    predicts (lab/predict_lab.py): a registered backend at some settings, or a lab-only baseline. Its name is
    its key in the lab's JSON (`torch.<name>`, or `<name>` for one with its own launcher)."""

    name: str
    backend: str  # the ALLREDUCE_BACKENDS record it measures; "" = lab-only (modelled by stepmodel under `name`)
    what: str  # what it runs, for the bench's --help
    flows: bool = False  # DDP on a gloo group of --flows devices: its settings end in "N flows"
    tuned: bool = False  # the backend after its tuner ran in the same process (the winner's settings are shown)
    default: bool = True  # measured unless --contenders says otherwise, and checked by lab/predict_lab.py
    overrides: tuple[str, ...] = ()  # config overrides of this variant of its backend (e.g. comm.balance=true)
    bucket_mb: float | None = None  # its backend's bucket key at full size (None: the config's default; x --fraction)
    # A lab-only method's "module:attribute": its step model (a recipes.comm.stepmodel.StepPattern), and the lab's
    # builder of its step, (model, params, one, world) -> (step, settings label). A backend's method is modelled
    # by its backend's record and built through recipes.comm.create_allreduce.
    step_model: str = ""
    build: str = ""

    @property
    def model(self) -> str:
        """The name recipes.comm.stepmodel.predict_step models it under: its backend's, or its own (lab-only)."""
        return self.backend or self.name

    @property
    def own_launcher(self) -> bool:
        """Runs under its backend's own launcher (a separate process group and JSON entry), not the lab's ranks."""
        return bool(self.backend) and registry.ALLREDUCE_BACKENDS[self.backend].launcher != "torchrun"


# The network lab's methods, in its tables' order.
LAB_METHODS = {
    m.name: m
    for m in (
        LabMethod(
            "per-tensor",
            "",
            "one blocking allreduce per gradient after backward (the naive baseline)",
            step_model="recipes.comm.stepmodel:PER_TENSOR",
            build="lab.bench_allreduce:per_tensor",
        ),
        LabMethod(
            "ddp", "ddp", "PyTorch DistributedDataParallel, bucket_cap_mb 25 (its default), one gloo device: one flow"
        ),
        LabMethod(
            "ddp-flows",
            "ddp",
            "the same DDP on a gloo group of --flows devices (comm.gloo_devices): its buckets spread over --flows TCP "
            "connections per peer, as many flows as multistream's K communicators",
            flows=True,
        ),
        LabMethod(
            "ddp_bf16", "ddp_bf16", "DDP with torch's bf16 compression hook (bf16_compress_hook): half DDP's bytes"
        ),
        LabMethod("multistream", "multistream", "our backend at the config defaults (comm.bucket_mb/streams/slices)"),
        LabMethod(
            "tuned",
            "multistream",
            "our backend after its auto-tuner ran in the same process (the winner's settings are shown)",
            tuned=True,
        ),
        LabMethod(
            "tuned-model",
            "multistream",
            "the tuner started from the step-time model's ranking for this lab, half the candidates",
            tuned=True,
            default=False,
            overrides=("comm.tune_start=model",),
        ),
        LabMethod(
            "balanced",
            "multistream",
            "our backend with comm.balance, timed once its balancer settled",
            default=False,
            overrides=("comm.balance=true",),
        ),
        LabMethod(
            "hop-balanced",
            "multistream",
            "our backend with comm.balance at hop level (a ring of point-to-point sends, each hop's chunk cut over "
            "its own connections), timed once its balancer settled",
            default=False,
            overrides=("comm.balance=true", "comm.balance_level=hop"),
            # K = 4 times DDP's default, so each of the ring's pieces (a bucket / W / K) is as large as one of DDP's
            # ring messages (a bucket / W) and it sends as many: ResNet-50's gradient is one bucket. With DDP's 25 MB
            # the ring sent K times DDP's messages, and 16 ranks on the lab's two cores paid for each; earlier runs
            # took 25 (their settings say 1.25 MB at --fraction 0.05).
            bucket_mb=100.0,
        ),
        LabMethod(
            "hier-balanced",
            "multistream",
            "our backend with comm.hierarchy=host: a reduce-scatter among the host's local ranks (gloo over loopback "
            "in the lab), the hop-balanced ring of each local rank between the hosts, an all-gather; timed once its "
            "balancer settled (bench_allreduce --local-ranks)",
            default=False,
            overrides=("comm.balance=true", "comm.balance_level=hop", "comm.hierarchy=host"),
            bucket_mb=100.0,  # hop-balanced's: each ring carries 1/L of a bucket, so its pieces are 1/L of that ring's
        ),
        LabMethod("horovod", "horovod", "real horovod.torch DistributedOptimizer, Horovod's defaults (gloo)"),
    )
}
