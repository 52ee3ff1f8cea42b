"""Conv shapes onnxruntime's int8 kernels run fast: same integers, another layout (deploy graph only).

Rewrites of the QDQ deploy graph, each exact (the same integer sums, so the same outputs bit for bit),
chosen by measurement on onnxruntime 1.32's CPU kernels (figures in
docs/benchmarks.md#deploy-speed-our-int8-onnx-vs-fp32-and-onnxruntimes-own-ptq):

- `tall_kernels_as_wide`: a region of [N, C, H, 1] tensors whose convs have (k x 1) kernels (CREPE: 512x1,
  64x1) runs as [N, C, 1, H] with (1 x k) kernels. onnxruntime's NHWC im2col copies one kernel row per
  `memcpy`: a (k x 1) kernel is k copies of C bytes, a (1 x k) kernel one copy of k*C bytes. CREPE's first
  conv (1 -> 128 channels, 512x1, stride 4) took 28 ms per batch of 64 in QLinearConv and 5.7 ms as 1x512
  (one thread, minimum CPU time); Conv1D measured the same as 1 x k. Swapping H and W of a tensor whose W
  is 1 is a Reshape (no data moves); one goes in where the region starts and one where it ends.

The other layout rewrites (export/conv_int8_paths.py, export/conv_float_stems.py) share this module's
graph helpers (`GraphShapes`, `node_attr`, `is_dq`, `zero_point_zero`).
"""

from __future__ import annotations

import functools
from collections import defaultdict

import numpy as np
import onnx
from onnx import helper, numpy_helper

# Ops that act per position and per channel on [N, C, H, W] (or only along H and W through their
# attributes, swapped below): a region of them may run with H and W exchanged.
_ELEMENTWISE = {
    "QuantizeLinear",
    "DequantizeLinear",
    "Relu",
    "Clip",
    "Sigmoid",
    "LeakyRelu",
    "Identity",
    "BatchNormalization",
}


_SPATIAL = {"Conv", "MaxPool", "AveragePool"}


_SPATIAL_ATTRS = ("kernel_shape", "strides", "dilations")


