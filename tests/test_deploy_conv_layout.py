"""Conv layouts of the "onnx" deploy model (amct_engine/export/conv_layout.py): (k x 1) kernels run as
(1 x k), convs on 1-3 input channels get zero channels up to 4, big convs go to ORT's QGEMM path on AMX;
each leaves every output bit-identical to the graph without the rewrite, and ORT still runs every layer in
its int8 kernels."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper
from torch import nn

import amct_engine as amct
import amct_engine.export.qdq.finalize as finalize
from amct_engine.export.qdq.fusion_report import FUSED_OPS, deploy_report, optimized_ops
from job_process.report import onnx_parameters
from tests.deploy_targets import full_int8_exact_here, record_exact_target


class TallNet(nn.Module):
    """A pitch tracker's layout: [N, 1, 64, 1], (17 x 1) and (5 x 1) convs, (2 x 1) max-pool, a Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, (17, 1), padding=(8, 0))
        self.bn1 = nn.BatchNorm2d(16)
        self.pool = nn.MaxPool2d((2, 1))
        self.conv2 = nn.Conv2d(16, 16, (5, 1), stride=(2, 1), padding=(2, 0))
        self.fc = nn.Linear(16 * 16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(torch.relu(self.conv2(x)), 1))


class RgbNet(nn.Module):
    """Three input channels into a 3x3 conv of 16 channels, then a 3x3 conv on 16 (aligned already)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 16, 3, stride=2, padding=1)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        return self.fc(torch.flatten(x, 1))


def _save(net: type[nn.Module], x: torch.Tensor, tmp_path, name: str, **options) -> tuple[np.ndarray, dict]:
    torch.manual_seed(0)
    model = net().eval()
    config, record = tmp_path / f"{name}.json", tmp_path / f"{name}_record.txt"
    amct.create_quant_retrain_config(str(config), model, x)
    qmodel = amct.create_quant_retrain_model(str(config), model, str(record), x).eval()
    with torch.no_grad():
        qmodel(x)  # calibration: the record
        expected = qmodel(x).numpy()
    paths = amct.save_quant_retrain_model(str(config), qmodel, str(record), str(tmp_path / name), x, **options)
    return expected, paths


def _run(path: str, x: torch.Tensor) -> np.ndarray:
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]


def _qlinear_convs(path: str) -> dict[str, onnx.NodeProto]:
    return {n.name.split("/")[0]: n for n in optimized_ops(onnx.load(path)).graph.node if n.op_type == "QLinearConv"}


def _kernel(node: onnx.NodeProto) -> list[int]:
    return list(next(a.ints for a in node.attribute if a.name == "kernel_shape"))


def test_tall_kernels_run_as_wide_kernels_with_bit_identical_outputs(tmp_path, monkeypatch):
    x = torch.randn(8, 1, 64, 1, generator=torch.Generator().manual_seed(3))
    expected, paths = _save(TallNet, x, tmp_path, "wide", deploy_target=record_exact_target())
    report = deploy_report(paths["deploy"])
    assert report["conv_layout"]["wide_kernels"] == ["conv1/Conv", "conv2/Conv"] and report["not_fused"] == {}
    convs = _qlinear_convs(paths["deploy"])
    assert {layer: _kernel(node) for layer, node in convs.items()} == {"conv1": [1, 17], "conv2": [1, 5]}
    ops = [n.op_type for n in optimized_ops(onnx.load(paths["deploy"])).graph.node]
    last = max(i for i, op in enumerate(ops) if op in FUSED_OPS)
    glue = {"QuantizeLinear", "Transpose", "Reshape", "Flatten", "NhwcMaxPool", "Clip"}
    assert [op for op in ops[:last] if op not in FUSED_OPS | glue] == []  # int8 from the first conv to the fc

    monkeypatch.setattr(finalize, "tall_kernels_as_wide", lambda model: [])
    _, reference = _save(TallNet, x, tmp_path, "tall", deploy_target=record_exact_target())
    assert all(_kernel(n)[1] == 1 for n in _qlinear_convs(reference["deploy"]).values())
    deploy = _run(paths["deploy"], x)
    np.testing.assert_array_equal(deploy, _run(reference["deploy"], x))  # the same integers, another layout
    np.testing.assert_array_equal(_run(paths["fake_quant"], x), expected)
    assert np.abs(deploy - expected).max() <= 0.02 * np.abs(expected).max()  # the requantisations round


@pytest.mark.parametrize("target", ["x86_vnni", "x86_avx2", "x86_avx2_u8u8"])
def test_convs_on_three_channels_get_a_fourth_zero_channel_where_weights_are_int8(tmp_path, monkeypatch, target):
    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(4))
    expected, paths = _save(RgbNet, x, tmp_path, target, deploy_target=target)
    model = onnx.load(paths["deploy"])
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    padded = target != "x86_avx2_u8u8"  # MLAS's symmetric conv takes int8 weights with zero point 0 only
    assert deploy_report(model)["conv_layout"]["padded_input_channels"] == (["conv1/Conv"] if padded else [])
    assert weights["conv1.weight"].shape == ((16, 4, 3, 3) if padded else (16, 3, 3, 3))
    if padded:
        assert not weights["conv1.weight"][:, 3].any()
    # report.json counts the model's weights: the zero channel is the kernel's layout, not a weight.
    assert onnx_parameters(paths["deploy"])["weights"] == sum(
        p.numel() for n, p in RgbNet().named_parameters() if n.endswith("weight")
    )
    ops = [n.op_type for n in optimized_ops(model).graph.node]
    assert ops.count("QLinearConv") == 2 and "Conv" not in ops and ops.count("Pad") == int(padded)
    if target == "x86_vnni" and not full_int8_exact_here():
        return  # 8-bit int8 weights saturate on this CPU: nothing exact to compare (export.deploy_target)
    monkeypatch.setitem(finalize.TARGET_REWRITES, "padded_input_channels", lambda model: [])
    _, reference = _save(RgbNet, x, tmp_path, f"{target}_ref", deploy_target=target)
    np.testing.assert_array_equal(_run(paths["deploy"], x), _run(reference["deploy"], x))
    assert (
        np.abs(_run(paths["deploy"], x) - expected).max()
        <= (0.02 if target != "x86_avx2" else 0.05) * np.abs(expected).max()
    )  # the requantisations round (and x86_avx2's 7-bit weights)


class StemNet(nn.Module):
    """ResNet's stem: a 7x7 stride-2 conv on three channels."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 7, stride=2, padding=3)
        self.fc = nn.Linear(16 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(torch.relu(self.conv1(x)), 1))


