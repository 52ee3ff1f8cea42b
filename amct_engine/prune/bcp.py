"""Balanced L2-norm filter pruning (BCP): which channels of a group go (docs/spec/engine.md §4.4 step 3).

Follows the test oracle (``custom_op/test_bcp.py``), not the shipped op: the channel score is the
mean over *all* the group's producers of their min-max normalised filter norms (the shipped ``bcp()``
only ever reads the first producer's norms, docs/spec/engine.md §8). ``bcp_importance`` is the scoring half, the
"bcp" entry of ``importance.IMPORTANCE_CRITERIA``; ``remain_count`` / ``select_pruned_channels`` are
the count and the per-group choice every criterion's scores go through.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from amct_engine.prune.channel_groups import ChannelGroup
from amct_engine.prune.layer_pruners import layer_pruner_for

ASCEND_CHANNEL_MULTIPLE = 16  # docs/spec/engine.md §4.4: ascend_optimized keeps a multiple of 16 channels


def remain_count(channels: int, prune_ratio: float, ascend_optimized: bool, group: int = 1) -> int:
    """How many of ``channels`` stay (docs/spec/engine.md §4.4 "Count", the oracle's ``cal_prune_num``).

    20 channels at 0.25 keep 15 (16 with ascend_optimized); 160 at 0.25 with group 2 keep 120.
    """
    remain = channels - round(channels * prune_ratio)
    if ascend_optimized:
        remain = min(math.ceil(remain / ASCEND_CHANNEL_MULTIPLE) * ASCEND_CHANNEL_MULTIPLE, channels)
        if remain == 0:
            remain = min(channels, ASCEND_CHANNEL_MULTIPLE)
    if group > 1:
        remain = min(math.floor(remain / group) * group, channels)
    if remain == 0:
        remain = group
    return remain


def filter_scores(weight: torch.Tensor, begin: int = 0, end: int | None = None) -> torch.Tensor:
    """Min-max normalised ‖W[c]‖₂ / (elements per filter) of rows ``begin:end`` (Cout on axis 0)."""
    rows = weight.detach()[begin:end]
    rows = rows.reshape(rows.shape[0], -1).to(torch.float64)
    norms = torch.linalg.vector_norm(rows, dim=1) / rows.shape[1]
    low, high = norms.min(), norms.max()
    if high <= low:  # all filters alike: the oracle divides by zero; no channel is worse than another
        return torch.zeros_like(norms)
    return (norms - low) / (high - low)


def select_pruned_channels(
    scores: torch.Tensor, prune_ratio: float, ascend_optimized: bool, group: int = 1
) -> list[int]:
    """Sorted indices of the channels to remove: the lowest scores of each of ``group`` equal parts."""
    channels = scores.numel()
    if channels % group:
        raise ValueError(f"{channels} channels cannot be split into {group} equal groups")
    prune_num = channels - remain_count(channels, prune_ratio, ascend_optimized, group)
    per_group, length = prune_num // group, channels // group
    pruned: list[int] = []
    for g in range(group):
        part = scores[g * length : (g + 1) * length]
        order = torch.argsort(part, stable=True)  # ties: the lower index goes first
        pruned.extend(int(i) + g * length for i in order[:per_group])
    return sorted(pruned)


def producer_scores(weights: Sequence[tuple[torch.Tensor, int, int]]) -> torch.Tensor:
    """The channel score of (weight, begin, end) producer ranges that share one mask: the mean of theirs."""
    if not weights:
        raise ValueError("a channel group needs at least one producer")
    return torch.stack([filter_scores(w, b, e) for w, b, e in weights]).mean(dim=0)


def bcp_prune_indices(
    weights: Sequence[tuple[torch.Tensor, int, int]],
    prune_ratio: float,
    ascend_optimized: bool,
    group: int = 1,
) -> list[int]:
    """Channels to prune from (weight, begin, end) producer ranges that share one mask."""
    return select_pruned_channels(producer_scores(weights), prune_ratio, ascend_optimized, group)


def bcp_importance(group: ChannelGroup, model: nn.Module) -> torch.Tensor:
    """The BCP score of each channel of ``group`` in ``model`` (the "bcp" importance criterion).

    Each producer's filters are the rows of its layer pruner's ``filter_weight``.
    """
    weights = []
    for member in group.producers:
        layer = model.get_submodule(member.name)
        weights.append((layer_pruner_for(layer).filter_weight(layer), member.begin, member.end))
    return producer_scores(weights)
