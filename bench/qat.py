"""Our quantisation rows of the engine table: INT8 QAT, A8W4 QAT and label-free INT8 distillation.

Every row starts from the shared FP32 base of bench/fashion.py and gets the same extra epochs on the
same batches with the same Adam lr as the FP32 row and the peers (torchao PT2E QAT, NNCF QAT from
bench/peers.py, which this module's ``methods`` lists next to ours):

- ``amct INT8 QAT``: create config → create retrain model → train → eval forward (fills the record) →
  ``save_quant_retrain_model``; the deploy model is the ``_deploy_model.onnx`` (integer kernels);
- ``amct A8W4 QAT``: the same with ``retrain_weight_quant_config { ulq_retrain { channel_wise: true
  dst_type: INT4 } }``;
- ``amct distill INT8``: teacher = the FP32 base, student = its INT8 copy, block-wise distillation for
  the same epochs on the same images (labels never used); its "train step" is the distillation time per
  batch of images (every group's step on that batch, the teacher's forward included).

Run on its own: ``python bench/engine_table.py [--quick] --only qat`` (prints the table of these rows,
the FP32 row and the QAT peers).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

if __package__ in (None, ""):  # run as a script: make `bench` and `amct_engine` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import amct_engine as amct  # noqa: E402
from bench import peers  # noqa: E402
from bench.common import summarize  # noqa: E402
from bench.fashion import DYNAMIC_AXES, IO_NAMES, timed_training  # noqa: E402
from job_process.training import evaluate_accuracy  # noqa: E402

A8W4_CFG = "retrain_weight_quant_config { ulq_retrain { channel_wise: true dst_type: INT4 } }"
Row = dict[str, Any]


def amct_qat(setup, name: str, cfg_text: str | None = None) -> Row:
    """Our QAT flow, timed: prepare = config + retrain model, convert = the save (two ONNX exports)."""
    workdir = setup.folder(name)
    config, record = workdir / "retrain.json", workdir / "record.txt"
    cfg = None
    if cfg_text:
        cfg = workdir / "qat.cfg"
        cfg.write_text(cfg_text + "\n")
    torch.manual_seed(setup.seed + 1)
    start = time.perf_counter()
    model = setup.base_copy().eval()
    amct.create_quant_retrain_config(str(config), model, setup.example, str(cfg) if cfg else None)
    qmodel = amct.create_quant_retrain_model(str(config), model, str(record), setup.example)
    prepare_s = time.perf_counter() - start
    training = timed_training(qmodel, setup.loader(), setup.epochs, setup.lr)
    accuracy = evaluate_accuracy(qmodel, setup.x_test, setup.y_test)  # the first eval forward writes the record
    start = time.perf_counter()
    paths = amct.save_quant_retrain_model(
        str(config), qmodel, str(record), str(workdir / "model"), setup.example, dynamic_axes=DYNAMIC_AXES, **IO_NAMES
    )
    return {
        "torch_accuracy": accuracy,
        "prepare_s": prepare_s,
        "convert_s": time.perf_counter() - start,
        "onnx": paths["deploy"],
        "deploy_kind": "amct deploy ONNX",
        **training,
    }


def amct_distill(setup) -> Row:
    """Label-free INT8 distillation from the FP32 base, on the same images for the same epochs."""
    workdir = setup.folder("distill")
    config = workdir / "distill.json"
    torch.manual_seed(setup.seed + 1)
    teacher = setup.base_copy().eval()
    start = time.perf_counter()
    amct.create_distill_config(str(config), teacher, setup.example)
    student = amct.create_distill_model(str(config), teacher, setup.example)
    prepare_s = time.perf_counter() - start
    # The same images in the same order as every other row; distillation never reads the labels.
    images = DataLoader(
        setup.x_train[: setup.train_limit],
        batch_size=setup.batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(setup.seed + 1),
    )
    losses: list[float] = []
    start = time.perf_counter()
    # its default optimiser (docs/spec/engine.md §6.2)
    amct.distill(
        teacher, student, str(config), images, epochs=setup.epochs, progress=lambda e: losses.append(float(e["loss"]))
    )
    train_s = time.perf_counter() - start
    accuracy = evaluate_accuracy(student, setup.x_test, setup.y_test)
    start = time.perf_counter()
    paths = amct.save_distill_model(
        student, str(workdir / "student"), setup.example, dynamic_axes=DYNAMIC_AXES, **IO_NAMES
    )
    batches = setup.epochs * len(images)
    # One number per batch of images (all groups' steps on it): comparable with one training step.
    per_batch = train_s / batches
    return {
        "torch_accuracy": accuracy,
        "prepare_s": prepare_s,
        "convert_s": time.perf_counter() - start,
        "onnx": paths["deploy"],
        "deploy_kind": "amct deploy ONNX",
        "step_s": summarize([per_batch]),
        "step_is_mean": True,
        "train_s": train_s,
        "distill_losses": losses,
        "note": "step = distillation time per batch of images (all groups)",
    }


def methods(setup) -> list[tuple[str, str, Callable[[], Row]]]:
    return [
        ("amct INT8 QAT", "ours", lambda: amct_qat(setup, "amct INT8 QAT")),
        ("amct A8W4 QAT", "ours", lambda: amct_qat(setup, "amct A8W4 QAT", A8W4_CFG)),
        ("amct distill INT8", "ours", lambda: amct_distill(setup)),
        *peers.qat_methods(setup),
    ]