@pytest.mark.parametrize("net, shape", [(TallNet, (2, 1, 64, 1)), (StemNet, (2, 3, 16, 16))], ids=["1x512", "7x7"])
def test_kernels_over_3x3_stay_unpadded(tmp_path, net, shape):
    """Padding lost on long kernels (1 channel under 1x512: four times the multiplies, 2.4x the time) and on
    ResNet-18's 7x7 stem (1.3x slower padded inside the network; conv_int8_paths._padding_pays)."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(5))
    _, paths = _save(net, x, tmp_path, "big_kernel", deploy_target="x86_vnni")
    assert deploy_report(paths["deploy"])["conv_layout"]["padded_input_channels"] == []


class GreyStemNet(nn.Module):
    """A greyscale image's stem (3x3 on one channel), ReLU and max-pool, then an int8 conv and a Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 16, 3, stride=2, padding=1)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        return self.fc(torch.flatten(torch.relu(self.conv2(x)), 1))


def test_a_one_channel_stem_runs_float_on_its_codes_and_stays_exact(tmp_path, monkeypatch):
    """QLinearConv on one input channel ran 4.4x slower than onnxruntime's float NCHWc conv (conv_float_stems.py):
    the stem sums its integer codes in float, rescales once after the pool, and the outputs stay the eval model's."""
    x = torch.rand(8, 1, 16, 16, generator=torch.Generator().manual_seed(7))
    expected, paths = _save(GreyStemNet, x, tmp_path, "stem", deploy_target="x86_vnni")
    report = deploy_report(paths["deploy"])
    assert report["conv_layout"]["float_stems"] == ["conv1/Conv"] and set(report["not_fused"]) == {"conv1"}
    assert "by design" in report["not_fused"]["conv1"] and report["conv_layout"]["padded_input_channels"] == []
    model = onnx.load(paths["deploy"])
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert weights["conv1.weight"].dtype == np.int8 and weights["conv1.bias"].dtype == np.int32  # the file's bytes
    ops = [n.op_type for n in optimized_ops(model).graph.node]
    assert ops.count("QLinearConv") == 1 and "ConvInteger" not in ops and "QGemm" in ops
    assert onnx_parameters(paths["deploy"])["weights"] == sum(
        p.numel() for n, p in GreyStemNet().named_parameters() if n.endswith("weight")
    )
    if not full_int8_exact_here():
        return  # 8-bit int8 weights saturate on this CPU: nothing exact to compare (export.deploy_target)
    np.testing.assert_array_equal(_run(paths["deploy"], x), expected)
    monkeypatch.setitem(finalize.TARGET_REWRITES, "float_stems", lambda model: [])
    _, reference = _save(GreyStemNet, x, tmp_path, "stem_ref", deploy_target="x86_vnni")
    np.testing.assert_array_equal(_run(paths["deploy"], x), _run(reference["deploy"], x))


