"""One trace for every file (export/layer_graph.py, docs/spec/engine.md §5.1): PTQ's float, fake-quant and
deploy models come from the one torch.onnx.export of quantize_model, and each computes what it should at a
batch size the trace never saw."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn

import amct_engine as amct
from amct_engine.export.layer_graph import PLACEHOLDER_DOMAIN, LayerPlaceholder, export_layer_graph
from amct_engine.quant.deployed import fold_batch_norm

DYNAMIC = {"x": {0: "n"}, "y": {0: "n"}}


class ConvBnViewNet(nn.Module):
    """conv -> BN -> ReLU -> `view(size(0), -1)` -> Linear: the view reads the batch size of a layer's output."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 6 * 6, 5)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        return self.fc(y.view(y.size(0), -1))


def _model() -> ConvBnViewNet:
    torch.manual_seed(0)
    model = ConvBnViewNet()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    return model.eval()


def _run(path, x: torch.Tensor) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]


def test_ptq_traces_the_model_once_for_its_three_files_and_each_runs_at_another_batch(tmp_path, monkeypatch):
    model, example = _model(), torch.randn(2, 3, 6, 6)
    exports = []
    real_export = torch.onnx.export
    monkeypatch.setattr(torch.onnx, "export", lambda *a, **k: exports.append(1) or real_export(*a, **k))
    config, fused, record = tmp_path / "ptq.json", tmp_path / "fused.onnx", tmp_path / "record.txt"
    amct.create_quant_config(str(config), model, example)
    calibration = amct.quantize_model(
        str(config),
        str(fused),
        str(record),
        model,
        example,
        input_names=["x"],
        output_names=["y"],
        dynamic_axes=DYNAMIC,
    )
    torch.manual_seed(1)
    with torch.no_grad():
        calibration(torch.randn(16, 3, 6, 6))
    paths = amct.save_model(str(fused), str(record), str(tmp_path / "ptq"))
    assert len(exports) == 1

    x = torch.randn(5, 3, 6, 6)
    folded = _model()
    folded.conv, folded.bn = fold_batch_norm(folded.conv, folded.bn), nn.Identity()
    with torch.no_grad():
        expected_float, expected_quant = folded(x).numpy(), calibration(x).numpy()
    np.testing.assert_allclose(_run(fused, x), expected_float, rtol=1e-5, atol=1e-5)
    # The fake-quant model computes the calibration model bit for bit (docs/spec/engine.md §5).
    np.testing.assert_array_equal(_run(paths["fake_quant"], x), expected_quant)
    assert np.abs(_run(paths["deploy"], x) - expected_quant).max() <= 0.05 * np.abs(expected_quant).max()


@pytest.mark.parametrize("dynamic", [True, False], ids=["dynamic batch", "static"])
def test_a_placeholder_is_typed_as_onnx_types_a_conv_and_the_trace_is_silent(capfd, dynamic):
    model = _model()
    model.conv = LayerPlaceholder("conv", model.conv)
    graph = export_layer_graph(model, (torch.randn(2, 3, 6, 6),), ["x"], ["y"], DYNAMIC if dynamic else None)
    placeholder = next(n for n in graph.graph.node if n.domain == PLACEHOLDER_DOMAIN)
    info = next(v for v in graph.graph.value_info if v.name == placeholder.output[0])
    dims = [d.dim_param or d.dim_value for d in info.type.tensor_type.shape.dim]
    assert dims[1:] == [8, 6, 6]
    # A symbolic batch keeps `y.size(0)` a Shape op; a static one is folded as for a Conv.
    assert isinstance(dims[0], str) if dynamic else dims[0] == 2
    assert ("Shape" in {n.op_type for n in graph.graph.node}) == dynamic
    assert "shape inference" not in capfd.readouterr().err


def test_a_float_model_traces_without_the_placeholder_domain_or_a_warning(capfd):
    """A model with no quantised layer (an FP32 export) declares no `amct.layer` domain, so torch does not warn
    on stderr that the domain is unused."""
    graph = export_layer_graph(_model(), (torch.randn(2, 3, 6, 6),), ["x"], ["y"], DYNAMIC)
    assert PLACEHOLDER_DOMAIN not in {o.domain for o in graph.opset_import}
    assert PLACEHOLDER_DOMAIN not in capfd.readouterr().err
