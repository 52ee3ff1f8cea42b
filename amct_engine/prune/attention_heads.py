"""Attention-head groups: whole heads as prunable units (docs/spec/engine.md §4.4 "Attention heads").

The channel dependency graph (dependency.py) stops at the ``view(B, S, H, D)`` that splits a query, key
or value projection's features into heads: one feature alone cannot leave a head. This module finds
the attention blocks in the captured graph instead, by their shape:

    q/k/v Linear → view/reshape(…, H, D) → transpose/permute → scaled_dot_product_attention
                 → transpose/permute → view/reshape(…, H·D) → output Linear

and makes one ``HeadGroup`` per block: ``H`` group channels of ``D`` features each (``Member.block``),
so removing head ``h`` removes rows ``[h·D, (h+1)·D)`` of q, k and v and the same input columns of the
output projection, through the ordinary plan (apply.py) and record (records.py).

The head count written in the graph's reshapes becomes ``-1`` (``free_head_counts``), which reads the
same before pruning and follows the projections' new width after it, in PyTorch and in the exported
ONNX Reshape alike.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import fx, nn

from amct_engine.graph.capture import CapturedModel
from amct_engine.graph.lifting import op_name
from amct_engine.graph.shapes import node_shapes
from amct_engine.prune.channel_groups import IN, OUT, ChannelDependencies, ChannelGroup, Member

HEAD = "HEAD"  # FilterPruneSpec.granularity of a projection whose heads are pruned
_SDPA = "scaled_dot_product_attention"
_RESHAPES = frozenset({"view", "reshape"})
_PERMUTES = frozenset({"transpose", "permute"})
_KEEPS = frozenset({"contiguous", "clone", "dropout"})


@dataclass
class HeadGroup(ChannelGroup):
    """A channel group whose channels are attention heads; ``sites``: the reshape nodes that fix H."""

    head_dim: int = 1
    sites: list[str] = field(default_factory=list)
    owner: str = ""  # the module holding q, k and v (its head-count attributes follow the pruned width)


def add_head_groups(cm: CapturedModel, deps: ChannelDependencies, head_layers: set[str]) -> list[HeadGroup]:
    """Add a ``HeadGroup`` to ``deps`` for every attention block whose q, k and v projections are all in
    ``head_layers`` (configured with HEAD granularity), replacing their per-channel groups (which the head
    split disables); the graph's head counts become -1 first."""
    found = [b for b in find_head_groups(cm) if {m.name for m in b.producers} <= head_layers]
    taken = {m.name for b in found for m in b.producers}
    deps.groups[:] = [g for g in deps.groups if not (set(g.producer_names) & taken)]
    for group in deps.groups:
        if set(group.producer_names) & head_layers:
            group.disabled.append(
                "its layer is configured with HEAD granularity but is not a query/key/value projection of an "
                'attention block the pruner recognises (docs/spec/engine.md §4.4 "Attention heads")'
            )
    if not found:
        return []
    if isinstance(cm.module, fx.GraphModule):
        free_head_counts(cm.module, found)
    for block in found:
        block.id = len(deps.groups)
        deps.groups.append(block)
        for member in block.members:
            deps.not_prunable.pop(member.name, None)
    return found


def find_head_groups(cm: CapturedModel) -> list[HeadGroup]:
    """One ``HeadGroup`` per attention block of the pattern above; blocks that differ are left out
    (grouped-query attention, a mask with a head axis, a projection used elsewhere)."""
    shapes, _ = node_shapes(cm)
    groups = []
    for node in cm.graph.nodes:
        if _fname(node) == _SDPA:
            group = _head_group(cm, node, shapes)
            if group is not None:
                groups.append(group)
    return groups


def free_head_counts(model: fx.GraphModule, groups: list[HeadGroup]) -> None:
    """Write -1 for the head count (H, or H·D where heads merge) in each group's reshapes."""
    by_name = {n.name: n for n in model.graph.nodes}
    for group in groups:
        for site in group.sites:
            node = by_name.get(site)
            if node is None:
                continue  # another trace of the model; the forward check reports a head count left fixed
            sizes, rebuild = _shape_args(node)
            index = _head_size_index(sizes, group)
            if index is not None:
                sizes[index] = -1
                rebuild(sizes)
    model.recompile()


def sync_head_attributes(model: nn.Module, groups: Sequence[HeadGroup]) -> None:
    """Set the head-count attributes of each block's owner module (``num_attention_heads``, ``heads``,
    ``all_head_size``…) from its query projection's width: a model run from its own Python forward
    (captured with torch.fx) reads them to reshape. Idempotent; nothing to do for a GraphModule."""
    if isinstance(model, fx.GraphModule):
        return
    for group in groups:
        owner = model.get_submodule(group.owner)
        heads = model.get_submodule(group.producers[0].name).out_features // group.head_dim
        for attr, per_head in _head_attributes(owner, group):
            setattr(owner, attr, heads * per_head)


def head_bcp_importance(group: HeadGroup, model: nn.Module) -> torch.Tensor:
    """Balanced L2 of each head: per projection, Σ over the head's rows of ‖W[row]‖₂ / in_features,
    min-max normalised; the mean over q, k and v (as BCP balances producers that share a mask)."""
    scores = []
    for member in group.producers:
        weight = model.get_submodule(member.name).weight.detach().to(torch.float64)
        rows = torch.linalg.vector_norm(weight, dim=1) / weight.shape[1]
        heads = rows.reshape(group.size, group.head_dim).sum(dim=1)
        low, high = heads.min(), heads.max()
        scores.append(torch.zeros_like(heads) if high <= low else (heads - low) / (high - low))
    return torch.stack(scores).mean(dim=0)


