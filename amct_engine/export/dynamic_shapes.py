"""Keep the input dimensions of a torch.export-captured model dynamic through `torch.onnx.export`.

torch.export writes `x.shape[d]` as an `aten.sym_size.int(x, d)` call whose users are aten op
overloads (`aten.view.default(x, [s0, s1, 12, 32])`). The TorchScript tracer behind
`torch.onnx.export` sees a Python int there and bakes it into the graph as a constant, so the ONNX
model only runs at the example's shapes (MiniLM: an Expand to [2, 32]), whatever `dynamic_axes`
says. Under tracing `x.size(d)` is recorded as Shape -> Gather and yields a 0-d tensor, which the
Python-level tensor functions accept where an int is expected, but the strict op overloads do not.
So a dimension read is rewritten together with its users, when every user has such a Python-level
form; otherwise that dimension stays fixed, as before.
"""

from __future__ import annotations

import copy
import operator

import torch
from torch import fx, nn

aten = torch.ops.aten


def _slice(x: torch.Tensor, dim: int = 0, start=None, end=None, step: int = 1) -> torch.Tensor:
    return x[(slice(None),) * dim + (slice(start, end, step),)]


def _arange(*args, **kwargs) -> torch.Tensor:
    return torch.arange(*args, **kwargs)


# op overload -> ("method", name) or ("function", callable) taking the same arguments
_PYTHON_FORMS = {
    aten.view.default: ("method", "view"),
    aten.reshape.default: ("method", "reshape"),
    aten.expand.default: ("method", "expand"),
    aten.slice.Tensor: ("function", _slice),
    aten.arange.default: ("function", _arange),
    aten.arange.start: ("function", _arange),
    aten.arange.start_step: ("function", _arange),
}
# Python operators on sizes (s0 * 12, s1 - 1) work on 0-d tensors as they do on ints.
_SIZE_ARITHMETIC = {operator.mul, operator.add, operator.sub, operator.floordiv, operator.neg}


def _is_size_read(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is aten.sym_size.int


def _size_values(size_read: fx.Node) -> set[fx.Node]:
    """The size read and the arithmetic nodes computed from it."""
    values, frontier = {size_read}, [size_read]
    while frontier:
        for user in frontier.pop().users:
            if user not in values and user.op == "call_function" and user.target in _SIZE_ARITHMETIC:
                values.add(user)
                frontier.append(user)
    return values


def _rewritable(values: set[fx.Node]) -> bool:
    users = {u for v in values for u in v.users if u not in values}
    return all(u.op == "call_function" and u.target in _PYTHON_FORMS for u in users)


def _to_python_form(node: fx.Node) -> None:
    kind, target = _PYTHON_FORMS[node.target]
    node.op, node.target = ("call_method" if kind == "method" else "call_function"), target


def traceable_sizes(model: nn.Module) -> nn.Module:
    """`model`, or a GraphModule over the same modules whose dimension reads the exporter traces."""
    if not isinstance(model, fx.GraphModule) or not any(_is_size_read(n) for n in model.graph.nodes):
        return model
    graph = copy.deepcopy(model.graph)
    rewritten, users = 0, set()
    for node in [n for n in graph.nodes if _is_size_read(n)]:  # decide on the graph as captured
        values = _size_values(node)
        if _rewritable(values):
            users |= {u for v in values for u in v.users if u not in values}
            node.op, node.target = "call_method", "size"
            rewritten += 1
    for user in users:
        _to_python_form(user)
    if not rewritten:
        return model
    traceable = fx.GraphModule(model, graph, class_name=type(model).__name__)
    return traceable.train(model.training)
