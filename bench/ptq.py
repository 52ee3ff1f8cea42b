"""ONNX Runtime static post-training quantisation: the "what I would use otherwise" row without training.

``quantize`` runs ``onnxruntime.quantization``'s documented flow on a float ONNX model:
``quant_pre_process`` (shape inference + graph optimisation), then ``quantize_static`` with QDQ format,
per-channel INT8 weights and INT8 activations, MinMax calibration on training images. In the engine
table it quantises the FP32 row's model (same training as everyone else) with the first
``CALIBRATION_IMAGES`` training images; the Torch-Pruning rows reuse it for their "+ ORT PTQ" variant.

Beside it, the rows of our PTQ (``amct_engine.ptq``: IFMR and HFMG activations, ARQ weights, BN folded; the
same calibration images in batches of ``CALIBRATION_BATCH``) and NNCF's ``nncf.quantize`` when NNCF is
installed; every row records its own wall time, and ``main`` prints ours / ORT's in the same run. The
mixed-precision points (``mixed_precision_points``) are ``auto_mixed_precision`` at several top-1 budgets:
estimated weight bytes and Ascend deploy bytes against the deploy model's top-1 (docs/spec/engine.md §4.12).

Run on its own: ``python bench/ptq.py [--quick]`` (PTQ rows, ratios and the mixed-precision points), or in
the engine table ``python bench/engine_table.py --quick --only ptq``.
"""

from __future__ import annotations

import copy
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
CALIBRATION_BATCH = 128
NAME = "ORT static PTQ (QDQ, per-channel)"
OURS = {"ifmr": "amct PTQ (IFMR, INT8)", "hfmg": "amct PTQ (HFMG, INT8)"}
NNCF_NAME = "NNCF PTQ (nncf.quantize)"
BUDGETS = (0.1, 0.25, 0.5, 1.0, 2.0)  # top-1 points, for the mixed-precision curve


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


def _calibration_batches(setup) -> list:
    images = setup.x_train[:CALIBRATION_IMAGES]
    return [images[i:i + CALIBRATION_BATCH] for i in range(0, len(images), CALIBRATION_BATCH)]


def amct_ptq_row(setup, algo: str) -> dict[str, Any]:
    """Our PTQ of the FP32 row's model: create_quant_config -> quantize_model -> batches -> save_model, timed."""
    import torch

    import amct_engine as amct
    from bench.fashion import DYNAMIC_AXES, IO_NAMES

    if setup.fp32_model is None:
        raise RuntimeError("the FP32 row did not run: nothing to quantise")
    folder = setup.folder(OURS[algo])
    batches = _calibration_batches(setup)
    cfg = folder / "ptq.cfg"
    cfg.write_text(f"batch_num: {len(batches)}\ncommon_config {{ {algo}_quantize {{}} }}\n")
    start = time.perf_counter()
    amct.create_quant_config(str(folder / "ptq.json"), setup.fp32_model, setup.example, config_defination=str(cfg))
    model = amct.quantize_model(str(folder / "ptq.json"), str(folder / "fused.onnx"), str(folder / "record.txt"),
                                setup.fp32_model, setup.example, dynamic_axes=DYNAMIC_AXES, **IO_NAMES)
    with torch.no_grad():
        for batch in batches:
            model(batch)
    paths = amct.save_model(str(folder / "fused.onnx"), str(folder / "record.txt"), str(folder / "ptq"))
    calibrate_s = time.perf_counter() - start
    return {"onnx": paths["deploy"], "calibrate_s": calibrate_s, "deploy_kind": "integer ONNX (save_model)",
            "torch_accuracy": ort_accuracy(paths["deploy"], setup.x_test, setup.y_test, setup.threads),
            "calibration_images": CALIBRATION_IMAGES}


def nncf_ptq_row(setup) -> dict[str, Any]:
    """nncf.quantize (PyTorch backend) on the same images, exported to QDQ ONNX; ImportError without NNCF."""
    import nncf
    import torch

    from bench.fashion import DYNAMIC_AXES, IO_NAMES

    batches = _calibration_batches(setup)
    start = time.perf_counter()
    quantized = nncf.quantize(copy.deepcopy(setup.fp32_model).eval(), nncf.Dataset(batches),
                              subset_size=len(batches))
    calibrate_s = time.perf_counter() - start
    path = setup.folder(NNCF_NAME) / "nncf_ptq.onnx"
    torch.onnx.export(quantized, (setup.example,), str(path), dynamo=False, opset_version=17,
                      dynamic_axes=DYNAMIC_AXES, **IO_NAMES)
    return {"onnx": str(path), "calibrate_s": calibrate_s, "deploy_kind": "QDQ ONNX (nncf.quantize)",
            "torch_accuracy": ort_accuracy(path, setup.x_test, setup.y_test, setup.threads),
            "calibration_images": CALIBRATION_IMAGES}


