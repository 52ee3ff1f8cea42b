"""AMCT's Ascend deploy layout (docs/spec/engine.md §5) and a numpy/onnxruntime reference for its custom ops.

The `ascend` back end emits, per quantised layer:
  AscendQuant(x) -> Conv|MatMul(+Add) on INT8 (or INT4) weights and an INT32 bias -> AscendDequant
with `AscendQuant` attributes scale = 1/scale_d, offset = offset_d, dst_type, and the UINT64
`<layer>.dequant.param` packing deq_scale = scale_w * scale_d (float32 bits [31:0]), shift_N
([39:32], always 0: searchN is gone, docs/spec/engine.md §4.7) and offset_w ([47:40], always 0 for symmetric
weights). `finalize_ascend_model` then names nodes and initialisers as AMCT does and merges
identical AscendQuant nodes; `ascend_to_standard_onnx` rewrites the custom ops into standard ones
so onnxruntime can run the model here, where no Ascend device exists.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from amct_engine.export.layer_graph import LAYER_ATTR, WTS_TYPE_ATTR
from amct_engine.export.onnx_graph import constants_to_initializers

ASCEND_DOMAIN = "amct.ascend"
OFFSET_W_SHIFT = 40
SHIFT_N_SHIFT = 32


def pack_dequant_param(deq_scale: np.ndarray, offset_w: np.ndarray | None = None) -> np.ndarray:
    """UINT64 words: float32 bits of deq_scale in [31:0], offset_w (uint8) in [47:40]."""
    bits = np.asarray(deq_scale, dtype=np.float32).view(np.uint32).astype(np.uint64)
    if offset_w is not None:
        bits |= (np.asarray(offset_w).astype(np.uint8).astype(np.uint64)) << np.uint64(OFFSET_W_SHIFT)
    return bits


def unpack_dequant_param(words: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Inverse of `pack_dequant_param`: (deq_scale float32, shift_n uint8, offset_w int8)."""
    words = np.asarray(words, dtype=np.uint64)
    deq_scale = (words & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.float32)
    shift_n = ((words >> np.uint64(SHIFT_N_SHIFT)) & np.uint64(0xFF)).astype(np.uint8)
    offset_w = ((words >> np.uint64(OFFSET_W_SHIFT)) & np.uint64(0xFF)).astype(np.uint8).view(np.int8)
    return deq_scale, shift_n, offset_w


def _attr(node: onnx.NodeProto, name: str):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return None


def _drop_attr(node: onnx.NodeProto, name: str) -> None:
    keep = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(keep)


def _rename_value(graph: onnx.GraphProto, old: str, new: str) -> None:
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new
    for init in graph.initializer:
        if init.name == old:
            init.name = new


def is_ascend_model(model: onnx.ModelProto) -> bool:
    return any(op.domain == ASCEND_DOMAIN for op in model.opset_import)


def finalize_ascend_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """AMCT names, UINT64 dequant params, merged AscendQuant nodes, custom domain declared."""
    graph = model.graph
    constants_to_initializers(model)
    initializers = {init.name: init for init in graph.initializer}
    for node in graph.node:
        layer = _attr(node, LAYER_ATTR)
        if layer is None:
            continue
        layer = layer.decode() if isinstance(layer, bytes) else layer
        wts_type = _attr(node, WTS_TYPE_ATTR).decode()
        _drop_attr(node, LAYER_ATTR)
        _drop_attr(node, WTS_TYPE_ATTR)
        if node.op_type == "AscendQuant":
            node.name = f"{layer}.quant"
        elif node.op_type == "AscendDequant":
            node.name = f"{layer}.dequant"
            param = initializers[node.input[1]]
            words = numpy_helper.to_array(param).astype(np.int64).view(np.uint64)
            new = numpy_helper.from_array(words, f"{layer}.dequant.param")
            param.CopyFrom(new)
            node.input[1] = new.name
        elif node.op_type in ("Conv", "MatMul", "Add"):
            _store_layer_tensors(graph, node, layer, wts_type, initializers)
    _merge_identical_quants(graph)
    if not is_ascend_model(model):
        model.opset_import.append(helper.make_opsetid(ASCEND_DOMAIN, 1))
    return model