class BigBiasStemNet(GreyStemNet):
    """A stem channel with tiny weights and a bias of 1: its int32 bias code (bias / (input x weight scale))
    is ~1e9, past 2^24, where float32 no longer holds the conv's integer sums exactly."""

    def __init__(self) -> None:
        super().__init__()
        with torch.no_grad():
            self.conv1.weight[0] *= 1e-4
            self.conv1.bias[0] = 1.0


def test_a_stem_whose_sums_float32_cannot_hold_stays_an_int8_conv(tmp_path):
    x = torch.rand(8, 1, 16, 16, generator=torch.Generator().manual_seed(7))
    expected, paths = _save(BigBiasStemNet, x, tmp_path, "big_bias", deploy_target="x86_vnni")
    report = deploy_report(paths["deploy"])
    assert report["conv_layout"]["float_stems"] == [] and report["layers"]["conv1"] == "QLinearConv"
    if full_int8_exact_here():
        np.testing.assert_array_equal(_run(paths["deploy"], x), expected)


class WideNet(nn.Module):
    """A 3x3 conv on 3 channels (too shallow for AMX), a 64 -> 64 3x3 conv on 16x16 outputs (9.4M multiply-adds
    an image: AMX pays), a 1x1 conv (too shallow), a Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, padding=1)
        self.conv2 = nn.Conv2d(64, 64, 3, padding=1)
        self.conv3 = nn.Conv2d(64, 16, 1, stride=4)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv3(torch.relu(self.conv2(torch.relu(self.conv1(x))))))
        return self.fc(torch.flatten(x, 1))


def test_amx_moves_big_convs_to_the_gemm_path_with_the_same_integers(tmp_path):
    """x86_amx (conv_int8_paths.convs_on_the_gemm_path): a big conv's weight zero point becomes an overridable
    initialiser of zeros, so onnxruntime's QLinearConv leaves its symmetric kernel for QGEMM (AMX tiles where
    the CPU has them). The user still sees one input, ORT still fuses, the outputs are the x86_vnni file's."""
    x = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(6))
    expected, amx = _save(WideNet, x, tmp_path, "amx", deploy_target="x86_amx")
    _, vnni = _save(WideNet, x, tmp_path, "vnni", deploy_target="x86_vnni")
    report = deploy_report(amx["deploy"])
    assert report["conv_layout"]["gemm_path_convs"] == ["conv2/Conv"]
    assert report["not_fused"] == {} and {report["layers"][c] for c in ("conv1", "conv2", "conv3")} == {"QLinearConv"}
    assert deploy_report(vnni["deploy"])["conv_layout"]["gemm_path_convs"] == []
    model = onnx.load(amx["deploy"])
    onnx.checker.check_model(model, full_check=True)
    user_input = model.graph.input[0].name
    assert [i.name for i in model.graph.input] == [user_input, "conv2.weight_zero_point"]
    zero_point = next(t for t in model.graph.initializer if t.name == "conv2.weight_zero_point")
    assert zero_point.data_type == onnx.TensorProto.INT8 and not numpy_helper.to_array(zero_point).any()
    session = ort.InferenceSession(amx["deploy"], providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == [user_input]
    if not full_int8_exact_here():
        return  # 8-bit int8 weights saturate on this CPU: nothing exact to compare (export.deploy_target)
    np.testing.assert_array_equal(_run(amx["deploy"], x), _run(vnni["deploy"], x))
    assert np.abs(_run(amx["deploy"], x) - expected).max() <= 0.02 * np.abs(expected).max()
