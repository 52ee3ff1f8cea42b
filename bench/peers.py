"""Peer QAT baselines for the benchmark: torchao PT2E QAT (x86 inductor quantiser) and NNCF QAT.

Each peer starts from a copy of the same trained FP32 model, fine-tunes with fake quantisation for
the same extra epochs on the same loader, and reports test accuracy and the median training-step
wall time. ``fp32_finetune`` is the like-for-like control (same extra epochs, no quantisation).
Every peer function returns ``{accuracy, step_time_s, step_time_min_s, prepare_s, convert_s}`` (seconds;
step_time_s is the median step, the min is less sensitive to a busy machine; prepare = copy + capture +
quantiser insertion/calibration, convert = conversion/stripping after training).

Run on its own: ``python bench/peers.py`` (needs the ``bench`` extra: torchao, nncf).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

if __package__ in (None, ""):  # run as a script: make `bench` and `amct_engine` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from amct_engine.data.fashion_mnist import load_fashion_mnist  # noqa: E402
from amct_engine.data.training import (  # noqa: E402
    SmallFashionCnn,
    evaluate_accuracy,
    make_loader,
    train_epochs,
)
from bench.common import StepTimer, format_table, package_versions, summarize  # noqa: E402

Loader = Any  # an iterable of (x, y) batches with len(); make_loader's DataLoader


def _example_batch(loader: Loader) -> torch.Tensor:
    return next(iter(loader))[0]


def _timed_training(
    model: nn.Module, loader: Loader, epochs: int, lr: float, set_mode: bool = True
) -> dict[str, float]:
    """Train with Adam and return ``{step_time_s, step_time_min_s}`` (median / min step wall time)."""
    timer = StepTimer()
    timer.start()
    train_epochs(model, loader, epochs, lr, optimizer="adam", progress=timer, set_mode=set_mode)
    stats = summarize(timer.durations)
    return {"step_time_s": stats["median"], "step_time_min_s": stats["min"]}


def fp32_finetune(
    model_fp32: nn.Module,
    train_loader: Loader,
    x_test: torch.Tensor,
    y_test: torch.Tensor,
    epochs: int,
    lr: float,
    seed: int,
) -> dict[str, float]:
    """Control: the same extra epochs of plain FP32 training on a copy of ``model_fp32``."""
    torch.manual_seed(seed)
    model = copy.deepcopy(model_fp32)
    steps = _timed_training(model, train_loader, epochs, lr)
    accuracy = evaluate_accuracy(model, x_test, y_test)
    return {"accuracy": accuracy, **steps, "prepare_s": 0.0, "convert_s": 0.0}


def torchao_qat(
    model_fp32: nn.Module,
    train_loader: Loader,
    x_test: torch.Tensor,
    y_test: torch.Tensor,
    epochs: int,
    lr: float,
    seed: int,
) -> dict[str, float]:
    """torchao PT2E QAT: export → prepare_qat_pt2e(X86InductorQuantizer, is_qat) → train → convert_pt2e.

    Accuracy is that of the converted model (reference quantize/dequantize ops run in eager mode:
    int8 numerics, no inductor lowering). Conv+BN are folded for QAT by torchao itself.
    """
    from torchao.quantization.pt2e import move_exported_model_to_eval, move_exported_model_to_train
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_qat_pt2e
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    torch.manual_seed(seed)
    start = time.perf_counter()
    model = copy.deepcopy(model_fp32).train()
    # The batch dim is dynamic: the last training batch and the evaluation chunks differ in size.
    batch = torch.export.Dim("batch")
    exported = torch.export.export(model, (_example_batch(train_loader),), dynamic_shapes=({0: batch},))
    quantizer = X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config(is_qat=True))
    prepared = prepare_qat_pt2e(exported.module(), quantizer)
    # PT2E graph modules refuse .train()/.eval(); torchao flips the BN/dropout nodes instead.
    move_exported_model_to_train(prepared)
    prepare_s = time.perf_counter() - start
    steps = _timed_training(prepared, train_loader, epochs, lr, set_mode=False)
    start = time.perf_counter()
    converted = convert_pt2e(prepared)
    move_exported_model_to_eval(converted)
    convert_s = time.perf_counter() - start
    accuracy = evaluate_accuracy(converted, x_test, y_test, set_mode=False)
    return {"accuracy": accuracy, **steps, "prepare_s": prepare_s, "convert_s": convert_s}


def nncf_qat(
    model_fp32: nn.Module,
    train_loader: Loader,
    x_test: torch.Tensor,
    y_test: torch.Tensor,
    epochs: int,
    lr: float,
    seed: int,
) -> dict[str, float]:
    """NNCF QAT (PyTorch backend): ``nncf.quantize`` (calibration on the train loader) → fine-tune.

    NNCF's documented QAT flow: the quantised model is a regular ``nn.Module`` with trainable
    ``SymmetricQuantizer`` hooks, trained with the usual loop. Accuracy is measured after
    ``nncf.strip`` (same numerics, fake-quant as torch ops).
    """
    import nncf

    torch.manual_seed(seed)
    start = time.perf_counter()
    model = copy.deepcopy(model_fp32).eval()
    calibration = nncf.Dataset(train_loader, lambda batch: batch[0])
    # subset_size counts dataset items, i.e. batches here: 300 samples' worth is NNCF's default.
    subset = max(1, min(len(train_loader), 300 // max(1, len(_example_batch(train_loader))) + 1))
    quantized = nncf.quantize(model, calibration, subset_size=subset)
    prepare_s = time.perf_counter() - start
    steps = _timed_training(quantized, train_loader, epochs, lr)
    start = time.perf_counter()
    quantized.eval()
    stripped = nncf.strip(quantized, do_copy=True, example_input=x_test[:1])
    convert_s = time.perf_counter() - start
    accuracy = evaluate_accuracy(stripped, x_test, y_test)
    return {"accuracy": accuracy, **steps, "prepare_s": prepare_s, "convert_s": convert_s}


PEERS = {"fp32 finetune": fp32_finetune, "torchao PT2E QAT": torchao_qat, "nncf QAT": nncf_qat}


def run_peers(
    train_limit: int = 20000,
    epochs: int = 1,
    lr: float = 1e-4,
    batch_size: int = 128,
    seed: int = 0,
    base_epochs: int = 1,
    base_lr: float = 2e-3,
) -> dict[str, Any]:
    """Train SmallFashionCnn FP32 on all 60k images, then run every peer on the first ``train_limit``."""
    x_train, y_train = load_fashion_mnist("train")
    x_test, y_test = load_fashion_mnist("test")
    torch.manual_seed(seed)
    base = SmallFashionCnn()
    start = time.perf_counter()
    train_epochs(base, make_loader(x_train, y_train, batch_size, shuffle=True, seed=seed), base_epochs, base_lr)
    base_time = time.perf_counter() - start
    base_acc = evaluate_accuracy(base, x_test, y_test)
    results: dict[str, Any] = {
        "base": {"accuracy": base_acc, "train_s": base_time, "epochs": base_epochs, "lr": base_lr},
        "setup": {
            "train_limit": train_limit,
            "epochs": epochs,
            "lr": lr,
            "batch_size": batch_size,
            "seed": seed,
        },
        "peers": {},
    }
    for name, fn in PEERS.items():
        # A fresh loader with the same seed per peer: every method sees the same batches in the same order.
        loader = make_loader(x_train[:train_limit], y_train[:train_limit], batch_size, shuffle=True, seed=seed + 1)
        start = time.perf_counter()
        results["peers"][name] = fn(base, loader, x_test, y_test, epochs, lr, seed)
        results["peers"][name]["total_s"] = time.perf_counter() - start
    return results


def format_results(results: dict[str, Any]) -> str:
    control = results["peers"]["fp32 finetune"]
    rows = [{"method": "fp32 base (no finetune)", "accuracy": results["base"]["accuracy"]}]
    for name, res in results["peers"].items():
        rows.append(
            {
                "method": name,
                "accuracy": res["accuracy"],
                "delta_vs_fp32": res["accuracy"] - control["accuracy"],
                "step_ms": res["step_time_s"] * 1e3,
                "step_ratio": res["step_time_s"] / control["step_time_s"],
                "min_step_ratio": res["step_time_min_s"] / control["step_time_min_s"],
                "prepare_s": res["prepare_s"],
                "convert_s": res["convert_s"],
                "total_s": res["total_s"],
            }
        )
    return format_table(
        rows,
        [
            "method",
            "accuracy",
            "delta_vs_fp32",
            "step_ms",
            "step_ratio",
            "min_step_ratio",
            "prepare_s",
            "convert_s",
            "total_s",
        ],
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-limit", type=int, default=20000, help="training images for the peer epochs")
    parser.add_argument("--epochs", type=int, default=1, help="extra (QAT / control) epochs")
    parser.add_argument("--lr", type=float, default=1e-4, help="Adam lr of the extra epochs")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = run_peers(args.train_limit, args.epochs, args.lr, args.batch_size, args.seed)
    results["setup"]["threads"] = args.threads
    results["setup"]["versions"] = package_versions("torch", "torchao", "nncf")
    print(format_results(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))



if __name__ == "__main__":
    main()