def _store_layer_tensors(graph, node, layer: str, wts_type: str, initializers) -> None:
    """`<layer>.weight` as INT8/INT4 and `<layer>.bias` as INT32 initialisers, as AMCT writes them.

    Conv/MatMul inputs are [data, weight, (bias)]; the bias Add after a MatMul is [data, bias].
    """
    node.name = layer if node.op_type != "Add" else f"{layer}.bias_add"
    roles = ["bias"] if node.op_type == "Add" else ["weight", "bias"]
    for name, role in zip(list(node.input[1:]), roles, strict=False):
        init = initializers.get(name)
        if init is None:
            continue
        values = numpy_helper.to_array(init)
        if role == "bias":
            typed = numpy_helper.from_array(values.astype(np.int32), f"{layer}.bias")
        elif wts_type == "INT4":
            typed = helper.make_tensor(
                f"{layer}.weight", onnx.TensorProto.INT4, values.shape, values.astype(np.int8).flatten().tolist()
            )
        else:
            typed = numpy_helper.from_array(values.astype(np.int8), f"{layer}.weight")
        _rename_value(graph, name, typed.name)
        init.CopyFrom(typed)
        initializers[typed.name] = init


def _merge_identical_quants(graph: onnx.GraphProto) -> None:
    """docs/spec/engine.md §5 QuantFusion: one AscendQuant per (tensor, scale, offset, dst_type)."""
    first: dict[tuple, onnx.NodeProto] = {}
    drop = []
    for node in graph.node:
        if node.op_type != "AscendQuant":
            continue
        key = (node.input[0], _attr(node, "scale"), _attr(node, "offset"), _attr(node, "dst_type"))
        kept = first.setdefault(key, node)
        if kept is not node:
            _rename_value(graph, node.output[0], kept.output[0])
            drop.append(node)
    for node in drop:
        graph.node.remove(node)


# ---------------------------------------------------------------------------------------------
# Reference: rewrite the Ascend ops into standard ONNX so onnxruntime runs the deploy model.


def _qrange(dst_type: str) -> tuple[float, float]:
    bits = int(dst_type.removeprefix("INT"))
    return float(-(2 ** (bits - 1))), float(2 ** (bits - 1) - 1)


def ascend_to_standard_onnx(model: onnx.ModelProto) -> onnx.ModelProto:
    """docs/spec/engine.md §5 fake-quant rewrite: AscendQuant -> Div/Round/Add/Clip/Sub, integer weights as
    float tensors of the same integers (a Conv's through a unit-scale DequantizeLinear), INT32 bias -> float tensor
    of the same integers, AscendDequant -> Mul(deq_scale).

    A Conv's weights stay INT8 behind a DequantizeLinear, as in our fake-quant model: as float initialisers
    onnxruntime would fold the rescale Mul into them and leave the integer domain. A MatMul's become float
    initialisers holding the integers: behind a DequantizeLinear, onnxruntime's extended optimisations turn
    DequantizeLinear -> MatMul into a kernel that quantises the float input again (off by codes), and no Mul
    follows a MatMul directly here (the bias Add sits between) to be folded.
    """
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    producers = {out: node for node in graph.node for out in node.output}
    # Only the quantised layers' tensors: the model's own integer constants (a Range's bounds, an index) stay.
    layers = {n.input[1].removesuffix(".dequant.param") for n in graph.node if n.op_type == "AscendDequant"}
    conv_weights = {n.input[1] for n in graph.node if n.op_type == "Conv"}
    new_inits, weight_names = [], set()
    for init in graph.initializer:
        values = numpy_helper.to_array(init)
        layer_tensor = init.name.rsplit(".", 1)[0] in layers
        if (
            layer_tensor
            and init.data_type in (onnx.TensorProto.INT8, onnx.TensorProto.INT4)
            and init.name in conv_weights
        ):
            new_inits.append(numpy_helper.from_array(values.astype(np.int8), init.name))
            weight_names.add(init.name)
        elif layer_tensor and init.data_type in (onnx.TensorProto.INT8, onnx.TensorProto.INT4, onnx.TensorProto.INT32):
            new_inits.append(numpy_helper.from_array(values.astype(np.float32), init.name))
        else:
            new_inits.append(init)
    del graph.initializer[:]
    graph.initializer.extend(new_inits)
    initializers = {init.name: init for init in graph.initializer}
    nodes = _dequantize_weights(weight_names, new_inits)
    for node in graph.node:
        if node.op_type == "AscendQuant" and node.domain == ASCEND_DOMAIN:
            nodes.extend(_quant_reference(node, new_inits))
        elif node.op_type == "AscendDequant" and node.domain == ASCEND_DOMAIN:
            rank = _output_rank(node.input[0], producers, initializers)
            nodes.extend(_dequant_reference(node, initializers, new_inits, rank))
        else:
            node.input[:] = [f"{n}/ref_float" if n in weight_names else n for n in node.input]
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for node in nodes for name in node.input}
    del graph.initializer[:]
    graph.initializer.extend(init for init in new_inits if init.name in used)
    del graph.value_info[:]  # intermediate types changed from integer to float
    kept = [op for op in model.opset_import if op.domain != ASCEND_DOMAIN]
    del model.opset_import[:]
    model.opset_import.extend(kept)
    return model


