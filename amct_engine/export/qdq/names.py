"""Names that read as the model: nodes and initialisers after their layer, short activation names."""

from __future__ import annotations

import onnx
from onnx import TensorProto

from amct_engine.export.qdq.graph_index import LAYER_OPS, layer_tag


def name_after_layers(model: onnx.ModelProto) -> onnx.ModelProto:
    """Nodes `<layer>/<Op>` and initialisers `<layer>.weight`, `.weight_scale`, `.bias`, `.input_scale`
    ...; the temporary layer attributes go. Other names stay as the exporter wrote them."""
    graph = model.graph
    producer = {out: n for n in graph.node for out in n.output}
    initializers = {t.name: t for t in graph.initializer}
    renamed: dict[str, str] = {}
    for node in graph.node:
        tag = layer_tag(node)
        if tag is None or node.op_type not in LAYER_OPS:
            continue
        roles = {1: "weight", 2: "bias"}
        for index, role in roles.items():
            dq = producer.get(node.input[index]) if index < len(node.input) else None
            if dq is not None and dq.op_type == "DequantizeLinear":
                for k, suffix in enumerate(("", "_scale", "_zero_point")):
                    _rename(graph, initializers, renamed, dq, k, f"{tag}.{role}{suffix}")
        dq = producer.get(node.input[0])  # its quantiser shares the parameters (or moved codes: _shape_ops_on_codes)
        if dq is not None and dq.op_type == "DequantizeLinear":
            for k, suffix in ((1, "_scale"), (2, "_zero_point")):
                _rename(graph, initializers, renamed, dq, k, f"{tag}.input{suffix}")
    for node in graph.node:
        node.input[:] = [renamed.get(n, n) for n in node.input]
    return model


def short_activation_names(model: onnx.ModelProto) -> onnx.ModelProto:
    """Activations between nodes get short names (`t12`): the exporter's (`/layer1/layer1.0/conv1/
    DequantizeLinear_output_0`) cost a tenth of a small A8W4 file. Nodes, initialisers, inputs and
    outputs keep their names; the value_info the exporter wrote goes (ORT infers shapes itself)."""
    graph = model.graph
    keep = {t.name for t in graph.initializer} | {v.name for v in graph.input} | {v.name for v in graph.output}
    names: dict[str, str] = {}
    for node in graph.node:
        for field in (node.input, node.output):
            field[:] = [n if not n or n in keep else names.setdefault(n, f"t{len(names)}") for n in field]
    del graph.value_info[:]
    return model


def _rename(graph, initializers, renamed, node, index, new_name):
    """Name the initialiser `node.input[index]` `new_name` (a copy when another role named it already)."""
    old = node.input[index] if index < len(node.input) else ""
    if old not in initializers or new_name in initializers:
        return
    if old in renamed:  # shared constant already named for another role: give this one its own copy
        copy = TensorProto()
        copy.CopyFrom(initializers[renamed[old]])
        copy.name = new_name
        graph.initializer.append(copy)
        initializers[new_name] = copy
        node.input[index] = new_name
        return
    initializers[old].name = new_name
    initializers[new_name] = initializers.pop(old)
    renamed[old] = new_name
