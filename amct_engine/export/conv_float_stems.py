"""An image stem's conv in float on its integer codes: faster than QLinearConv, the same integers.

A rewrite of the QDQ deploy graph for the x86 targets with int8 weights (export/deploy_target.py
`DeployTarget.rewrites`), chosen by measurement on onnxruntime 1.32's CPU kernels:

- `float_stems` (x86_vnni, x86_amx and x86_avx2, before the padding): a conv on one input channel with a 2-D
  kernel up to 3x3 (a greyscale image's stem) has too little depth per output for the int8 GEMM: QLinearConv
  took 702 µs per batch of 64 on the 20k-parameter Fashion-MNIST CNN's 28x28 stem, padded or not, where onnxruntime's
  float NCHWc conv took 157 µs (one thread, minimum). Such a conv runs float on its integer codes (input
  codes less the zero point, weight codes, int32 bias), with the rescale by input x weight scale moved
  after the ReLU and max-pool: the same integer sums and the same single multiply as the eval model, so
  the codes the next layer reads are bit for bit the same (the whole model: 598 against 1,012 µs, FP32
  532 µs). Only where every partial sum is an integer float32 holds exactly (below 2^24). ResNet-18's
  7x7 stem on 3 channels ran slower so (whole model at batch 8: 21.9 against 18.7 ms CPU time; level
  at batch 1): stems stay one channel and 3x3 at most.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from amct_engine.export.conv_layout import GraphShapes, is_dq, node_attr, zero_point_zero

STEM_MAX_CHANNELS, STEM_MAX_TAPS = 1, 9  # the image stems float_stems runs float (measured: its doc)


def float_stems(model: onnx.ModelProto) -> list[str]:
    """Run each int8 conv on one input channel (a greyscale image's stem, 2-D kernels up to 3x3) as a float
    conv on integer-valued operands (module doc). Returns the rewritten convs; the graph changes in place.

    `DQ(x) -> Conv(DQ(w), DQ(b)) -> Relu -> Q -> DQ -> MaxPool -> Q` becomes
    `DQ(x, scale 1) -> Conv(float(w), float(b)) -> Relu -> MaxPool -> Mul(bias scale) -> Q` (zero-point-0 int8
    weights, as x86_vnni writes them): the conv sums the same
    integers (exact in float32 below 2^24), the one multiply by the bias scale (input scale x weight scale)
    is the eval model's rescale, and ReLU and max-pool commute with a positive per-channel scale and with the
    quantiser dropped before the pool (both monotonic), so the codes are the PyTorch eval model's.
    """
    shapes = GraphShapes(model)
    rewritten = []
    for conv in [n for n in model.graph.node if n.op_type == "Conv"]:
        plan = _stem_plan(conv, shapes)
        if plan is not None:
            _rewrite_stem(model, conv, shapes, *plan)
            rewritten.append(conv.name)
    return rewritten


def _stem_plan(conv: onnx.NodeProto, shapes: GraphShapes):
    """(input DQ, weight DQ, bias DQ, the ReLU, the quantiser after it, the max-pool or None), or None."""
    x_dq, w_dq = shapes.producer.get(conv.input[0]), shapes.producer.get(conv.input[1])
    b_dq = shapes.producer.get(conv.input[2]) if len(conv.input) > 2 and conv.input[2] else None
    if (
        node_attr(conv, "group", 1) != 1
        or not is_dq(x_dq)
        or not is_dq(w_dq)
        or not is_dq(b_dq)
        or any(n.input[0] not in shapes.initializers for n in (w_dq, b_dq))
        or not (zero_point_zero(w_dq, shapes) and zero_point_zero(b_dq, shapes))
    ):
        return None
    codes = numpy_helper.to_array(shapes.initializers[w_dq.input[0]])
    if (
        codes.ndim != 4
        or codes.shape[1] > STEM_MAX_CHANNELS
        or min(codes.shape[2:]) < 2
        or int(np.prod(codes.shape[2:])) > STEM_MAX_TAPS
    ):
        return None  # measured on image stems only: 1-D kernels stay int8
    if not _sums_exact_in_float(x_dq, codes, numpy_helper.to_array(shapes.initializers[b_dq.input[0]]), shapes):
        return None
    relu = _only_reader(conv.output[0], shapes, "Relu")
    quant = _only_reader(relu.output[0], shapes, "QuantizeLinear") if relu is not None else None
    if quant is None or any(len(shapes.readers[name]) != 1 for name in (w_dq.input[0], *b_dq.input[:2])):
        return None
    dq = _only_reader(quant.output[0], shapes, "DequantizeLinear")
    pool = _only_reader(dq.output[0], shapes, "MaxPool") if dq is not None else None
    requant = _only_reader(pool.output[0], shapes, "QuantizeLinear") if pool is not None else None
    if requant is None or list(requant.input[1:]) != list(quant.input[1:]):
        pool = None  # no max-pool between two identical quantisers: the rescale goes right after the ReLU
    return x_dq, w_dq, b_dq, relu, quant, pool


def _sums_exact_in_float(x_dq: onnx.NodeProto, codes: np.ndarray, bias: np.ndarray, shapes: GraphShapes) -> bool:
    """Every partial sum of the float conv is an integer below 2^24, so float32 holds it exactly (in any
    order): the bound of |input code - zero point| times the weights' absolute row sums, plus |bias|."""
    zero = shapes.initializers.get(x_dq.input[2]) if len(x_dq.input) > 2 and x_dq.input[2] else None
    zero_point = int(numpy_helper.to_array(zero)) if zero is not None else 0
    code_range = (-128, 127) if zero is not None and zero.data_type == TensorProto.INT8 else (0, 255)
    largest_input = max(abs(code_range[0] - zero_point), abs(code_range[1] - zero_point))
    row_sums = np.abs(codes.astype(np.int64)).reshape(codes.shape[0], -1).sum(axis=1)
    return int((largest_input * row_sums + np.abs(bias.astype(np.int64))).max()) < 2**24


def _only_reader(tensor: str, shapes: GraphShapes, op_type: str) -> onnx.NodeProto | None:
    readers = shapes.readers[tensor]
    return readers[0] if len(readers) == 1 and readers[0].op_type == op_type else None


def _rewrite_stem(model: onnx.ModelProto, conv, shapes: GraphShapes, x_dq, w_dq, b_dq, relu, quant, pool) -> None:
    """The file keeps the int8 weight, the int32 bias and the bias scale (reshaped to [1, C, 1, 1]): the same
    bytes; Casts of those constants, which onnxruntime folds when it loads the model, make the float operands."""
    stem = conv.name.split("/")[0] or conv.output[0]
    graph = model.graph
    model.graph.initializer.append(numpy_helper.from_array(np.ones((), np.float32), f"{stem}.unit_scale"))
    rescale_scale = shapes.initializers[b_dq.input[1]]  # read by the bias's DequantizeLinear only (_stem_plan)
    if len(rescale_scale.dims) == 1:  # per output channel: [1, C, 1, 1] broadcasts over the activations
        rescale_scale.dims[:] = [1, rescale_scale.dims[0], 1, 1]
    before_conv = [
        helper.make_node(
            "DequantizeLinear",
            [x_dq.input[0], f"{stem}.unit_scale", *x_dq.input[2:]],
            [f"{stem}_input_codes"],
            name=f"{stem}/DequantizeLinear_codes",
        ),
        helper.make_node(
            "Cast", [w_dq.input[0]], [f"{stem}_weight_codes"], name=f"{stem}/CastWeight", to=TensorProto.FLOAT
        ),
        helper.make_node(
            "Cast", [b_dq.input[0]], [f"{stem}_bias_codes"], name=f"{stem}/CastBias", to=TensorProto.FLOAT
        ),
    ]
    conv.input[:] = [n.output[0] for n in before_conv[:3]]
    last = pool if pool is not None else relu
    rescale = helper.make_node("Mul", [last.output[0], b_dq.input[1]], [f"{stem}_rescaled"], name=f"{stem}/Rescale")
    dead = {id(w_dq), id(b_dq)}
    if pool is not None:  # Relu -> MaxPool directly; the quantiser after the pool reads the rescaled values
        pool.input[0] = relu.output[0]
        shapes.readers[pool.output[0]][0].input[0] = rescale.output[0]
        dead |= {id(quant), id(shapes.readers[quant.output[0]][0])}
    else:
        quant.input[0] = rescale.output[0]
    nodes = []
    for node in graph.node:
        if id(node) not in dead:
            nodes += [*(before_conv if node is conv else []), node, *([rescale] if node is last else [])]
    del graph.node[:]
    graph.node.extend(nodes)
    used = {i for n in graph.node for i in n.input}
    orphaned = set(w_dq.input[1:]) - used  # the weight scale: the bias scale is the whole rescale
    kept = [t for t in graph.initializer if t.name not in orphaned]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    if not any(x_dq.output[0] in n.input for n in graph.node):
        graph.node.remove(x_dq)
