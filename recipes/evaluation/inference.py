"""Optimized batch-1 inference: the `--optimize` modes, each turned into a runner `uint8 image -> logits`.

Every runner takes the uint8 NCHW crop (what the decoder gives) on its device and returns float logits; the
normalization is part of the graph, so that compiled and exported models fuse it with the first layer.
`build_runner(mode, model, example, calibration)` is the one entry point; `MODES` lists what each mode does.
"""

from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from base.errors import ConfigError
from base.writer import write_output
from data.transforms import IMAGENET_MEAN, IMAGENET_STD


@dataclass(frozen=True)
class Mode:
    help: str
    fold_bn: bool = True  # fold BatchNorm into the preceding convolution, channels_last
    compile: str = "never"  # torch.compile: "never", "always", or "cuda" (only on a GPU)
    dtype: torch.dtype = torch.float32
    quantize: bool = False  # post-training static INT8, calibrated
    engine: str = "torch"  # "torch" or "onnxruntime"
    devices: tuple[str, ...] = ("cpu", "cuda")


MODES: dict[str, Mode] = {
    "none": Mode("eager fp32 as trained: the reference every other mode is compared with", fold_bn=False),
    "fuse": Mode("BatchNorm folded into the convolutions, channels_last, eager fp32"),
    "compile": Mode(
        "fuse + inductor, weights frozen and constant-folded: compiled ahead of time (AOTInductor) on CPU, "
        "torch.compile with CUDA graphs on GPU; fp32",
        compile="always",
    ),
    "int8": Mode(
        "post-training static INT8: PT2E with the x86 inductor quantizer, calibrated on training images, "
        "compiled like compile (CPU)",
        fold_bn=False,
        compile="always",
        quantize=True,
        devices=("cpu",),
    ),
    "fp16": Mode(
        "fuse + float16 weights and activations; compiled with CUDA graphs on GPU, eager on CPU",
        compile="cuda",
        dtype=torch.float16,
    ),
    "bf16": Mode(
        "fuse + bfloat16 weights and activations; compiled with CUDA graphs on GPU, eager on CPU",
        compile="cuda",
        dtype=torch.bfloat16,
    ),
    "onnxruntime": Mode(
        "the peer: the fp32 model exported to ONNX, run by ONNX Runtime (all graph optimizations)",
        fold_bn=False,
        engine="onnxruntime",
    ),
    "onnxruntime-int8": Mode(
        "ONNX Runtime's own static INT8 (QDQ, per-channel weights) calibrated on the same images as int8 (CPU)",
        fold_bn=False,
        quantize=True,
        engine="onnxruntime",
        devices=("cpu",),
    ),
}


def check_mode(name: str, device: torch.device | str) -> Mode:
    """The Mode called `name`, or a ConfigError naming the valid modes / why it cannot run on `device`."""
    if name not in MODES:
        raise ConfigError(f"--optimize: unknown mode '{name}' (expected one of {', '.join(MODES)})")
    mode = MODES[name]
    kind = torch.device(device).type
    if kind not in mode.devices:
        raise ConfigError(f"--optimize {name}: runs on {' or '.join(mode.devices)} only, not on {kind}")
    return mode


@dataclass
class Runner:
    """A built mode: `fn(uint8 [1,3,H,W] on device) -> float logits`, plus what was done to build it."""

    mode: str
    fn: Callable[[torch.Tensor], torch.Tensor]
    device: torch.device
    info: dict = field(default_factory=dict)


class Classifier(nn.Module):
    """uint8 NCHW image -> logits: normalization (and the memory format) inside the graph."""

    def __init__(self, model: nn.Module, channels_last: bool = False, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.model, self.channels_last, self.dtype = model, channels_last, dtype
        std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1).to(dtype), persistent=False)
        self.register_buffer("inv_std", (1.0 / std).to(dtype), persistent=False)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = (image.to(self.dtype) - self.mean) * self.inv_std
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.model(x).float()


