"""Graph capture: nn.Module, DataParallel, TorchScript (scripted and traced files), failures."""

from __future__ import annotations

import pathlib
import threading
import warnings

import pytest
import torch
from torch import fx, nn

from amct_engine.graph.capture import CapturedModel, capture_model, register_amct_module_type
from amct_engine.graph.errors import GraphCaptureError
from tests.models import (
    ConvBnReluNet,
    DataDependentNet,
    LayerZooNet,
    ShapeBranchNet,
    SharedWeightNet,
    TinyResNet,
    TwoInputNet,
    example_input,
)

CONV_BN_RELU_TYPES = {
    "conv1": "Conv2d",
    "bn": "BatchNorm2d",
    "relu": "ReLU",
    "conv2": "Conv2d",
    "bn2": "BatchNorm2d",
    "relu2": "ReLU",
    "fc": "Linear",
}

LIFTED_TYPES = {"Conv2d", "BatchNorm2d", "ReLU", "Linear"}


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def _save_torchscript(model: nn.Module, x: torch.Tensor, kind: str, path: pathlib.Path) -> pathlib.Path:
    ts = torch.jit.script(model) if kind == "script" else torch.jit.trace(model, (x,))
    torch.jit.save(ts, str(path))
    return path


# --- nn.Module -------------------------------------------------------------------------------------


def test_nn_module_layers_are_call_module_nodes_named_by_path():
    cm = capture_model(ConvBnReluNet(), example_input(ConvBnReluNet))

    assert cm.source == "nn.Module"
    assert isinstance(cm.graph_module, fx.GraphModule)
    assert cm.module_types() == CONV_BN_RELU_TYPES


def test_graph_module_shares_leaf_modules_with_the_deep_copy():
    model = ConvBnReluNet()
    cm = capture_model(model, example_input(ConvBnReluNet))

    assert cm.module is not model
    assert cm.graph_module.get_submodule("conv1") is cm.module.conv1
    assert cm.module.conv1.weight is not model.conv1.weight
    assert torch.equal(cm.module.conv1.weight, model.conv1.weight)


def test_graph_module_computes_what_the_model_computes():
    model = TinyResNet().eval()
    x = example_input(TinyResNet)
    cm = capture_model(model, x)

    assert _max_diff(cm.graph_module(x), model(x)) == 0.0


def test_nested_paths_and_reused_relu_of_a_resnet_block():
    cm = capture_model(TinyResNet(), example_input(TinyResNet))

    types = cm.module_types()
    assert types["layer1.0.conv1"] == "Conv2d"
    assert types["layer2.0.downsample.0"] == "Conv2d"
    assert cm.call_count("layer1.0.relu") == 2  # after bn1, and after the residual add
    assert [n.op for n in cm.consumers("layer1.0.bn2")] == ["call_function"]  # the residual add


def test_multi_input_forward():
    model = TwoInputNet()
    x, y = example_input(TwoInputNet, seed=1), example_input(TwoInputNet, seed=2)
    cm = capture_model(model, [x, y])

    assert cm.example_inputs == (x, y)
    assert [n.op for n in cm.graph.nodes].count("placeholder") == 2
    assert _max_diff(cm.graph_module(x, y), model(x, y)) == 0.0


def test_data_parallel_wrapper_is_unwrapped():
    cm = capture_model(nn.DataParallel(ConvBnReluNet()), example_input(ConvBnReluNet))

    assert type(cm.module) is ConvBnReluNet
    assert cm.module_types() == CONV_BN_RELU_TYPES


def test_model_that_cannot_be_deep_copied_is_used_in_place_with_a_warning():
    model = ConvBnReluNet()
    model.lock = threading.Lock()  # not deep-copyable

    with pytest.warns(UserWarning, match="deep-copy"):
        cm = capture_model(model, example_input(ConvBnReluNet))

    assert cm.module is model


@pytest.mark.parametrize("bad", [3, "not a tensor", (), [torch.zeros(1), 2.0], {"x": torch.zeros(1)}])
def test_input_data_must_be_tensors(bad):
    with pytest.raises(TypeError, match="input_data"):
        capture_model(ConvBnReluNet(), bad)


def test_model_must_be_a_module_or_a_path():
    with pytest.raises(TypeError, match="model must be"):
        capture_model(lambda x: x, torch.zeros(1))


class Conv2dQAT(nn.Conv2d):
    """Named like an AMCT distill op (docs/spec/engine.md §1.1 AMCT_OPERATIONS)."""


