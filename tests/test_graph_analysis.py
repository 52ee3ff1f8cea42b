"""Layer discovery (docs/spec/engine.md §4.9), conv→BN→activation chains and distill groups
(docs/spec/engine.md §6.1)."""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from amct_engine.graph.analysis import (
    Chain,
    conv_bn_act_chains,
    excluded_layers,
    input_bounded_below,
    input_non_negative,
    quantizable_layers,
)
from amct_engine.graph.capture import capture_model
from amct_engine.graph.distill_groups import distill_groups
from amct_engine.layer_table import distill_type_names
from tests.models import (
    ActivationsNet,
    ConvBnReluNet,
    ExclusionNet,
    ReusedModuleNet,
    SharedWeightNet,
    TinyResNet,
    TwoInputNet,
    example_input,
)

CONV_BN_RELU_GROUPS = [["conv1", "bn", "relu"], ["conv2", "bn2", "relu2"], ["fc"]]


def _capture(model_cls, **kwargs):
    return capture_model(model_cls(**kwargs), example_input(model_cls))


class FunctionalReluNet(nn.Module):
    """conv1 → F.relu → conv2 → torch.relu → flatten → fc; input [N, 1, 4, 4]."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 2, 3, padding=1)
        self.conv2 = nn.Conv2d(2, 2, 3, padding=1)
        self.fc = nn.Linear(32, 2)

    def forward(self, x):
        x = self.conv2(F.relu(self.conv1(x)))
        return self.fc(torch.relu(x).flatten(1))


# --- layer discovery -------------------------------------------------------------------------------


def test_quantizable_layers_in_topological_order():
    cm = _capture(ConvBnReluNet)

    layers = quantizable_layers(cm)

    assert [(layer.name, layer.type_name) for layer in layers] == [
        ("conv1", "Conv2d"),
        ("conv2", "Conv2d"),
        ("fc", "Linear"),
    ]
    assert layers[0].module is cm.module.conv1


def test_nested_resnet_layers_keep_their_module_paths():
    names = [layer.name for layer in quantizable_layers(_capture(TinyResNet))]

    assert names[:3] == ["conv1", "layer1.0.conv1", "layer1.0.conv2"]
    assert "layer2.0.downsample.0" in names and names[-1] == "fc"


def test_reused_module_is_excluded_with_its_call_count():
    cm = _capture(ReusedModuleNet)

    assert [layer.name for layer in quantizable_layers(cm)] == ["head"]
    assert excluded_layers(cm) == {
        "conv": "the module is called 2 times in forward; reused modules are not supported (docs/spec/engine.md §4.9)"
    }


def test_shared_weight_excludes_both_holders():
    reasons = excluded_layers(_capture(SharedWeightNet))

    assert set(reasons) == {"fc_a", "fc_b"}
    assert "shared with fc_b" in reasons["fc_a"]


def test_padding_mode_and_conv3d_dilation_exclusions():
    cm = _capture(ExclusionNet)

    reasons = excluded_layers(cm)

    assert [layer.name for layer in quantizable_layers(cm)] == ["conv3d_ok", "fc"]
    assert "padding_mode is 'reflect'" in reasons["conv3d_reflect"]
    assert "dilation[0] = 2" in reasons["conv3d_dilated"]


def test_distill_types_keep_only_conv2d_and_linear():
    assert [layer.name for layer in quantizable_layers(_capture(ExclusionNet), distill_type_names())] == ["fc"]


# --- chains and the ReLU input ---------------------------------------------------------------------


def test_conv_bn_relu_chains():
    assert conv_bn_act_chains(_capture(ConvBnReluNet)) == [
        Chain("conv1", "bn", "relu", "ReLU"),
        Chain("conv2", "bn2", "relu2", "ReLU"),
        Chain("fc"),
    ]


def test_chains_record_functional_activations_without_a_module():
    chains = {c.layer: c for c in conv_bn_act_chains(_capture(ActivationsNet))}

    assert chains["conv1"] == Chain("conv1", None, "act1", "LeakyReLU")
    assert chains["conv2"].members == ["conv2", "bn2", "act2"]
    assert chains["conv3"] == Chain("conv3", None, None, "ReLU")  # F.relu
    assert chains["fc2"].act == "softmax"


def test_residual_add_ends_the_chain_after_bn():
    chains = {c.layer: c for c in conv_bn_act_chains(_capture(TinyResNet))}

    assert chains["layer1.0.conv1"] == Chain("layer1.0.conv1", "layer1.0.bn1", "layer1.0.relu", "ReLU")
    assert chains["layer1.0.conv2"] == Chain("layer1.0.conv2", "layer1.0.bn2")


def test_input_non_negative_module_and_functions():
    relu_net = _capture(ConvBnReluNet)
    functional = capture_model(FunctionalReluNet(), torch.randn(1, 1, 4, 4))

    # fc reads relu2 through flatten, which keeps the sign (AMCT looks at the direct producer only).
    assert [input_non_negative(relu_net, n) for n in ("conv1", "conv2", "fc")] == [False, True, True]
    assert input_non_negative(functional, "conv2")  # F.relu
    assert input_non_negative(functional, "fc")  # torch.relu, then flatten


class _PoolThenLinear(nn.Module):
    """relu → max-pool → flatten → fc1 (non-negative input); sigmoid-free tanh → flatten → fc2 (signed)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(8, 2)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        a = self.fc1(torch.flatten(self.pool(torch.relu(y)), 1))
        b = self.fc2(torch.flatten(torch.nn.functional.avg_pool2d(torch.tanh(y), 2), 1))
        return a + b


