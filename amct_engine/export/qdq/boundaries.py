"""Quantise every tensor between two quantised layers so onnxruntime runs the graph in int8.

The layer writer (export.backends.QdqDeployBackend) quantises each layer's *input* with the
layer's own quantiser, as AMCT does. onnxruntime's QDQ fusions (QLinearConv, QGemm, QLinearAdd,
QLinearMul, QLinearConcat, QLinearGlobalAveragePool, int8 MaxPool) also need the *output* of each op
quantised (`DequantizeLinear -> op -> QuantizeLinear`). This pass, on the exported ONNX graph:

- finds every float tensor from which a quantised layer's input is reached through ops that run in
  int8 or in float between quantisers (export/qdq/op_roles.py), except a clamp's input (ReLU, ReLU6):
  the layer before the clamp takes the clamp's output quantiser, ORT drops the clamp or we clamp the codes;
- gives it its quantisation parameters: those of the quantiser that reads it or that reads it
  through ops commuting with quantisation (MaxPool, Flatten, Reshape, ...): exact, since
  max(q(a), q(b)) = q(max(a, b)); a sigmoid's or hardsigmoid's output its whole range [0, 1];
  otherwise (residual Add inputs and outputs, pool inputs, concat inputs, the input of a SiLU, a
  hardswish or a PReLU) uint8 parameters calibrated on the example input (one quantisation step of
  error at that tensor, as ORT's quantiser);
- inserts QuantizeLinear and one DequantizeLinear per reader.
Naming follows in export/qdq/names.py; the tensors no quantiser covers are calibrated in export/qdq/calibration.py."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx
from onnx import helper, numpy_helper

from amct_engine.export.layer_graph import LAYER_ATTR
from amct_engine.export.onnx_graph import constants_to_initializers
from amct_engine.export.qdq.activations_on_codes import snap_to_gate_grid
from amct_engine.export.qdq.calibration import calibrate
from amct_engine.export.qdq.codes import passes_codes, shape_ops_on_codes
from amct_engine.export.qdq.graph_index import LAYER_OPS, GraphIndex, layer_tag
from amct_engine.export.qdq.op_roles import (
    FLOAT_BETWEEN_OPS,
    clamp_bounds,
    commutes,
    fixed_parameters,
    lower_bound,
    passes_quantized_data,
    runs_in_int8,
)
from amct_engine.export.qdq.zero_pads import fold_zero_pads


def _merge_equal_quantizers(model: onnx.ModelProto) -> None:
    """One QuantizeLinear per tensor and parameter values: layers sharing an input quantiser
    (a block output read by a conv and a downsample conv) read one, so ORT can fuse the producer."""
    graph = model.graph
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    first: dict[tuple, str] = {}
    replaced: dict[str, str] = {}
    keep = []
    for node in graph.node:
        if node.op_type == "QuantizeLinear" and len(node.input) == 3 and all(i in values for i in node.input[1:]):
            key = (
                node.input[0],
                values[node.input[1]].tobytes(),
                values[node.input[2]].tobytes(),
                str(values[node.input[2]].dtype),
                tuple(a.SerializeToString() for a in node.attribute),
            )
            if key in first:
                replaced[node.output[0]] = first[key]
                continue
            first[key] = node.output[0]
        keep.append(node)
    for node in keep:
        node.input[:] = [replaced.get(n, n) for n in node.input]
    del graph.node[:]
    graph.node.extend(keep)


def _topological_tensors(model: onnx.ModelProto) -> list[str]:
    return [out for node in model.graph.node for out in node.output]


def _plan(g: GraphIndex) -> tuple[dict[str, tuple[str, str] | None], list[str]]:
    """Tensor -> its quantiser's (scale, zero point) names, or None where it must be calibrated."""
    leads: dict[str, bool] = {}
    params: dict[str, tuple[str, str] | None] = {}
    for name in reversed(_topological_tensors(g.model)):
        readers = [n for n, _ in g.readers[name]]
        # Only through ops with an int8 form or none needed: a transformer's LayerNorm, Softmax or GELU stays float.
        leads[name] = g.is_float_activation(name) and any(
            n.op_type == "QuantizeLinear"
            or (passes_quantized_data(g, n) and any(leads.get(o, False) for o in n.output))
            for n in readers
        )
        if not leads[name]:
            continue
        own = g.quantizer_params(name)
        if own is None:
            through = [params.get(n.output[0]) for n in readers if commutes(n)]
            own = next((p for p in through if p is not None), None)
        params[name] = own
    plan = {}
    for name, p in params.items():
        producer = g.producer[name]
        if producer.op_type == "DequantizeLinear" or not (
            runs_in_int8(g, producer) or producer.op_type in LAYER_OPS | FLOAT_BETWEEN_OPS
        ):
            continue  # a float op's output: quantised by the layer reading it, as AMCT does
        readers = [n for n, _ in g.readers[name]]
        if (
            readers
            and layer_tag(producer)
            and all(n.op_type == "Add" and layer_tag(n) == layer_tag(producer) for n in readers)
        ):
            continue  # a MatMul layer's own bias Add: the layer's output is the Add's
        if readers and all(clamp_bounds(g, n) is not None for n in readers):
            continue  # the clamp's output is quantised; ORT removes the clamp, or we clamp the codes
        if (
            all(n.op_type == "QuantizeLinear" for n in readers)
            and name not in g.outputs
            and not _clamp_kept_by_ort(g, name, p)
        ):
            continue  # already quantised for every reader
        plan[name] = p
    return plan, [n for n, p in plan.items() if p is None]


