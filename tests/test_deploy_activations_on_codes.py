"""Hardswish on integer codes and PReLU without ORT's float kernel (export/qdq/activations_on_codes.py): each
rewrite computes what the float chain it replaces computes, on every input code, and runs in ORT's int8 or
vectorised kernels."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from amct_engine.export.qdq.activations_on_codes import (
    hardswish_on_codes,
    prelu_without_float_kernel,
    snap_to_gate_grid,
)

EVERY_CODE = np.arange(256, dtype=np.uint8).reshape(1, 1, 16, 16)


def _chain(activation: onnx.NodeProto, params: dict[str, np.ndarray], shape=(1, 1, 16, 16)) -> onnx.ModelProto:
    """codes -> DequantizeLinear -> activation -> QuantizeLinear -> codes, as `boundaries` leaves it."""
    nodes = [
        helper.make_node("DequantizeLinear", ["codes", "in_scale", "in_zero"], ["x"], name="dq"),
        activation,
        helper.make_node("QuantizeLinear", ["y", "out_scale", "out_zero"], ["out"], name="q"),
    ]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("codes", TensorProto.UINT8, list(shape))],
        [helper.make_tensor_value_info("out", TensorProto.UINT8, list(shape))],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in params.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model: onnx.ModelProto, codes: np.ndarray, tmp_path=None) -> tuple[np.ndarray, list[str]]:
    """The output codes, and the op types of ORT's optimised graph (when tmp_path is given)."""
    options = ort.SessionOptions()
    if tmp_path is not None:
        options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    out = session.run(None, {"codes": codes})[0]
    ops = [n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node] if tmp_path else []
    return out, ops


@pytest.mark.parametrize("low, high", [(-8.0, 12.0), (-3.5, 40.0), (-1.0, 6.0), (-20.0, 2.5), (-0.2, 0.9)])
def test_a_hardswish_input_grid_covers_its_range_and_minus_3_with_a_scale_that_divides_3(low, high):
    scale, zero = (high - low) / 255, round(-low / ((high - low) / 255))
    snapped_scale, snapped_zero = snap_to_gate_grid(scale, zero)
    steps = 3 / float(snapped_scale)
    assert abs(steps - round(steps)) < 1e-4 and int(snapped_zero) >= round(steps)  # the gate's codes exist
    covered_low = -float(snapped_scale) * int(snapped_zero)
    covered_high = float(snapped_scale) * (255 - int(snapped_zero))
    assert covered_low <= min(low, -3.0) + float(snapped_scale) and covered_high >= high - float(snapped_scale)
    widest = (max(high, 0) - min(low, -3.0)) / 255
    assert float(snapped_scale) <= widest * (1 + 1 / (steps - 1)) + 1e-9  # grows by about one code in n


@pytest.mark.parametrize("low, high", [(-8.0, 12.0), (-3.0, 40.0), (-20.0, 2.5)])
def test_hardswish_on_codes_gives_the_float_chains_codes_and_runs_as_qlinearmul(low, high, tmp_path):
    scale, zero = snap_to_gate_grid((high - low) / 255, round(-low * 255 / (high - low)))
    out_scale = np.float32((high + 0.375) / 255)
    params = {
        "in_scale": scale,
        "in_zero": zero,
        "out_scale": out_scale,
        "out_zero": np.uint8(round(0.375 / float(out_scale))),
    }
    float_chain = _chain(helper.make_node("HardSwish", ["x"], ["y"], name="hardswish"), params)
    on_codes = onnx.ModelProto()
    on_codes.CopyFrom(float_chain)
    assert hardswish_on_codes(on_codes) == ["hardswish"]
    onnx.checker.check_model(on_codes)
    expected, _ = _run(float_chain, EVERY_CODE)
    got, ops = _run(on_codes, EVERY_CODE, tmp_path)
    difference = np.abs(got.astype(int) - expected.astype(int))
    assert difference.max() <= 1 and (difference == 0).mean() > 0.97  # QLinearMul rounds once, like the chain
    assert "QLinearMul" in ops and "HardSwish" not in ops and "HardSigmoid" not in ops, ops


def test_a_hardswish_input_off_the_grid_keeps_the_float_chain():
    params = {"in_scale": np.float32(0.07), "in_zero": np.uint8(100)}
    params |= {"out_scale": np.float32(0.05), "out_zero": np.uint8(8)}
    model = _chain(helper.make_node("HardSwish", ["x"], ["y"], name="hardswish"), params)
    assert hardswish_on_codes(model) == []
    assert [n.op_type for n in model.graph.node] == ["DequantizeLinear", "HardSwish", "QuantizeLinear"]


def _prelu_chain(slopes: np.ndarray) -> onnx.ModelProto:
    params = {
        "in_scale": np.float32(0.05),
        "in_zero": np.uint8(128),
        "out_scale": np.float32(0.04),
        "out_zero": np.uint8(60),
        "slope": slopes.astype(np.float32).reshape(-1, 1, 1),
    }
    return _chain(helper.make_node("PRelu", ["x", "slope"], ["y"], name="prelu"), params, (1, len(slopes), 16, 16))


def test_a_per_channel_prelu_becomes_max_of_x_and_its_product_bit_identical(tmp_path):
    slopes = np.array([0.02, 0.25, 0.6, 1.0, -0.3])  # a negative slope too: max(x, a x) holds for every a <= 1
    prelu = _prelu_chain(slopes)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(prelu)
    assert prelu_without_float_kernel(rewritten) == ["prelu"]
    codes = np.broadcast_to(EVERY_CODE, (1, len(slopes), 16, 16)).copy()
    expected, _ = _run(prelu, codes)
    got, ops = _run(rewritten, codes, tmp_path)
    np.testing.assert_array_equal(got, expected)
    assert "PRelu" not in ops and "Max" in ops


def test_one_slope_for_every_channel_is_a_leaky_relu_in_int8(tmp_path):
    prelu = _prelu_chain(np.full(4, 0.25))
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(prelu)
    prelu_without_float_kernel(rewritten)
    codes = np.broadcast_to(EVERY_CODE, (1, 4, 16, 16)).copy()
    expected, _ = _run(prelu, codes)
    got, ops = _run(rewritten, codes, tmp_path)
    assert np.abs(got.astype(int) - expected.astype(int)).max() <= 1
    assert "QLinearLeakyRelu" in ops and "PRelu" not in ops, ops


def test_a_slope_above_one_keeps_the_prelu():
    prelu = _prelu_chain(np.array([0.5, 1.5]))
    assert prelu_without_float_kernel(prelu) == []
    assert "PRelu" in [n.op_type for n in prelu.graph.node]
