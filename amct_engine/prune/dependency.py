"""Channel dependency groups over the captured fx graph (spec §4.4 steps 1-2; Torch-Pruning's DependencyGraph).

A *channel group* is a set of channels that must go together from every layer that touches them. It
starts at a producer (a Conv2d or Linear whose output channels can be removed) and follows the
tensor forward:

- BN, activations, pooling, dropout, padding keep the channels (BN is pruned with them);
- flatten / view / reshape keep the channel axis outermost of the merged dims, so a channel becomes
  a block of H·W features that a following Linear loses together;
- an elementwise add / sub / mul of two tracked tensors merges their groups: all producers of a
  residual add share one mask; an operand whose channels cannot be pruned disables the group;
- a concat along the channel axis keeps each input's group at its own offset;
- a depthwise conv follows its producer (its channels and ``groups`` shrink); a grouped conv asks
  that every group loses the same number of channels;
- Conv / ConvTranspose / Linear inputs and BN features are the passive consumers;
- any other consumer (an unknown op, indexing, a split, the model output, a reused module) disables
  the group, with the reason recorded for the report.

Tensor shapes come from one ``ShapeProp`` run with the captured example inputs.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp, TensorMetadata

from amct_engine.graph.capture import CapturedModel
from amct_engine.graph.lifting import op_name
from amct_engine.prune.channel_groups import (  # noqa: F401  (re-exported: the graph's vocabulary)
    BN_TYPES,
    CONV_TRANSPOSE_TYPES,
    CONV_TYPES,
    DEPTHWISE,
    IN,
    NORM,
    OP,
    OUT,
    ChannelDependencies,
    ChannelGroup,
    Member,
)

# Modules and functions whose every output channel depends on the same input channel only.
_ELEMENTWISE_MODULES = frozenset({
    "ReLU", "ReLU6", "LeakyReLU", "Sigmoid", "Tanh", "GELU", "SiLU", "Mish", "Hardswish", "Hardsigmoid",
    "Hardtanh", "ELU", "SELU", "CELU", "Softplus", "Softsign", "Dropout", "Dropout1d", "Dropout2d",
    "Dropout3d", "AlphaDropout", "Identity", "Softmax", "LogSoftmax", "Softmax2d",
})
_SPATIAL_MODULES = frozenset({
    "MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d", "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d",
    "Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d", "ZeroPad1d", "ZeroPad2d", "ZeroPad3d",
    "ConstantPad1d", "ConstantPad2d", "ConstantPad3d", "ReflectionPad1d", "ReflectionPad2d",
    "ReflectionPad3d", "ReplicationPad1d", "ReplicationPad2d", "ReplicationPad3d", "CircularPad1d",
    "CircularPad2d", "CircularPad3d",
})
_RESHAPE_MODULES = frozenset({"Flatten", "Unflatten"})

_ELEMENTWISE_FUNCTIONS = frozenset({
    "add", "add_", "iadd", "sub", "sub_", "isub", "rsub", "mul", "mul_", "imul", "div", "div_", "truediv",
    "itruediv", "maximum", "minimum", "pow", "clamp", "clamp_", "clip", "clamp_min", "clamp_max",
    "relu", "relu_", "relu6", "leaky_relu", "leaky_relu_", "hardtanh", "hardtanh_", "gelu", "silu",
    "silu_", "mish", "sigmoid", "sigmoid_", "tanh", "tanh_", "hardswish", "hardswish_", "hardsigmoid",
    "elu", "elu_", "selu", "celu", "softplus", "softsign", "neg", "abs", "exp", "log", "sqrt", "rsqrt",
    "square", "sign", "erf", "dropout", "dropout_", "alpha_dropout", "feature_dropout", "dropout2d",
    "contiguous", "clone", "detach", "to", "float", "half", "double", "type", "cpu", "cuda", "_to_copy",
    "alias", "softmax", "log_softmax", "_softmax", "_log_softmax", "stochastic_depth",
})
_SPATIAL_FUNCTIONS = frozenset({
    "max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d",
    "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d", "_adaptive_avg_pool2d",
    "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d", "interpolate", "upsample",
    "upsample_nearest2d", "upsample_bilinear2d", "pad", "constant_pad_nd",
})
_RESHAPE_FUNCTIONS = frozenset({
    "flatten", "view", "reshape", "_unsafe_view", "unflatten", "squeeze", "squeeze_", "unsqueeze",
    "unsqueeze_",
})
_PERMUTE_FUNCTIONS = frozenset({"permute", "transpose", "transpose_", "swapaxes", "swapdims", "t"})
_REDUCE_FUNCTIONS = frozenset({"mean", "sum", "amax", "amin", "nansum"})
_CONCAT_FUNCTIONS = frozenset({"cat", "concat", "concatenate"})
# Results that are not tensors: reading a shape does not use the channels' values.
_SHAPE_QUERIES = frozenset({"size", "dim", "numel", "getattr", "sym_size", "_assert_tensor_metadata"})
_OP_TYPES = {"add": "Add", "iadd": "Add", "add_": "Add", "sub": "Sub", "isub": "Sub", "sub_": "Sub",
             "rsub": "Sub", "mul": "Mul", "imul": "Mul", "mul_": "Mul", "div": "Div", "truediv": "Div",
             "itruediv": "Div", "div_": "Div", "cat": "Concat", "concat": "Concat", "concatenate": "Concat"}


class _Segment(NamedTuple):
    atom: int | None  # None: channels that cannot be pruned (a graph input, a reused layer, …)
    channels: int
    block: int = 1

    @property
    def features(self) -> int:
        return self.channels * self.block


class _Layout(NamedTuple):
    """Where a tensor's channels are and which groups they belong to, in order along that axis."""

    axis: int
    rank: int
    segments: tuple[_Segment, ...]


