"""Linear layers whose output stays float (a transformer's) as onnxruntime's MatMulIntegerToFloat with their bias.

In the QDQ form such a layer is `DequantizeLinear(codes) -> MatMul <- DequantizeLinear(int8 weight)`, then
`Add(DequantizeLinear(int32 bias))`. onnxruntime fuses the MatMul into its `MatMulIntegerToFloat` (the
QDQ MatMul selector with no QuantizeLinear after it) but leaves the bias as a DequantizeLinear computed
on every run and a separate Add: 36 of each in MiniLM-L6. Its own fusion that folds the bias in
(`MatMulIntegerToFloatFusion`) starts from `MatMulInteger -> Cast -> Mul(scales)`, only when the scales
are computed at run time (dynamic quantisation); constant scales are folded before it runs. So the
deploy graph carries the node ORT would make, `com.microsoft::MatMulIntegerToFloat(A codes, B codes,
a_scale, b_scale, a_zero_point, b_zero_point, bias)`, with the bias as the float32 values the
DequantizeLinear computed (int32 codes x scale, in float32). Measured on MiniLM (batch 1, one thread,
minima of interleaved runs): 0.27x FP32 instead of 0.37x; the same integer products, the bias added in
the kernel's output step (its rounding, not the Add's: within float32 rounding of the QDQ graph).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx
from onnx import helper, numpy_helper

MS_DOMAIN = "com.microsoft"


def _dq(node: onnx.NodeProto | None, initializers: dict, constant: bool) -> bool:
    """A DequantizeLinear whose scale and zero point are initialisers (and its input too, if `constant`)."""
    if node is None or node.op_type != "DequantizeLinear" or not all(i in initializers for i in node.input[1:]):
        return False
    return (node.input[0] in initializers) == constant


def _bias_values(dq: onnx.NodeProto, initializers: dict) -> np.ndarray:
    """What DequantizeLinear computes from the int32 bias codes: (q - zero point) * scale in float32."""
    values = [numpy_helper.to_array(initializers[n]) for n in dq.input]
    codes, scale = values[0].astype(np.float32), values[1].astype(np.float32)
    zero = values[2].astype(np.float32) if len(values) > 2 else np.float32(0)
    return ((codes - zero) * scale).astype(np.float32)


def matmuls_to_integer_to_float(model: onnx.ModelProto) -> list[str]:
    """Rewrite every `DQ(codes) -> MatMul <- DQ(const weight) [-> Add(DQ(const int32 bias))]` whose output
    is not requantised into one MatMulIntegerToFloat (module doc). Returns the rewritten layers' names."""
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            readers[name].append(node)
    replaced: dict[int, onnx.NodeProto] = {}  # id(node to replace) -> MatMulIntegerToFloat
    dropped: set[int] = set()
    for matmul in (n for n in graph.node if n.op_type == "MatMul"):
        a_dq, b_dq = producer.get(matmul.input[0]), producer.get(matmul.input[1])
        if (
            not _dq(a_dq, initializers, constant=False)
            or not _dq(b_dq, initializers, constant=True)
            or numpy_helper.to_array(initializers[a_dq.input[1]]).size != 1
        ):
            continue
        if any(r.op_type == "QuantizeLinear" for r in readers[matmul.output[0]]):
            continue  # requantised: ORT makes a QLinearMatMul of it
        stem = matmul.name.split("/")[0] or matmul.output[0]
        inputs = [a_dq.input[0], b_dq.input[0], a_dq.input[1], b_dq.input[1], _input(a_dq, 2), _input(b_dq, 2)]
        last = matmul
        add = readers[matmul.output[0]][0] if len(readers[matmul.output[0]]) == 1 else None
        bias_dq = producer.get(add.input[1]) if add is not None and add.op_type == "Add" else None
        if bias_dq is not None and _dq(bias_dq, initializers, constant=True) and add.input[0] == matmul.output[0]:
            graph.initializer.append(numpy_helper.from_array(_bias_values(bias_dq, initializers), f"{stem}.bias_float"))
            inputs.append(f"{stem}.bias_float")
            last = add
            dropped.update({id(add), id(bias_dq)} if len(readers[bias_dq.output[0]]) == 1 else {id(add)})
        fused = helper.make_node(
            "MatMulIntegerToFloat", inputs, list(last.output), name=f"{stem}/MatMulIntegerToFloat", domain=MS_DOMAIN
        )
        replaced[id(matmul)] = fused
        for dq in (a_dq, b_dq):
            if len(readers[dq.output[0]]) == 1:
                dropped.add(id(dq))
    if not replaced:
        return []
    kept = [replaced.get(id(n), n) for n in graph.node if id(n) not in dropped]
    del graph.node[:]
    graph.node.extend(kept)
    _drop_unused_initializers(graph)
    if MS_DOMAIN not in {o.domain for o in model.opset_import}:
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return [n.name.split("/")[0] for n in replaced.values()]


def _input(node: onnx.NodeProto, index: int) -> str:
    return node.input[index] if len(node.input) > index else ""


def _drop_unused_initializers(graph: onnx.GraphProto) -> None:
    used = {name for n in graph.node for name in n.input}
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