class GraphShapes:
    """Static shapes (None where unknown), constants and producers/readers of a model."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        graph = model.graph
        self.initializers = {t.name: t for t in graph.initializer}
        self.constant = set(self.initializers)
        for node in graph.node:  # topological order: a node of constants only makes constants
            if all(not i or i in self.constant for i in node.input):
                self.constant.update(node.output)
        self.producer = {o: n for n in graph.node for o in n.output}
        self.readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for node in graph.node:
            for name in node.input:
                self.readers[name].append(node)

    @functools.cached_property
    def dims(self) -> dict[str, list[int | None]]:
        """Shape inference runs only for the rewrites that read shapes (the wide kernels, and the AMX convs once a
        candidate is found): the stems and the channel padding read the graph alone, and each rewrite builds its
        own `GraphShapes`."""
        inferred = onnx.shape_inference.infer_shapes(self.model)
        return {
            v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
            for v in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output)
            if v.type.tensor_type.HasField("shape")
        }

    def width_one(self, name: str) -> bool:
        dims = self.dims.get(name)
        return dims is not None and len(dims) == 4 and dims[3] == 1


def node_attr(node: onnx.NodeProto, name: str, default=None):
    found = next((a for a in node.attribute if a.name == name), None)
    return default if found is None else helper.get_attribute_value(found)


def _setnode_attr(node: onnx.NodeProto, name: str, value) -> None:
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend([*kept, helper.make_attribute(name, value)])


def is_dq(node: onnx.NodeProto | None) -> bool:
    return node is not None and node.op_type == "DequantizeLinear"


def zero_point_zero(dq: onnx.NodeProto, shapes: GraphShapes) -> bool:
    if len(dq.input) < 3 or not dq.input[2]:
        return True
    zero = shapes.initializers.get(dq.input[2])
    return zero is not None and not numpy_helper.to_array(zero).any()


def _activations(node: onnx.NodeProto, shapes: GraphShapes) -> list[str]:
    """The data tensors a node reads and writes: every op above reads its data as input 0 (the others are
    weights, biases, scales, zero points, clip bounds)."""
    return [n for n in (*node.input[:1], *node.output) if n and n not in shapes.constant]


def _flippable(node: onnx.NodeProto, shapes: GraphShapes) -> bool:
    if node.op_type not in _ELEMENTWISE | _SPATIAL:
        return False
    if node.op_type in ("QuantizeLinear", "DequantizeLinear") and node_attr(node, "axis", 1) not in (1, -3):
        return False
    if node.op_type in _SPATIAL and (node_attr(node, "kernel_shape") or [0, 0])[-1] != 1:
        return False
    if node_attr(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return False
    data = _activations(node, shapes)
    return bool(data) and all(shapes.width_one(n) for n in data)


def _regions(model: onnx.ModelProto, shapes: GraphShapes) -> list[list[onnx.NodeProto]]:
    """Connected groups of flippable nodes (joined by the activations they share), in graph order."""
    nodes = [n for n in model.graph.node if _flippable(n, shapes)]
    parent = list(range(len(nodes)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for name in _activations(node, shapes):
            if name in owner:
                parent[root(i)] = root(owner[name])
            owner.setdefault(name, i)
    groups: dict[int, list[onnx.NodeProto]] = defaultdict(list)
    for i, node in enumerate(nodes):
        groups[root(i)].append(node)
    return list(groups.values())


def _swap_hw(values: list[int]) -> list[int]:
    if len(values) == 4:  # pads: [h_begin, w_begin, h_end, w_end]
        return [values[1], values[0], values[3], values[2]]
    return [values[1], values[0]]


def _flip_node(node: onnx.NodeProto, shapes: GraphShapes, flipped_weights: set[str]) -> None:
    for name in (*_SPATIAL_ATTRS, "pads"):
        values = node_attr(node, name)
        if values is not None:
            _setnode_attr(node, name, _swap_hw(list(values)))
    if node.op_type != "Conv":
        return
    weight = node.input[1]
    dq = shapes.producer.get(weight)
    tensor = dq.input[0] if dq is not None and dq.op_type == "DequantizeLinear" else weight
    if tensor in flipped_weights or tensor not in shapes.initializers:
        return
    codes = numpy_helper.to_array(shapes.initializers[tensor])
    shapes.initializers[tensor].CopyFrom(numpy_helper.from_array(np.ascontiguousarray(codes.swapaxes(2, 3)), tensor))
    flipped_weights.add(tensor)


def _reshape(model: onnx.ModelProto, source: str, target: str, shape: list[int], name: str) -> onnx.NodeProto:
    shape_name = f"{name}_shape"
    if shape_name not in {t.name for t in model.graph.initializer}:
        model.graph.initializer.append(numpy_helper.from_array(np.array(shape, np.int64), shape_name))
    return helper.make_node("Reshape", [source, shape_name], [target], name=name)


def tall_kernels_as_wide(model: onnx.ModelProto) -> list[str]:
    """Run each region of (k x 1) convs on [N, C, H, 1] tensors as (1 x k) convs on [N, C, 1, H] (module
    doc). Returns the names of the convs whose kernels were turned; the graph changes in place."""
    shapes = GraphShapes(model)
    outputs = {o.name for o in model.graph.output}
    turned, flipped_weights = [], set()
    before: dict[int, list[onnx.NodeProto]] = defaultdict(list)  # id(node) -> Reshapes to insert before it
    after: dict[int, list[onnx.NodeProto]] = defaultdict(list)
    regions = _regions(model, shapes)  # held until the end: `before`/`after` are keyed by id(node)
    for region in regions:
        convs = [n for n in region if n.op_type == "Conv" and (node_attr(n, "kernel_shape") or [1])[0] > 1]
        if not convs:
            continue
        members = {id(n) for n in region}
        produced = {o for n in region for o in n.output}
        renamed: dict[str, str] = {}
        for node in region:
            data = set(_activations(node, shapes))
            for i, name in enumerate(node.input):
                if name in data and name not in produced:  # enters the region: [N, C, H, 1] -> [N, C, 1, H]
                    if name not in renamed:
                        renamed[name] = f"{name}_wide"
                        before[id(node)].append(
                            _reshape(model, name, renamed[name], [0, 0, 1, -1], f"{renamed[name]}/Reshape")
                        )
                    node.input[i] = renamed[name]
        for node in region:
            for i, name in enumerate(node.output):
                leaves = name in outputs or any(id(r) not in members for r in shapes.readers[name])
                if not leaves:
                    continue
                wide = f"{name}_wide"
                node.output[i] = wide
                for reader in (r for r in shapes.readers[name] if id(r) in members):
                    reader.input[:] = [wide if n == name else n for n in reader.input]
                after[id(node)].append(_reshape(model, wide, name, [0, 0, -1, 1], f"{name}/Reshape"))
            _flip_node(node, shapes, flipped_weights)
        turned += [n.name for n in convs]
    if turned:
        _insert_around(model, before, after)
    return turned


def _insert_around(model: onnx.ModelProto, before: dict, after: dict) -> None:
    ordered = []
    for node in model.graph.node:
        ordered += [*before.get(id(node), []), node, *after.get(id(node), [])]
    del model.graph.node[:]
    model.graph.node.extend(ordered)
