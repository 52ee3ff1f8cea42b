"""Where a tensor's pruned channels are: its ``Layout``, and how reshapes, permutes and reductions move it.

The dependency builder keeps one ``Layout`` per fx node whose output carries prunable channels. A
layout is the channel axis and, in order along it, ``Segment`` runs of channels, each from one
channel atom (a producer's output, ``channel_atoms.py``) or from nothing prunable. After a flatten a
channel becomes a ``block`` of features that a Linear reads together.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple


class Segment(NamedTuple):
    atom: int | None  # None: channels that cannot be pruned (a graph input, a reused layer, …)
    channels: int
    block: int = 1

    @property
    def features(self) -> int:
        return self.channels * self.block


class Layout(NamedTuple):
    """Where a tensor's channels are and which groups they belong to, in order along that axis."""

    axis: int
    rank: int
    segments: tuple[Segment, ...]

    @property
    def features(self) -> int:
        return sum(s.features for s in self.segments)


class Unsupported(Exception):
    """The node uses its input channels in a way the pruner does not follow; the message says how."""


def reshaped(layout: Layout, before: tuple[int, ...], after: tuple[int, ...]) -> Layout:
    """The layout after a flatten / view / reshape / (un)squeeze from shape ``before`` to ``after``."""
    for (t0, t1), (s0, s1) in _dim_groups(before, after):
        if not t0 <= layout.axis < t1:
            continue
        if math.prod(before[t0 : layout.axis]) != 1:
            raise Unsupported("merges dims in front of the channel axis, which interleaves channels")
        inner = math.prod(before[layout.axis + 1 : t1])
        kept = [j for j in range(s0, s1) if after[j] != 1] or [s0]
        new_axis, split = kept[0], math.prod(after[kept[0] + 1 : s1])
        segments = []
        for seg in layout.segments:
            block = seg.block * inner
            if block % split:
                raise Unsupported("splits the channel axis into several dims")
            segments.append(Segment(seg.atom, seg.channels, block // split))
        return Layout(new_axis, len(after), tuple(segments))
    raise Unsupported("reshapes the tensor in a way the pruner cannot follow")


def permuted(layout: Layout, fname: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Layout:
    """The layout after ``permute`` / ``transpose`` / ``t`` with these arguments (the tensor's excluded)."""
    rank = layout.rank
    if fname == "permute":
        dims = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple)) else args
        dims = kwargs.get("dims", dims)
        order = [d % rank for d in dims]
        axis = order.index(layout.axis)
    else:
        d0, d1 = (0, 1) if fname == "t" else (args[0] % rank, args[1] % rank)
        axis = {d0: d1, d1: d0}.get(layout.axis, layout.axis)
    return Layout(axis, rank, layout.segments)


def reduced(layout: Layout, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Layout:
    """The layout after ``mean`` / ``sum`` / … over dims other than the channel axis (the tensor is args[0])."""
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    if dim is None:
        raise Unsupported("reduces over every dim, the channels included")
    dims = {d % layout.rank for d in (dim if isinstance(dim, (list, tuple)) else [dim])}
    if layout.axis in dims:
        raise Unsupported("reduces over the channel axis")
    axis = layout.axis if keepdim else layout.axis - sum(d < layout.axis for d in dims)
    rank = layout.rank if keepdim else layout.rank - len(dims)
    return Layout(axis, rank, layout.segments)


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
        raise Unsupported("reshapes to a different number of elements") from None
    return groups
