"""A BatchNormalization between quantisers runs as an int8 1x1 depthwise conv (QLinearConv in onnxruntime)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx
from onnx import helper, numpy_helper


def batch_norms_as_depthwise_convs(model: onnx.ModelProto) -> onnx.ModelProto:
    """A BatchNormalization between quantisers (CREPE's conv -> ReLU -> BN -> pool) as a 1x1
    depthwise conv with int8 weight +-127 and per-channel scale |a|/127 (a = gamma / sqrt(var + eps)),
    int32 bias round(b / (s_in * scale)): ORT runs it as a QLinearConv, so the graph stays int8.
    a is represented to float precision and the bias to 1/254 of an input step."""
    graph = model.graph
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    producer = {out: n for n in graph.node for out in n.output}
    readers = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            readers[name].append(node)
    ranks = {
        v.name: len(v.type.tensor_type.shape.dim) for v in onnx.shape_inference.infer_shapes(model).graph.value_info
    }
    for node in graph.node:
        if node.op_type != "BatchNormalization" or len(node.output) != 1:
            continue
        dq = producer.get(node.input[0])
        outs = readers[node.output[0]]
        if (
            dq is None
            or dq.op_type != "DequantizeLinear"
            or dq.input[1] not in values
            or not outs
            or any(r.op_type != "QuantizeLinear" for r in outs)
            or ranks.get(node.input[0], 0) < 3
        ):
            continue
        _as_depthwise_conv(graph, node, values, float(values[dq.input[1]]), ranks[node.input[0]] - 2)
    used = {name for n in graph.node for name in n.input}
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return model


def _as_depthwise_conv(graph: onnx.GraphProto, node: onnx.NodeProto, values: dict, s_in: float, dims: int) -> None:
    """Replace BatchNormalization `node` (input scale `s_in`, `dims` spatial dimensions) by its int8 conv."""
    gamma, beta, mean, var = (values[n].astype(np.float64) for n in node.input[1:5])
    eps = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)
    a = gamma / np.sqrt(var + eps)
    b = beta - mean * a
    w_scale = np.where(a == 0, 1.0, np.abs(a) / 127).astype(np.float32)
    codes = np.where(a == 0, 0, np.sign(a) * 127).astype(np.int8)
    bias = np.round(b / (s_in * w_scale.astype(np.float64))).astype(np.int32)
    channels = codes.size
    stem = node.name.strip("/").replace("/", ".") or node.output[0]
    inits = {
        f"{stem}.weight": codes.reshape(channels, 1, *[1] * dims),
        f"{stem}.weight_scale": w_scale,
        f"{stem}.weight_zero_point": np.zeros(channels, np.int8),
        f"{stem}.bias": bias,
        f"{stem}.bias_scale": (w_scale * np.float32(s_in)).astype(np.float32),
        f"{stem}.bias_zero_point": np.zeros(channels, np.int32),
    }
    graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in inits.items())
    weight, bias_dq = (
        helper.make_node(
            "DequantizeLinear",
            [f"{stem}.{role}", f"{stem}.{role}_scale", f"{stem}.{role}_zero_point"],
            [f"{stem}.{role}_dq"],
            axis=0,
            name=f"{stem}/DequantizeLinear_{role}",
        )
        for role in ("weight", "bias")
    )
    conv = helper.make_node(
        "Conv",
        [node.input[0], f"{stem}.weight_dq", f"{stem}.bias_dq"],
        list(node.output),
        group=channels,
        kernel_shape=[1] * dims,
        name=f"{stem}/Conv",
    )
    node.CopyFrom(conv)
    index = list(graph.node).index(node)
    graph.node.insert(index, bias_dq)
    graph.node.insert(index, weight)
