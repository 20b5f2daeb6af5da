"""scripts/gpu_check/gpu_check_perf.py on the CPU (--smoke): every part runs its code path on tiny sizes, writes its
JSON after the part, and reports without judging; kernel names sort into the classes the GPU profile reports."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support import ROOT

from scripts.gpu_check.gpu_check_perf import kernel_class


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("cudnn::bn_fw_tr_1C11_singleread_fp16<512, 1, 2, 5, 4, 14, 0, true>", "batchnorm"),
        ("void at::native::batch_norm_collect_statistics_channels_last_kernel<c10::BFloat16>", "batchnorm"),
        ("triton_red_fused__native_batch_norm_legit_functional_relu_3", "batchnorm"),
        ("sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x64", "convolution"),
        ("aten::mkldnn_convolution", "convolution"),
        ("aten::convolution_backward", "convolution"),
        ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedSgdMathFunctor>", "optimizer"),
        ("aten::_foreach_add_", "optimizer"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "elementwise"),
        ("triton_poi_fused_add_relu_12", "elementwise"),
        ("aten::empty_strided", "other"),
    ],
)
def test_kernel_names_sort_into_classes(name, cls):
    assert kernel_class(name) == cls


def _smoke(tmp_path, *parts):
    out = tmp_path / "perf.json"
    cmd = [sys.executable, "-m", "scripts.gpu_check.gpu_check_perf", "--smoke", "--out", str(out)]
    cmd += ["--work", str(tmp_path / "work"), "--parts", *parts]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.exists(), p.stderr[-3000:]
    return p, json.loads(out.read_text())


def test_kernels_and_dali_loop_smoke(tmp_path):
    p, rep = _smoke(tmp_path, "kernels", "dali_loop")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert [d["part"] for d in rep["parts_done"]] == ["kernels", "dali_loop"]
    kernels = rep["raw"]["kernels"]
    assert [(k["model"], k["dtype"]) for k in kernels] == [
        ("test_resnet", "fp16"),
        ("test_resnet", "bf16"),
        ("resnet10t", "fp16"),
    ]
    for k in kernels:
        assert k["kernel_ms"]["convolution"] > 0 and k["kernel_ms"]["batchnorm"] > 0 and k["ms_per_step"] > 0
    loop = rep["raw"]["dali_loop"]
    assert [d["size"] for d in loop] == [32] and loop[0]["dali"] > 0 and loop[0]["synthetic"] > 0
    names = [r["name"] for r in rep["rows"]]
    assert "bf16/fp16 step time" in names and "dali loader cost 32 px" in names
    assert not [r for r in rep["rows"] if r["result"].startswith("fail")]
    assert all(r["result"] == "n/a: reported" for r in rep["rows"] if r["number"] is not None)  # CPU: not judged
    assert (tmp_path / "work" / "jpegs" / "train").is_dir()


@pytest.mark.slow
def test_compile_smoke_reports_cold_and_warm_seconds(tmp_path):
    p, rep = _smoke(tmp_path, "compile")
    assert p.returncode == 0, p.stderr[-3000:]
    c = rep["raw"]["compile"]["compile"]
    assert c["cold"]["cache"] == "cold" and c["warm"]["cache"] == "warm"
    assert 0 < c["warm"]["compile_s"] < c["cold"]["compile_s"]
    assert rep["raw"]["compile"]["eager_ms"] > 0 and rep["raw"]["compile"]["compiled_ms"] > 0
