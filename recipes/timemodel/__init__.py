"""How long a schedule takes on a cluster: a time model with every cost a term of its own, calibrated on published runs.

A phase of the schedule costs, per step (training clock):
    compute       the GPU's own arithmetic for a full training step at the phase's image size and batch, from a
                  rate table per GPU (published PyTorch figures, the H200 measured here, or a `make gpu-check`
                  profile): per resolution, not per pixel
    step floor    the part of the step the GPU waits for the host: a step costs max(arithmetic, floor), the floor
                  found in a rate table without a fit (split_floor: small images whose steps stop shrinking)
    intra-host    the same step inside a host of G GPUs: they share the host's CPUs, PCIe and NVLink (published
                  1-GPU vs 8-GPU throughput of the same code)
    exposed comm  the inter-host allreduce that backward does not hide (recipes/comm/stepmodel.py, per backend)
    sync          every step ends in a collective that waits for the slowest of N GPUs: a GPU's step-time jitter
                  sigma costs sigma x (sqrt(2 ln N) - sqrt(2 ln G)) more on H hosts than on one
    small coll.   latency-bound collectives besides the gradients' (none in this trainer; old published code)
and, per phase, the input pipeline's rebuild and the autotuning of new convolution shapes when the image size or
batch changes. The wall clock adds, per epoch, the BN-statistics allreduce and validation, and once the start-up.
DAWNBench's training clock (the TSV's hours) stops during validation and starts after start-up: in both Alibaba
entries the first epoch takes as long as the next, and the trainer here counts the same way (recipes/epoch_clock.py).

Each term carries a low-mid-high range; a prediction's range is the sum, and it names the term that contributes the
widest part. Numbers that come from a fit say so (`Calibration`): the V100 shape of rate against resolution
comes from Alibaba's 1 x 8 entry, sigma from the record's 16 x 8 entry.

The package, one job per module:
    rates       a rate table per GPU and its step floor (published, measured here, or a gpu-check profile)
    profile     when each gradient is ready during backward (the model's FLOPs on the meta device)
    terms       sync, validation, BN allreduce, start-up, the comm model's range: value, range and source each
    estimate    Cluster, Phase, Backend and `estimate`: a schedule's terms on a cluster
    calibration the fit's residuals on the published runs, as lab/timemodel_evidence.py wrote them to
                docs/data/timemodel-evidence.json (read when asked; the evidence is research, not product)
    entry       `predict`, `predicted_seconds` and `predicted_estimate` for other tools, `calibrated_compute` for
                the autotuner's start
    imagenet    ImageNet-1k's sizes
    inputs      the input term: the images per second DALI decodes per GPU, measured on an H200
"""

from __future__ import annotations

from recipes.timemodel.calibration import calibration_lines, calibration_rows
from recipes.timemodel.entry import (
    calibrated_compute,
    cluster_shape,
    predict,
    predicted_estimate,
    predicted_seconds,
)
from recipes.timemodel.estimate import (
    Backend,
    Cluster,
    Estimate,
    Phase,
    PhaseEstimate,
    Term,
    backends,
    entry_phases,
    estimate,
    exposed_comm_s,
    schedule_phases,
    step_compute,
)
from recipes.timemodel.imagenet import (
    IMAGENET_TRAIN_IMAGES,
    VAL_IMAGES,
)
from recipes.timemodel.inputs import InputRate, input_rate
from recipes.timemodel.profile import (
    GradProfile,
    profile_model,
)
from recipes.timemodel.rates import (
    ALIBABA_1X8_BATCH,
    ALIBABA_1X8_EPOCH_S,
    DATA,
    DTYPES,
    FASTAI_1X8_EPOCH_S,
    FLOOR_WHY,
    H100_OF_H200,
    H200_BF16,
    H200_CHECK,
    H200_PROFILE,
    H200_RERUN,
    HOST_FLOOR_STEPS,
    MEASURED,
    NO_PUBLISHED,
    NVIDIA_TF_XLA_V100,
    PUBLISHED,
    GpuRates,
    ProfileError,
    Rate,
    gpu_for_device,
    gpu_names,
    load_gpu_profile,
    measured,
    published,
    split_floor,
)
from recipes.timemodel.terms import (
    BnAllreduce,
    CommUncertainty,
    StartUp,
    Sync,
    Validation,
)

__all__ = [
    "cluster_shape",
    "predicted_estimate",
    "InputRate",
    "input_rate",
    "predicted_seconds",
    "ALIBABA_1X8_BATCH",
    "ALIBABA_1X8_EPOCH_S",
    "Backend",
    "BnAllreduce",
    "Cluster",
    "CommUncertainty",
    "DATA",
    "DTYPES",
    "Estimate",
    "FASTAI_1X8_EPOCH_S",
    "FLOOR_WHY",
    "GpuRates",
    "GradProfile",
    "H100_OF_H200",
    "H200_BF16",
    "H200_CHECK",
    "H200_PROFILE",
    "H200_RERUN",
    "HOST_FLOOR_STEPS",
    "IMAGENET_TRAIN_IMAGES",
    "MEASURED",
    "NO_PUBLISHED",
    "NVIDIA_TF_XLA_V100",
    "PUBLISHED",
    "Phase",
    "PhaseEstimate",
    "ProfileError",
    "Rate",
    "StartUp",
    "Sync",
    "Term",
    "VAL_IMAGES",
    "Validation",
    "backends",
    "calibrated_compute",
    "calibration_lines",
    "calibration_rows",
    "entry_phases",
    "estimate",
    "exposed_comm_s",
    "gpu_for_device",
    "gpu_names",
    "load_gpu_profile",
    "measured",
    "predict",
    "profile_model",
    "published",
    "schedule_phases",
    "split_floor",
    "step_compute",
]
