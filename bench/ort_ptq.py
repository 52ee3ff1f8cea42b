"""onnxruntime's own static post-training quantisation, the peer every deploy-speed and PTQ row is set against:
`quant_pre_process`, then `quantize_static` with per-channel int8 weights and min-max calibration on an array
of inputs (bench/ptq.py, bench/deploy_speed.py, bench/peers.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx

CALIBRATION_BATCH = 128


class ArrayReader:
    """The ``CalibrationDataReader`` protocol over an array: one batch of ``batch`` images per call."""

    def __init__(self, name: str, x: np.ndarray, batch: int = 64) -> None:
        self.name, self.x, self.batch, self.offset = name, x, batch, 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self.offset >= len(self.x):
            return None
        chunk = self.x[self.offset : self.offset + self.batch]
        self.offset += self.batch
        return {self.name: chunk}

    def rewind(self) -> None:
        self.offset = 0


def quantize(
    fp32_onnx: str | Path,
    calibration: np.ndarray,
    out: str | Path,
    batch: int = CALIBRATION_BATCH,
    quant_format: str = "QDQ",
    activation: str = "S8",
) -> dict[str, Any]:
    """Pre-process + static quantisation of ``fp32_onnx`` into ``out``: per-channel int8 weights, activations
    int8 (``"S8"``, S8S8) or uint8 (``"U8"``, U8S8), QDQ or QOperator; returns ``{onnx, calibrate_s}``."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    out = Path(out)
    start = time.perf_counter()
    prepared = out.with_name(out.stem + "_pre.onnx")
    if not prepared.exists():
        try:
            quant_pre_process(str(fp32_onnx), str(prepared))
        except Exception:  # e.g. a detector's "Incomplete symbolic shape inference"
            # ORT's own way out: its pre-processing without the symbolic pass (onnx's shape inference and the
            # graph optimisation still run), so the peer is measured rather than left out.
            quant_pre_process(str(fp32_onnx), str(prepared), skip_symbolic_shape=True)
    input_name = onnx.load(str(prepared), load_external_data=False).graph.input[0].name
    quantize_static(
        str(prepared),
        str(out),
        ArrayReader(input_name, np.ascontiguousarray(calibration, dtype=np.float32), batch),
        quant_format=QuantFormat.QDQ if quant_format == "QDQ" else QuantFormat.QOperator,
        per_channel=True,
        activation_type=QuantType.QUInt8 if activation == "U8" else QuantType.QInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=CalibrationMethod.MinMax,
    )
    return {"onnx": str(out), "calibrate_s": time.perf_counter() - start}
