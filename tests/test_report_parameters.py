"""report.json's weight counts: the layers' weight tensors only, and for integer models the codes that
differ from their zero point (a code equal to it dequantises to 0), so quantisation adds no "non-zeros"."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from job_process.report import onnx_parameters


def _save(tmp_path, nodes, initializers, inputs, name="m.onnx") -> str:
    graph = helper.make_graph(
        nodes,
        "g",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(v, k) for k, v in initializers.items()],
    )
    path = tmp_path / name
    onnx.save(helper.make_model(graph), path)
    return str(path)


def test_a_float_conv_counts_its_weight_zeros_but_not_its_bias(tmp_path):
    weight = np.ones((2, 1, 2, 2), np.float32)
    weight[0, 0, 0, :] = 0  # two pruned weights
    bias = np.zeros(2, np.float32)  # zeros here are no pruning
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])
    path = _save(tmp_path, [helper.make_node("Conv", ["x", "w", "b"], ["y"])], {"w": weight, "b": bias}, [x])
    assert onnx_parameters(path) == {"total": 10, "weights": 8, "nonzero_weights": 6}


def test_integer_codes_count_against_their_per_channel_zero_point(tmp_path):
    codes = np.array([[[[0, 1], [2, 3]]], [[[3, 3], [0, 4]]]], np.int8)  # channel 1's zero point is 3
    zero_points = np.array([0, 3], np.int8)
    x = helper.make_tensor_value_info("x", TensorProto.INT8, [1, 1, 4, 4])
    nodes = [
        helper.make_node("ConvInteger", ["x", "w", "", "wzp"], ["c"]),
        helper.make_node("Cast", ["c"], ["y"], to=TensorProto.FLOAT),
    ]
    path = _save(tmp_path, nodes, {"w": codes, "wzp": zero_points}, [x])
    # channel 0: the 0 is zero; channel 1: the two 3s are zero, the 0 is not (it dequantises to -3 * scale).
    assert onnx_parameters(path) == {"total": 10, "weights": 8, "nonzero_weights": 5}


def test_a_fake_quant_weight_behind_dequantize_and_transpose(tmp_path):
    codes = np.array([[5, 5, 7], [1, 5, 5]], np.uint8)  # zero point 5: two codes mean something
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])
    constant = helper.make_node("Constant", [], ["codes"], value=numpy_helper.from_array(codes))
    nodes = [
        constant,
        helper.make_node("DequantizeLinear", ["codes", "scale", "zp"], ["w"]),
        helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "wt"], ["y"]),
    ]
    path = _save(tmp_path, nodes, {"scale": np.array(0.1, np.float32), "zp": np.array(5, np.uint8)}, [x])
    assert onnx_parameters(path) == {"total": 8, "weights": 6, "nonzero_weights": 2}


def test_a_matmul_of_two_activations_has_no_weights(tmp_path):
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 2])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 2])
    path = _save(tmp_path, [helper.make_node("MatMul", ["a", "b"], ["y"])], {}, [a, b])
    assert onnx_parameters(path) == {"total": 0, "weights": 0, "nonzero_weights": 0}


def test_a_matmul_integer_to_float_counts_its_codes_against_their_per_column_zero_point(tmp_path):
    codes = np.array([[128, 3], [128, 0]], np.uint8)  # column 0's zero point is 128, column 1's is 0
    inits = {
        "w": codes,
        "sa": np.array(0.1, np.float32),
        "sw": np.array([0.1, 0.2], np.float32),
        "za": np.array(128, np.uint8),
        "zw": np.array([128, 0], np.uint8),
        "bias": np.zeros(2, np.float32),
    }
    x = helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 2])
    node = helper.make_node(
        "MatMulIntegerToFloat", ["x", "w", "sa", "sw", "za", "zw", "bias"], ["y"], domain="com.microsoft"
    )
    path = _save(tmp_path, [node], inits, [x])
    assert onnx_parameters(path) == {"total": 12, "weights": 4, "nonzero_weights": 1}
