"""Producers and readers of an exported graph's tensors, and the helpers every QDQ pass shares."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx
from onnx import TensorProto, helper

# Which input of each op carries the data (the others are shapes, axes, ...).
DATA_INPUTS = {"Reshape": 1, "Squeeze": 1, "Unsqueeze": 1, "Pad": 1, "Slice": 1, "Resize": 1, "Clip": 1, "PRelu": 1}


LAYER_OPS = {"Conv", "Gemm", "MatMul"}


class GraphIndex:
    """Producers and readers of every tensor of an ONNX graph."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        graph = model.graph
        self.initializers = {t.name: t for t in graph.initializer}
        self.outputs = {o.name for o in graph.output}
        self.producer = {out: n for n in graph.node for out in n.output}
        self.readers: dict[str, list[tuple[onnx.NodeProto, int]]] = defaultdict(list)
        for node in graph.node:
            for i, name in enumerate(node.input[: DATA_INPUTS.get(node.op_type, len(node.input))]):
                if name:
                    self.readers[name].append((node, i))
        inferred = onnx.shape_inference.infer_shapes(model)
        self.elem_type = {
            v.name: v.type.tensor_type.elem_type
            for v in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output)
        }

    def is_float_activation(self, name: str) -> bool:
        return name in self.producer and self.elem_type.get(name) == TensorProto.FLOAT

    def quantizer_params(self, name: str) -> tuple[str, str] | None:
        """(scale, zero point) initialiser names of a QuantizeLinear reading `name`."""
        for node, _ in self.readers[name]:
            if node.op_type == "QuantizeLinear" and len(node.input) == 3:
                return node.input[1], node.input[2]
        return None


def layer_tag(node: onnx.NodeProto) -> str | None:
    """The layer a node belongs to (`<layer>/<Op>` names; the exporter's own names start with '/')."""
    return node.name.split("/")[0] if "/" in node.name and not node.name.startswith("/") else None


def drop_dead_nodes(model: onnx.ModelProto) -> None:
    """Nodes none of whose outputs is read or is a graph output (the pads computation of a folded Pad)."""
    graph = model.graph
    while True:
        used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
        dead = [n for n in graph.node if not any(o in used for o in n.output)]
        if not dead:
            return
        for node in dead:
            graph.node.remove(node)


def constant_value(model: onnx.ModelProto, name: str) -> np.ndarray | None:
    """The value of a tensor computed from initialisers only (onnx's reference evaluator), else None."""
    from onnx.reference import ReferenceEvaluator

    producer = {out: n for n in model.graph.node for out in n.output}
    initializers = {t.name for t in model.graph.initializer}
    needed, stack = [], [name]
    while stack:
        tensor = stack.pop()
        if tensor in initializers or not tensor:
            continue
        node = producer.get(tensor)
        if node is None or len(needed) > 32:
            return None  # a graph input, or not a small constant computation
        if node not in needed:
            needed.append(node)
            stack.extend(node.input)
    order = [n for n in model.graph.node if n in needed]
    used = {i for n in order for i in n.input}
    graph = helper.make_graph(
        order,
        "constant",
        [],
        [helper.make_tensor_value_info(name, TensorProto.UNDEFINED, None)],
        [t for t in model.graph.initializer if t.name in used],
    )
    sub = helper.make_model(graph, opset_imports=model.opset_import)
    try:
        return np.asarray(ReferenceEvaluator(sub).run(None, {})[0])
    except Exception:  # noqa: BLE001 - not evaluable: the Pad stays
        return None
