"""QAT benchmark on Fashion-MNIST: our INT8 / A8W4 QAT against FP32 and the torchao / NNCF peers.

One run, one data set, one seed. SmallFashionCnn is trained in FP32 for 1 epoch on all 60k training
images (Adam 2e-3, batch 128). Then every method gets the same extra epoch(s) on the first
``--train-limit`` images, in the same batch order, with the same Adam lr (``--lr``, default 5e-4):

- ``fp32 finetune``: the control (no quantisation); every accuracy delta and step-time ratio is against it;
- ``amct INT8 QAT``: the default retrain config; ``amct A8W4 QAT``: a retrain ``.cfg`` with
  ``retrain_weight_quant_config { ulq_retrain { channel_wise: true dst_type: INT4 } }``;
- ``torchao PT2E QAT`` (X86InductorQuantizer) and ``nncf QAT``, from ``bench/peers.py``.

Our QAT models are saved with ``save_quant_retrain_model``; the ``_deploy_model.onnx`` is scored in
onnxruntime and compared with the FP32 model exported by ``export_onnx`` (dynamic batch axis): file
size ratio, and ORT latency ratio (min / median / max) at batch 64 and batch 1.

Run: ``.venv/bin/python bench/qat.py [--train-limit 60000] [--json out.json] [--markdown out.md]``.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

if __package__ in (None, ""):  # run as a script: make `bench` and `amct_engine` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import amct_engine as amct  # noqa: E402
from amct_engine.data.fashion_mnist import load_fashion_mnist  # noqa: E402
from amct_engine.data.training import SmallFashionCnn, evaluate_accuracy, make_loader, train_epochs  # noqa: E402
from amct_engine.export.save import export_onnx  # noqa: E402
from bench.common import StepTimer, file_size, format_table, ort_latency, package_versions, summarize  # noqa: E402
from bench.peers import fp32_finetune, nncf_qat, torchao_qat  # noqa: E402

A8W4_CFG = "retrain_weight_quant_config { ulq_retrain { channel_wise: true dst_type: INT4 } }"
CONTROL = "fp32 finetune"
IO_NAMES = {"input_names": ["x"], "output_names": ["logits"]}
DYNAMIC_AXES = {"x": {0: "n"}, "logits": {0: "n"}}
# Modules a peer needs: a failed import marks the peer "unavailable" instead of failing the run.
PEER_IMPORTS = {
    "torchao PT2E QAT": (
        "torchao.quantization.pt2e.quantize_pt2e",
        "torchao.quantization.pt2e.quantizer.x86_inductor_quantizer",
    ),
    "nncf QAT": ("nncf",),
}
Loader = Any


# --------------------------------------------------------------------------- our QAT


def amct_qat(
    model_fp32: nn.Module,
    train_loader: Loader,
    x_test: torch.Tensor,
    y_test: torch.Tensor,
    epochs: int,
    lr: float,
    seed: int,
    workdir: Path,
    cfg_text: str | None = None,
) -> dict[str, Any]:
    """create config → create retrain model → train → eval forward (fills the record) → save both ONNX.

    Same return keys as the peers (``accuracy, step_time_s, step_time_min_s, prepare_s, convert_s``)
    plus ``deploy`` / ``fake_quant`` (paths). convert = the save (two ONNX exports and their checks).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    example = x_test[:8]
    config, record = workdir / "retrain.json", workdir / "record.txt"
    cfg = None
    if cfg_text:
        cfg = workdir / "qat.cfg"
        cfg.write_text(cfg_text + "\n")
    torch.manual_seed(seed)
    start = time.perf_counter()
    model = copy.deepcopy(model_fp32).eval()
    amct.create_quant_retrain_config(str(config), model, example, str(cfg) if cfg else None)
    qmodel = amct.create_quant_retrain_model(str(config), model, str(record), example)
    prepare_s = time.perf_counter() - start
    timer = StepTimer()
    timer.start()
    train_epochs(qmodel, train_loader, epochs, lr, optimizer="adam", progress=timer)
    steps = summarize(timer.durations)
    accuracy = evaluate_accuracy(qmodel, x_test, y_test)  # the first eval forward writes the record
    start = time.perf_counter()
    paths = amct.save_quant_retrain_model(
        str(config), qmodel, str(record), str(workdir / "model"), example, dynamic_axes=DYNAMIC_AXES, **IO_NAMES
    )
    convert_s = time.perf_counter() - start
    return {
        "accuracy": accuracy,
        "step_time_s": steps["median"],
        "step_time_min_s": steps["min"],
        "prepare_s": prepare_s,
        "convert_s": convert_s,
        **paths,
    }