def _ties(g: GraphIndex, plan: dict[str, tuple[str, str] | None]) -> dict[str, str]:
    """Tensor -> the tensor whose parameters it takes: the output of a max-pool, a split, a nearest resize or a
    shape op that no quantiser of a layer reads takes its input's, so the op runs on the codes (ORT drops
    the equal pair; qdq/codes.py) instead of in float between two quantisers; calibrating it on its own
    bought no accuracy (its range lies within its input's)."""
    ties: dict[str, str] = {}
    for name in _topological_tensors(g.model):
        producer = g.producer[name]
        source = producer.input[0] if producer.input else ""
        if plan.get(name, ...) is None and source in plan and passes_codes(producer):
            ties[name] = ties.get(source, source)
    return ties


def _snap_hardswish_inputs(g: GraphIndex, calibrated: dict[str, tuple]) -> None:
    """A tensor read only by HardSwish gets a grid whose scale divides 3, so its gate runs on the codes
    (export/qdq/activations_on_codes.py)."""
    for name, (scale, zero_point) in list(calibrated.items()):
        readers = [n for n, _ in g.readers[name]]
        if readers and all(n.op_type == "HardSwish" for n in readers):
            snapped = snap_to_gate_grid(float(scale), int(zero_point))
            if snapped is not None:
                calibrated[name] = snapped


def _clamp_kept_by_ort(g: GraphIndex, name: str, params: tuple[str, str] | None) -> bool:
    """A clamp's output (ReLU, ReLU6) whose quantiser reaches outside the clamp's bounds: ORT keeps that clamp
    in float (its ClipQuantFusion drops it only when the quantiser's range lies within the bounds) and so
    cannot fuse the layer before it; we clamp the codes instead (`_Insertions.clamp_on_codes`)."""
    producer = g.producer[name]
    bounds = clamp_bounds(g, producer)
    if bounds is None or params is None or name in g.outputs:
        return False
    if [n for n, _ in g.readers[producer.input[0]]] != [producer]:
        return False
    low, high = _code_range(g, params)
    eps = float(np.finfo(np.float32).eps)
    return bounds[0] - low > eps or high - bounds[1] > eps


def _quantizer(g: GraphIndex, params: tuple[str, str]) -> tuple[float, np.ndarray, np.iinfo]:
    """A quantiser's scale, zero point and the range of its codes' type."""
    zero = numpy_helper.to_array(g.initializers[params[1]])
    return float(numpy_helper.to_array(g.initializers[params[0]])), zero, np.iinfo(zero.dtype)


