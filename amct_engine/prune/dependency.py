"""Channel dependency groups over the captured fx graph (docs/spec/engine.md §4.4 steps 1-2; Torch-Pruning's
DependencyGraph).

A *channel group* is a set of channels that must go together from every layer that touches them. It
starts at a producer (a layer whose output channels can be removed: a Conv2d, a Linear, any type
registered as a ``PRODUCER`` in the layer-pruner table) and follows the tensor forward:

- the layer-pruner table (``layer_pruners.py``) says what a layer does with channels: producers and
  consumers (Conv / ConvTranspose / Linear inputs) lose their input channels with the group,
  pass-through layers (BN) are pruned with it and keep it going, a depthwise conv follows its
  producer (its channels and ``groups`` shrink); a grouped conv asks that every group loses the
  same number of channels;
- activations, pooling, dropout, padding keep the channels (``op_vocabulary.py``);
- flatten / view / reshape keep the channel axis outermost of the merged dims, so a channel becomes
  a block of H·W features that a following Linear loses together (``channel_layout.py``);
- an elementwise add / sub / mul of two tracked tensors merges their groups: all producers of a
  residual add share one mask; an operand whose channels cannot be pruned disables the group;
- a concat along the channel axis keeps each input's group at its own offset;
- any other consumer (an unknown op or layer type, indexing, a split, the model output, a reused
  module) disables the group, with the reason recorded for the report.

Tensor shapes come from one ``ShapeProp`` run with the captured example inputs (graph/shapes.py).
"""

from __future__ import annotations

from typing import Any

from torch import fx, nn

from amct_engine.graph.analysis import shared_weights
from amct_engine.graph.capture import CapturedModel
from amct_engine.graph.lifting import op_name
from amct_engine.graph.shapes import node_shapes
from amct_engine.prune import op_vocabulary as ops
from amct_engine.prune.channel_atoms import ChannelAtoms
from amct_engine.prune.channel_groups import (  # noqa: F401  (re-exported: the graph's vocabulary)
    DEPTHWISE,
    IN,
    NORM,
    OP,
    OUT,
    ChannelDependencies,
    ChannelGroup,
    Member,
)
from amct_engine.prune.channel_layout import Layout, Segment, Unsupported, permuted, reduced, reshaped
from amct_engine.prune.layer_pruners import (
    CONSUMER,
    FOLLOWER,
    PASS_THROUGH,
    PRODUCER,
    LayerPruner,
    layer_pruner_for,
)


def build_channel_groups(cm: CapturedModel) -> ChannelDependencies:
    """The channel dependency graph of a captured model (every producer layer leads a group)."""
    return _GroupBuilder(cm).build()