def test_input_non_negative_looks_through_pooling_and_flatten_only():
    for source in (_PoolThenLinear(), torch.jit.script(_PoolThenLinear())):
        cm = capture_model(source, torch.randn(1, 1, 4, 4))
        assert input_non_negative(cm, "fc1")  # relu → max-pool → flatten
        assert not input_non_negative(cm, "fc2")  # tanh → avg-pool → flatten: signed


def test_input_non_negative_on_a_torchscript_functional_relu():
    cm = capture_model(torch.jit.script(FunctionalReluNet()), torch.randn(1, 1, 4, 4))

    assert input_non_negative(cm, "conv2")  # aten.relu.default call


class _SqueezeExciteBlock(nn.Module):
    """conv0 → act → conv1 → act → x * sigmoid(fc(pool(x))) → conv2: every conv after conv0 reads `act`."""

    def __init__(self, act: type[nn.Module]) -> None:
        super().__init__()
        self.conv0, self.conv1, self.conv2 = nn.Conv2d(1, 4, 3), nn.Conv2d(4, 4, 1), nn.Conv2d(4, 4, 1)
        self.act0, self.act1, self.fc = act(), act(), nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act1(self.conv1(self.act0(self.conv0(x))))
        return self.conv2(y * torch.sigmoid(self.fc(F.adaptive_avg_pool2d(y, 1))))


@pytest.mark.parametrize(
    "act, non_negative, bounded_below", [(nn.ReLU6, True, False), (nn.SiLU, False, True), (nn.Hardswish, False, True)]
)
def test_relu6_inputs_are_non_negative_and_silu_hardswish_inputs_bounded_below_through_a_gate(
    act, non_negative, bounded_below
):
    """ReLU6 gets fixed_min like ReLU; SiLU and hardswish inputs start from the asymmetric search; the product
    with a sigmoid gate keeps what its other factor had."""
    x = torch.randn(1, 1, 6, 6)
    scripted = torch.jit.script(_SqueezeExciteBlock(act))
    for cm in (capture_model(_SqueezeExciteBlock(act), x), capture_model(scripted, x)):
        for name in ("conv1", "conv2", "fc"):
            assert input_non_negative(cm, name) is non_negative, name
            assert input_bounded_below(cm, name) is bounded_below, name
        assert not input_non_negative(cm, "conv0") and not input_bounded_below(cm, "conv0")