def _code_range(g: GraphIndex, params: tuple[str, str]) -> tuple[float, float]:
    """The real values of the lowest and the highest code of a quantiser."""
    scale, zero, info = _quantizer(g, params)
    return scale * (info.min - int(zero)), scale * (info.max - int(zero))


def _base_name(g: GraphIndex, tensor: str) -> str:
    """A readable stem for the quantiser of `tensor`: its producer's layer or node name."""
    node = g.producer[tensor]
    tag = layer_tag(node)
    return f"{tag}.output" if tag else (node.name.strip("/").replace("/", ".") or tensor) + ".output"


def _pop_tags(model: onnx.ModelProto) -> None:
    """Name each tagged node `<layer>/<Op>` (unique) and drop the temporary attribute ORT rejects."""
    used: set[str] = set()
    for node in model.graph.node:
        names = [a.name for a in node.attribute]
        if LAYER_ATTR not in names:
            continue
        tag = node.attribute[names.index(LAYER_ATTR)].s.decode()
        del node.attribute[names.index(LAYER_ATTR)]
        stem = f"{tag}/NoInt8Kernel" if node.op_type == "Identity" else f"{tag}/{node.op_type}"
        node.name, k = stem, 1
        while node.name in used:
            node.name, k = f"{stem}_{k}", k + 1
        used.add(node.name)


