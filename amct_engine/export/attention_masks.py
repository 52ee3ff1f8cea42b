"""Boolean attention masks with a finite fill, and no NaN guard after each softmax (docs/spec/engine.md §5.3).

torch's ONNX translation of `scaled_dot_product_attention` with a boolean mask adds `Where(mask, 0, -inf)` to
the scores and, since ONNX's Softmax of a row whose every key is masked is 0/0, follows each Softmax with
`Where(IsNaN(p), 0, p)`. Those guards are element-wise passes over every attention matrix: in the BBC task's
pruned INT8 MiniLM at batch 1, 128 tokens, 0.6 of its 4.3 ms of kernel time (docs/bbc_task.md, "Results on an
AMX CPU"), on two threads as on one.

With float32's lowest finite value as the fill no Softmax output is NaN, so the guard never fires and goes.
A row with at least one visible key computes what it did: `exp(lowest - max)` underflows to 0 as `exp(-inf)`
does. A row with none (a query of an all-padding sequence, or a causal query before the first token of a
left-padded one) now averages the values instead of giving zeros: outputs at positions that carry no input.

Only the exact pattern is rewritten: the Softmax reads `Add(scores, fill)` with the scores from a MatMul (or its
scaling) and no other mask, and the fill's Where feeds nothing but Adds whose one consumer is a Softmax; anything
else is left as it is (a second -inf source would make NaN rows again, which the guard must then catch).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

LOWEST = np.finfo(np.float32).min
FILL_NAME = "attention_mask/finite_fill"
SCORES = ("MatMul", "FusedMatMul", "Mul", "Div")  # what the other addend (the scaled q·kᵀ) may come from


def finite_attention_masks(model: onnx.ModelProto) -> list[str]:
    """Rewrite `model` in place; the Softmax nodes whose NaN guard was removed."""
    graph = model.graph
    producers = {out: node for node in graph.node for out in node.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    constants = _constants(graph)
    graph_outputs = {o.name for o in graph.output}
    fills, guarded = {}, []
    for softmax in (n for n in graph.node if n.op_type == "Softmax"):
        guard = _nan_guard(softmax, consumers, constants, graph_outputs)
        masks = _mask_fills(softmax, producers, consumers, constants)
        if guard is None or masks is None:
            continue
        guarded.append((softmax, guard))
        fills.update({id(where): where for where in masks})
    if not guarded:
        return []
    if not any(i.name == FILL_NAME for i in graph.initializer):
        graph.initializer.append(numpy_helper.from_array(np.array([LOWEST], np.float32), FILL_NAME))
    # A fill may serve softmaxes whose guard could not go: those rows still see no NaN, so a kept guard is harmless.
    orphans = set()
    for where in fills.values():
        orphans.add(where.input[2])
        where.input[2] = FILL_NAME
    dropped = set()
    for softmax, (isnan, where) in guarded:
        orphans.add(where.input[1])
        for node in consumers.get(where.output[0], []):
            node.input[:] = [softmax.output[0] if name == where.output[0] else name for name in node.input]
        dropped.update({id(isnan), id(where)})
    kept = [n for n in graph.node if id(n) not in dropped]
    del graph.node[:]
    graph.node.extend(kept)
    _drop_unused(graph, orphans)
    return [softmax.name or softmax.output[0] for softmax, _ in guarded]


def _constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    values = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def _all_equal(values: np.ndarray | None, target: float) -> bool:
    return values is not None and values.size > 0 and bool(np.all(values == target))


def _nan_guard(softmax, consumers, constants, graph_outputs) -> tuple[onnx.NodeProto, onnx.NodeProto] | None:
    """(IsNaN, Where) when the Softmax's only consumers are `Where(IsNaN(p), 0, p)`."""
    out = softmax.output[0]
    users = consumers.get(out, [])
    isnan = [n for n in users if n.op_type == "IsNaN"]
    where = [n for n in users if n.op_type == "Where"]
    if len(users) != 2 or len(isnan) != 1 or len(where) != 1 or out in graph_outputs:
        return None
    isnan_node, where_node = isnan[0], where[0]
    if consumers.get(isnan_node.output[0], []) != [where_node] or where_node.output[0] in graph_outputs:
        return None
    if list(where_node.input) != [isnan_node.output[0], where_node.input[1], out]:
        return None
    return (isnan_node, where_node) if _all_equal(constants.get(where_node.input[1]), 0.0) else None


def _mask_fills(softmax, producers, consumers, constants) -> list[onnx.NodeProto] | None:
    """The `Where(mask, 0, -inf)` nodes added to this Softmax's scores, if each feeds only such Adds."""
    add = producers.get(softmax.input[0])
    if add is None or add.op_type != "Add" or consumers.get(add.output[0], []) != [softmax]:
        return None
    fills = []
    for name in add.input:
        where = producers.get(name)
        if where is None or where.op_type != "Where" or len(where.input) != 3:
            if where is None or where.op_type not in SCORES:
                return None  # another mask could still bring -inf: the guard stays
            continue
        if not (_all_equal(constants.get(where.input[1]), 0.0) and _all_equal(constants.get(where.input[2]), -np.inf)):
            return None
        for user in consumers.get(where.output[0], []):
            after = consumers.get(user.output[0], []) if user.op_type == "Add" else []
            if user.op_type != "Add" or len(after) != 1 or after[0].op_type != "Softmax":
                return None
        fills.append(where)
    return fills or None


def _drop_unused(graph: onnx.GraphProto, names: set[str]) -> None:
    """Remove the constants (Constant nodes or initialisers) among `names` that nothing reads any more."""
    used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    unused = names - used
    nodes = [n for n in graph.node if not (n.op_type == "Constant" and n.output[0] in unused)]
    inits = [i for i in graph.initializer if i.name not in unused]
    del graph.node[:], graph.initializer[:]
    graph.node.extend(nodes)
    graph.initializer.extend(inits)