class _SplitBlock(nn.Module):
    """A C2f block's start: conv → ReLU6 → split in halves; conv1 reads one half (torch.export captures it)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv0, self.act, self.conv1 = nn.Conv2d(1, 4, 3), nn.ReLU6(), nn.Conv2d(2, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.act(self.conv0(x)).split(2, dim=1)
        return self.conv1(a) + b


def test_a_half_of_a_split_keeps_its_sign():
    assert input_non_negative(capture_model(_SplitBlock(), torch.randn(1, 1, 6, 6)), "conv1")


def test_input_non_negative_unknown_layer():
    with pytest.raises(ValueError, match="'nope' is not called"):
        input_non_negative(_capture(ConvBnReluNet), "nope")


# --- distill groups (docs/spec/engine.md §6.1) --------------------------------------------------------------------


def test_default_distill_groups_are_minimal_units():
    assert distill_groups(_capture(ConvBnReluNet)) == CONV_BN_RELU_GROUPS


@pytest.mark.parametrize("kind", ["script", "trace"])
def test_torchscript_files_give_the_same_groups(tmp_path, kind):
    x = example_input(ConvBnReluNet)
    model = ConvBnReluNet().eval()
    ts = torch.jit.script(model) if kind == "script" else torch.jit.trace(model, (x,))
    torch.jit.save(ts, str(tmp_path / "model.pt"))

    cm = capture_model(tmp_path / "model.pt", x)

    assert distill_groups(cm) == CONV_BN_RELU_GROUPS
    assert [layer.name for layer in quantizable_layers(cm, distill_type_names())] == ["conv1", "conv2", "fc"]


def test_group_size_two_cascades_through_single_consumers():
    cm = _capture(ConvBnReluNet)

    expected = [["conv1", "bn", "relu", "conv2", "bn2", "relu2"], ["fc"]]  # flatten breaks relu2 → fc
    assert distill_groups(cm, group_size=2) == expected
    assert distill_groups(cm, group_size=5) == expected


def test_activation_units_and_cascade():
    cm = _capture(ActivationsNet)

    assert distill_groups(cm) == [
        ["conv1", "act1"],
        ["conv2", "bn2", "act2"],
        ["conv3"],
        ["fc1", "act3"],
        ["fc2", "softmax"],
    ]
    assert distill_groups(cm, group_size=2) == [
        ["conv1", "act1", "conv2", "bn2", "act2"],
        ["conv3"],
        ["fc1", "act3", "fc2", "softmax"],
    ]


def test_resnet_blocks_cascade_conv1_into_conv2_but_not_across_the_add():
    groups = distill_groups(_capture(TinyResNet), group_size=2)

    assert ["layer1.0.conv1", "layer1.0.bn1", "layer1.0.relu", "layer1.0.conv2", "layer1.0.bn2"] in groups
    assert ["conv1", "bn1", "relu"] in groups  # stem relu feeds a conv and the residual add


def test_user_group_is_expanded_along_its_only_route():
    cm = _capture(ConvBnReluNet)

    assert distill_groups(cm, user_groups=[("conv1", "relu2")]) == [
        ["conv1", "bn", "relu", "conv2", "bn2", "relu2"],
        ["fc"],
    ]


def test_user_groups_accept_cfg_objects_and_sort_by_position():
    cm = _capture(ConvBnReluNet)
    group = types.SimpleNamespace(start_layer_name="conv2", end_layer_name="bn2")

    assert distill_groups(cm, user_groups=[group]) == [["conv1", "bn", "relu"], ["conv2", "bn2"], ["fc"]]


def test_user_group_with_two_routes_is_refused():
    route = "Can not find an only route from conv1 to layer1.1.conv1: .*more than one path"
    with pytest.raises(ValueError, match=route):
        distill_groups(_capture(TinyResNet), user_groups=[("conv1", "layer1.1.conv1")])


def test_user_group_with_no_route_is_refused():
    with pytest.raises(
        ValueError, match="Can not find an only route from conv2 to conv1: 'conv1' cannot be reached from 'conv2'"
    ):
        distill_groups(_capture(ConvBnReluNet), user_groups=[("conv2", "conv1")])


def test_user_group_through_a_function_call_is_refused():
    with pytest.raises(ValueError, match=r"passes through `flatten` \(call_function flatten\)"):
        distill_groups(_capture(ConvBnReluNet), user_groups=[("conv2", "fc")])


def test_user_group_with_unknown_or_reused_start():
    with pytest.raises(ValueError, match="layer 'conv9' is not called"):
        distill_groups(_capture(ConvBnReluNet), user_groups=[("conv9", "fc")])
    with pytest.raises(ValueError, match="start layer 'conv' is reused"):
        distill_groups(_capture(ReusedModuleNet), user_groups=[("conv", "head")])


def test_intersecting_user_groups_are_refused():
    with pytest.raises(ValueError, match="share bn, relu; distill groups must not intersect"):
        distill_groups(_capture(ConvBnReluNet), user_groups=[("conv1", "relu"), ("bn", "conv2")])


def test_auto_units_do_not_take_members_of_user_groups():
    groups = distill_groups(_capture(ConvBnReluNet), user_groups=[("relu", "conv2")])

    assert groups == [["conv1", "bn"], ["relu", "conv2"], ["fc"]]


def test_bad_group_size_and_group_format():
    cm = _capture(ConvBnReluNet)
    with pytest.raises(ValueError, match="group_size"):
        distill_groups(cm, group_size=0)
    with pytest.raises(TypeError, match="pair"):
        distill_groups(cm, user_groups=["conv1"])


def test_no_distillable_layer():
    cm = capture_model(nn.Sequential(nn.Conv1d(2, 2, 3)), torch.randn(1, 2, 8))

    with pytest.raises(ValueError, match="Not found distill group"):
        distill_groups(cm)


def test_two_input_model_groups():
    x = example_input(TwoInputNet)
    cm = capture_model(TwoInputNet(), (x, x))

    assert distill_groups(cm) == [["conv_x"], ["conv_y"], ["fc"]]
