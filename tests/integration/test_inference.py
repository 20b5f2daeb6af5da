"""Optimize modes: BN folding is exact, every mode agrees with eager fp32, ONNX export, clear errors."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import timm
import torch

import evaluate
from base.errors import ConfigError
from data.folder import scan_split
from data.transforms import normalize
from recipes.evaluation.accuracy import config_from_checkpoint, load_model
from recipes.evaluation.inference import MODES, Classifier, build_runner, check_mode, count_bn, fold_bn
from recipes.evaluation.latency import load_image
from recipes.rundir import checkpoint_files as ckpt


@pytest.fixture(scope="module")
def trained(tiny_checkpoint, tiny_root):
    """(model, val images as uint8 [1,3,32,32], train images for calibration) of the tiny checkpoint."""
    ck = ckpt.load_checkpoint(tiny_checkpoint)
    model = load_model(ck, config_from_checkpoint(ck)).eval()
    classes = ck.model_info.classes
    val = [load_image(f, 32, 0.875) for f in scan_split(tiny_root, "val", classes=classes).files]
    train = [load_image(f, 32, 0.875) for f in scan_split(tiny_root, "train", classes=classes).files]
    return model, val, train


def test_fold_bn_output_equals_unfused_within_1e_5():
    torch.manual_seed(0)
    model = timm.create_model("resnet26d", num_classes=10, zero_init_last=False).eval()
    for m in model.modules():  # non-trivial statistics, so that folding has something to get wrong
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    before = count_bn(model)
    fused = fold_bn(model)
    assert before == 31 and count_bn(fused) == 0  # resnet26d: every BN follows a convolution
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        ref, out = model(x), fused(x)
    assert ref.abs().max() > 0.1
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    assert count_bn(model) == before  # the original is untouched


def test_classifier_normalizes_uint8_inside():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 3)).eval()
    img = torch.randint(0, 256, (1, 3, 8, 8), dtype=torch.uint8)
    with torch.no_grad():
        torch.testing.assert_close(Classifier(net)(img), net(normalize(img, False)))
        torch.testing.assert_close(Classifier(net, channels_last=True)(img), net(normalize(img, True)))


def _agreement(trained, mode: str):
    model, val, train = trained
    ref = build_runner("none", model, val[0])
    run = build_runner(mode, model, val[0], calibration=train[::2], threads=1)  # 24 images, every class
    a = torch.cat([ref.fn(x) for x in val])
    b = torch.cat([run.fn(x) for x in val])
    return a, b, run


# mode: (max |logit difference| relative to the largest logit, minimum top-1 agreement)
TOLERANCE = {
    "fuse": (1e-5, 1.0),
    "compile": (1e-5, 1.0),
    "fp16": (1e-2, 1.0),
    "bf16": (5e-2, 0.95),
    "int8": (0.1, 0.9),
    "onnxruntime": (1e-5, 1.0),
    "onnxruntime-int8": (0.1, 0.9),
}


@pytest.mark.parametrize(
    "mode",
    [
        "fuse",
        "fp16",
        "bf16",
        "onnxruntime",
        "onnxruntime-int8",
        pytest.param("compile", marks=pytest.mark.slow),
        pytest.param("int8", marks=pytest.mark.slow),
    ],
)
def test_mode_agrees_with_eager_fp32(trained, mode):
    a, b, run = _agreement(trained, mode)
    rel, agree = TOLERANCE[mode]
    assert b.dtype == torch.float32 and b.shape == a.shape == (20, 4)
    assert float((a - b).abs().max() / a.abs().max()) <= rel
    assert float((a.argmax(1) == b.argmax(1)).float().mean()) >= agree
    if MODES[mode].quantize:
        assert run.info["calibration_images"] == 24
        assert float((a - b).abs().max()) > 0  # really quantized, not the fp32 graph
    if mode in ("fuse", "compile", "fp16", "bf16"):
        assert run.info["bn_folded"] == count_bn(trained[0]) > 0
    if MODES[mode].engine == "torch":
        assert run.info["compiled"] == (mode in ("compile", "int8"))  # fp16/bf16 compile on GPU only


def test_mode_errors_are_clear(trained, monkeypatch):
    with pytest.raises(ConfigError, match=r"unknown mode 'turbo' \(expected one of none, fuse, compile, int8"):
        check_mode("turbo", "cpu")
    with pytest.raises(ConfigError, match="--optimize int8: runs on cpu only, not on cuda"):
        check_mode("int8", "cuda")
    model, val, _ = trained
    with pytest.raises(ConfigError, match="needs calibration images"):
        build_runner("int8", model, val[0], calibration=[])
    monkeypatch.setitem(sys.modules, "torchao", None)  # as if torchao were not installed
    with pytest.raises(ConfigError, match=r"--optimize int8: needs the 'torchao' package \(pip install torchao\)"):
        build_runner("int8", model, val[0], calibration=val[:2])


def test_export_onnx_runs_in_onnxruntime_like_torch(tiny_checkpoint, trained, tmp_path, capsys):
    ort = pytest.importorskip("onnxruntime")
    path = tmp_path / "m.onnx"
    assert evaluate.main([str(tiny_checkpoint), "--export", "onnx", "--export-file", str(path)]) == 0
    assert f"wrote {path}" in capsys.readouterr().out
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (inp,), (outp,) = session.get_inputs(), session.get_outputs()
    assert (inp.name, inp.type, inp.shape, outp.name) == ("image", "tensor(uint8)", [1, 3, 32, 32], "logits")
    model, val, _ = trained
    with torch.no_grad():
        for x in val[:4]:
            want = model(normalize(x, False)).numpy()
            np.testing.assert_allclose(session.run(None, {"image": x.numpy()})[0], want, atol=1e-4, rtol=1e-4)


def test_export_onnx_writes_through_the_writer_never_through_a_link(tmp_path, monkeypatch):
    """torch.onnx.export wrote --export-file itself: a link planted after the flag's check was followed. The export
    is stood in for (as torch's: it writes to a path it is given, else returns the program), the write is real."""
    import types

    from recipes.evaluation.inference import export_onnx

    def fake_export(module, args, f=None, **kw):
        if f is not None:
            open(f, "wb").write(b"onnx")  # noqa: SIM115
        return types.SimpleNamespace(model_proto=types.SimpleNamespace(SerializeToString=lambda: b"onnx"))

    monkeypatch.setitem(sys.modules, "onnxscript", types.ModuleType("onnxscript"))
    monkeypatch.setattr(torch.onnx, "export", fake_export)
    model = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(3, 2))
    (tmp_path / "m.onnx").symlink_to(tmp_path / "victim")
    with pytest.raises(ConfigError, match=r"^--export-file: '.*m\.onnx' is a symbolic link"):
        export_onnx(model, 8, tmp_path / "m.onnx")
    assert not (tmp_path / "victim").exists()
    assert export_onnx(model, 8, tmp_path / "ok.onnx").read_bytes() == b"onnx"