class _Unsupported(Exception):
    """The node uses its input channels in a way the pruner does not follow; the message says how."""


@dataclass
class _Atom:
    size: int
    members: list[Member] = field(default_factory=list)
    divisions: int = 1
    parent: int = -1
    reasons: list[str] = field(default_factory=list)


def build_channel_groups(cm: CapturedModel) -> ChannelDependencies:
    """The channel dependency graph of a captured model (all Conv2d/Linear layers lead a group)."""
    return _GroupBuilder(cm).build()


class _GroupBuilder:
    def __init__(self, cm: CapturedModel):
        self.cm = cm
        self.shapes, self.output_shapes = _tensor_shapes(cm)
        self.atoms: list[_Atom] = []
        self.layouts: dict[fx.Node, _Layout | None] = {}
        self.not_prunable: dict[str, str] = {}
        self.shared = shared_weights(cm.module)

    # ------------------------------------------------------------------ result

    def build(self) -> ChannelDependencies:
        for node in self.cm.graph.nodes:
            try:
                layout = self._visit(node)
            except _Unsupported as exc:
                self._consume_all(node, str(exc))
                layout = None
            self.layouts[node] = layout
        classes: dict[int, list[int]] = {}
        for i in range(len(self.atoms)):
            classes.setdefault(self._find(i), []).append(i)
        groups = []
        for root, atoms in sorted(classes.items(), key=lambda kv: kv[1][0]):
            members = [m for a in atoms for m in self.atoms[a].members]
            members.sort(key=lambda m: not m.is_producer)  # producers first, as in AMCT's records
            top = self.atoms[root]
            groups.append(ChannelGroup(len(groups), top.size, members, top.divisions,
                                       list(dict.fromkeys(top.reasons))))
        return ChannelDependencies(groups, self.not_prunable, self.output_shapes)

    # ------------------------------------------------------------------ atoms (union-find)

    def _new_atom(self, size: int, member: Member, divisions: int = 1) -> int:
        self.atoms.append(_Atom(size, [member], divisions))
        return len(self.atoms) - 1

    def _find(self, a: int) -> int:
        while self.atoms[a].parent >= 0:
            a = self.atoms[a].parent
        return a

    def _union(self, a: int, b: int) -> int:
        ra, rb = self._find(a), self._find(b)
        if ra == rb:
            return ra
        top, low = self.atoms[ra], self.atoms[rb]
        low.parent = ra
        top.reasons.extend(low.reasons)
        self._set_divisions(ra, low.divisions)
        return ra

    def _set_divisions(self, atom: int, divisions: int) -> None:
        root = self.atoms[self._find(atom)]
        merged = math.lcm(root.divisions, divisions)
        if root.size % merged:
            root.reasons.append(f"grouped convs need {merged} equal parts of its {root.size} channels")
        else:
            root.divisions = merged

    def _disable(self, segments, reason: str) -> None:
        for seg in segments:
            if seg.atom is not None:
                self.atoms[self._find(seg.atom)].reasons.append(reason)

    def _add_member(self, atom: int, member: Member) -> None:
        self.atoms[atom].members.append(member)

    # ------------------------------------------------------------------ visiting

    def _visit(self, node: fx.Node) -> _Layout | None:
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
                self._disable(layout.segments, f"{_describe(self.cm, node)} {why}")

    def _shape(self, node: Any) -> tuple[int, ...] | None:
        return self.shapes.get(node.name) if isinstance(node, fx.Node) else None

    def _input(self, node: fx.Node) -> tuple[fx.Node | None, _Layout | None]:
        inp = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
        return inp, (self.layouts.get(inp) if inp is not None else None)

    def _reuse_reason(self, name: str) -> str | None:
        calls = self.cm.call_count(name)
        if calls > 1:
            return f"is called {calls} times in forward (reused modules are never pruned)"
        if name in self.shared:
            return f"shares its weight with {', '.join(self.shared[name])} (shared weights are never pruned)"
        return None

    def _visit_module(self, node: fx.Node) -> _Layout | None:
        name = node.target
        module = self.cm.get_module(name)
        type_name = type(module).__name__
        inp, layout = self._input(node)
        if self._shape(node) is None or len(node.all_input_nodes) > 1:
            raise _Unsupported("has several inputs or outputs; the pruner follows single-tensor layers only")
        if isinstance(module, CONV_TYPES):
            return self._conv(node, module, layout)
        if isinstance(module, CONV_TRANSPOSE_TYPES):
            self.not_prunable.setdefault(name, f"{type_name} output channels are not pruned (spec §4.4)")
            if layout is not None:
                if module.groups != 1:
                    raise _Unsupported("is a grouped ConvTranspose; its input channels are not pruned")
                self._consumer_members(node, layout, IN, "ConvTranspose", axis_needed=1)
            return None
        if isinstance(module, nn.Linear):
            return self._linear(node, module, layout)
        if isinstance(module, BN_TYPES):
            if layout is None:
                return None
            self._consumer_members(node, layout, NORM, "BatchNormalization", axis_needed=1, allow_block=True)
            return layout
        if layout is None:
            return None
        if type_name in _ELEMENTWISE_MODULES or (type_name == "PReLU" and module.num_parameters == 1):
            return self._same_channels(node, layout)
        if type_name in _SPATIAL_MODULES:
            return self._same_channels(node, layout)
        if type_name in _RESHAPE_MODULES:
            return self._reshape(node, inp, layout)
        raise _Unsupported(f"is a {type_name}; the pruner does not know how it uses channels")

    def _conv(self, node: fx.Node, conv: nn.Module, layout: _Layout | None) -> _Layout | None:
        name, groups = node.target, conv.groups
        depthwise = groups > 1 and groups == conv.in_channels
        reuse = self._reuse_reason(name)
        if depthwise:
            self.not_prunable.setdefault(name, "depthwise conv: it follows the channels of its producer")
            if layout is None:
                return None
            if reuse:
                raise _Unsupported(reuse)
            if conv.out_channels != conv.in_channels:
                raise _Unsupported(f"is a depthwise conv with channel multiplier "
                                   f"{conv.out_channels // conv.in_channels}; only multiplier 1 is followed")
            self._consumer_members(node, layout, DEPTHWISE, "Conv", axis_needed=1, group=groups)
            return _Layout(1, len(self._shape(node)), layout.segments)
        if layout is not None:
            self._guarded(node, layout, lambda: self._conv_input(node, layout, groups))
        if not isinstance(conv, nn.Conv2d):
            self.not_prunable.setdefault(name, f"{type(conv).__name__}: only Conv2d and Linear layers lead a "
                                               "channel group (spec §4.9)")
            return None
        if reuse:
            self.not_prunable.setdefault(name, reuse)
            return None
        member = Member(name, OUT, 0, conv.out_channels, "Conv", group=groups)
        atom = self._new_atom(conv.out_channels, member, divisions=groups)
        return _Layout(1, len(self._shape(node)), (_Segment(atom, conv.out_channels),))

    def _linear(self, node: fx.Node, linear: nn.Linear, layout: _Layout | None) -> _Layout | None:
        name = node.target
        reuse = self._reuse_reason(name)
        if layout is not None:
            self._guarded(node, layout, lambda: self._consumer_members(
                node, layout, IN, "Gemm", axis_needed=layout.rank - 1, allow_block=True))
        if reuse:
            self.not_prunable.setdefault(name, reuse)
            return None
        rank = len(self._shape(node))
        atom = self._new_atom(linear.out_features, Member(name, OUT, 0, linear.out_features, "Gemm"))
        return _Layout(rank - 1, rank, (_Segment(atom, linear.out_features),))

    def _guarded(self, node: fx.Node, layout: _Layout, register) -> None:
        """Register a layer as a consumer; if it cannot be one, disable the groups it reads (the layer
        may still lead a group of its own)."""
        try:
            register()
        except _Unsupported as exc:
            self._disable(layout.segments, f"{_describe(self.cm, node)} {exc}")

    def _conv_input(self, node: fx.Node, layout: _Layout, groups: int) -> None:
        if groups > 1:
            tracked = [s for s in layout.segments if s.atom is not None]
            if len(layout.segments) != 1 or len(tracked) != 1:
                raise _Unsupported(f"is a grouped conv (groups={groups}) fed by several channel groups "
                                   "(a concat); AMCT does not prune these either")
            self._set_divisions(tracked[0].atom, groups)
        self._consumer_members(node, layout, IN, "Conv", axis_needed=1, group=groups)

    def _consumer_members(self, node, layout: _Layout, kind: str, op_type: str, axis_needed: int,
                          allow_block: bool = False, group: int = 1) -> None:
        name = node.target
        reuse = self._reuse_reason(name)
        if reuse:
            raise _Unsupported(reuse)
        if layout.axis != axis_needed:
            raise _Unsupported(f"reads channels on axis {axis_needed}, but these channels are on axis "
                               f"{layout.axis} (AMCT disables Conv↔Linear mixes too)")
        if not allow_block and any(s.block != 1 for s in layout.segments):
            raise _Unsupported("reads a reshaped tensor whose channels were merged with other dims")
        offset = 0
        for seg in layout.segments:
            if seg.atom is not None:
                member = Member(name, kind, offset, offset + seg.features, op_type, seg.block, group)
                self._add_member(seg.atom, member)
            offset += seg.features

    # ------------------------------------------------------------------ functions

    def _visit_function(self, node: fx.Node, fname: str) -> _Layout | None:
        if fname in _SHAPE_QUERIES:
            return None
        tracked = [n for n in node.all_input_nodes if self.layouts.get(n) is not None]
        if not tracked:
            return None
        shape = self._shape(node)
        if shape is None:
            raise _Unsupported("does not return one tensor (a split, chunk or max with indices?)")
        if fname in _ELEMENTWISE_FUNCTIONS:
            return self._elementwise(node, fname, shape)
        if fname in _CONCAT_FUNCTIONS:
            return self._concat(node, fname, shape)
        inp, layout = self._input(node)
        if layout is None:
            raise _Unsupported(f"(`{fname}`) reads the channels through an argument the pruner does not follow")
        if fname in _SPATIAL_FUNCTIONS:
            return self._same_channels(node, layout)
        if fname in _RESHAPE_FUNCTIONS:
            return self._reshape(node, inp, layout)
        if fname in _PERMUTE_FUNCTIONS:
            return self._permute(node, fname, layout)
        if fname in _REDUCE_FUNCTIONS:
            return self._reduce(node, layout)
        if fname == "getitem":
            raise _Unsupported("indexes the tensor, which can drop or reorder channels")
        raise _Unsupported(f"(`{fname}`) is not an op the pruner knows to keep channels independent")

    def _same_channels(self, node: fx.Node, layout: _Layout) -> _Layout:
        shape = self._shape(node)
        if shape is None or len(shape) != layout.rank or shape[layout.axis] != _features(layout):
            raise _Unsupported("changes the size of the channel axis")
        return layout

    def _elementwise(self, node: fx.Node, fname: str, shape: tuple[int, ...]) -> _Layout | None:
        operands = [n for n in _flat_nodes((node.args, node.kwargs)) if self._shape(n) is not None]
        rank = len(shape)
        axes = {lay.axis + rank - lay.rank for n in operands if (lay := self.layouts.get(n)) is not None}
        if len(axes) != 1:
            raise _Unsupported("combines tensors whose channels are on different axes")
        axis = axes.pop()
        return self._unify_operands(node, fname, operands, axis, rank, shape)

    def _unify_operands(self, node, fname, operands, axis, rank, shape) -> _Layout | None:
        """Operands share channels position by position: merge their groups (a residual add)."""
        parts: list[tuple[fx.Node, tuple[_Segment, ...]]] = []
        for n in operands:
            other = self._shape(n)
            pos = axis - (rank - len(other))
            if pos < 0 or (other[pos] == 1 and shape[axis] != 1):
                continue  # broadcast along the channels: a per-tensor scalar, not a channel operand
            layout = self.layouts.get(n)
            if layout is None:
                parts.append((n, (_Segment(None, other[pos]),)))
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
        return _Layout(axis, rank, segments)

    def _unify(self, node, left, right, left_node, right_node) -> tuple[_Segment, ...]:
        if [(s.channels, s.block) for s in left] != [(s.channels, s.block) for s in right]:
            reason = (f"{_describe(self.cm, node)} combines channels laid out differently (e.g. a concat "
                      "with one conv); only equal layouts are merged")
            self._disable(left + right, reason)
            return tuple(_Segment(None, s.channels, s.block) for s in left)
        out = []
        for a, b in zip(left, right, strict=True):
            if a.atom is not None and b.atom is not None:
                out.append(_Segment(self._union(a.atom, b.atom), a.channels, a.block))
                continue
            if a.atom is not None or b.atom is not None:
                fixed = right_node if a.atom is not None else left_node
                reason = (f"{_describe(self.cm, node)} combines them with `{fixed.name}`, whose channels "
                          "cannot be pruned (a graph input, a reused or non-prunable layer)")
                self._disable((a, b), reason)
            out.append(_Segment(None, a.channels, a.block))
        return tuple(out)

    def _op_members(self, node: fx.Node, fname: str, segments, offset: int) -> None:
        op_type = _OP_TYPES.get(fname)
        if op_type is None:
            return
        for seg in segments:
            if seg.atom is not None:
                self._add_member(seg.atom, Member(node.name, OP, offset, offset + seg.features, op_type))
            offset += seg.features

    def _concat(self, node: fx.Node, fname: str, shape: tuple[int, ...]) -> _Layout | None:
        tensors = node.args[0] if node.args else node.kwargs.get("tensors", ())
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        rank = len(shape)
        dim = dim % rank
        tensors = [t for t in tensors if isinstance(t, fx.Node)]
        layouts = [self.layouts.get(t) for t in tensors]
        if any(lay is not None and lay.axis != dim for lay in layouts):
            axes = {lay.axis for lay in layouts if lay is not None}
            if len(axes) != 1:
                raise _Unsupported("concatenates tensors whose channels are on different axes")
            # concat along another dim (batch, spatial): every input must keep the same channels
            return self._unify_operands(node, "", tensors, axes.pop(), rank, shape)
        segments: list[_Segment] = []
        for tensor, layout in zip(tensors, layouts, strict=True):
            if layout is None:
                segments.append(_Segment(None, self._shape(tensor)[dim]))
            else:
                self._op_members(node, fname, layout.segments, sum(s.features for s in segments))
                segments.extend(layout.segments)
        return _Layout(dim, rank, tuple(segments))

    def _reshape(self, node: fx.Node, inp: fx.Node, layout: _Layout) -> _Layout:
        before, after = self._shape(inp), self._shape(node)
        if before is None or after is None:
            raise _Unsupported("reshapes a tensor of unknown shape")
        for (t0, t1), (s0, s1) in _dim_groups(before, after):
            if not t0 <= layout.axis < t1:
                continue
            if math.prod(before[t0:layout.axis]) != 1:
                raise _Unsupported("merges dims in front of the channel axis, which interleaves channels")
            inner = math.prod(before[layout.axis + 1:t1])
            kept = [j for j in range(s0, s1) if after[j] != 1] or [s0]
            new_axis, split = kept[0], math.prod(after[kept[0] + 1:s1])
            segments = []
            for seg in layout.segments:
                block = seg.block * inner
                if block % split:
                    raise _Unsupported("splits the channel axis into several dims")
                segments.append(_Segment(seg.atom, seg.channels, block // split))
            return _Layout(new_axis, len(after), tuple(segments))
        raise _Unsupported("reshapes the tensor in a way the pruner cannot follow")

    def _permute(self, node: fx.Node, fname: str, layout: _Layout) -> _Layout:
        rank = layout.rank
        args = [a for a in node.args[1:]]
        if fname == "permute":
            dims = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple)) else args
            dims = node.kwargs.get("dims", dims)
            order = [d % rank for d in dims]
            axis = order.index(layout.axis)
        else:
            d0, d1 = (0, 1) if fname == "t" else (args[0] % rank, args[1] % rank)
            axis = {d0: d1, d1: d0}.get(layout.axis, layout.axis)
        return self._same_channels(node, _Layout(axis, rank, layout.segments))

    def _reduce(self, node: fx.Node, layout: _Layout) -> _Layout:
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        if dim is None:
            raise _Unsupported("reduces over every dim, the channels included")
        dims = {d % layout.rank for d in (dim if isinstance(dim, (list, tuple)) else [dim])}
        if layout.axis in dims:
            raise _Unsupported("reduces over the channel axis")
        axis = layout.axis if keepdim else layout.axis - sum(d < layout.axis for d in dims)
        rank = layout.rank if keepdim else layout.rank - len(dims)
        return self._same_channels(node, _Layout(axis, rank, layout.segments))