def _dequantize_weights(weight_names: set[str], inits: list) -> list[onnx.NodeProto]:
    """One DequantizeLinear(w, 1.0, 0) per integer weight; consumers read `<w>/ref_float`."""
    if not weight_names:
        return []
    one = _const(inits, "ref/unit_scale", 1.0)
    inits.append(numpy_helper.from_array(np.array(0, dtype=np.int8), "ref/zero_int8"))
    return [
        helper.make_node("DequantizeLinear", [name, one, "ref/zero_int8"], [f"{name}/ref_float"])
        for name in sorted(weight_names)
    ]


def _const(inits: list, name: str, value) -> str:
    inits.append(numpy_helper.from_array(np.asarray(value, dtype=np.float32), name))
    return name


def _quant_reference(node, inits: list) -> list[onnx.NodeProto]:
    """AscendQuant as Div(x, scale_d) -> Round -> Add(offset) -> Clip -> Sub(offset).

    The node stores scale = 1/scale_d; scale_d is written reciprocal-stable (1/(1/scale_d) gives it
    back), so dividing by the recovered scale_d is exactly QuantizeLinear's arithmetic and the
    reference agrees with the fake-quant model bit for bit. (Ascend multiplies by `scale`: at most
    one ulp apart before rounding.)
    """
    p = node.name or node.output[0]
    scale_d = np.float32(1) / np.float32(_attr(node, "scale"))
    offset = _attr(node, "offset")
    qn, qp = _qrange(_attr(node, "dst_type").decode())
    names = [f"{p}/ref_{s}" for s in ("div", "round", "add", "clip")]
    return [
        helper.make_node("Div", [node.input[0], _const(inits, f"{p}/ref_scale_d", scale_d)], [names[0]]),
        helper.make_node("Round", [names[0]], [names[1]]),
        helper.make_node("Add", [names[1], _const(inits, f"{p}/ref_offset", offset)], [names[2]]),
        helper.make_node(
            "Clip", [names[2], _const(inits, f"{p}/ref_qn", qn), _const(inits, f"{p}/ref_qp", qp)], [names[3]]
        ),
        helper.make_node("Sub", [names[3], f"{p}/ref_offset"], [node.output[0]]),
    ]


def _output_rank(tensor: str, producers: dict, initializers: dict) -> int | None:
    """Rank of a Conv's weight feeding this tensor (through a bias Add), None for MatMul."""
    node = producers.get(tensor)
    while node is not None and node.op_type == "Add":
        node = producers.get(node.input[0])
    if node is not None and node.op_type == "Conv":
        return len(initializers[node.input[1].removesuffix("/ref_float")].dims)
    return None


def _dequant_reference(node, initializers: dict, inits: list, conv_rank: int | None) -> list[onnx.NodeProto]:
    words = numpy_helper.to_array(initializers[node.input[1]])
    deq_scale, _, _ = unpack_dequant_param(words)
    if conv_rank is not None and deq_scale.size > 1:
        deq_scale = deq_scale.reshape([1, -1] + [1] * (conv_rank - 2))
    name = _const(inits, f"{node.name or node.output[0]}/ref_deq_scale", deq_scale)
    return [helper.make_node("Mul", [node.input[0], name], [node.output[0]])]
