"""Quantise every tensor between two quantised layers so onnxruntime runs the graph in int8.

The layer writer (export.backends.QdqDeployBackend) quantises each layer's *input* with the
layer's own quantiser, as AMCT does. onnxruntime's QDQ fusions (QLinearConv, QGemm, QLinearAdd,
QLinearConcat, QLinearGlobalAveragePool, int8 MaxPool) also need the *output* of each op quantised
(`DequantizeLinear -> op -> QuantizeLinear`). This pass, on the exported ONNX graph:

- finds every float tensor from which a quantised layer's input is reached ("leads to a
  quantised layer"), except a ReLU's input: ORT drops a ReLU followed by QuantizeLinear whose zero
  point is the lowest code, so the conv before it still fuses;
- gives it its quantisation parameters: those of the quantiser that reads it or that reads it
  through ops commuting with quantisation (MaxPool, Flatten, Reshape, ...): exact, since
  max(q(a), q(b)) = q(max(a, b)); otherwise (residual Add inputs and outputs, pool inputs,
  concat inputs, a float op such as CREPE's BatchNorm after a ReLU) uint8 parameters calibrated
  on the example input (one quantisation step of error at that tensor, as ORT's quantiser);
- inserts QuantizeLinear and one DequantizeLinear per reader.
Then it names nodes and initialisers after their layer (`layer1.0.conv1/Conv`, `layer1.0.conv1.weight`).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from amct_engine.export.ascend import LAYER_ATTR
from amct_engine.export.conv_layout import (
    convs_on_the_gemm_path,
    float_stems,
    pad_input_channels,
    tall_kernels_as_wide,
)
from amct_engine.export.float_output_matmul import matmuls_to_integer_to_float
from amct_engine.export.int4_pack import INT4_SUFFIX, pack_int4_weights
from amct_engine.export.onnx_graph import constants_to_initializers, drop_default_attributes

# Ops through which quantisation commutes: the input takes the output's parameters exactly.
COMMUTING_OPS = {"MaxPool", "Flatten", "Reshape", "Identity", "Dropout", "Transpose", "Squeeze", "Unsqueeze"}
# Which input of each op carries the data (the others are shapes, axes, ...).
DATA_INPUTS = {"Reshape": 1, "Squeeze": 1, "Unsqueeze": 1, "Pad": 1, "Slice": 1, "Resize": 1, "Clip": 1}
LAYER_OPS = {"Conv", "Gemm", "MatMul"}
# Ops ORT runs in int8 between quantisers (QDQ fusions, dropped QDQ pairs, or our BatchNorm rewrite).
INT8_OPS = COMMUTING_OPS | {
    "Relu",
    "Add",
    "Concat",
    "GlobalAveragePool",
    "AveragePool",
    "BatchNormalization",
    "Sigmoid",
    "LeakyRelu",
}
CALIBRATION_MARGIN = 1.25


class _Graph:
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


def fold_zero_pads(model: onnx.ModelProto) -> None:
    """A zero `Pad` before a quantised conv (CREPE pads each conv's input itself) becomes the conv's own
    padding: exact, since QuantizeLinear maps 0.0 to the zero point, which is what QLinearConv pads with."""
    graph = model.graph
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    readers = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            readers[name].append(node)
    dropped = []
    for pad in (n for n in graph.node if n.op_type == "Pad"):
        for name in pad.input[1:3]:
            if name and name not in values:  # F.pad's pads come out of a Concat/Slice/Cast chain on constants
                found = _constant_value(model, name)
                if found is not None:
                    values[name] = found
        convs = _padded_convs(pad, values, readers)
        if convs is None:
            continue
        pads = values[pad.input[1]].astype(int).tolist()
        rank = len(pads) // 2
        spatial = pads[2:rank] + pads[rank + 2 :]
        for quantize, conv in convs:
            quantize.input[0] = pad.input[0]
            names = [a.name for a in conv.attribute]
            old = list(conv.attribute[names.index("pads")].ints) if "pads" in names else [0] * len(spatial)
            if "pads" in names:
                del conv.attribute[names.index("pads")]
            conv.attribute.append(helper.make_attribute("pads", [a + b for a, b in zip(old, spatial, strict=True)]))
        dropped.append(pad)
    for pad in dropped:
        graph.node.remove(pad)
    if dropped:
        _drop_dead_nodes(model)


def _drop_dead_nodes(model: onnx.ModelProto) -> None:
    """Nodes none of whose outputs is read or is a graph output (the pads computation of a folded Pad)."""
    graph = model.graph
    while True:
        used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
        dead = [n for n in graph.node if not any(o in used for o in n.output)]
        if not dead:
            return
        for node in dead:
            graph.node.remove(node)


def _constant_value(model: onnx.ModelProto, name: str) -> np.ndarray | None:
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


def _padded_convs(pad, values, readers) -> list | None:
    """[(QuantizeLinear, Conv)] reading a constant zero Pad over spatial dims only, else None."""
    mode = next((a.s.decode() for a in pad.attribute if a.name == "mode"), "constant")
    if mode != "constant" or len(pad.input) < 2 or pad.input[1] not in values or len(pad.input) > 3 and pad.input[3]:
        return None
    if len(pad.input) > 2 and pad.input[2] and (pad.input[2] not in values or values[pad.input[2]].any()):
        return None
    pads = values[pad.input[1]].astype(int).tolist()
    rank = len(pads) // 2
    if rank < 3 or any(pads[i] for i in (0, 1, rank, rank + 1)) or min(pads) < 0:
        return None
    found = []
    for quantize in readers[pad.output[0]]:
        dequantize = readers[quantize.output[0]] if quantize.op_type == "QuantizeLinear" else []
        convs = (
            readers[dequantize[0].output[0]]
            if len(dequantize) == 1 and dequantize[0].op_type == "DequantizeLinear"
            else []
        )
        if (
            len(convs) != 1
            or convs[0].op_type != "Conv"
            or convs[0].input[0] != dequantize[0].output[0]
            or any(a.name == "auto_pad" and a.s not in (b"", b"NOTSET") for a in convs[0].attribute)
        ):
            return None
        found.append((quantize, convs[0]))
    return found or None


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


def _plan(g: _Graph) -> tuple[dict[str, tuple[str, str] | None], list[str]]:
    """Tensor -> its quantiser's (scale, zero point) names, or None where it must be calibrated."""
    leads: dict[str, bool] = {}
    params: dict[str, tuple[str, str] | None] = {}
    for name in reversed(_topological_tensors(g.model)):
        readers = [n for n, _ in g.readers[name]]
        # Only through ops with an int8 form: a transformer's LayerNorm, Softmax or GELU stays float.
        leads[name] = g.is_float_activation(name) and any(
            n.op_type == "QuantizeLinear" or (n.op_type in INT8_OPS and any(leads.get(o, False) for o in n.output))
            for n in readers
        )
        if not leads[name]:
            continue
        own = g.quantizer_params(name)
        if own is None:
            through = [params.get(n.output[0]) for n in readers if n.op_type in COMMUTING_OPS]
            own = next((p for p in through if p is not None), None)
        params[name] = own
    plan = {}
    for name, p in params.items():
        producer = g.producer[name]
        if producer.op_type not in INT8_OPS | LAYER_OPS | {"DequantizeLinear"}:
            continue  # a float op's output: quantised by the layer reading it, as AMCT does
        readers = [n for n, _ in g.readers[name]]
        if producer.op_type == "DequantizeLinear":
            continue
        if readers and _tag(producer) and all(n.op_type == "Add" and _tag(n) == _tag(producer) for n in readers):
            continue  # a MatMul layer's own bias Add: the layer's output is the Add's
        if readers and all(n.op_type == "Relu" for n in readers):
            continue  # the ReLU's output is quantised; ORT removes the ReLU (zero point = lowest code)
        if (
            all(n.op_type == "QuantizeLinear" for n in readers)
            and name not in g.outputs
            and not _relu_kept_by_ort(g, name, p)
        ):
            continue  # already quantised for every reader
        plan[name] = p
    return plan, [n for n, p in plan.items() if p is None]


def _relu_kept_by_ort(g: _Graph, name: str, params: tuple[str, str] | None) -> bool:
    """A ReLU output whose quantiser's zero point is not the lowest code: ORT keeps that ReLU in float
    (and so cannot fuse the conv before it); we rewrite it as Clip(q, min=zero point) on the codes."""
    producer = g.producer[name]
    if producer.op_type != "Relu" or params is None or name in g.outputs:
        return False
    if [n.op_type for n, _ in g.readers[producer.input[0]]] != ["Relu"]:
        return False
    zero = numpy_helper.to_array(g.initializers[params[1]])
    return int(zero) != int(np.iinfo(zero.dtype).min)


def _calibrate(model: onnx.ModelProto, names: list[str], feeds: dict[str, np.ndarray]) -> dict[str, tuple]:
    """uint8 (scale, zero point) covering each tensor's range on the example input, 0 included."""
    if not names:
        return {}
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    known = {o.name for o in probe.graph.output}
    probe.graph.output.extend(
        helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names if n not in known
    )
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    values = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
    found = {}
    for name in names:
        if not np.isfinite(values[name]).all():
            continue  # e.g. an attention mask's -inf: left float
        # A margin over the example's range: the example is a batch or two, other inputs reach further.
        lo, hi = (
            CALIBRATION_MARGIN * min(float(values[name].min()), 0.0),
            CALIBRATION_MARGIN * max(float(values[name].max()), 0.0),
        )
        scale = (hi - lo) / 255 if hi > lo else 1.0
        found[name] = (np.float32(scale), np.uint8(np.clip(round(-lo / scale), 0, 255)))
    return found


def _base_name(g: _Graph, tensor: str) -> str:
    """A readable stem for the quantiser of `tensor`: its producer's layer or node name."""
    node = g.producer[tensor]
    tag = _tag(node)
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


def _tag(node: onnx.NodeProto) -> str | None:
    """The layer a node belongs to (`<layer>/<Op>` names; the exporter's own names start with '/')."""
    return node.name.split("/")[0] if "/" in node.name and not node.name.startswith("/") else None


def quantize_boundaries(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> onnx.ModelProto:
    """Insert QuantizeLinear/DequantizeLinear on every tensor between quantised layers (module doc)."""
    constants_to_initializers(model)
    _pop_tags(model)
    fold_zero_pads(model)
    _merge_equal_quantizers(model)
    g = _Graph(model)
    plan, to_calibrate = _plan(g)
    calibrated = _calibrate(model, to_calibrate, feeds)
    graph = model.graph
    new_nodes: dict[str, list[onnx.NodeProto]] = defaultdict(list)  # after the producer of a tensor
    dropped: set = set()  # ReLUs rewritten as Max on codes, and the quantisers they made redundant
    rewired: dict[str, str] = {}  # output of a dropped quantiser -> the codes that replace it
    bases: set[str] = set()
    for name, params in plan.items():
        base, k = _base_name(g, name), 1
        while base in bases:  # a layer with two planned outputs (MatMul, then its bias Add)
            base, k = f"{_base_name(g, name)}_{k}", k + 1
        bases.add(base)
        if params is None and name not in calibrated:
            continue
        if params is None:
            scale_value, zero_value = calibrated[name]
            params = (f"{base}_scale", f"{base}_zero_point")
            added = [
                numpy_helper.from_array(np.array(scale_value), params[0]),
                numpy_helper.from_array(np.array(zero_value), params[1]),
            ]
            graph.initializer.extend(added)
            g.initializers.update((t.name, t) for t in added)
        quantized = next(
            (
                n.output[0]
                for n, _ in g.readers[name]
                if n.op_type == "QuantizeLinear" and tuple(n.input[1:3]) == params
            ),
            None,
        )
        if _relu_kept_by_ort(g, name, params):
            # relu on codes is max(q, zero point), exactly: quantise the ReLU's input instead.
            relu = g.producer[name]
            codes = f"{base}_quantized"
            new_nodes[relu.input[0]].extend(
                [
                    helper.make_node(
                        "QuantizeLinear", [relu.input[0], *params], [f"{base}_prerelu"], name=f"{base}/QuantizeLinear"
                    ),
                    # Clip on uint8 is vectorised in ORT; Max ran 5x slower on a ResNet-18 stem.
                    helper.make_node("Clip", [f"{base}_prerelu", params[1]], [codes], name=f"{base}/Clip"),
                ]
            )
            dropped.add(relu.name or id(relu))
            for reader, _ in g.readers[name]:
                if reader.op_type == "QuantizeLinear" and tuple(reader.input[1:3]) == params:
                    dropped.add(reader.name or id(reader))
                    rewired[reader.output[0]] = codes
            quantized = codes
        elif quantized is None:
            quantized = f"{base}_quantized"
            new_nodes[name].append(
                helper.make_node("QuantizeLinear", [name, *params], [quantized], name=f"{base}/QuantizeLinear")
            )
        for k, (reader, index) in enumerate(g.readers[name]):
            if reader.op_type == "QuantizeLinear" and (reader.name or id(reader)) not in dropped:
                continue
            if (reader.name or id(reader)) in dropped:
                continue
            dequantized = f"{base}_dequantized_{k}"
            new_nodes[quantized].append(
                helper.make_node(
                    "DequantizeLinear", [quantized, *params], [dequantized], name=f"{base}/DequantizeLinear_{k}"
                )
            )
            reader.input[index] = dequantized
    ordered = []

    def place(node: onnx.NodeProto) -> None:
        if (node.name or id(node)) in dropped:
            return
        node.input[:] = [rewired.get(n, n) for n in node.input]
        ordered.append(node)
        for out in node.output:
            for follower in new_nodes.pop(out, []):
                place(follower)

    for node in list(graph.node):
        place(node)
    del graph.node[:]
    graph.node.extend(ordered)
    _shape_ops_on_codes(model)
    return model


# Ops that only move values: they run on integer codes as well as on floats.
SHAPE_OPS = {"Flatten", "Reshape", "Identity", "Transpose", "Squeeze", "Unsqueeze"}


def _shape_ops_on_codes(model: onnx.ModelProto) -> None:
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
        _drop_dead_nodes(model)


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
        gamma, beta, mean, var = (values[n].astype(np.float64) for n in node.input[1:5])
        eps = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)
        a = gamma / np.sqrt(var + eps)
        b = beta - mean * a
        s_in = float(values[dq.input[1]])
        w_scale = np.where(a == 0, 1.0, np.abs(a) / 127).astype(np.float32)
        codes = np.where(a == 0, 0, np.sign(a) * 127).astype(np.int8)
        bias = np.round(b / (s_in * w_scale.astype(np.float64))).astype(np.int32)
        channels, dims = codes.size, ranks[node.input[0]] - 2
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
        weight = helper.make_node(
            "DequantizeLinear",
            [f"{stem}.weight", f"{stem}.weight_scale", f"{stem}.weight_zero_point"],
            [f"{stem}.weight_dq"],
            axis=0,
            name=f"{stem}/DequantizeLinear_weight",
        )
        bias_dq = helper.make_node(
            "DequantizeLinear",
            [f"{stem}.bias", f"{stem}.bias_scale", f"{stem}.bias_zero_point"],
            [f"{stem}.bias_dq"],
            axis=0,
            name=f"{stem}/DequantizeLinear_bias",
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
    used = {name for n in graph.node for name in n.input}
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return model


def name_after_layers(model: onnx.ModelProto) -> onnx.ModelProto:
    """Nodes `<layer>/<Op>` and initialisers `<layer>.weight`, `.weight_scale`, `.bias`, `.input_scale`
    ...; the temporary layer attributes go. Other names stay as the exporter wrote them."""
    graph = model.graph
    producer = {out: n for n in graph.node for out in n.output}
    initializers = {t.name: t for t in graph.initializer}
    renamed: dict[str, str] = {}
    for node in graph.node:
        tag = _tag(node)
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


PRODUCER = "amct_engine"
REPORT_KEY = "amct_deploy_report"
# What each quantised layer should become after ORT's optimiser.
FUSED_OPS = {
    "QLinearConv",
    "QGemm",
    "QLinearMatMul",
    "MatMulIntegerToFloat",
    "QLinearAdd",
    "QLinearConcat",
    "QLinearGlobalAveragePool",
    "QLinearAveragePool",
    "QLinearSigmoid",
    "QLinearLeakyRelu",
    "DynamicQuantizeMatMul",
    "MatMulNBits",
}


def optimized_ops(model: onnx.ModelProto) -> onnx.ModelProto:
    """The graph ORT's CPU provider runs after its optimiser (all levels), as a ModelProto."""
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3  # not the warning that the saved graph is hardware specific
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return onnx.load(options.optimized_model_filepath)


def _why_not_fused(model: onnx.ModelProto, layer: str) -> str:
    """The reason a layer's op stayed float: what reads its output in the deploy graph."""
    node = next(n for n in model.graph.node if n.name.split("/")[0] == layer and n.op_type in LAYER_OPS)
    outputs = {o.name for o in model.graph.output}
    readers = [n.op_type for n in model.graph.node if node.output[0] in n.input]
    if node.output[0] in outputs or not readers:
        return "its output is a model output, kept float (a quantised output would cost a rounding)"
    if "QuantizeLinear" not in readers:
        return (
            f"its output is read by float ops ({', '.join(sorted(set(readers)))}) and reaches no quantised "
            "layer, so it is not quantised and ORT cannot make an int8 kernel of it"
        )
    return "ORT's QDQ selectors rejected the group (see the optimised graph)"


# export.conv_layout.float_stems says why.
FLOAT_STEM_REASON = "float stem by design: exact on its integer codes, faster than QLinearConv on one channel"


def fusion_report(model: onnx.ModelProto, deploy_target: str) -> dict:
    """Which op each quantised layer runs as after ORT's optimiser, and the layers that did not fuse, why.

    ORT names a fused node after the node it replaces, so `<layer>/<Op>` survives optimisation.
    """
    layers = {
        n.name.split("/")[0]
        for n in model.graph.node  # MatMulIntegerToFloat: export.float_output_matmul
        if n.op_type in LAYER_OPS | {"MatMulIntegerToFloat"} and "/" in n.name and not n.name.startswith("/")
    }
    optimized = optimized_ops(model)
    runs_as: dict[str, str] = {}
    for node in optimized.graph.node:
        layer = node.name.split("/")[0]
        layer_op = node.op_type in FUSED_OPS or node.op_type in LAYER_OPS | {"FusedConv", "FusedGemm"}
        if layer in layers and layer_op and runs_as.get(layer) not in FUSED_OPS:
            runs_as[layer] = node.op_type
    ops: dict[str, int] = defaultdict(int)
    for node in optimized.graph.node:
        ops[node.op_type] += 1
    not_fused = {
        layer: f"runs as float {op}: {_why_not_fused(model, layer)}"
        for layer, op in runs_as.items()
        if op not in FUSED_OPS
    }
    for node in model.graph.node:  # layers the writer could not give an int8 kernel (QdqDeployBackend)
        if node.op_type == "Identity" and node.name.endswith("/NoInt8Kernel"):
            layer = node.name.split("/")[0]
            runs_as[layer] = "float (integer-valued)"
            not_fused[layer] = (
                "INT16 activations or a transposed conv: onnxruntime has no int8 kernel for it, "
                "so it runs the fake-quant form (integer-valued floats, exact)"
            )
    return {
        "deploy_target": deploy_target,
        "layers": runs_as,
        "not_fused": not_fused,
        "optimized_op_counts": dict(sorted(ops.items())),
    }


def finalize_qdq_deploy(model: onnx.ModelProto, feeds: dict[str, np.ndarray], deploy_target: str) -> onnx.ModelProto:
    """The "onnx" deploy format's finaliser: boundaries quantised, names, producer, and the export's
    decisions in the file's metadata (`deploy_report` adds what onnxruntime makes of the graph)."""
    import json

    model = name_after_layers(batch_norms_as_depthwise_convs(quantize_boundaries(model, feeds)))
    x86_signed = deploy_target in ("x86_vnni", "x86_amx")
    decisions = {
        "deploy_target": deploy_target,
        "wide_kernels": tall_kernels_as_wide(model),
        "float_stems": float_stems(model) if x86_signed else [],
        # export.conv_layout: padding serves the symmetric conv, which x86_amx steers away from.
        "padded_input_channels": pad_input_channels(model) if deploy_target == "x86_vnni" else [],
        "gemm_path_convs": convs_on_the_gemm_path(model) if deploy_target == "x86_amx" else [],
        "matmul_integer_to_float": matmuls_to_integer_to_float(model),
    }
    model = pack_int4_weights(model)
    model = drop_default_attributes(short_activation_names(model))  # after the packing: it writes value_info
    model.producer_name = PRODUCER
    kept = [p for p in model.metadata_props if p.key != REPORT_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    # Only what cannot be read off the graph, and no empty lists: a few percent of a small A8W4 file.
    stored = {key: value for key, value in decisions.items() if value}
    model.metadata_props.add(key=REPORT_KEY, value=json.dumps(stored, sort_keys=True, separators=(",", ":")))
    return model


def deploy_report(model: str | onnx.ModelProto) -> dict:
    """A deploy model's report ({} for a file `finalize_qdq_deploy` did not write): the export's decisions
    stored in the file (deploy target, conv layout rewrites, float-output MatMuls), the INT4 weights, and
    which op each quantised layer runs as after this onnxruntime's optimiser, with the layers that did not
    fuse and why and the op counts of that graph (`fusion_report`, computed now: an onnxruntime session)."""
    import json

    model = onnx.load(model) if isinstance(model, str) else model
    stored = next((json.loads(p.value) for p in model.metadata_props if p.key == REPORT_KEY), None)
    if stored is None:
        return {}
    report = fusion_report(model, stored["deploy_target"])
    layout = {
        key: stored.get(key, []) for key in ("wide_kernels", "float_stems", "padded_input_channels", "gemm_path_convs")
    }
    for layer in (name.split("/")[0] for name in layout["float_stems"]):  # ORT renames them (NCHWc)
        report["layers"][layer] = "Conv"
        report["not_fused"][layer] = FLOAT_STEM_REASON
    report["int4_weights"] = [
        t.name.removesuffix(INT4_SUFFIX) for t in model.graph.initializer if t.data_type == TensorProto.INT4
    ]
    report["conv_layout"] = layout
    report["matmul_integer_to_float"] = stored.get("matmul_integer_to_float", [])
    return report