class _MyWrapper(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Conv2d(1, 1, 1)

    def forward(self, x):
        return self.inner(x)


def test_model_already_holding_amct_ops_is_rejected():
    model = ConvBnReluNet()
    model.conv1 = Conv2dQAT(1, 8, 3, padding=1)

    with pytest.raises(ValueError, match=r"already contains AMCT operations: conv1 \(Conv2dQAT\)"):
        capture_model(model, example_input(ConvBnReluNet))


def test_registered_wrapper_types_are_leaves_and_can_be_allowed():
    register_amct_module_type(_MyWrapper)
    model = nn.Sequential(_MyWrapper(), nn.ReLU())
    x = torch.randn(1, 1, 4, 4)

    with pytest.raises(ValueError, match="_MyWrapper"):
        capture_model(model, x)
    cm = capture_model(model, x, reject_amct_ops=False)
    assert cm.module_types() == {"0": "_MyWrapper", "1": "ReLU"}


# --- fx failures and the torch.export fallback -----------------------------------------------------


def test_data_dependent_branch_names_the_fx_node_and_the_source_line():
    with pytest.raises(GraphCaptureError) as info:
        capture_model(DataDependentNet(), example_input(DataDependentNet))

    message = str(info.value)
    assert "models.py:" in message and "`if x.sum() > 0:`" in message
    assert "fx node `gt`" in message
    assert "torch.export failed as well" in message
    assert "torch.where" in message  # what to do about it


def test_without_export_fallback_a_shape_branch_is_an_error():
    with pytest.raises(GraphCaptureError, match=r"`if y.shape\[-1\] > 4:`"):
        capture_model(ShapeBranchNet(), example_input(ShapeBranchNet), allow_export_fallback=False)


def test_shape_branch_falls_back_to_torch_export_with_module_paths():
    model = ShapeBranchNet().eval()
    x = example_input(ShapeBranchNet)

    with pytest.warns(UserWarning, match="Captured with torch.export"):
        cm = capture_model(model, x)

    assert cm.source == "torch.export"
    assert cm.module is cm.graph_module
    assert cm.module_types() == {"conv": "Conv2d", "relu": "ReLU", "fc": "Linear"}
    assert _max_diff(cm.module(x), model(x)) < 1e-6


def test_export_fallback_keeps_shared_weights_shared():
    class SharedWithBranch(SharedWeightNet):
        def forward(self, x):
            if x.shape[0] > 1:
                x = x * 2
            return super().forward(x)

    with pytest.warns(UserWarning):
        cm = capture_model(SharedWithBranch(), torch.randn(2, 8))

    assert cm.module.fc_a.weight is cm.module.fc_b.weight


# --- TorchScript -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["script", "trace"])
@pytest.mark.parametrize("model_cls", [ConvBnReluNet, TinyResNet])
def test_torchscript_file_rebuilds_the_same_layers_and_outputs(tmp_path, model_cls, kind):
    model = model_cls().eval()
    x = example_input(model_cls)
    path = _save_torchscript(model, x, kind, tmp_path / f"{kind}.pt")
    reference = capture_model(model, x)

    cm = capture_model(str(path), x)

    assert cm.source == "torchscript"
    assert cm.module is cm.graph_module
    # parameter-free modules other than activations (avgpool) stay aten calls in the rebuild
    layers = {n: t for n, t in reference.module_types().items() if t in LIFTED_TYPES}
    assert cm.module_types() == layers
    assert [cm.call_count(n) for n in layers] == [reference.call_count(n) for n in layers]
    loaded = torch.jit.load(str(path))
    x_other = example_input(model_cls, batch=3, seed=7)
    assert _max_diff(cm.module(x_other), loaded(x_other)) <= 1e-5


@pytest.mark.parametrize("kind", ["script", "trace"])
def test_torchscript_rebuild_of_every_lifted_layer_kind(tmp_path, kind):
    model = LayerZooNet().eval()
    for bn in (model.bn1d, model.bn3d):
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    x = example_input(LayerZooNet)
    path = _save_torchscript(model, x, kind, tmp_path / "zoo.pt")

    cm = capture_model(path, x)

    originals = dict(model.named_modules())
    for name, type_name in cm.module_types().items():
        rebuilt, original = cm.get_module(name), originals[name]
        assert type_name == type(original).__name__
        assert repr(rebuilt) == repr(original)  # stride, padding, groups, eps, momentum, p …
    assert set(cm.module_types()) == set(capture_model(model, x).module_types())
    x_other = example_input(LayerZooNet, batch=3, seed=5)
    assert _max_diff(cm.module(x_other), model(x_other)) <= 1e-5


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_file_traced_in_train_mode_follows_the_rebuilt_modules_flags(tmp_path):
    # a trace bakes BN batch statistics and dropout into its graph; the rebuilt modules obey .eval()
    model = LayerZooNet().train()
    x = example_input(LayerZooNet, batch=4)
    path = _save_torchscript(model, x, "trace", tmp_path / "train.pt")

    cm = capture_model(path, x)

    assert cm.module.training and cm.get_module("drop").training
    cm.module.eval()
    model.eval()
    assert _max_diff(cm.module(x), model(x)) <= 1e-5


def test_traced_file_gets_conv_and_bn_attributes_from_the_call_arguments(tmp_path):
    model = ConvBnReluNet().eval()
    model.bn2.running_mean.uniform_()
    model.bn2.eps = 1e-3
    x = example_input(ConvBnReluNet)
    path = _save_torchscript(model, x, "trace", tmp_path / "traced.pt")

    cm = capture_model(pathlib.Path(path), x)

    conv2, bn2 = cm.get_module("conv2"), cm.get_module("bn2")
    assert (conv2.stride, conv2.padding, conv2.kernel_size) == ((2, 2), (1, 1), (3, 3))
    assert bn2.eps == pytest.approx(1e-3)
    assert torch.equal(bn2.running_mean, model.bn2.running_mean)
    assert isinstance(conv2.weight, nn.Parameter) and conv2.weight.requires_grad


def test_scripted_model_in_train_mode_keeps_train_mode_semantics(tmp_path):
    model = ConvBnReluNet().train()
    x = example_input(ConvBnReluNet, batch=4)
    path = _save_torchscript(model, x, "script", tmp_path / "train.pt")

    cm = capture_model(path, x)

    assert cm.module.training and cm.get_module("bn").training
    assert _max_diff(cm.module(x), torch.jit.load(str(path))(x)) <= 1e-5  # batch statistics


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")  # tracing a train-mode BatchNorm
def test_script_module_object_is_not_modified():
    ts = torch.jit.trace(ConvBnReluNet().train(), (example_input(ConvBnReluNet),))

    cm = capture_model(ts, example_input(ConvBnReluNet))

    assert ts.training  # conversion worked on a private copy put in eval mode
    assert cm.module_types() == CONV_BN_RELU_TYPES  # in-memory trace: names still recovered


@pytest.mark.parametrize("kind", ["script", "trace"])
def test_torchscript_shared_weight_stays_shared(kind):
    x = example_input(SharedWeightNet)
    ts = torch.jit.script(SharedWeightNet()) if kind == "script" else torch.jit.trace(SharedWeightNet(), (x,))

    cm = capture_model(ts, x)

    assert cm.module.fc_a.weight is cm.module.fc_b.weight
    assert cm.module.fc_a.bias is not cm.module.fc_b.bias


def test_rebuilt_torchscript_model_can_be_captured_again():
    # passes that change shapes (pruning) re-capture cm.module, a GraphModule for TorchScript input
    x = example_input(TinyResNet)
    cm = capture_model(torch.jit.trace(TinyResNet().eval(), (x,)), x)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = capture_model(cm.module, x)

    assert again.source == "nn.Module"
    assert again.module_types() == cm.module_types()
    assert _max_diff(again.module(x), cm.module(x)) == 0.0


def test_missing_torchscript_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        capture_model(tmp_path / "nope.pt", torch.zeros(1))


def test_state_dict_file_is_not_a_torchscript_file(tmp_path):
    path = tmp_path / "weights.pth"
    torch.save(ConvBnReluNet().state_dict(), path)

    with pytest.raises(GraphCaptureError, match="is not a TorchScript file"):
        capture_model(path, example_input(ConvBnReluNet))


class _CondNet(nn.Module):
    """The converter turns this `if` into torch.cond: both branches have the same shape."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        if x.sum() > 0:  # noqa: SIM108 - an if statement, for a prim::If node
            y = torch.relu(y)
        else:
            y = y - 1
        return y


class _LoopNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        for _ in range(int(x.sum().item()) % 3):
            y = y + 1
        return y


def test_scripted_data_dependent_if_names_prim_if_and_its_line(tmp_path):
    x = example_input(DataDependentNet)
    path = _save_torchscript(DataDependentNet(), x, "script", tmp_path / "vad_like.pt")

    with pytest.raises(GraphCaptureError) as info:
        capture_model(path, x)

    message = str(info.value)
    assert "prim::If" in message and "`if x.sum() > 0:`" in message
    assert "vad_like.pt" in message


def test_scripted_if_that_converts_to_cond_is_rejected():
    with pytest.raises(GraphCaptureError, match=r"prim::If .*`if x.sum\(\) > 0:` became torch.cond"):
        capture_model(torch.jit.script(_CondNet()), torch.randn(2, 4))


def test_scripted_data_dependent_loop_names_prim_loop():
    with pytest.raises(GraphCaptureError, match=r"failed on node prim::Loop .*`for _ in range"):
        capture_model(torch.jit.script(_LoopNet()), torch.randn(2, 4))


def test_captured_model_helpers():
    cm: CapturedModel = capture_model(ConvBnReluNet(), example_input(ConvBnReluNet))

    (bn,) = cm.nodes_of("bn")
    assert [n.target for n in cm.producers(bn)] == ["conv1"]
    assert [n.target for n in cm.consumers("bn")] == ["relu"]
    assert cm.position("conv1") < cm.position("bn") < cm.position("fc")
    assert cm.nodes_of("unknown") == []


def test_export_fallback_keeps_the_batch_dimension_dynamic():
    model = ShapeBranchNet().eval()
    with pytest.warns(UserWarning, match="torch.export"):
        cm = capture_model(model, torch.randn(ShapeBranchNet.input_shape))
    x = torch.randn(5, *ShapeBranchNet.input_shape[1:])  # input_data had batch 1
    torch.testing.assert_close(cm.module(x), model(x))
