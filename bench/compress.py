"""Compressed retraining on Fashion-MNIST: BCP filter pruning / 4:2 sparsity + INT8 QAT vs Torch-Pruning.

Every method starts from the same FP32 SmallFashionCnn (1 epoch on all 60k images), then gets the same
extra epochs on the same batches in the same order:

- ``fp32 control``: plain FP32 fine-tuning (the like-for-like baseline);
- ``amct BCP 30%/50% + INT8``: ``create_compressed_retrain_model`` (balanced L2-norm filter pruning,
  ascend_optimized off: 16/32-channel convs would not shrink otherwise) then QAT; deploy = INT8 ONNX;
- ``amct M4N2 + INT8``: 4-of-2 selective sparsity then QAT;
- ``torch-pruning 30%/50%``: Torch-Pruning's MetaPruner with group L2 magnitude importance at the same
  channel ratio (fc excluded, as our pruner excludes the model output), FP32 fine-tuning, FP32 ONNX.

Columns: test accuracy (of the PyTorch model), its delta to the control, parameters and non-zero
weights vs FP32, deploy-ONNX bytes vs the FP32 ONNX, and ONNX Runtime latency at batch 64 vs FP32.

Run: ``python bench/compress.py`` (needs the ``bench`` extra for torch-pruning and the
dataset-fashion-mnist package).
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

import torch
from torch import nn

if __package__ in (None, ""):  # run as a script: make `bench` and `amct_engine` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from amct_engine.data.fashion_mnist import load_fashion_mnist  # noqa: E402
from amct_engine.data.training import SmallFashionCnn, evaluate_accuracy, make_loader, train_epochs  # noqa: E402
from amct_engine.export.save import export_onnx  # noqa: E402
from amct_engine.prune.selective import bake_selective_masks  # noqa: E402
from amct_engine.prune_retrain import create_compressed_retrain_model, save_compressed_retrain_model  # noqa: E402
from bench.common import file_size, format_table, ort_latency, package_versions  # noqa: E402

QUANT_CFG = """
retrain_data_quant_config { ulq_quantize { } }
retrain_weight_quant_config { arq_retrain { channel_wise: true dst_type: INT8 } }
"""
FILTER_CFG = ("prune_config { filter_pruner { balanced_l2_norm_filter_prune "
              "{ prune_ratio: %s ascend_optimized: false } } }")
M4N2_CFG = "prune_config { n_out_of_m_pruner { l1_selective_prune { n_out_of_m_type: M4N2 update_freq: 0 } } }"
ONNX_AXES = {"x": {0: "n"}, "logits": {0: "n"}}


def _weights(model: nn.Module) -> tuple[int, int]:
    """(parameters, non-zero weights of conv/linear layers after baking masks)."""
    params = sum(p.numel() for p in model.parameters())
    nonzero = sum(int((m.weight != 0).sum()) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear)))
    return params, nonzero


def _export_fp32(model: nn.Module, path: Path, example: torch.Tensor) -> str:
    export_onnx(model.eval(), str(path), (example,), ["x"], ["logits"], ONNX_AXES)
    return str(path)


def amct_run(base, cfg_text, loader, epochs, lr, example, x_test, y_test, workdir: Path, seed: int) -> dict:
    cfg, record = workdir / "compressed.cfg", workdir / "record.txt"
    cfg.write_text(cfg_text + QUANT_CFG)
    start = time.perf_counter()
    model = create_compressed_retrain_model(base, example, str(cfg), str(record))
    torch.manual_seed(seed)
    train_epochs(model, loader, epochs, lr)
    train_s = time.perf_counter() - start
    accuracy = evaluate_accuracy(model, x_test, y_test)  # the eval forward fills the record
    paths = save_compressed_retrain_model(model, str(record), str(workdir / "amct"), example, ["x"], ["logits"],
                                          ONNX_AXES)
    baked = copy.deepcopy(model).eval()
    bake_selective_masks(baked)
    return {"accuracy": accuracy, "params": model.amct_prune_report.params_after, "nonzero": _weights(baked)[1],
            "onnx": paths["deploy"], "train_s": train_s}


def torch_pruning_run(base, ratio, loader, epochs, lr, example, x_test, y_test, workdir: Path, seed: int) -> dict:
    import torch_pruning as tp

    start = time.perf_counter()
    model = copy.deepcopy(base)
    pruner = tp.pruner.MetaPruner(
        model, example, importance=tp.importance.GroupMagnitudeImportance(p=2), pruning_ratio=ratio,
        ignored_layers=[model.fc],
    )
    pruner.step()
    torch.manual_seed(seed)
    train_epochs(model, loader, epochs, lr)
    train_s = time.perf_counter() - start
    params, nonzero = _weights(model)
    return {"accuracy": evaluate_accuracy(model, x_test, y_test), "params": params, "nonzero": nonzero,
            "onnx": _export_fp32(model, workdir / "tp.onnx", example), "train_s": train_s}


def fp32_run(base, loader, epochs, lr, example, x_test, y_test, workdir: Path, seed: int) -> dict:
    start = time.perf_counter()
    model = copy.deepcopy(base)
    torch.manual_seed(seed)
    train_epochs(model, loader, epochs, lr)
    params, nonzero = _weights(model)
    return {"accuracy": evaluate_accuracy(model, x_test, y_test), "params": params, "nonzero": nonzero,
            "onnx": _export_fp32(model, workdir / "fp32.onnx", example), "train_s": time.perf_counter() - start}


def run(train_limit: int, epochs: int, lr: float, batch_size: int, seed: int, threads: int,
        methods: list[str]) -> dict[str, Any]:
    x_train, y_train = load_fashion_mnist("train")
    x_test, y_test = load_fashion_mnist("test")
    torch.manual_seed(seed)
    base = SmallFashionCnn()
    train_epochs(base, make_loader(x_train, y_train, batch_size, seed=seed), 1, 2e-3)
    base.eval()
    example = x_test[:8]
    runs = {
        "fp32 control": lambda **kw: fp32_run(base, **kw),
        "amct BCP 30% + INT8": lambda **kw: amct_run(base, FILTER_CFG % 0.3, **kw),
        "amct BCP 50% + INT8": lambda **kw: amct_run(base, FILTER_CFG % 0.5, **kw),
        "amct M4N2 + INT8": lambda **kw: amct_run(base, M4N2_CFG, **kw),
        "torch-pruning 30%": lambda **kw: torch_pruning_run(base, 0.3, **kw),
        "torch-pruning 50%": lambda **kw: torch_pruning_run(base, 0.5, **kw),
    }
    results: dict[str, Any] = {"base_accuracy": evaluate_accuracy(base, x_test, y_test), "methods": {}}
    with tempfile.TemporaryDirectory() as tmp:
        fp32_file = _export_fp32(base, Path(tmp) / "base.onnx", example)
        base_params, base_nonzero = _weights(base)
        base_latency = ort_latency(fp32_file, 64, threads=threads)["median"]
        for name, fn in runs.items():
            if methods and not any(m in name for m in methods):
                continue
            workdir = Path(tmp) / name.replace(" ", "_").replace("%", "").replace("+", "")
            workdir.mkdir()
            loader = make_loader(x_train[:train_limit], y_train[:train_limit], batch_size, seed=seed + 1)
            res = fn(loader=loader, epochs=epochs, lr=lr, example=example, x_test=x_test, y_test=y_test,
                     workdir=workdir, seed=seed + 1)
            res["params_ratio"] = res["params"] / base_params
            res["nonzero_ratio"] = res["nonzero"] / base_nonzero
            res["file_ratio"] = file_size(res["onnx"]) / file_size(fp32_file)
            res["latency_ratio"] = ort_latency(res.pop("onnx"), 64, threads=threads)["median"] / base_latency
            results["methods"][name] = res
            print(f"{name}: {res}", file=sys.stderr)
    return results


def format_results(results: dict[str, Any]) -> str:
    control = results["methods"].get("fp32 control", {}).get("accuracy")
    rows = [{"method": "fp32 base (1 epoch)", "accuracy": results["base_accuracy"]}]
    for name, res in results["methods"].items():
        rows.append({
            "method": name,
            "accuracy": res["accuracy"],
            "delta_vs_fp32": None if control is None else res["accuracy"] - control,
            "params_ratio": res["params_ratio"],
            "nonzero_ratio": res["nonzero_ratio"],
            "file_ratio": res["file_ratio"],
            "ort_latency_ratio": res["latency_ratio"],
            "train_s": res["train_s"],
        })
    columns = ["method", "accuracy", "delta_vs_fp32", "params_ratio", "nonzero_ratio", "file_ratio",
               "ort_latency_ratio", "train_s"]
    return format_table(rows, columns)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-limit", type=int, default=60000, help="training images for the extra epochs")
    parser.add_argument("--epochs", type=int, default=2, help="extra (retraining / control) epochs")
    parser.add_argument("--lr", type=float, default=5e-4, help="Adam lr of the extra epochs")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch and onnxruntime threads")
    parser.add_argument("--only", nargs="*", default=[], help="run only methods whose name contains one of these")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = run(args.train_limit, args.epochs, args.lr, args.batch_size, args.seed, args.threads, args.only)
    versions = package_versions("torch", "torch-pruning", "onnxruntime")
    results["setup"] = vars(args) | {"json": str(args.json) if args.json else None, "versions": versions}
    print(format_results(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))



if __name__ == "__main__":
    main()