class _GroupBuilder:
    def __init__(self, cm: CapturedModel):
        self.cm = cm
        self.shapes, self.output_shapes = node_shapes(cm)
        self.atoms = ChannelAtoms()
        self.layouts: dict[fx.Node, Layout | None] = {}
        self.not_prunable: dict[str, str] = {}
        self.shared = shared_weights(cm.module)

    def build(self) -> ChannelDependencies:
        for node in self.cm.graph.nodes:
            try:
                layout = self._visit(node)
            except Unsupported as exc:
                self._consume_all(node, str(exc))
                layout = None
            self.layouts[node] = layout
        return ChannelDependencies(self.atoms.groups(), self.not_prunable, self.output_shapes)

    # ------------------------------------------------------------------ visiting

    def _visit(self, node: fx.Node) -> Layout | None:
        if node.op in ("placeholder", "get_attr"):
            return None
        if node.op == "output":
            self._consume_all(node, "must keep its channel count")
            return None
        if node.op == "call_module":
            return self._visit_module(node)
        return self._visit_function(node, _function_name(node))

    def _consume_all(self, node: fx.Node, why: str) -> None:
        for inp in node.all_input_nodes:
            layout = self.layouts.get(inp)
            if layout is not None:
                self.atoms.disable(layout.segments, f"{_describe(self.cm, node)} {why}")

    def _shape(self, node: Any) -> tuple[int, ...] | None:
        return self.shapes.get(node.name) if isinstance(node, fx.Node) else None

    def _input(self, node: fx.Node) -> tuple[fx.Node | None, Layout | None]:
        inp = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
        return inp, (self.layouts.get(inp) if inp is not None else None)

    def _reuse_reason(self, name: str) -> str | None:
        calls = self.cm.call_count(name)
        if calls > 1:
            return f"is called {calls} times in forward (reused modules are never pruned)"
        if name in self.shared:
            return f"shares its weight with {', '.join(self.shared[name])} (shared weights are never pruned)"
        return None

    def _visit_module(self, node: fx.Node) -> Layout | None:
        module = self.cm.get_module(node.target)
        inp, layout = self._input(node)
        if self._shape(node) is None or len(node.all_input_nodes) > 1:
            raise Unsupported("has several inputs or outputs; the pruner follows single-tensor layers only")
        pruner = layer_pruner_for(module)
        if pruner is not None:
            return self._layer(node, module, pruner, layout)
        if layout is None:
            return None
        type_name = type(module).__name__
        if type_name in ops.ELEMENTWISE_MODULES or (type_name == "PReLU" and module.num_parameters == 1):
            return self._same_channels(node, layout)
        if type_name in ops.SPATIAL_MODULES:
            return self._same_channels(node, layout)
        if type_name in ops.RESHAPE_MODULES:
            return self._reshape(node, inp, layout)
        raise Unsupported(f"is a {type_name}; the pruner does not know how it uses channels")

    # ------------------------------------------------------------------ layers of the pruner table

    def _layer(self, node: fx.Node, module: nn.Module, pruner: LayerPruner, layout: Layout | None) -> Layout | None:
        name, flow = node.target, pruner.channel_flow(module)
        if flow == PASS_THROUGH:
            if layout is None:
                return None
            if pruner.in_channel_axis(module, layout.rank) != layout.axis:
                # A norm of another axis (a BatchNorm2d after a Linear on a 4-D input, AMCT's LinearIn4)
                # does not read these channels: they pass through it unchanged, and it loses nothing.
                return self._same_channels(node, layout)
            self._read_channels(node, module, pruner, layout)
            return layout
        if flow == FOLLOWER:
            self.not_prunable.setdefault(name, pruner.not_leading_reason(module))
            if layout is None:
                return None
            reuse = self._reuse_reason(name)
            if reuse:
                raise Unsupported(reuse)
            self._read_channels(node, module, pruner, layout)
            rank = len(self._shape(node))
            return Layout(pruner.out_channel_axis(module, rank), rank, layout.segments)
        if flow not in (PRODUCER, CONSUMER):
            raise ValueError(
                f"{type(pruner).__name__}.channel_flow gave {flow!r}; expected one of "
                f"{PRODUCER!r}, {CONSUMER!r}, {PASS_THROUGH!r}, {FOLLOWER!r}"
            )
        if layout is not None:
            self._guarded(node, layout, lambda: self._read_channels(node, module, pruner, layout))
        if flow == CONSUMER:
            self.not_prunable.setdefault(name, pruner.not_leading_reason(module))
            return None
        reuse = self._reuse_reason(name)
        if reuse:
            self.not_prunable.setdefault(name, reuse)
            return None
        return self._lead_group(node, module, pruner)

    def _lead_group(self, node: fx.Node, module: nn.Module, pruner: LayerPruner) -> Layout:
        size, groups, rank = pruner.get_out_channels(module), pruner.groups(module), len(self._shape(node))
        atom = self.atoms.new(size, Member(node.target, OUT, 0, size, pruner.op_type, group=groups), groups)
        return Layout(pruner.out_channel_axis(module, rank), rank, (Segment(atom, size),))

    def _guarded(self, node: fx.Node, layout: Layout, register) -> None:
        """Register a layer as a consumer; if it cannot be one, disable the groups it reads (the layer
        may still lead a group of its own)."""
        try:
            register()
        except Unsupported as exc:
            self.atoms.disable(layout.segments, f"{_describe(self.cm, node)} {exc}")

    def _read_channels(self, node: fx.Node, module: nn.Module, pruner: LayerPruner, layout: Layout) -> None:
        """Make the layer a member of every group its input channels belong to, at their offsets."""
        problem = pruner.input_problem(module)
        if problem:
            raise Unsupported(problem)
        groups, kind = pruner.groups(module), pruner.input_kind(module)
        if groups > 1 and kind == IN:
            self._split_in_groups(layout, groups)
        reuse = self._reuse_reason(node.target)
        if reuse:
            raise Unsupported(reuse)
        axis_needed = pruner.in_channel_axis(module, layout.rank)
        if layout.axis != axis_needed:
            raise Unsupported(
                f"reads channels on axis {axis_needed}, but these channels are on axis "
                f"{layout.axis} (AMCT disables Conv↔Linear mixes too)"
            )
        if not pruner.reads_merged_channels and any(s.block != 1 for s in layout.segments):
            raise Unsupported("reads a reshaped tensor whose channels were merged with other dims")
        offset = 0
        for seg in layout.segments:
            if seg.atom is not None:
                member = Member(node.target, kind, offset, offset + seg.features, pruner.op_type, seg.block, groups)
                self.atoms.add_member(seg.atom, member)
            offset += seg.features

    def _split_in_groups(self, layout: Layout, groups: int) -> None:
        # a grouped layer reads its input in `groups` equal parts: the group feeding it must lose as many from each
        tracked = [s for s in layout.segments if s.atom is not None]
        if len(layout.segments) != 1 or len(tracked) != 1:
            raise Unsupported(
                f"is a grouped conv (groups={groups}) fed by several channel groups "
                "(a concat); AMCT does not prune these either"
            )
        self.atoms.set_divisions(tracked[0].atom, groups)

    # ------------------------------------------------------------------ functions

    def _visit_function(self, node: fx.Node, fname: str) -> Layout | None:
        if fname in ops.SHAPE_QUERIES:
            return None
        tracked = [n for n in node.all_input_nodes if self.layouts.get(n) is not None]
        if not tracked:
            return None
        shape = self._shape(node)
        if shape is None:
            raise Unsupported("does not return one tensor (a split, chunk or max with indices?)")
        if fname in ops.ELEMENTWISE_FUNCTIONS:
            return self._elementwise(node, fname, shape)
        if fname in ops.CONCAT_FUNCTIONS:
            return self._concat(node, fname, shape)
        inp, layout = self._input(node)
        if layout is None:
            raise Unsupported(f"(`{fname}`) reads the channels through an argument the pruner does not follow")
        if fname in ops.SPATIAL_FUNCTIONS:
            return self._same_channels(node, layout)
        if fname in ops.RESHAPE_FUNCTIONS:
            return self._reshape(node, inp, layout)
        if fname in ops.PERMUTE_FUNCTIONS:
            return self._same_channels(node, permuted(layout, fname, node.args[1:], node.kwargs))
        if fname in ops.REDUCE_FUNCTIONS:
            return self._same_channels(node, reduced(layout, node.args, node.kwargs))
        if fname == "getitem":
            raise Unsupported("indexes the tensor, which can drop or reorder channels")
        raise Unsupported(f"(`{fname}`) is not an op the pruner knows to keep channels independent")

    def _same_channels(self, node: fx.Node, layout: Layout) -> Layout:
        shape = self._shape(node)
        if shape is None or len(shape) != layout.rank or shape[layout.axis] != layout.features:
            raise Unsupported("changes the size of the channel axis")
        return layout

    def _reshape(self, node: fx.Node, inp: fx.Node, layout: Layout) -> Layout:
        before, after = self._shape(inp), self._shape(node)
        if before is None or after is None:
            raise Unsupported("reshapes a tensor of unknown shape")
        return reshaped(layout, before, after)

    def _elementwise(self, node: fx.Node, fname: str, shape: tuple[int, ...]) -> Layout | None:
        operands = [n for n in _flat_nodes((node.args, node.kwargs)) if self._shape(n) is not None]
        rank = len(shape)
        axes = {lay.axis + rank - lay.rank for n in operands if (lay := self.layouts.get(n)) is not None}
        if len(axes) != 1:
            raise Unsupported("combines tensors whose channels are on different axes")
        axis = axes.pop()
        return self._unify_operands(node, fname, operands, axis, rank, shape)

    def _unify_operands(self, node, fname, operands, axis, rank, shape) -> Layout | None:
        """Operands share channels position by position: merge their groups (a residual add)."""
        parts: list[tuple[fx.Node, tuple[Segment, ...]]] = []
        for n in operands:
            other = self._shape(n)
            pos = axis - (rank - len(other))
            if pos < 0 or (other[pos] == 1 and shape[axis] != 1):
                continue  # broadcast along the channels: a per-tensor scalar, not a channel operand
            layout = self.layouts.get(n)
            if layout is None:
                parts.append((n, (Segment(None, other[pos]),)))
            else:
                parts.append((n, layout.segments))
        if not parts:
            return None
        segments = parts[0][1]
        for n, other in parts[1:]:
            segments = self._unify(node, segments, other, parts[0][0], n)
        self._op_members(node, fname, segments, 0)
        if all(s.atom is None for s in segments):
            return None
        return Layout(axis, rank, segments)

    def _unify(self, node, left, right, left_node, right_node) -> tuple[Segment, ...]:
        if [(s.channels, s.block) for s in left] != [(s.channels, s.block) for s in right]:
            reason = (
                f"{_describe(self.cm, node)} combines channels laid out differently (e.g. a concat "
                "with one conv); only equal layouts are merged"
            )
            self.atoms.disable(left + right, reason)
            return tuple(Segment(None, s.channels, s.block) for s in left)
        out = []
        for a, b in zip(left, right, strict=True):
            if a.atom is not None and b.atom is not None:
                out.append(Segment(self.atoms.union(a.atom, b.atom), a.channels, a.block))
                continue
            if a.atom is not None or b.atom is not None:
                fixed = right_node if a.atom is not None else left_node
                reason = (
                    f"{_describe(self.cm, node)} combines them with `{fixed.name}`, whose channels "
                    "cannot be pruned (a graph input, a reused or non-prunable layer)"
                )
                self.atoms.disable((a, b), reason)
            out.append(Segment(None, a.channels, a.block))
        return tuple(out)

    def _op_members(self, node: fx.Node, fname: str, segments, offset: int) -> None:
        op_type = ops.OP_TYPES.get(fname)
        if op_type is None:
            return
        for seg in segments:
            if seg.atom is not None:
                self.atoms.add_member(seg.atom, Member(node.name, OP, offset, offset + seg.features, op_type))
            offset += seg.features

    def _concat(self, node: fx.Node, fname: str, shape: tuple[int, ...]) -> Layout | None:
        tensors = node.args[0] if node.args else node.kwargs.get("tensors", ())
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        rank = len(shape)
        dim = dim % rank
        tensors = [t for t in tensors if isinstance(t, fx.Node)]
        layouts = [self.layouts.get(t) for t in tensors]
        if any(lay is not None and lay.axis != dim for lay in layouts):
            axes = {lay.axis for lay in layouts if lay is not None}
            if len(axes) != 1:
                raise Unsupported("concatenates tensors whose channels are on different axes")
            # concat along another dim (batch, spatial): every input must keep the same channels
            return self._unify_operands(node, "", tensors, axes.pop(), rank, shape)
        segments: list[Segment] = []
        for tensor, layout in zip(tensors, layouts, strict=True):
            if layout is None:
                segments.append(Segment(None, self._shape(tensor)[dim]))
            else:
                self._op_members(node, fname, layout.segments, sum(s.features for s in segments))
                segments.extend(layout.segments)
        return Layout(dim, rank, tuple(segments))


# ---------------------------------------------------------------------- helpers


def _function_name(node: fx.Node) -> str:
    if node.op == "call_method":
        return node.target
    return op_name(node.target) or getattr(node.target, "__name__", str(node.target))


def _describe(cm: CapturedModel, node: fx.Node) -> str:
    if node.op == "call_module":
        return f"'{node.target}' ({type(cm.get_module(node.target)).__name__})"
    if node.op == "output":
        return "the model output"
    return f"`{node.name}` ({node.op} {_function_name(node)})"


def _flat_nodes(value) -> list[fx.Node]:
    if isinstance(value, fx.Node):
        return [value]
    if isinstance(value, (list, tuple)):
        return [n for v in value for n in _flat_nodes(v)]
    if isinstance(value, dict):
        return [n for v in value.values() for n in _flat_nodes(v)]
    return []
