"""ONNX Runtime static post-training quantisation: the "what I would use otherwise" row without training.

``quantize`` runs ``onnxruntime.quantization``'s documented flow on a float ONNX model:
``quant_pre_process`` (shape inference + graph optimisation), then ``quantize_static`` with QDQ format,
per-channel INT8 weights and INT8 activations, MinMax calibration on training images. In the engine
table it quantises the FP32 row's model (same training as everyone else) with the first
``CALIBRATION_IMAGES`` training images; the Torch-Pruning rows reuse it for their "+ ORT PTQ" variant.

Run on its own: ``python bench/engine_table.py --quick --only ptq`` (FP32 base, FP32 row and the PTQ row only).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx

if __package__ in (None, ""):  # run as a script: make `bench` and `amct_engine` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ort_accuracy  # noqa: E402
from bench.fashion import export_fp32  # noqa: E402

CALIBRATION_IMAGES = 512
NAME = "ORT static PTQ (QDQ, per-channel)"


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


def quantize(fp32_onnx: str | Path, calibration: np.ndarray, out: str | Path) -> dict[str, Any]:
    """Pre-process + static QDQ quantisation of ``fp32_onnx`` into ``out``; returns ``{onnx, calibrate_s}``."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    out = Path(out)
    start = time.perf_counter()
    prepared = out.with_name(out.stem + "_pre.onnx")
    quant_pre_process(str(fp32_onnx), str(prepared))
    input_name = onnx.load(str(prepared), load_external_data=False).graph.input[0].name
    quantize_static(
        str(prepared), str(out), ArrayReader(input_name, np.ascontiguousarray(calibration, dtype=np.float32)),
        quant_format=QuantFormat.QDQ, per_channel=True, activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax,
    )
    return {"onnx": str(out), "calibrate_s": time.perf_counter() - start}


def ptq_row(setup) -> dict[str, Any]:
    """The PTQ row: quantise the FP32 row's ONNX (trained like every other method) with training images."""
    if setup.fp32_model is None:
        raise RuntimeError("the FP32 row did not run: nothing to quantise")
    folder = setup.folder(NAME)
    fp32 = export_fp32(setup.fp32_model, folder / "fp32.onnx", setup.example)
    result = quantize(fp32, setup.x_train[:CALIBRATION_IMAGES].numpy(), folder / "ptq.onnx")
    return {**result, "torch_accuracy": ort_accuracy(result["onnx"], setup.x_test, setup.y_test, setup.threads),
            "deploy_kind": "QDQ ONNX (quantize_static)", "calibration_images": CALIBRATION_IMAGES}


def methods(setup) -> list[tuple[str, str, Callable[[], dict[str, Any]]]]:
    return [(NAME, "peer", lambda: ptq_row(setup))]
