"""Format-independent rewrites of an exported ONNX graph, shared by the format finalisers."""

from __future__ import annotations

import onnx


def constants_to_initializers(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    """Turn Constant nodes into initialisers (so they can carry AMCT's names); name -> tensor."""
    graph = model.graph
    keep, found = [], {}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            tensor = onnx.TensorProto()
            tensor.CopyFrom(node.attribute[0].t)
            tensor.name = node.output[0]
            graph.initializer.append(tensor)
            found[tensor.name] = tensor
        else:
            keep.append(node)
    del graph.node[:]
    graph.node.extend(keep)
    return found


def compact_graph(model: onnx.ModelProto) -> onnx.ModelProto:
    """Constant nodes become initialisers and internal tensor names get short: same graph, fewer bytes.

    The exporter's names (`/layer1/conv1/Constant_4_output_0`) and one Constant node per scale cost
    ~4 KB on a 20k-parameter model, a fifth of its INT8 deploy file. Node names stay (they name layers).
    """
    constants_to_initializers(model)
    graph = model.graph
    public = {v.name for v in graph.input} | {v.name for v in graph.output}
    names: dict[str, str] = {}

    def short(name: str) -> str:
        return name if not name or name in public else names.setdefault(name, f"t{len(names)}")

    for node in graph.node:
        node.input[:] = [short(n) for n in node.input]
        node.output[:] = [short(n) for n in node.output]
    for tensor in graph.initializer:
        tensor.name = short(tensor.name)
    for info in graph.value_info:
        info.name = short(info.name)
    return model


# Attribute values the ONNX operator specs define as the default (every element, for lists).
DEFAULT_ATTRIBUTES = {
    "Conv": {"dilations": 1, "group": 1, "pads": 0, "strides": 1},
    "MaxPool": {"ceil_mode": 0, "dilations": 1, "pads": 0, "storage_order": 0, "strides": 1},
    "AveragePool": {"ceil_mode": 0, "count_include_pad": 0, "pads": 0, "strides": 1},
    "Flatten": {"axis": 1},
    "Gemm": {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0},
}


def drop_default_attributes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Leave out attributes that hold their spec default (`dilations=[1, 1]`, `group=1`, ...): the
    same graph, ~25 bytes a node, which counts on a small A8W4 file (docs/spec/engine.md §5)."""
    for node in model.graph.node:
        defaults = DEFAULT_ATTRIBUTES.get(node.op_type, {})
        kept = []
        for attribute in node.attribute:
            value = onnx.helper.get_attribute_value(attribute)
            values = value if isinstance(value, list) else [value]
            if attribute.name not in defaults or not values or any(v != defaults[attribute.name] for v in values):
                kept.append(attribute)
        if len(kept) != len(node.attribute):
            del node.attribute[:]
            node.attribute.extend(kept)
    return model
