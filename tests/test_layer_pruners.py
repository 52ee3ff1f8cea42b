"""A user layer type made prunable through the layer-pruner table, end to end through the public API.

``ScaledConv2d`` is the kind of layer a user writes: its own ``weight`` / ``bias`` / ``scale``
Parameters and a forward that calls ``F.conv2d``. Capture traces *into* a module that is not a
``torch.nn`` class (fx only keeps ``torch.nn`` layers as leaves), so pruning would see a bare
``conv2d`` call and no layer. ``register_layer_pruner(ScaledConv2d, pruner)`` therefore does two
things: it adds the pruner to ``LAYER_PRUNERS`` and registers the class as a capture leaf
(``amct_engine.graph.capture.register_leaf_module_type``), so the graph holds one ``call_module``
node ``stem`` of type ``ScaledConv2d``. ``unregister_layer_pruner`` undoes both.
The cfg reader configures the layer types the table knows (``weight_layer_type_names``), so the
registered class takes the cfg's prune config like a built-in layer.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import amct_engine.prune_retrain as amct
from amct_engine.graph.capture import capture_model, register_leaf_module_type, unregister_leaf_module_type
from amct_engine.prune import LAYER_PRUNERS, LayerPruner, register_layer_pruner, unregister_layer_pruner
from amct_engine.prune.dependency import IN, OUT, build_channel_groups
from amct_engine.prune.layer_pruners import PRODUCER, keep_indices, layer_pruner_for, new_parameter
from amct_engine.prune.records import read_prune_records
from amct_engine.prune.report import DISABLED, PRUNED

FILTER_50 = (
    "prune_config { filter_pruner { balanced_l2_norm_filter_prune { prune_ratio: 0.5 ascend_optimized: false } } }\n"
)


class ScaledConv2d(nn.Module):
    """A 3x3 conv with a learnt per-channel output scale, written without nn.Conv2d."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out_channels, in_channels, 3, 3) * 0.2)
        self.bias = nn.Parameter(torch.randn(out_channels) * 0.1)
        self.scale = nn.Parameter(torch.rand(out_channels) + 0.5)

    def forward(self, x):
        return F.conv2d(x, self.weight, self.bias, padding=1) * self.scale.view(1, -1, 1, 1)


class ScaledConv2dPruner(LayerPruner):
    """Leads a group like a Conv2d: output channels are weight rows, bias and scale entries."""

    op_type = "Conv"
    flow = PRODUCER

    def get_out_channels(self, layer: ScaledConv2d) -> int:
        return layer.weight.shape[0]

    def get_in_channels(self, layer: ScaledConv2d) -> int:
        return layer.weight.shape[1]

    def prune_out_channels(self, layer: ScaledConv2d, indices) -> None:
        keep = keep_indices(self.get_out_channels(layer), set(indices))
        for name in ("weight", "bias", "scale"):
            setattr(layer, name, new_parameter(getattr(layer, name), getattr(layer, name).detach()[keep]))

    def prune_in_channels(self, layer: ScaledConv2d, indices) -> None:
        keep = keep_indices(self.get_in_channels(layer), set(indices))
        layer.weight = new_parameter(layer.weight, layer.weight.detach()[:, keep])


