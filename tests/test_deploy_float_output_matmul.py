"""Linear layers whose output stays float run as one MatMulIntegerToFloat with their bias
(amct_engine/export/float_output_matmul.py): no bias DequantizeLinear or Add left for ORT to run each
time, the outputs those of the QDQ graph within float32 rounding, and A8W4 weights still packed."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

import amct_engine as amct
import amct_engine.export.qdq.finalize as finalize
from amct_engine.export.qdq.fusion_report import deploy_report, optimized_ops


class FeedForward(nn.Module):
    """A transformer block's FFN on [N, tokens, 16]: Linear -> GELU -> Linear, residual, LayerNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))))


def _save(tmp_path, name: str, cfg: str = "") -> tuple[np.ndarray, dict, torch.Tensor]:
    torch.manual_seed(0)
    model = FeedForward().eval()
    x = torch.randn(4, 6, 16, generator=torch.Generator().manual_seed(1))
    config, record, cfg_path = tmp_path / f"{name}.json", tmp_path / f"{name}.txt", tmp_path / f"{name}.cfg"
    cfg_path.write_text(cfg)
    amct.create_quant_retrain_config(str(config), model, x, str(cfg_path) if cfg else None)
    qmodel = amct.create_quant_retrain_model(str(config), model, str(record), x).eval()
    with torch.no_grad():
        qmodel(x)  # calibration: the record
        expected = qmodel(x).numpy()
    paths = amct.save_quant_retrain_model(
        str(config),
        qmodel,
        str(record),
        str(tmp_path / name),
        x,
        input_names=["x"],
        dynamic_axes={"x": {0: "n", 1: "tokens"}},
    )
    return expected, paths, x


def _run(path: str, x: torch.Tensor) -> np.ndarray:
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})[0]


def test_a_float_output_linear_is_one_matmul_integer_to_float_with_its_bias(tmp_path, monkeypatch):
    expected, paths, x = _save(tmp_path, "ffn")
    model = onnx.load(paths["deploy"])
    onnx.checker.check_model(model, full_check=True)
    fused = {n.name: list(n.input) for n in model.graph.node if n.op_type == "MatMulIntegerToFloat"}
    assert set(fused) == {"up/MatMulIntegerToFloat", "down/MatMulIntegerToFloat"}
    assert all(inputs[6].endswith(".bias_float") for inputs in fused.values())  # the bias goes in
    report = deploy_report(model)
    assert report["matmul_integer_to_float"] == ["up", "down"]
    assert report["layers"] == {"up": "MatMulIntegerToFloat", "down": "MatMulIntegerToFloat"}
    assert report["not_fused"] == {}
    ops = [n.op_type for n in optimized_ops(model).graph.node]
    assert ops.count("MatMulIntegerToFloat") == 2 and not {"MatMulInteger", "DequantizeLinear", "MatMul"} & set(ops)

    monkeypatch.setattr(finalize, "matmuls_to_integer_to_float", lambda model: [])
    _, reference, _ = _save(tmp_path, "qdq")
    deploy = _run(paths["deploy"], x)
    np.testing.assert_allclose(deploy, _run(reference["deploy"], x), rtol=0, atol=1e-5)  # float32 rounding
    np.testing.assert_allclose(deploy, expected, rtol=0, atol=0.05 * np.abs(expected).max())
    for shape in ((1, 3, 16), (7, 11, 16)):  # dynamic batch and tokens still run
        assert _run(paths["deploy"], torch.randn(shape)).shape == shape


@pytest.mark.parametrize("bits", [4])
def test_a8w4_float_output_linears_keep_int4_weights(tmp_path, bits):
    cfg = f"retrain_weight_quant_config {{ arq_retrain {{ dst_type: INT{bits} }} }}"
    expected, paths, x = _save(tmp_path, "a8w4", cfg)
    model = onnx.load(paths["deploy"])
    assert deploy_report(model)["int4_weights"] == ["up.weight", "down.weight"]
    ops = [n.op_type for n in optimized_ops(model).graph.node]
    assert ops.count("MatMulIntegerToFloat") == 2 and "Cast" not in ops  # ORT folds the INT4 -> INT8 Cast
    np.testing.assert_allclose(_run(paths["deploy"], x), expected, rtol=0, atol=0.05 * np.abs(expected).max())
