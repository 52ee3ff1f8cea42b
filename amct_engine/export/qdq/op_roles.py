"""What each op of an exported graph is to the QDQ planner (export/qdq/boundaries.py): whether onnxruntime
runs it in int8 between quantisers, runs it in float between them, or clamps (docs/spec/engine.md §5,
"Int8 around activations").

- Commuting ops (MaxPool, Reshape, ...): quantisation passes through them exactly, so their input takes
  their output's parameters.
- Int8 ops: ORT's QDQ selectors fuse `DequantizeLinear -> op -> QuantizeLinear` into an int8 kernel
  (QLinearAdd, QLinearConcat, QLinearGlobalAveragePool, QLinearSigmoid, QLinearLeakyRelu, QLinearMul),
  drop the pair (MaxPool, Reshape), or we rewrite the op (BatchNormalization after a ReLU).
- Gated products: a Mul one of whose inputs is a Sigmoid or HardSigmoid output, i.e. SiLU / swish
  (x * sigmoid(x)) and a squeeze-excite gate (x * sigmoid(fc(x))): QLinearMul. Other Muls stay float,
  so a transformer's GELU (x * 0.5 * (1 + erf(x / sqrt 2))) is not cut into int8 pieces.
- Float-between ops: ORT has no int8 kernel (HardSwish, HardSigmoid, PRelu, Tanh, ...): the op runs in
  float between a DequantizeLinear and a QuantizeLinear, which lets the layers on both sides fuse; HardSwish
  and PRelu are then rewritten into ops ORT runs faster (export/qdq/activations_on_codes.py).
- Clamps (Relu, Clip with constant bounds): quantising after the clamp is the clamp of the codes, so the
  layer before it takes the clamp's output quantiser; ORT drops the clamp when the quantiser's range lies
  inside the clamp's bounds, and elsewhere we clamp the codes (boundaries._Insertions.clamp_on_codes).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from amct_engine.export.qdq.graph_index import GraphIndex

COMMUTING_OPS = {"MaxPool", "Flatten", "Reshape", "Identity", "Dropout", "Transpose", "Squeeze", "Unsqueeze"}

INT8_OPS = COMMUTING_OPS | {  # and Clip with constant bounds, and gated products (runs_in_int8)
    "Relu",
    "Add",
    "Concat",
    "GlobalAveragePool",
    "AveragePool",
    "BatchNormalization",
    "Sigmoid",
    "LeakyRelu",
    "Split",  # a C2f block's halves, split on the codes (export/qdq/codes.py)
}

GATES = {"Sigmoid", "HardSigmoid"}

FLOAT_BETWEEN_OPS = {"HardSwish", "HardSigmoid", "PRelu", "Tanh", "Elu", "Selu", "Celu", "Softplus", "Mish"}

# Outputs whose range is known: quantised over it exactly instead of over a calibrated one.
BOUNDED_OUTPUTS = {"Sigmoid": (0.0, 1.0), "HardSigmoid": (0.0, 1.0), "Tanh": (-1.0, 1.0)}


def clamp_bounds(g: GraphIndex, node: onnx.NodeProto) -> tuple[float, float] | None:
    """(low, high) of a Relu or of a Clip whose bounds are constants, else None."""
    if node.op_type == "Relu":
        return 0.0, float("inf")
    if node.op_type != "Clip":
        return None
    bounds = []
    for index, default in ((1, -np.inf), (2, np.inf)):
        name = node.input[index] if len(node.input) > index else ""
        if name and name not in g.initializers:
            return None
        bounds.append(float(numpy_helper.to_array(g.initializers[name])) if name else default)
    return bounds[0], bounds[1]


def commutes(node: onnx.NodeProto) -> bool:
    """Quantisation passes through the op exactly: a reshaping, a max, a nearest-neighbour upsampling."""
    if node.op_type == "Resize":
        mode = next((a.s for a in node.attribute if a.name == "mode"), b"nearest")
        return mode == b"nearest"
    return node.op_type in COMMUTING_OPS


def runs_in_int8(g: GraphIndex, node: onnx.NodeProto) -> bool:
    if commutes(node):
        return True
    if node.op_type == "Clip":
        return clamp_bounds(g, node) is not None
    if node.op_type == "Mul":
        producers = [g.producer.get(name) for name in node.input]
        return all(p is not None for p in producers) and any(p.op_type in GATES for p in producers if p)
    return node.op_type in INT8_OPS


def passes_quantized_data(g: GraphIndex, node: onnx.NodeProto) -> bool:
    """Whether a quantised output of `node` makes its input worth quantising too (the planner's `leads`)."""
    return runs_in_int8(g, node) or node.op_type in FLOAT_BETWEEN_OPS


# Outputs bounded below whatever the input, at the function's minimum (docs/spec/engine.md §5, "Int8 around
# activations"): a calibrated range starts there at the lowest, so the calibration's margin is not spent below it.
LOWER_BOUNDS = {"HardSwish": -0.375, "Mish": -0.30884, "Softplus": 0.0}
SWISH_MINIMUM = -0.278465  # x * sigmoid(x) at x = -1.278465


def lower_bound(g: GraphIndex, node: onnx.NodeProto) -> float | None:
    """The least value `node`'s output can take (LOWER_BOUNDS, SiLU's x * sigmoid(x), Elu's -alpha), else None."""
    if node.op_type in LOWER_BOUNDS:
        return LOWER_BOUNDS[node.op_type]
    if node.op_type == "Elu":
        return -next((a.f for a in node.attribute if a.name == "alpha"), 1.0)
    if node.op_type == "Mul" and len(node.input) == 2:  # SiLU: x * Sigmoid(x)
        for x, gate in (node.input, reversed(node.input)):
            producer = g.producer.get(gate)
            if producer is not None and producer.op_type == "Sigmoid" and producer.input[0] == x:
                return SWISH_MINIMUM
    return None


def fixed_parameters(op_type: str) -> tuple[np.float32, np.uint8] | None:
    """uint8 (scale, zero point) covering a bounded output's whole range, e.g. 1/255 and 0 for a sigmoid."""
    if op_type not in BOUNDED_OUTPUTS:
        return None
    low, high = BOUNDED_OUTPUTS[op_type]
    scale = (high - low) / 255
    return np.float32(scale), np.uint8(round(-low / scale))