class ScaledNet(nn.Module):
    """stem (the user layer, 16 channels) → ReLU → conv (its consumer) → pool → fc."""

    def __init__(self):
        super().__init__()
        self.stem = ScaledConv2d(3, 16)
        self.conv = nn.Conv2d(16, 8, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        x = self.conv(torch.relu(self.stem(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


class FedScaledNet(nn.Module):
    """conv (a Conv2d producer) → the user layer: the user layer reads the conv's channels."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.scaled = ScaledConv2d(16, 8)

    def forward(self, x):
        return self.scaled(self.conv(x)).mean((2, 3))


def _input(seed: int = 0) -> torch.Tensor:
    return torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(seed))


def _cfg(tmp_path, text: str = FILTER_50) -> str:
    path = tmp_path / "prune.cfg"
    path.write_text(text)
    return str(path)


@pytest.fixture
def scaled_conv_pruner():
    pruner = register_layer_pruner(ScaledConv2d, ScaledConv2dPruner())
    try:
        yield pruner
    finally:
        unregister_layer_pruner(ScaledConv2d)


def test_registering_a_pruner_makes_the_layer_one_leaf_of_the_captured_graph(scaled_conv_pruner):
    cm = capture_model(ScaledNet(), _input())
    assert cm.module_types()["stem"] == "ScaledConv2d"
    assert layer_pruner_for(cm.get_module("stem")) is scaled_conv_pruner
    (group,) = [g for g in build_channel_groups(cm).groups if g.producer_names == ["stem"]]
    assert {(m.name, m.kind, m.op_type) for m in group.members} == {("stem", OUT, "Conv"), ("conv", IN, "Conv")}
    assert not group.disabled


def test_the_user_layer_loses_channels_and_its_consumer_reads_fewer(tmp_path, scaled_conv_pruner):
    torch.manual_seed(0)
    model = ScaledNet()
    record = tmp_path / "record.txt"
    pruned = amct.create_prune_retrain_model(model, _input(), _cfg(tmp_path), str(record))

    assert pruned.stem.weight.shape == (8, 3, 3, 3)
    assert pruned.stem.bias.shape == pruned.stem.scale.shape == (8,)
    assert pruned.conv.in_channels == 8 and pruned.conv.weight.shape[1] == 8
    assert pruned(_input(seed=1)).shape == model(_input(seed=1)).shape == (2, 4)
    statuses = {tuple(g.producers): g.status for g in pruned.amct_prune_report.groups}
    assert statuses[("stem",)] == PRUNED
    (stem_record,) = [r for r in read_prune_records(record) if r.producer[0].name == "stem"]
    assert [n.name for n in stem_record.consumer] == ["conv"]


def test_restore_replays_the_user_layer_from_the_record(tmp_path, scaled_conv_pruner):
    torch.manual_seed(0)
    record = tmp_path / "record.txt"
    pruned = amct.create_prune_retrain_model(ScaledNet(), _input(), _cfg(tmp_path), str(record)).eval()
    torch.save(pruned.state_dict(), tmp_path / "pruned.pth")
    restored = amct.restore_prune_retrain_model(
        ScaledNet(), _input(), str(record), _cfg(tmp_path), str(tmp_path / "pruned.pth")
    ).eval()
    assert restored.stem.scale.shape == (8,) and restored.conv.in_channels == 8
    with torch.no_grad():
        assert torch.equal(restored(_input(seed=2)), pruned(_input(seed=2)))


def test_unregistering_removes_the_pruner_and_the_capture_leaf():
    register_layer_pruner(ScaledConv2d, ScaledConv2dPruner())
    unregister_layer_pruner(ScaledConv2d)
    assert ScaledConv2d not in LAYER_PRUNERS
    assert "stem" not in capture_model(ScaledNet(), _input()).module_types()


def test_an_unregistered_user_layer_disables_the_group_it_reads_with_the_op_it_calls(tmp_path):
    # not a leaf: capture traces into its forward, and the pruner meets a bare F.conv2d
    pruned = amct.create_prune_retrain_model(FedScaledNet(), _input(), _cfg(tmp_path), str(tmp_path / "r.txt"))
    (group,) = [g for g in pruned.amct_prune_report.groups if g.producers == ["conv"]]
    assert group.status == DISABLED
    assert "(`conv2d`) is not an op the pruner knows to keep channels independent" in group.reason
    assert pruned.conv.out_channels == 16


def test_an_unregistered_user_leaf_disables_the_group_it_reads_naming_its_type():
    register_leaf_module_type(ScaledConv2d)  # a leaf, but no layer pruner
    try:
        deps = build_channel_groups(capture_model(FedScaledNet(), _input()))
    finally:
        unregister_leaf_module_type(ScaledConv2d)
    (group,) = [g for g in deps.groups if g.producer_names == ["conv"]]
    assert group.disabled == [
        "'scaled' (ScaledConv2d) is a ScaledConv2d; the pruner does not know how it uses channels"
    ]
