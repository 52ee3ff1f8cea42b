"""BCP channel selection against the docs/spec/engine.md §4.4 numbers and a numpy oracle (AMCT's test_bcp.py,
docs/spec/engine.md §7.4)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from amct_engine.graph.capture import capture_model
from amct_engine.prune.bcp import bcp_prune_indices, filter_scores, remain_count, select_pruned_channels
from amct_engine.prune.dependency import build_channel_groups
from amct_engine.prune.importance import DEFAULT_IMPORTANCE, IMPORTANCE_CRITERIA
from amct_engine.prune.passes import filter_prune
from amct_engine.prune.report import PruneReport
from amct_engine.prune.settings import FilterPruneSpec, LayerPruneSettings
from tests.prune_models import LinearStack, PruneResNet, example_input


def _oracle(weights: list[np.ndarray], ratio: float, ascend: bool, group: int) -> list[int]:
    """numpy restatement of the oracle: mean of min-max normalised L2/numel norms, per-group lowest."""
    norms = []
    for w in weights:
        rows = w.reshape(w.shape[0], -1)
        n = np.linalg.norm(rows, ord=2, axis=1) / rows[0].size
        norms.append((n - n.min()) / (n.max() - n.min()))
    score = np.mean(norms, axis=0)
    num = score.shape[0]
    remain = num - round(num * ratio)
    if ascend:
        remain = min(math.ceil(remain / 16) * 16, num) or min(num, 16)
    if group > 1:
        remain = min(math.floor(remain / group) * group, num)
    remain = remain or group
    per_group, length = (num - remain) // group, num // group
    pruned = []
    for g in range(group):
        order = np.argsort(score[g * length : (g + 1) * length], kind="stable") + g * length
        pruned.extend(order[:per_group].tolist())
    return sorted(pruned)


@pytest.mark.parametrize(
    ("channels", "ratio", "ascend", "group", "kept"),
    [
        (20, 0.25, False, 1, 15),  # docs/spec/engine.md §4.4 / HIASCEND 0397
        (20, 0.25, True, 1, 16),
        (160, 0.25, False, 2, 120),  # AMCT EltwiseConv
        (160, 0.3, True, 1, 112),
        (16, 0.3, True, 1, 16),  # "too small": ascend keeps all 16
        (16, 0.3, False, 1, 11),
        (4, 0.9, True, 1, 4),  # remain 0 → min(N, 16)
        (8, 0.95, False, 2, 2),  # remain 0 → group
        (30, 0.5, True, 1, 16),
    ],
)
def test_remain_count_follows_the_spec_rounding(channels, ratio, ascend, group, kept):
    assert remain_count(channels, ratio, ascend, group) == kept


@pytest.mark.parametrize("ascend", [True, False])
@pytest.mark.parametrize("group", [1, 2])
@pytest.mark.parametrize("channels", [160, 16])
def test_single_producer_matches_the_numpy_oracle(channels, group, ascend):
    weight = torch.randn(channels, 4, 3, 3, generator=torch.Generator().manual_seed(channels + group))
    got = bcp_prune_indices([(weight, 0, channels)], 0.3, ascend, group)
    assert got == _oracle([weight.numpy()], 0.3, ascend, group)
    per_group = [sum(1 for i in got if i // (channels // group) == g) for g in range(group)]
    assert len(set(per_group)) == 1  # every conv group loses the same count


def test_several_producers_average_their_normalised_scores():
    # docs/spec/engine.md §4.4: the mean over all producers, not only the first one (the shipped op's bug)
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(64, 8, 3, 3, generator=gen), torch.randn(64, 16, generator=gen) * 5
    got = bcp_prune_indices([(a, 0, 64), (b, 0, 64)], 0.5, False)
    assert got == _oracle([a.numpy(), b.numpy()], 0.5, False, 1)
    assert got != bcp_prune_indices([(a, 0, 64)], 0.5, False)


def test_scores_of_a_producer_range_use_only_those_rows():
    weight = torch.arange(12.0).reshape(6, 2)
    scores = filter_scores(weight, 2, 5)
    assert scores.shape == (3,)
    assert scores[0] == 0 and scores[-1] == 1


def test_lowest_norm_filters_go_first():
    weight = torch.ones(8, 3)
    weight[[1, 6]] = 0.01
    assert select_pruned_channels(filter_scores(weight), 0.25, False) == [1, 6]


def test_equal_filters_prune_the_lowest_indices():
    assert bcp_prune_indices([(torch.ones(8, 3), 0, 8)], 0.5, False) == [0, 1, 2, 3]


def test_bcp_is_the_default_importance_criterion_beside_group_l2_and_taylor():
    # issue 18 adds the two Torch-Pruning criteria; AMCT's BCP stays the default
    assert IMPORTANCE_CRITERIA.names() == ("bcp", "group_l2", "taylor") and DEFAULT_IMPORTANCE == "bcp"


def test_bcp_importance_scores_a_group_like_its_producers_weights():
    model = PruneResNet()
    deps = build_channel_groups(capture_model(model, example_input(PruneResNet)))
    group = next(g for g in deps.groups if len(g.producers) > 1)
    weights = [(model.get_submodule(m.name).weight, m.begin, m.end) for m in group.producers]
    expected = torch.stack([filter_scores(w, b, e) for w, b, e in weights]).mean(dim=0)
    assert torch.equal(IMPORTANCE_CRITERIA["bcp"](group, model), expected)


def test_filter_prune_ranks_channels_with_the_criterion_it_is_given():
    cm = capture_model(LinearStack(), example_input(LinearStack))
    settings = LayerPruneSettings(specs={"fc1": FilterPruneSpec(0.5, ascend_optimized=False)})
    seen = []

    def last_channels_first(group, model):  # the highest channel index scores lowest
        seen.append(group.producer_names)
        return -torch.arange(group.size, dtype=torch.float64)

    (cut,) = filter_prune(cm, settings, PruneReport(), criterion=last_channels_first)
    assert seen == [["fc1"]]
    assert list(cut.channels) == list(range(cut.group.size // 2, cut.group.size))
