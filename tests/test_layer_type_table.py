"""The layer-type table (amct_engine/layer_table.py): a throw-away type, registered with one entry and its
behaviour, is captured as a leaf, quantised by QAT and PTQ, and written into every ONNX file, whose outputs
match the PyTorch model (docs/architecture.md, "Add a layer type")."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn

import amct_engine as amct
from amct_engine.graph.capture import capture_model
from amct_engine.layer_table import LAYER_TYPES, LayerTypeEntry, register_layer_type, retrain_type_names
from amct_engine.layers import LayerBehaviour, behaviour_of
from amct_engine.quant.retrain_layer import QuantRetrainLayer


class PointwiseMix(nn.Module):
    """A 1×1 convolution written as a channel-mixing matrix: weight [out, in]."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(cout, cin) * 0.3)
        self.bias = nn.Parameter(torch.randn(cout) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return POINTWISE.call(self, x, self.weight, self.bias)


class PointwiseMixBehaviour(LayerBehaviour):
    def out_channels(self, module):
        return module.weight.shape[0]

    def call(self, module, x, weight, bias):
        y = torch.einsum("oc,nchw->nohw", weight, x)
        return y if bias is None else y + bias[:, None, None]

    def output_rank(self, module):
        return 4

    def write(self, g, x, module, weight, bias, *, input_rank=None, stored="torch", **attrs):
        kernel = g.op("Unsqueeze", weight, g.op("Constant", value_t=torch.tensor([2, 3])))
        return g.op("Conv", x, kernel, *([bias] if bias is not None else []), kernel_shape_i=[1, 1], **attrs)


POINTWISE = PointwiseMixBehaviour()


class MixNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.relu = nn.ReLU()
        self.mix = PointwiseMix(8, 6)
        self.fc = nn.Linear(6 * 8 * 8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.mix(self.relu(self.conv(x))), 1))


@pytest.fixture
def pointwise_type():
    register_layer_type(
        LayerTypeEntry("PointwiseMix", f"{__name__}:PointwiseMix", f"{__name__}:POINTWISE", distill=True)
    )
    yield
    LAYER_TYPES.unregister("PointwiseMix")


def _assert_files_match(paths: dict, model: nn.Module, x: torch.Tensor, limit: float) -> None:
    with torch.no_grad():
        want = model(x).numpy()
    for kind, path in paths.items():
        got = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"input": x.numpy()})[0]
        error = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        assert error <= limit, (kind, error)


def test_a_registered_layer_type_is_quantised_and_exported_by_qat_and_ptq(tmp_path, pointwise_type):
    torch.manual_seed(0)
    model = MixNet().eval()
    x = torch.rand(16, 3, 8, 8)
    assert "PointwiseMix" in retrain_type_names() and behaviour_of(model.mix) is POINTWISE
    axes = {"input": {0: "batch"}, "output": {0: "batch"}}

    config, record = str(tmp_path / "qat.json"), str(tmp_path / "qat.txt")
    amct.create_quant_retrain_config(config, model, x)
    qat = amct.create_quant_retrain_model(config, model, record, x)
    assert isinstance(qat.get_submodule("mix"), QuantRetrainLayer)
    qat.train()
    qat(x).sum().backward()  # trains through its fake-quantised weight
    assert qat.get_submodule("mix").layer.weight.grad is not None
    qat.eval()
    with torch.no_grad():
        qat(x)
    paths = amct.save_quant_retrain_model(config, qat, record, str(tmp_path / "qat"), x, ["input"], ["output"], axes)
    _assert_files_match(paths, model, x, limit=0.05)

    config, fused, record = str(tmp_path / "ptq.json"), str(tmp_path / "fused.onnx"), str(tmp_path / "ptq.txt")
    amct.create_quant_config(config, model, x)
    calibration = amct.quantize_model(config, fused, record, model, x, ["input"], ["output"], axes)
    assert isinstance(calibration.get_submodule("mix"), QuantRetrainLayer)
    with torch.no_grad():
        calibration(x)
    paths = amct.save_model(fused, record, str(tmp_path / "ptq"))
    _assert_files_match({**paths, "fused": fused}, model, x, limit=0.05)


def test_without_its_entry_the_layer_is_traced_through_and_left_float():
    model = MixNet().eval()
    x = torch.rand(2, 3, 8, 8)
    cm_layers = list(capture_model(model, x).module_types())
    assert "mix" not in cm_layers  # fx inlined its einsum: nothing to quantise