# ---------------------------------------------------------------------- pattern matching


def _head_group(cm: CapturedModel, sdpa: fx.Node, shapes) -> HeadGroup | None:
    operands = [a for a in sdpa.args[:3] if isinstance(a, fx.Node)]
    if len(operands) != 3 or _mask_has_heads(sdpa, shapes):
        return None
    inputs = [_back_to_projection(cm, n, shapes) for n in operands]
    if any(i is None for i in inputs):
        return None
    heads = {(h, d) for _, h, d, _ in inputs}
    projections = [p for p, _, _, _ in inputs]
    if len(heads) != 1 or len(set(projections)) != 3:
        return None  # grouped-query attention (fewer k/v heads) or one projection for several operands
    (h, d), sites = heads.pop(), [s for *_, path in inputs for s in path]
    output = _on_to_projection(cm, sdpa, shapes, h, d)
    if output is None or h < 2:
        return None
    out_proj, out_sites = output
    members = [Member(p, OUT, 0, h * d, "Gemm", d) for p in projections]
    members.append(Member(out_proj, IN, 0, h * d, "Gemm", d))
    owner = ".".join(_common_prefix([p.split(".")[:-1] for p in projections]))
    return HeadGroup(0, h, members, head_dim=d, sites=sites + out_sites, owner=owner)


def _common_prefix(paths: list[list[str]]) -> list[str]:
    prefix = []
    for parts in zip(*paths, strict=False):
        if len(set(parts)) != 1:
            break
        prefix.append(parts[0])
    return prefix


# attribute names that hold a head count, or the width of all heads together (transformers, timm, …)
_COUNT_NAME = re.compile(r"^(num_(attention_)?heads|n_heads?|nheads|heads)$")
_WIDTH_NAME = re.compile(r"^(all_head_size|inner_dim)$")


def _head_attributes(owner: nn.Module, group: HeadGroup) -> list[tuple[str, int]]:
    """(attribute, features per head) of the owner's ints that hold the group's head count or width, as
    found before pruning (the count H or H·D) or after it (any multiple of the head size)."""
    found = []
    for attr, value in vars(owner).items():
        if isinstance(value, bool) or not isinstance(value, int):
            continue
        if _COUNT_NAME.match(attr):
            found.append((attr, 1))
        elif _WIDTH_NAME.match(attr) and value % group.head_dim == 0:
            found.append((attr, group.head_dim))
    return found


def _back_to_projection(cm: CapturedModel, node: fx.Node, shapes):
    """From an attention operand back to the Linear that made it: (module path, H, D, reshape nodes)."""
    sites, split = [], None
    while node.op != "call_module":
        name = _fname(node)
        if len(node.users) != 1 or not node.args or not isinstance(node.args[0], fx.Node):
            return None
        if name in _RESHAPES:
            sites.append(node.name)
            split = shapes.get(node.name)
        elif name not in _PERMUTES and name not in _KEEPS:
            return None
        node = node.args[0]
    module = cm.get_module(node.target)
    if type(module) is not nn.Linear or len(node.users) != 1 or split is None or len(split) < 2:
        return None
    h, d = split[-2], split[-1]
    if h * d != module.out_features or cm.call_count(node.target) != 1:
        return None
    return node.target, h, d, sites


def _on_to_projection(cm: CapturedModel, node: fx.Node, shapes, h: int, d: int):
    """From the attention output on to the Linear that reads the merged heads: (module path, reshape nodes)."""
    sites, before = [], shapes.get(node.name)
    while True:
        if len(node.users) != 1:
            return None
        node = next(iter(node.users))
        if node.op == "call_module":
            break
        name = _fname(node)
        if name in _RESHAPES:
            sites.append(node.name)
        elif name not in _PERMUTES and name not in _KEEPS:
            return None
        if node.args[0] is not None and shapes.get(node.name) is not None:
            before, after = shapes.get(node.args[0].name), shapes.get(node.name)
            if name in _RESHAPES and after[-1] == h * d and before[-2:] != (h, d):
                return None  # merges the heads in another order than head-major
    module = cm.get_module(node.target)
    if type(module) is not nn.Linear or module.in_features != h * d or cm.call_count(node.target) != 1:
        return None
    return node.target, sites


def _mask_has_heads(sdpa: fx.Node, shapes) -> bool:
    mask = sdpa.args[3] if len(sdpa.args) > 3 else sdpa.kwargs.get("attn_mask")
    if not isinstance(mask, fx.Node):
        return False
    shape = shapes.get(mask.name)
    return shape is not None and len(shape) >= 3 and shape[-3] != 1


def _shape_args(node: fx.Node):
    """The reshape's size list and a function that writes a new one back into the node."""
    if len(node.args) == 2 and isinstance(node.args[1], (list, tuple)):
        return list(node.args[1]), lambda sizes: setattr(node, "args", (node.args[0], sizes))
    return list(node.args[1:]), lambda sizes: setattr(node, "args", (node.args[0], *sizes))


def _head_size_index(sizes: list, group: HeadGroup) -> int | None:
    """Where the head count sits in a reshape's sizes: the literal H before D, or the literal H·D."""
    if any(isinstance(s, int) and s == -1 for s in sizes):
        return None  # already inferred
    width = group.size * group.head_dim
    for i, s in enumerate(sizes):
        if isinstance(s, int) and s == group.size and i + 1 < len(sizes) and sizes[i + 1] == group.head_dim:
            return i
        if isinstance(s, int) and s == width and i == len(sizes) - 1:
            return i
    return None


def _fname(node: fx.Node) -> str:
    if node.op == "call_method":
        return str(node.target)
    if node.op == "call_function":
        return op_name(node.target) or getattr(node.target, "__name__", "")
    return ""
