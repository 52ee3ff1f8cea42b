"""Piecewise-linear activations without onnxruntime's slow float kernels (docs/spec/engine.md §5, "Int8
around activations"): hardswish on integer codes, PReLU as LeakyRelu or as a Mul and a Max.

After `boundaries` both run in float between a DequantizeLinear and a QuantizeLinear, and both cost more
there than the int8 convs around them gain (MobileNetV3, MTCNN's ONet: docs/benchmarks.md, "Mobile CNNs").

- HardSwish(x) = x * clip(x / 6 + 0.5, 0, 1). When the input's uint8 scale s divides 3 (n = 3 / s codes) and
  its range reaches -3 (zero point z >= n), the gate clip(x / 6 + 0.5, 0, 1) = (s / 6) * (clip(q, z - n, z + n)
  - (z - n)) is the input's codes clipped, read with scale s / 6 and zero point z - n: exact. The graph becomes
  `DQ(q) * DQ(Clip(q))` before the output's QuantizeLinear, which ORT fuses into QLinearMul: a uint8 Clip and
  an int8 multiply instead of DequantizeLinear + HardSwish + QuantizeLinear (0.44 against 1.42 ms on a
  [8, 72, 56, 56] tensor, one thread, AVX-512 VNNI). `boundaries` gives such inputs that grid
  (`snap_to_gate_grid`): their range reaches -3 (below it the activation is 0) and grows by at most 1 / n.
- PReLU(x) = max(x, a * x) wherever every slope a <= 1 (bit-identical: the same product): ORT's PRelu kernel
  took 10.3 ms where Mul + Max took 0.94 ms on a [32, 32, 46, 46] tensor. One slope for every channel is a
  LeakyRelu, which ORT runs in int8 (QLinearLeakyRelu) between the quantisers already there.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from amct_engine.export.qdq.graph_index import GraphIndex

HARDSWISH_BREAK = 3.0  # HardSwish's gate is 0 below -3 and 1 above 3 (ONNX: alpha 1/6, beta 0.5)


def snap_to_gate_grid(scale: float, zero_point: int) -> tuple[np.float32, np.uint8] | None:
    """uint8 parameters that cover the calibrated range and -3, with a scale that divides 3 (module doc); None
    when the range is so wide that one code exceeds 3."""
    low = min(-scale * zero_point, -HARDSWISH_BREAK)
    high = scale * (255 - zero_point)
    steps = math.floor(HARDSWISH_BREAK / ((high - low) / 255) + 1e-6)  # 3 / (3 / 85) is 84.99999...
    if steps < 1:
        return None
    snapped = np.float32(HARDSWISH_BREAK / steps)
    return snapped, np.uint8(min(round(-low / float(snapped)), 255))


def _constant(g: GraphIndex, name: str) -> np.ndarray | None:
    return numpy_helper.to_array(g.initializers[name]) if name in g.initializers else None


def _gate_steps(g: GraphIndex, dequantize: onnx.NodeProto) -> tuple[int, int] | None:
    """(n, z) of a uint8 DequantizeLinear whose scale divides 3 into n steps and whose zero point z >= n."""
    if len(dequantize.input) != 3:
        return None
    scale, zero = _constant(g, dequantize.input[1]), _constant(g, dequantize.input[2])
    if scale is None or zero is None or scale.size != 1 or zero.dtype != np.uint8:
        return None
    steps = HARDSWISH_BREAK / float(scale)
    n, z = round(steps), int(zero)
    return (n, z) if n >= 1 and abs(steps - n) < 1e-3 and z >= n else None


def _add_initializer(g: GraphIndex, name: str, value: np.ndarray) -> str:
    tensor = numpy_helper.from_array(value, name)
    g.model.graph.initializer.append(tensor)
    g.initializers[name] = tensor
    return name


def hardswish_on_codes(model: onnx.ModelProto) -> list[str]:
    """Rewrite `DQ(q) -> HardSwish` as `DQ(q) * DQ(Clip(q))` where the input's grid allows (module doc); the
    names of the HardSwish nodes rewritten."""
    return _rewrite_each(model, "HardSwish", _hardswish_nodes)


def prelu_without_float_kernel(model: onnx.ModelProto) -> list[str]:
    """Every PRelu with constant slopes as LeakyRelu (one slope) or as Max(x, a * x) (all slopes <= 1); the
    names of the PRelu nodes rewritten."""
    return _rewrite_each(model, "PRelu", _prelu_nodes)


def _hardswish_nodes(g: GraphIndex, node: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    dequantize = g.producer.get(node.input[0])
    grid = _gate_steps(g, dequantize) if dequantize is not None and dequantize.op_type == "DequantizeLinear" else None
    if dequantize is None or grid is None:
        return None
    (n, z), base = grid, (node.name or node.output[0]).strip("/").replace("/", ".")
    bounds = [_add_initializer(g, f"{base}.gate_low", np.array(z - n, np.uint8))]
    if z + n < 255:  # the codes never pass 255: no upper clip needed there
        bounds.append(_add_initializer(g, f"{base}.gate_high", np.array(z + n, np.uint8)))
    gate_scale = np.float32(numpy_helper.to_array(g.initializers[dequantize.input[1]]) / 6)
    gate_params = [
        _add_initializer(g, f"{base}.gate_scale", np.array(gate_scale)),
        _add_initializer(g, f"{base}.gate_zero_point", np.array(z - n, np.uint8)),
    ]
    return [
        helper.make_node("Clip", [dequantize.input[0], *bounds], [f"{base}.gate_codes"], name=f"{node.name}/GateClip"),
        helper.make_node(
            "DequantizeLinear", [f"{base}.gate_codes", *gate_params], [f"{base}.gate"], name=f"{node.name}/Gate"
        ),
        helper.make_node("Mul", [node.input[0], f"{base}.gate"], [node.output[0]], name=f"{node.name}/Mul"),
    ]


def _prelu_nodes(g: GraphIndex, node: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    slope = _constant(g, node.input[1])
    x, y = node.input[0], node.output[0]
    if slope is None:
        return None
    if np.all(slope == slope.flat[0]):
        return [helper.make_node("LeakyRelu", [x], [y], name=f"{node.name}/LeakyRelu", alpha=float(slope.flat[0]))]
    if float(slope.max()) > 1.0:
        return None
    scaled = f"{y}.negative_part"
    return [
        helper.make_node("Mul", [x, node.input[1]], [scaled], name=f"{node.name}/Mul"),
        helper.make_node("Max", [x, scaled], [y], name=f"{node.name}/Max"),
    ]


def _rewrite_each(model: onnx.ModelProto, op_type: str, replacement) -> list[str]:
    """Each `op_type` node for which `replacement(g, node)` gives nodes replaced by them; the names replaced."""
    g = GraphIndex(model)
    rewritten: list[str] = []
    new_nodes: dict[int, list[onnx.NodeProto]] = {}
    for index, node in enumerate(model.graph.node):
        nodes = replacement(g, node) if node.op_type == op_type else None
        if nodes:
            new_nodes[index] = nodes
            rewritten.append(node.name)
    _replace_nodes(model, new_nodes)
    return rewritten


def _replace_nodes(model: onnx.ModelProto, new_nodes: dict[int, list[onnx.NodeProto]]) -> None:
    """The node at each index of `new_nodes` replaced by its nodes, in place (the order stays topological)."""
    if not new_nodes:
        return
    ordered = [after for k, node in enumerate(model.graph.node) for after in new_nodes.get(k, [node])]
    del model.graph.node[:]
    model.graph.node.extend(ordered)
