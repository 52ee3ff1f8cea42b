"""Export fidelity found on MiniLM (issue 5), on models small enough for the fast suite.

- A model captured through torch.export reads its input shapes with `aten.sym_size` calls; the
  ONNX model must still take other batch sizes and sequence lengths than the example.
- Integer kernels: a per-channel Linear has full-range weight codes, and onnxruntime's u8s8 kernels
  saturate on x86 without VNNI; the deploy and fake-quant models must equal the PyTorch model.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn

import amct_engine as amct
from amct_engine.export.save import export_onnx
from amct_engine.graph.capture import capture_model
from tests.deploy_targets import record_exact_target


class TokenMixer(nn.Module):
    """[batch, tokens, 8] -> [batch, 8 * tokens]: position offsets, a head split and a shape branch."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens = x.shape[0], x.shape[1]
        y = self.fc(x + torch.arange(tokens, dtype=x.dtype)[None, :, None])
        y = y.view(batch, tokens, 2, 4).transpose(1, 2).reshape(batch, -1)
        if x.shape[-1] > 4:  # fx cannot trace this: the capture goes through torch.export
            y = y * 2
        return y


def _run(path: str, x: torch.Tensor) -> np.ndarray:
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]


def test_a_torch_export_capture_exports_with_dynamic_batch_and_length(tmp_path):
    model = TokenMixer().eval()
    with pytest.warns(UserWarning, match="torch.export"):
        captured = capture_model(model, torch.randn(2, 6, 8))
    assert any(n.target is torch.ops.aten.sym_size.int for n in captured.graph.nodes)
    path = str(tmp_path / "mixer.onnx")
    export_onnx(
        captured.module,
        path,
        (torch.randn(2, 6, 8),),
        ["x"],
        ["y"],
        {"x": {0: "batch", 1: "tokens"}, "y": {0: "batch", 1: "features"}},
    )
    for shape in ((2, 6, 8), (5, 3, 8), (1, 11, 8)):
        x = torch.randn(shape)
        np.testing.assert_allclose(_run(path, x), model(x).detach().numpy(), rtol=1e-5, atol=1e-5)


class WideLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(512, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


PER_CHANNEL = (
    'distill_override_layer_types: { layer_type: "Linear" '
    "distill_weight_quant_config: { arq_distill: { channel_wise: true } } }\n"
)


def test_per_channel_linear_deploys_exactly_on_integer_kernels(tmp_path):
    torch.manual_seed(0)
    teacher = WideLinear().eval()
    x = torch.rand(64, 512) * 4  # one-sided: most input codes sit near 255
    cfg = tmp_path / "linear.cfg"
    cfg.write_text(PER_CHANNEL)
    config = tmp_path / "distill.json"
    amct.create_distill_config(str(config), teacher, x[:2], str(cfg))
    student = amct.create_distill_model(str(config), teacher, x[:2])
    assert student.fc.weight_quant.channel_wise and student.fc.weight_quant.wts_scales.numel() == 32
    with torch.no_grad():
        student.eval()(x)  # calibration
        expected = student(x).numpy()
    paths = amct.save_distill_model(  # the record's 8-bit codes on this CPU's exact kernels
        student,
        str(tmp_path / "wide"),
        x[:2],
        input_names=["x"],
        dynamic_axes={"x": {0: "n"}},
        deploy_target=record_exact_target(),
    )
    for kind in ("fake_quant", "deploy"):
        # Integer sums are exact; only the final float rescale may differ in its last bit.
        np.testing.assert_allclose(_run(paths[kind], x), expected, rtol=1e-6, atol=1e-6 * np.abs(expected).max())
