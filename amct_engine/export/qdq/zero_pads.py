"""A zero `Pad` before a quantised conv becomes the conv's own padding (CREPE pads each conv's input itself)."""

from __future__ import annotations

from collections import defaultdict

import onnx
from onnx import helper, numpy_helper

from amct_engine.export.qdq.graph_index import constant_value, drop_dead_nodes


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
                found = constant_value(model, name)
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
        drop_dead_nodes(model)


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