# ---------------------------------------------------------------------- helpers


def _features(layout: _Layout) -> int:
    return sum(s.features for s in layout.segments)


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


def _dim_groups(before, after) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Pair runs of input dims with runs of output dims of equal product (a reshape's structure)."""
    groups, i, j = [], 0, 0
    try:
        while i < len(before) and j < len(after):
            i0, j0 = i, j
            pi, pj = before[i], after[j]
            i, j = i + 1, j + 1
            while pi != pj:
                if pi < pj:
                    pi, i = pi * before[i], i + 1
                else:
                    pj, j = pj * after[j], j + 1
            groups.append(((i0, i), (j0, j)))
    except IndexError:
        raise _Unsupported("reshapes to a different number of elements") from None
    return groups


def _tensor_shapes(cm: CapturedModel) -> tuple[dict[str, tuple[int, ...] | None], list[tuple[int, ...]]]:
    """Node name → output shape (None when not one tensor), and the model's output shapes: one eval forward."""
    gm = copy.deepcopy(cm.graph_module).eval()
    with torch.no_grad():
        result = ShapeProp(gm).propagate(*cm.example_inputs)
    shapes = {}
    for node in gm.graph.nodes:
        meta = node.meta.get("tensor_meta")
        shapes[node.name] = tuple(meta.shape) if isinstance(meta, TensorMetadata) else None
    outputs = []
    fx.node.map_aggregate(result, lambda v: outputs.append(tuple(v.shape)) if isinstance(v, torch.Tensor) else v)
    return shapes, outputs


def shared_weights(root: nn.Module) -> dict[str, list[str]]:
    """Module path → the other paths holding the same weight Parameter."""
    owners: dict[int, list[str]] = {}
    for name, module in root.named_modules(remove_duplicate=False):
        weight = module._parameters.get("weight")
        if weight is not None:
            owners.setdefault(id(weight), []).append(name)
    return {name: [o for o in names if o != name] for names in owners.values() if len(names) > 1
            for name in names}
