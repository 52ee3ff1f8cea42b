"""Ops that only move or compare values run on integer codes (docs/spec/engine.md §5, "Int8 around activations").

A reshaping, a split, a max-pool or a nearest-neighbour resize commutes with dequantisation: op(DQ(q)) =
DQ(op(q)), since DequantizeLinear is an increasing map applied value by value. So `DQ -> op -> readers` may
run as `op -> DQ -> readers` on the codes, exactly, and a reader that quantises again with the same
parameters reads the codes themselves (Q(DQ(q)) = q)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx
from onnx import helper, numpy_helper

from amct_engine.export.qdq.graph_index import drop_dead_nodes
from amct_engine.export.qdq.op_roles import commutes

# Ops that only move values: moved onto the codes whenever a DequantizeLinear feeds them.
SHAPE_OPS = {"Flatten", "Reshape", "Identity", "Transpose", "Squeeze", "Unsqueeze"}
# Ops that move or compare values, which ORT runs on the codes itself when each output is quantised again
# with the input's parameters (its DropQDQ and Split selectors): moved here only where ORT would not, i.e.
# where an output is read by a quantiser with other parameters (a requantisation) or by a float op.
CODE_OPS = {"MaxPool", "Split", "Resize"}


def shape_ops_on_codes(model: onnx.ModelProto) -> None:
    """`DQ(p) -> op -> Q(p)` becomes `op` on the codes and `DQ(p) -> op -> Q(p')` becomes `op -> DQ(p) -> Q(p')`.

    A ReLU output quantised for the next layer's quantiser, read through a Flatten, is quantised twice
    with the same parameters; the Flatten may move the codes instead (exact). ORT drops such a pair itself
    at load, so the graph it runs is the same: the file is smaller (a few percent of a small A8W4 model)
    and reads as what runs. A C2f block's Split whose second half is read by a conv with its own input
    quantiser, and the max-pool before a conv with other parameters, ran in float between the quantisers
    (ORT's selectors need equal parameters on every side): on the codes they move a quarter of the bytes
    and only the requantisation stays float."""
    graph = model.graph
    producer = {out: n for n in graph.node for out in n.output}
    readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            readers[name].append(node)
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    outputs = {o.name for o in graph.output}

    def same(a: onnx.NodeProto, b: onnx.NodeProto) -> bool:
        if a.attribute or b.attribute or len(a.input) != 3 or len(b.input) != 3:
            return False
        if not all(n in values for n in (*a.input[1:], *b.input[1:])):
            return False
        return all(
            values[x].dtype == values[y].dtype and np.array_equal(values[x], values[y])
            for x, y in zip(a.input[1:], b.input[1:], strict=True)
        )

    def same_type(dequant: onnx.NodeProto, quant: onnx.NodeProto) -> bool:
        """A per-tensor quantiser to the codes' type (QLinearLeakyRelu's input and output share it)."""
        if quant.op_type != "QuantizeLinear" or quant.attribute or len(quant.input) != 3:
            return False
        zero_points = [values.get(n.input[2]) for n in (dequant, quant)]
        return all(z is not None and z.size == 1 for z in zero_points) and zero_points[0].dtype == zero_points[1].dtype

    renamed: dict[str, str] = {}
    dropped: set[int] = set()
    added: dict[int, list[onnx.NodeProto]] = defaultdict(list)  # after the node with this id
    for node in graph.node:
        dequant = producer.get(node.input[0]) if node.input else None
        if dequant is None or dequant.op_type != "DequantizeLinear" or dequant.attribute or not passes_codes(node):
            continue
        if any(o in outputs or not readers[o] for o in node.output):
            continue
        requants = [[r for r in readers[o] if r.op_type == "QuantizeLinear" and same(dequant, r)] for o in node.output]
        ort_fuses = all(len(readers[o]) == 1 and q for o, q in zip(node.output, requants, strict=True))
        if node.op_type in CODE_OPS and ort_fuses:
            continue
        if node.op_type in SHAPE_OPS and not ort_fuses:
            continue  # a shape op read by a float op keeps its float input (a transformer's Reshape before MatMul)
        node.input[0] = dequant.input[0]
        for k, out in enumerate(node.output):
            others = [r for r in readers[out] if all(r is not q for q in requants[k])]
            codes = f"{out}_codes" if others else out  # `out` stays the float tensor's name where one is left
            for requant in requants[k]:
                renamed[requant.output[0]] = codes
                dropped.add(id(requant))
            for j, requant in enumerate(r for r in others if same_type(dequant, r)):
                added[id(node)].extend(_requantize(codes, dequant, f"{out}_requantized_{j}"))
                requant.input[0] = f"{out}_requantized_{j}"
            if any(not same_type(dequant, r) for r in others):  # float readers: dequantise once
                added[id(node)].append(
                    helper.make_node("DequantizeLinear", [codes, *dequant.input[1:]], [out], name=f"{out}/Dequantize")
                )
            node.output[k] = codes
    ordered = []
    for node in graph.node:
        if id(node) not in dropped:
            ordered.append(node)
            ordered.extend(added.get(id(node), []))
    del graph.node[:]
    graph.node.extend(ordered)
    for node in graph.node:
        node.input[:] = [renamed.get(n, n) for n in node.input]
    if dropped or added:
        drop_dead_nodes(model)


def _requantize(codes: str, dequant: onnx.NodeProto, name: str) -> list[onnx.NodeProto]:
    """`DQ(p) -> LeakyRelu(alpha=1) -> ` (the reader's `Q(p')`): ORT fuses it into QLinearLeakyRelu, a 256-entry
    table it builds with the same float dequantise and MLAS quantise as the two nodes, so the codes are
    the same; 0.34 against 0.59 ms for DequantizeLinear + QuantizeLinear on [8, 32, 80, 80], one thread."""
    return [
        helper.make_node("DequantizeLinear", [codes, *dequant.input[1:]], [f"{name}_float"], name=f"{name}/Dequantize"),
        helper.make_node("LeakyRelu", [f"{name}_float"], [name], name=f"{name}/Requantize", alpha=1.0),
    ]


def passes_codes(node: onnx.NodeProto) -> bool:
    if node.op_type in SHAPE_OPS | {"Split"}:
        return True
    if node.op_type == "MaxPool" and len(node.output) > 1:
        return False  # its Indices output is not a value
    return node.op_type in CODE_OPS and commutes(node)  # MaxPool; Resize in nearest mode only