# --------------------------------------------------------------------------- ORT


def ort_accuracy(path: str | Path, x: torch.Tensor, y: torch.Tensor, threads: int, chunk: int = 1000) -> float:
    """Top-1 accuracy of an ONNX classifier (input ``x``) in onnxruntime on CPU."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    logits = np.concatenate(
        [session.run(None, {name: x[i : i + chunk].numpy()})[0] for i in range(0, len(x), chunk)]
    )
    return float((logits.argmax(1) == y.numpy()).mean())


def _ratios(num: Mapping[str, float], den: Mapping[str, float]) -> dict[str, float]:
    return {key: num[key] / den[key] for key in ("min", "median", "max")}


# --------------------------------------------------------------------------- the run


def _missing_import(modules: Sequence[str]) -> str | None:
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # any import failure (ImportError, broken install) counts
            return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None


def _run_method(name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one method, timing it; an import error → ``unavailable``, any other error → ``failed``."""
    print(f"[qat bench] {name} …", file=sys.stderr, flush=True)
    start = time.perf_counter()
    try:
        result = fn()
    except ImportError as exc:
        return {"status": "unavailable", "reason": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    except Exception as exc:  # a broken peer must not take the whole table down
        return {"status": "failed", "reason": f"{type(exc).__name__}: {exc}".splitlines()[0][:200]}
    result["status"] = "ok"
    result["total_s"] = time.perf_counter() - start
    print(f"[qat bench] {name}: accuracy {result['accuracy']:.4f} in {result['total_s']:.1f} s", file=sys.stderr)
    return result


def run_benchmark(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    run_start = time.perf_counter()
    x_train, y_train = load_fashion_mnist("train")
    x_test, y_test = load_fashion_mnist("test")
    torch.manual_seed(args.seed)
    base = SmallFashionCnn()
    start = time.perf_counter()
    base_loader = make_loader(x_train, y_train, args.batch_size, shuffle=True, seed=args.seed)
    train_epochs(base, base_loader, args.base_epochs, args.base_lr)
    base_train_s = time.perf_counter() - start
    base.eval()
    base_accuracy = evaluate_accuracy(base, x_test, y_test)
    print(f"[qat bench] fp32 base: accuracy {base_accuracy:.4f} in {base_train_s:.1f} s", file=sys.stderr)

    fp32_onnx = workdir / "fp32.onnx"
    export_onnx(copy.deepcopy(base).eval(), str(fp32_onnx), (x_test[:8],), dynamic_axes=DYNAMIC_AXES, **IO_NAMES)

    x_extra, y_extra = x_train[: args.train_limit], y_train[: args.train_limit]
    common = (x_test, y_test, args.epochs, args.lr, args.seed)

    def loader() -> Loader:
        # A fresh loader with the same seed per method: every method sees the same batches in the same order.
        return make_loader(x_extra, y_extra, args.batch_size, shuffle=True, seed=args.seed + 1)

    methods: dict[str, Callable[[], dict[str, Any]]] = {
        CONTROL: lambda: fp32_finetune(base, loader(), *common),
        "amct INT8 QAT": lambda: amct_qat(base, loader(), *common, workdir=workdir / "int8"),
        "amct A8W4 QAT": lambda: amct_qat(base, loader(), *common, workdir=workdir / "a8w4", cfg_text=A8W4_CFG),
        "torchao PT2E QAT": lambda: torchao_qat(base, loader(), *common),
        "nncf QAT": lambda: nncf_qat(base, loader(), *common),
    }
    results: dict[str, Any] = {}
    for name, fn in methods.items():
        reason = _missing_import(PEER_IMPORTS.get(name, ()))
        if reason is not None:
            results[name] = {"status": "unavailable", "reason": reason}
            print(f"[qat bench] {name}: unavailable: {reason}", file=sys.stderr)
            continue
        results[name] = _run_method(name, fn)

    # Deploy side, measured after all training so the FP32 and quantised files see the same machine state.
    print("[qat bench] onnxruntime accuracy / latency …", file=sys.stderr, flush=True)
    deploy: dict[str, Any] = {}
    onnx_models = {"fp32 onnx": (fp32_onnx, base_accuracy)}
    for name in ("amct INT8 QAT", "amct A8W4 QAT"):
        if results[name]["status"] == "ok":
            onnx_models[name] = (Path(results[name]["deploy"]), results[name]["accuracy"])
    for name, (path, torch_accuracy) in onnx_models.items():
        entry: dict[str, Any] = {"path": str(path), "bytes": file_size(path), "torch_accuracy": torch_accuracy}
        entry["ort_accuracy"] = ort_accuracy(path, x_test, y_test, args.threads)
        for batch, repeats in ((64, args.latency_repeats), (1, 4 * args.latency_repeats)):
            entry[f"latency_b{batch}_s"] = ort_latency(path, batch, repeats=repeats, warmup=5, threads=args.threads)
        deploy[name] = entry
    fp32_entry = deploy["fp32 onnx"]
    for entry in deploy.values():
        entry["size_ratio"] = entry["bytes"] / fp32_entry["bytes"]
        for batch in (64, 1):
            key = f"latency_b{batch}_s"
            entry[f"latency_b{batch}_ratio"] = _ratios(entry[key], fp32_entry[key])

    control = results[CONTROL]
    if control["status"] == "ok":
        for res in results.values():
            if res["status"] == "ok":
                res["accuracy_delta"] = res["accuracy"] - control["accuracy"]
                res["step_ratio"] = res["step_time_s"] / control["step_time_s"]
                res["step_ratio_min"] = res["step_time_min_s"] / control["step_time_min_s"]

    return {
        "setup": {
            "model": "SmallFashionCnn",
            "base_epochs": args.base_epochs,
            "base_lr": args.base_lr,
            "base_train_images": len(x_train),
            "train_limit": len(x_extra),
            "epochs": args.epochs,
            "lr": args.lr,
            "optimizer": "adam",
            "batch_size": args.batch_size,
            "seed": args.seed,
            "threads": args.threads,
            "latency_repeats": {"b64": args.latency_repeats, "b1": 4 * args.latency_repeats},
            "versions": package_versions("torch", "onnxruntime", "torchao", "nncf"),
        },
        "base": {"accuracy": base_accuracy, "train_s": base_train_s},
        "methods": results,
        "deploy": deploy,
        "total_s": time.perf_counter() - run_start,
    }


# --------------------------------------------------------------------------- report


def _pt(delta: float) -> str:
    points = round(delta * 100, 2) + 0.0  # + 0.0: no "-0.00"
    return f"{points:+.2f} pt"


def _triple(ratio: Mapping[str, float]) -> str:
    return f"{ratio['min']:.2f} / {ratio['median']:.2f} / {ratio['max']:.2f}"


TRAIN_COLUMNS = [
    "method", "accuracy", "vs fp32 ctrl", "step ms (med)", "step ratio (med)", "step ratio (min)",
    "prepare s", "convert s", "total s",
]
DEPLOY_COLUMNS = [
    "onnx model", "ORT accuracy", "vs torch", "size kB", "size ratio", "b64 ms (med)",
    "b64 ratio min/med/max", "b1 ms (med)", "b1 ratio min/med/max",
]


def table_rows(results: Mapping[str, Any]) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """The two tables as rows of pre-formatted strings: training (all methods) and ORT deploy."""
    train = [{"method": "fp32 base (no extra epoch)", "accuracy": f"{results['base']['accuracy']:.4f}"}]
    for name, res in results["methods"].items():
        if res["status"] != "ok":
            train.append({"method": name, "accuracy": f"{res['status']}: {res['reason']}"})
            continue
        row = {
            "method": name,
            "accuracy": f"{res['accuracy']:.4f}",
            "step ms (med)": f"{res['step_time_s'] * 1e3:.1f}",
            "prepare s": f"{res['prepare_s']:.2f}",
            "convert s": f"{res['convert_s']:.2f}",
            "total s": f"{res['total_s']:.1f}",
        }
        if "accuracy_delta" in res:
            row["vs fp32 ctrl"] = "(control)" if name == CONTROL else _pt(res["accuracy_delta"])
            row["step ratio (med)"] = f"{res['step_ratio']:.2f}"
            row["step ratio (min)"] = f"{res['step_ratio_min']:.2f}"
        train.append(row)
    deploy = []
    for name, entry in results["deploy"].items():
        label = "fp32 onnx (baseline)" if name == "fp32 onnx" else name.replace(" QAT", " deploy")
        deploy.append(
            {
                "onnx model": label,
                "ORT accuracy": f"{entry['ort_accuracy']:.4f}",
                "vs torch": _pt(entry["ort_accuracy"] - entry["torch_accuracy"]),
                "size kB": f"{entry['bytes'] / 1024:.1f}",
                "size ratio": f"{entry['size_ratio']:.3f}",
                "b64 ms (med)": f"{entry['latency_b64_s']['median'] * 1e3:.3f}",
                "b64 ratio min/med/max": _triple(entry["latency_b64_ratio"]),
                "b1 ms (med)": f"{entry['latency_b1_s']['median'] * 1e3:.3f}",
                "b1 ratio min/med/max": _triple(entry["latency_b1_ratio"]),
            }
        )
    return train, deploy


def setup_line(results: Mapping[str, Any]) -> str:
    s = results["setup"]
    return (
        f"SmallFashionCnn on Fashion-MNIST; FP32 base: {s['base_epochs']} epoch(s) on {s['base_train_images']} images, "
        f"Adam {s['base_lr']:g}, batch {s['batch_size']}. Every method then: {s['epochs']} extra epoch(s) on the first "
        f"{s['train_limit']} images, same batch order, Adam lr {s['lr']:g} for all, seed {s['seed']}, "
        f"{s['threads']} torch/ORT thread(s). Versions: "
        + ", ".join(f"{k} {v}" for k, v in s["versions"].items())
    )


NOTES = (
    "accuracy deltas and step ratios are against the fp32 finetune control (same extra epochs, same data order); "
    "QAT accuracy is the PyTorch model after training (torchao: converted model, NNCF: stripped model). "
    "ORT rows: the amct `_deploy_model.onnx` against the FP32 model exported with export_onnx (dynamic batch); "
    "'vs torch' compares ORT with the PyTorch accuracy of the same model; latency ratios are deploy/FP32 of "
    "the min, median and max per-run time."
)


def format_markdown(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    def cell(value: Any) -> str:
        return "-" if value is None else str(value).replace("|", "\\|")

    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(row.get(col)) for col in columns) + " |" for row in rows]
    return "\n".join(lines)


def report(results: Mapping[str, Any], markdown: bool = False) -> str:
    train, deploy = table_rows(results)
    fmt = format_markdown if markdown else format_table
    total = f"Total runtime {results['total_s']:.1f} s."
    parts = [setup_line(results), "", fmt(train, TRAIN_COLUMNS), "", fmt(deploy, DEPLOY_COLUMNS), "", NOTES, total]
    if markdown:
        parts.insert(0, "## QAT benchmark (bench/qat.py)\n")
    return "\n".join(parts)



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-limit", type=int, default=20000, help="training images for the extra epochs")
    parser.add_argument("--epochs", type=int, default=1, help="extra (QAT / control) epochs")
    parser.add_argument("--lr", type=float, default=5e-4, help="Adam lr of the extra epochs, the same for all")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--base-epochs", type=int, default=1, help="FP32 epochs on all 60k images")
    parser.add_argument("--base-lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads and ORT intra-op threads")
    parser.add_argument("--latency-repeats", type=int, default=100, help="ORT runs at batch 64 (4x at batch 1)")
    parser.add_argument("--out-dir", type=Path, help="keep the ONNX files here (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--markdown", type=Path, help="also write the tables here as markdown")
    args = parser.parse_args(argv)
    if args.train_limit < 1 or args.epochs < 1:
        parser.error("--train-limit and --epochs must be >= 1")
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="amct-qat-bench-") as tmp:
        workdir = args.out_dir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        results = run_benchmark(args, workdir)
    print(report(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    if args.markdown:
        args.markdown.write_text(report(results, markdown=True) + "\n")
    ours_failed = [n for n in (CONTROL, "amct INT8 QAT", "amct A8W4 QAT") if results["methods"][n]["status"] != "ok"]
    return 1 if ours_failed else 0


if __name__ == "__main__":
    sys.exit(main())