def quantize_boundaries(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> onnx.ModelProto:
    """Insert QuantizeLinear/DequantizeLinear on every tensor between quantised layers (module doc)."""
    constants_to_initializers(model)
    _pop_tags(model)
    fold_zero_pads(model)
    _merge_equal_quantizers(model)
    g = GraphIndex(model)
    plan, to_calibrate = _plan(g)
    ties = _ties(g, plan)
    to_calibrate = [name for name in to_calibrate if name not in ties]
    fixed = {name: fixed_parameters(g.producer[name].op_type) for name in to_calibrate}
    bounds = {name: lower_bound(g, g.producer[name]) for name in to_calibrate}
    known_bounds = {name: bound for name, bound in bounds.items() if bound is not None}
    calibrated = calibrate(model, [name for name, p in fixed.items() if p is None], feeds, known_bounds)
    calibrated.update((name, p) for name, p in fixed.items() if p is not None)
    _snap_hardswish_inputs(g, calibrated)
    edit = _Insertions(g)
    bases: dict[str, str] = {}
    for name in plan:
        base, k = _base_name(g, name), 1
        while base in bases.values():  # a layer with two planned outputs (MatMul, then its bias Add)
            base, k = f"{_base_name(g, name)}_{k}", k + 1
        bases[name] = base
    chosen: dict[str, tuple[str, str]] = {}
    for name, params in plan.items():
        if params is None and name in calibrated:
            params = edit.add_parameters(bases[name], *calibrated[name])
        if params is not None:
            chosen[name] = params
    chosen.update((name, chosen[source]) for name, source in ties.items() if source in chosen)
    for name in plan:
        if name in chosen:
            edit.quantize(name, bases[name], chosen[name])
    edit.apply()
    shape_ops_on_codes(model)
    return model


class _Insertions:
    """The nodes quantize_boundaries adds after each tensor's producer, the nodes it drops, and the tensors
    that replace a dropped quantiser's output; `apply` rebuilds the node list in order."""

    def __init__(self, g: GraphIndex) -> None:
        self.g = g
        self.new_nodes: dict[str, list[onnx.NodeProto]] = defaultdict(list)  # after the producer of a tensor
        self.dropped: set = set()  # ReLUs rewritten as Clip on codes, and the quantisers they made redundant
        self.rewired: dict[str, str] = {}  # output of a dropped quantiser -> the codes that replace it
        self.moved: set = set()  # existing quantisers placed after their tensor's producer instead

    def add_parameters(self, base: str, scale, zero_point) -> tuple[str, str]:
        names = (f"{base}_scale", f"{base}_zero_point")
        added = [
            numpy_helper.from_array(np.array(value), n) for value, n in zip((scale, zero_point), names, strict=True)
        ]
        self.g.model.graph.initializer.extend(added)
        self.g.initializers.update((t.name, t) for t in added)
        return names

    def quantize(self, name: str, base: str, params: tuple[str, str]) -> None:
        """Quantise tensor `name` with `params` once, and give each reader but its quantisers a DequantizeLinear."""
        g = self.g
        existing = next(
            (n for n, _ in g.readers[name] if n.op_type == "QuantizeLinear" and tuple(n.input[1:3]) == params), None
        )
        if _clamp_kept_by_ort(g, name, params):
            quantized = self.clamp_on_codes(name, base, params)
        elif existing is not None:
            # A layer's own input quantiser, written just before its layer: it moves up to the tensor's
            # producer, since the other readers (a Resize, a residual Add) may come before that layer.
            quantized = existing.output[0]
            self.new_nodes[name].insert(0, existing)
            self.moved.add(existing.name or id(existing))
        else:
            quantized = f"{base}_quantized"
            self.new_nodes[name].append(
                helper.make_node("QuantizeLinear", [name, *params], [quantized], name=f"{base}/QuantizeLinear")
            )
        for k, (reader, index) in enumerate(g.readers[name]):
            if reader.op_type == "QuantizeLinear" or (reader.name or id(reader)) in self.dropped:
                continue
            dequantized = f"{base}_dequantized_{k}"
            self.new_nodes[quantized].append(
                helper.make_node(
                    "DequantizeLinear", [quantized, *params], [dequantized], name=f"{base}/DequantizeLinear_{k}"
                )
            )
            reader.input[index] = dequantized

    def clamp_on_codes(self, name: str, base: str, params: tuple[str, str]) -> str:
        """A clamp on codes is exact (quantisation is monotone): quantise the clamp's input instead, and clip
        the codes to the codes of its bounds (the zero point for a ReLU's 0)."""
        g = self.g
        clamp = g.producer[name]
        codes = f"{base}_quantized"
        bounds = self._bound_codes(base, params, clamp_bounds(g, clamp) or (0.0, float("inf")))
        self.new_nodes[clamp.input[0]].extend(
            [
                helper.make_node(
                    "QuantizeLinear", [clamp.input[0], *params], [f"{base}_preclamp"], name=f"{base}/QuantizeLinear"
                ),
                # Clip on uint8 is vectorised in ORT; Max ran 5x slower on a ResNet-18 stem.
                helper.make_node("Clip", [f"{base}_preclamp", *bounds], [codes], name=f"{base}/Clip"),
            ]
        )
        self.dropped.add(clamp.name or id(clamp))
        for reader, _ in g.readers[name]:
            if reader.op_type == "QuantizeLinear" and tuple(reader.input[1:3]) == params:
                self.dropped.add(reader.name or id(reader))
                self.rewired[reader.output[0]] = codes
        return codes

    def _bound_codes(self, base: str, params: tuple[str, str], bounds: tuple[float, float]) -> list[str]:
        """Clip's min and max inputs: initialisers holding the codes of a clamp's bounds, '' for an infinite one."""
        scale, zero, info = _quantizer(self.g, params)
        names = ["", ""]
        for k, (bound, suffix) in enumerate(zip(bounds, ("low", "high"), strict=True)):
            if np.isinf(bound):
                continue
            code = np.array(np.clip(round(bound / scale) + int(zero), info.min, info.max), dtype=zero.dtype)
            names[k] = f"{base}_clamp_{suffix}"
            initializer = numpy_helper.from_array(code, names[k])
            self.g.model.graph.initializer.append(initializer)
            self.g.initializers[names[k]] = initializer
        return names[:1] if not names[1] else names

    def apply(self) -> None:
        graph = self.g.model.graph
        ordered: list[onnx.NodeProto] = []

        def place(node: onnx.NodeProto, follower: bool = False) -> None:
            key = node.name or id(node)
            if key in self.dropped or (key in self.moved and not follower):
                return
            node.input[:] = [self.rewired.get(n, n) for n in node.input]
            ordered.append(node)
            for out in node.output:
                for after in self.new_nodes.pop(out, []):
                    place(after, follower=True)

        for node in list(graph.node):
            place(node)
        del graph.node[:]
        graph.node.extend(ordered)
