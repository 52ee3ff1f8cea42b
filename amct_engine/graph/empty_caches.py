"""Drop the empty key/value cache a transformers model builds inside its forward (docs/spec/engine.md §5.3).

A transformers decoder-style model (Llama, Qwen, …) called with `use_cache=True`, its configs' default,
creates a `DynamicCache` whose first update concatenates a fresh empty tensor (`torch.tensor([])`, shape
[0]) with each layer's keys and values: `torch.cat([empty, keys], dim=-2)`, which torch's legacy rule for
1-D empty tensors makes the keys themselves. torch.export writes the empty tensor as a lifted constant
read through `lift_fresh_copy` and `detach_`, ops the ONNX exporter has no translation for. Those reads are
copies, and the concatenation with an empty tensor is the other input, so the graph computes the same
without them.
"""

from __future__ import annotations

import torch
from torch import fx

aten = torch.ops.aten

# Ops that return their input's values (a copy, or the tensor itself without autograd history).
_COPIES = frozenset({aten.lift_fresh_copy.default, aten.detach_.default, aten.detach.default})


def drop_empty_cache_concats(gm: fx.GraphModule) -> None:
    """Remove copy-only reads of constants and empty 1-D constants from concatenations (in place)."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target in _COPIES and isinstance(node.args[0], fx.Node):
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
    for node in graph.nodes:
        if node.op == "call_function" and node.target is aten.cat.default:
            kept = [t for t in node.args[0] if not _is_empty_constant(gm, t)]
            if kept and len(kept) < len(node.args[0]):
                node.args = (kept, *node.args[1:])
    for node in list(graph.nodes):
        if node.op == "get_attr" and not node.users:
            graph.erase_node(node)
    graph.lint()
    gm.recompile()


def _is_empty_constant(gm: fx.GraphModule, node) -> bool:
    if not isinstance(node, fx.Node) or node.op != "get_attr":
        return False
    value = gm
    for name in node.target.split("."):
        value = getattr(value, name, None)
    return isinstance(value, torch.Tensor) and value.dim() == 1 and value.numel() == 0
