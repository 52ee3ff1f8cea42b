"""Channel dependency groups: which layers lose the same channels, and why a group cannot be pruned."""

from __future__ import annotations

import torch
from torch import nn

from amct_engine.graph.capture import capture_model
from amct_engine.prune.dependency import DEPTHWISE, IN, NORM, OP, build_channel_groups
from tests.models import ReusedModuleNet, SharedWeightNet
from tests.models import example_input as models_input
from tests.prune_models import (
    ConvToLinearOnLastDim,
    EltwiseConv,
    LinearStack,
    PruneResNet,
    SliceNet,
    example_input,
)


def _deps(model_cls, x=None):
    model = model_cls()
    return build_channel_groups(capture_model(model, example_input(model_cls) if x is None else x))


def _group_led_by(deps, producer):
    (group,) = [g for g in deps.groups if producer in g.producer_names]
    return group


def _members(group, kind):
    return {m.name: (m.begin, m.end, m.block) for m in group.members if m.kind == kind}


def test_identity_residual_add_merges_the_stem_and_the_block_output():
    deps = _deps(PruneResNet)
    group = _group_led_by(deps, "conv1")
    assert group.producer_names == ["conv1", "layer1.conv2"]
    assert set(_members(group, IN)) == {"layer1.conv1", "layer2.conv1", "layer2.downsample.0"}
    assert set(_members(group, NORM)) == {"bn1", "layer1.bn2"}
    assert not group.disabled


def test_downsample_shortcut_shares_one_mask_with_the_block():
    group = _group_led_by(_deps(PruneResNet), "layer2.conv2")
    assert group.producer_names == ["layer2.downsample.0", "layer2.conv2"]
    assert set(_members(group, NORM)) == {"layer2.downsample.1", "layer2.bn2"}


def test_concat_keeps_each_input_at_its_offset_and_depthwise_follows():
    deps = _deps(PruneResNet)
    a, b = _group_led_by(deps, "branch_a.0"), _group_led_by(deps, "branch_b.0")
    assert _members(a, DEPTHWISE) == {"dw": (0, 32, 1)} and _members(b, DEPTHWISE) == {"dw": (32, 64, 1)}
    assert _members(a, IN) == {"pw": (0, 32, 1)} and _members(b, IN) == {"pw": (32, 64, 1)}
    assert _members(b, OP) == {"cat": (32, 64, 1)}
    assert "dw" not in [g.producer_names[0] for g in deps.groups]


def test_flatten_to_linear_prunes_input_features_in_blocks_of_hw():
    group = _group_led_by(_deps(PruneResNet), "pw")
    assert _members(group, IN) == {"fc": (0, 512, 16)}  # 32 channels x 4x4 after the pool
    assert group.members[-1].indices([1]) == list(range(16, 32))


def test_the_model_output_disables_the_head():
    group = _group_led_by(_deps(PruneResNet), "fc")
    assert group.disabled == ["the model output must keep its channel count"]


def test_adds_of_grouped_convs_merge_four_producers_with_two_divisions():
    deps = _deps(EltwiseConv)
    group = _group_led_by(deps, "layer1.0")
    assert group.producer_names == ["layer1.0", "layer2.0", "layer3.0", "layer4.0"]
    assert group.divisions == 2 and not group.disabled
    assert {m.name: m.group for m in group.members if m.kind == IN} == {"layer5.0": 2, "layer6.0": 2}


def test_linear_on_the_conv_width_axis_disables_the_conv_with_a_reason():
    group = _group_led_by(_deps(ConvToLinearOnLastDim), "conv")
    assert len(group.disabled) == 1
    assert "'fc' (Linear) reads channels on axis 3" in group.disabled[0]


def test_an_unknown_consumer_disables_only_its_group():
    deps = _deps(SliceNet)
    assert "indexes the tensor" in _group_led_by(deps, "conv1").disabled[0]
    assert not _group_led_by(deps, "conv2").disabled


def test_linear_bn1d_linear_chain_is_prunable():
    deps = _deps(LinearStack)
    fc1 = _group_led_by(deps, "fc1")
    assert _members(fc1, NORM) == {"bn": (0, 64, 1)} and _members(fc1, IN) == {"fc2": (0, 64, 1)}
    assert not fc1.disabled and not _group_led_by(deps, "fc2").disabled


def test_reused_module_is_never_pruned():
    deps = build_channel_groups(capture_model(ReusedModuleNet(), models_input(ReusedModuleNet)))
    assert "called 2 times" in deps.not_prunable["conv"]
    assert all("conv" not in g.producer_names for g in deps.groups)


def test_shared_weights_are_never_pruned():
    deps = build_channel_groups(capture_model(SharedWeightNet(), models_input(SharedWeightNet)))
    assert "shares its weight with fc_b" in deps.not_prunable["fc_a"]
    assert all(g.producer_names != ["fc_a"] for g in deps.groups)


class _ScaleByParameter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.scale = nn.Parameter(torch.ones(1, 8, 1, 1))
        self.head = nn.Conv2d(8, 2, 1)

    def forward(self, x):
        return self.head(self.conv(x) * self.scale)


def test_an_operand_that_cannot_be_pruned_disables_the_group():
    deps = build_channel_groups(capture_model(_ScaleByParameter(), torch.randn(1, 3, 8, 8)))
    assert "cannot be pruned" in _group_led_by(deps, "conv").disabled[0]


class _Permuted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 1)
        self.fc = nn.Linear(8, 4)
        self.out = nn.Linear(4, 2)

    def forward(self, x):
        return self.out(self.fc(self.conv(x).permute(0, 2, 3, 1)).mean(dim=(1, 2)))


def test_permute_moves_the_channel_axis_to_a_linear():
    deps = build_channel_groups(capture_model(_Permuted(), torch.randn(1, 3, 4, 4)))
    conv, fc = _group_led_by(deps, "conv"), _group_led_by(deps, "fc")
    assert _members(conv, IN) == {"fc": (0, 8, 1)} and not conv.disabled
    assert _members(fc, IN) == {"out": (0, 4, 1)} and not fc.disabled