def mixed_precision_points(setup, budgets=BUDGETS) -> list[dict[str, Any]]:
    """auto_mixed_precision at each top-1 budget, searched on 2,000 held-out training images."""
    from amct_engine.mixed_precision import Budget, auto_mixed_precision

    held_out = slice(len(setup.x_train) - 2000, len(setup.x_train))
    points = []
    for budget in budgets:
        start = time.perf_counter()
        result = auto_mixed_precision(setup.fp32_model, setup.example, _calibration_batches(setup),
                                      setup.x_train[held_out], setup.y_train[held_out],
                                      Budget(max_top1_drop=budget), setup.folder(f"mixed {budget}"))
        points.append({"budget": budget, "precisions": result.precisions, "weight_bytes": result.weight_bytes,
                       "int8_weight_bytes": result.int8_weight_bytes, "file_bytes": result.file_bytes,
                       "search_top1_drop": result.deployed.top1_drop, "search_s": time.perf_counter() - start,
                       "test_accuracy": ort_accuracy(result.files["deploy"], setup.x_test, setup.y_test,
                                                     setup.threads)})
    return points


def methods(setup) -> list[tuple[str, str, Callable[[], dict[str, Any]]]]:
    return [(NAME, "peer", lambda: ptq_row(setup)),
            (OURS["ifmr"], "ours", lambda: amct_ptq_row(setup, "ifmr")),
            (OURS["hfmg"], "ours", lambda: amct_ptq_row(setup, "hfmg")),
            (NNCF_NAME, "peer", lambda: nncf_ptq_row(setup))]


def main(argv: list[str] | None = None) -> int:
    import argparse
    import platform
    import tempfile

    import torch

    from bench.fashion import BASELINE, fp32_control, prepare, run_row

    parser = argparse.ArgumentParser(description="PTQ rows (ours, ORT static, NNCF) and mixed-precision points")
    parser.add_argument("--quick", action="store_true", help="a few thousand images, for a smoke run")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    flags = sorted(f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")
                   if f in Path("/proc/cpuinfo").read_text())
    print(f"CPU: {platform.processor() or platform.machine()}; ISA flags: {', '.join(flags) or 'none of interest'}")
    with tempfile.TemporaryDirectory(prefix="amct-ptq-bench-") as tmp:
        setup = prepare(Path(tmp), quick=args.quick, threads=args.threads)
        rows = {name: run_row(name, family, fn) for name, family, fn in
                [(BASELINE, "baseline", lambda: fp32_control(setup)), *methods(setup)]}
        fp32 = rows[BASELINE]["torch_accuracy"]
        ort_s = rows[NAME].get("calibrate_s")
        print("\n| method | test top-1 (ORT) | Δ vs FP32 (pts) | PTQ wall time (s) | time / ORT's |")
        print("|---|---|---|---|---|")
        for name, row in rows.items():
            if row["status"] != "ok":
                print(f"| {name} | {row['status']}: {row.get('reason', '')} | | | |")
                continue
            seconds = row.get("calibrate_s")
            ratio = f"{seconds / ort_s:.2f}×" if seconds and ort_s else ""
            print(f"| {name} | {row['torch_accuracy']:.4f} | {(row['torch_accuracy'] - fp32) * 100:+.2f} | "
                  f"{seconds:.2f} | {ratio} |" if seconds else f"| {name} | {row['torch_accuracy']:.4f} | | | |")
        print("\n| top-1 budget (pts) | choice | weight bytes (est.) | Ascend deploy bytes | test top-1 (ORT) |")
        print("|---|---|---|---|---|")
        for p in mixed_precision_points(setup, BUDGETS[1:4] if args.quick else BUDGETS):
            choice = ", ".join(f"{k}:{v}" for k, v in p["precisions"].items())
            print(f"| {p['budget']} | {choice} | {p['weight_bytes']:.0f} / {p['int8_weight_bytes']:.0f} INT8 | "
                  f"{p['file_bytes']['ascend_deploy']} / {p['file_bytes']['int8_ascend_deploy']} INT8 | "
                  f"{p['test_accuracy']:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
