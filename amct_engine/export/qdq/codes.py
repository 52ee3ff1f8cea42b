"""Shape ops run on integer codes: a tensor quantised twice with the same parameters around a shape op is
quantised once."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx
from onnx import numpy_helper

from amct_engine.export.qdq.graph_index import drop_dead_nodes

# Ops that only move values: they run on integer codes as well as on floats.
SHAPE_OPS = {"Flatten", "Reshape", "Identity", "Transpose", "Squeeze", "Unsqueeze"}


def shape_ops_on_codes(model: onnx.ModelProto) -> None:
    """`Q -> DQ -> Flatten -> Q -> DQ` with equal parameters becomes `Q -> Flatten -> DQ`.

    A ReLU output quantised for the next layer's quantiser, read through a Flatten, is quantised twice
    with the same parameters; Q(DQ(q)) = q, so the shape op may move the codes instead (exact). ORT
    drops such a pair itself at load, so the graph it runs is the same: the file is smaller (a few
    percent of a small A8W4 model) and reads as what runs."""
    graph = model.graph
    producer = {out: n for n in graph.node for out in n.output}
    read_by = defaultdict(int)
    for name in (i for n in graph.node for i in n.input):
        read_by[name] += 1
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    outputs = {o.name for o in graph.output}

    def same(a: onnx.NodeProto, b: onnx.NodeProto) -> bool:
        if len(a.input) != 3 or len(b.input) != 3 or not all(n in values for n in (*a.input[1:], *b.input[1:])):
            return False
        return all(
            values[x].dtype == values[y].dtype and np.array_equal(values[x], values[y])
            for x, y in zip(a.input[1:], b.input[1:], strict=True)
        )

    renamed: dict[str, str] = {}
    dropped = []
    for requant in graph.node:
        shape_op = producer.get(requant.input[0]) if requant.op_type == "QuantizeLinear" else None
        if (
            shape_op is None
            or shape_op.op_type not in SHAPE_OPS
            or read_by[shape_op.output[0]] != 1
            or shape_op.output[0] in outputs
        ):
            continue
        dequant = producer.get(shape_op.input[0])
        if dequant is None or dequant.op_type != "DequantizeLinear":
            continue
        if same(dequant, requant) and not requant.attribute and not dequant.attribute:
            shape_op.input[0] = dequant.input[0]
            renamed[requant.output[0]] = shape_op.output[0]
            dropped.append(requant)
    for node in dropped:
        graph.node.remove(node)
    for node in graph.node:
        node.input[:] = [renamed.get(n, n) for n in node.input]
    if dropped:
        drop_dead_nodes(model)