def fold_bn(model: nn.Module) -> nn.Module:
    """A copy of `model` (eval) with every BatchNorm that directly follows a conv/linear folded into its weights."""
    from torch.fx.experimental.optimization import fuse

    return fuse(copy.deepcopy(model).eval())


def count_bn(model: nn.Module) -> int:
    return sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def _need(module: str, mode: str, pip: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"--optimize {mode}: needs the '{pip}' package (pip install {pip})") from None


def _compile(module: nn.Module, device: torch.device, example: torch.Tensor):
    """Inductor for batch-1 inference, compiled now. Freezing folds the weights in as constants (pre-packed oneDNN
    weights, conv+add+ReLU fused on CPU). On CPU the graph is compiled ahead of time (AOTInductor: one C++ library,
    no Python guards or wrapper between kernels); on GPU torch.compile "reduce-overhead" replays the whole model as
    one CUDA graph."""
    import torch._inductor.config as inductor_config

    if device.type == "cpu":
        with torch.no_grad(), inductor_config.patch(freezing=True), tempfile.TemporaryDirectory() as tmp:
            program = torch.export.export(module, (example,))
            package = torch._inductor.aoti_compile_and_package(program, package_path=str(Path(tmp) / "model.pt2"))
            compiled = torch._inductor.aoti_load_package(package)
        compiled(example)
        return compiled
    compiled = torch.compile(module, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad(), inductor_config.patch(freezing=True):
        for _ in range(3):  # compile, then record and settle the CUDA graph
            compiled(example)
    return compiled


def _calibration_list(calibration: Iterable[torch.Tensor] | None, mode: str) -> list[torch.Tensor]:
    images = list(calibration or [])
    if not images:
        raise ConfigError(f"--optimize {mode}: needs calibration images (training images, see --calib-images)")
    return images


def _quantize_pt2e(module: nn.Module, example: torch.Tensor, calibration: list[torch.Tensor]) -> nn.Module:
    _need("torchao", "int8", "torchao")
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    exported = torch.export.export(module, (example,)).module()
    quantizer = X86InductorQuantizer()
    quantizer.set_global(get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(exported, quantizer)
    with torch.no_grad():
        for image in calibration:
            prepared(image)
    return convert_pt2e(prepared)


def build_runner(
    name: str,
    model: nn.Module,
    example: torch.Tensor,
    calibration: Iterable[torch.Tensor] | None = None,
    threads: int | None = None,
) -> Runner:
    """Turn a trained fp32 `model` into the runner of mode `name` on `example`'s device.

    example: a uint8 [1, 3, H, W] image on the target device (fixes the shape that compiled modes specialize on).
    calibration: uint8 images for the INT8 modes (a few hundred training images).
    threads: ONNX Runtime intra-op threads (default: torch's, so that both engines use the same cores).
    """
    device = example.device
    mode = check_mode(name, device)
    model = copy.deepcopy(model).float().eval().to(device)
    info: dict = {"mode": name, "help": mode.help, "device": str(device), "dtype": str(mode.dtype).split(".")[-1]}
    if mode.engine == "onnxruntime":
        return _build_onnxruntime(
            name, mode, model, example=example, calibration=calibration, threads=threads, info=info
        )
    if mode.fold_bn:
        before = count_bn(model)
        model = fold_bn(model)
        info["bn_folded"] = before - count_bn(model)
        model = model.to(memory_format=torch.channels_last)
    module = Classifier(model, channels_last=mode.fold_bn, dtype=mode.dtype).to(device=device, dtype=mode.dtype)
    module.eval()
    if mode.quantize:
        images = _calibration_list(calibration, name)
        module = _quantize_pt2e(module, example, images)
        info["calibration_images"] = len(images)
    compiled = mode.compile == "always" or (mode.compile == "cuda" and device.type == "cuda")
    info["compiled"] = compiled
    info["cuda_graphs"] = compiled and device.type == "cuda"
    fn = _compile(module, device, example) if compiled else module
    return Runner(name, _no_grad(fn), device, info)


def _no_grad(fn):
    def run(image: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return fn(image)

    return run


# ---------------------------------------------------------------------------------------------------------
# ONNX export and the ONNX Runtime peer.


def export_onnx(model: nn.Module, image_size: int, path: str | Path) -> Path:
    """Write `model` (fp32, eval) as ONNX: input 'image' uint8 [1, 3, S, S], output 'logits' float [1, classes]."""
    _need("onnxscript", "onnx export", "onnxscript")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    module = Classifier(copy.deepcopy(model).float().cpu()).eval()
    example = torch.zeros(1, 3, image_size, image_size, dtype=torch.uint8)
    program = torch.onnx.export(
        module,
        (example,),
        dynamo=True,
        input_names=["image"],
        output_names=["logits"],
        verbose=False,
        report=False,
    )
    # serialized here and written by the one writer: never through a link planted after the flag was checked
    write_output(path, program.model_proto.SerializeToString(), "--export-file", ConfigError)
    return path


class _CalibrationReader:
    """ONNX Runtime's calibration interface over our uint8 images."""

    def __init__(self, images: list[torch.Tensor]):
        self.images = iter(images)

    def get_next(self):
        image = next(self.images, None)
        return None if image is None else {"image": image.cpu().numpy()}


def _build_onnxruntime(name, mode, model, *, example, calibration, threads, info) -> Runner:
    ort = _need("onnxruntime", name, "onnxruntime")
    device = example.device
    workdir = Path(tempfile.mkdtemp(prefix="onnx-"))
    path = export_onnx(model, example.shape[-1], workdir / "model.onnx")
    if mode.quantize:
        from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
        from onnxruntime.quantization.shape_inference import quant_pre_process

        images = _calibration_list(calibration, name)
        pre = workdir / "model.pre.onnx"
        quant_pre_process(str(path), str(pre))
        path = workdir / "model.int8.onnx"
        quantize_static(
            str(pre),
            str(path),
            _CalibrationReader(images),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
            # logits stay fp32, as in the PT2E int8 mode (a clipped logit range loses the ranking)
            extra_options={"OpTypesToExcludeOutputQuantization": ["Gemm", "MatMul"]},
        )
        info["calibration_images"] = len(images)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads or torch.get_num_threads()
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    providers = ["CPUExecutionProvider"]
    if device.type == "cuda":
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise ConfigError(
                f"--optimize {name} on cuda: ONNX Runtime has no CUDA provider (pip install onnxruntime-gpu)"
            )
        providers = [("CUDAExecutionProvider", {"device_id": device.index or 0})]
    session = ort.InferenceSession(str(path), options, providers=providers)
    info.update(
        {
            "onnx_file_bytes": os.path.getsize(path),
            "provider": session.get_providers()[0],
            "threads": options.intra_op_num_threads,
            "onnxruntime": ort.__version__,
        }
    )
    fn = _ort_cuda_fn(session, device) if device.type == "cuda" else _ort_cpu_fn(session)
    fn(example)  # first run initializes the session's kernels
    return Runner(name, fn, device, info)


def _ort_cpu_fn(session):
    def run(image: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(session.run(None, {"image": image.numpy()})[0])

    return run


def _ort_cuda_fn(session, device: torch.device):
    """Feed the device tensor to ONNX Runtime in place (I/O binding): no copy through the host."""
    import numpy as np

    binding = session.io_binding()

    def run(image: torch.Tensor) -> torch.Tensor:
        image = image.contiguous()
        binding.bind_input("image", "cuda", device.index or 0, np.uint8, list(image.shape), image.data_ptr())
        binding.bind_output("logits", "cuda", device.index or 0)
        torch.cuda.current_stream(device).synchronize()
        session.run_with_iobinding(binding)
        return torch.from_numpy(binding.copy_outputs_to_cpu()[0])

    return run


__all__ = ["MODES", "Classifier", "Runner", "build_runner", "check_mode", "export_onnx", "fold_bn"]
