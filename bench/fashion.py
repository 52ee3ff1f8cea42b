"""The shared Fashion-MNIST setting of the engine benchmark: one FP32 base model, one data order, one deploy check.

``prepare`` loads the data and trains a CNN (SmallFashionCnn unless told: ``MODELS``) in FP32 once
(``base_epochs`` on the first ``base_images`` training images, Adam 2e-3, batch 128). Every method of the
engine table (bench/qat.py, bench/compress.py, bench/ptq.py) starts from a copy of that base and gets the
same extra ``epochs`` on the same ``train_limit`` images in the same batch order (``setup.loader()``), with the
same Adam lr.

Each method returns a *row*: ``{name, family, status, torch_accuracy, onnx, step_s, losses, ...}``.
``measure_deploy`` then scores every row's deploy ONNX in onnxruntime on the test set and times all of
them round-robin at batch 1 and 64, and fills the ratios against the ``FP32`` row of the same run.
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

if __package__ in (None, ""):  # run as a script: make `bench` and `amct_engine` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from amct_engine.export.save import export_onnx  # noqa: E402
from bench.common import (  # noqa: E402
    StepTimer,
    error_summary,
    file_size,
    interleaved_latency,
    ort_accuracy,
    ort_node_profile,
    ratios,
    summarize,
)
from examples.fashion_mnist import load_fashion_mnist  # noqa: E402
from examples.models import FashionCnn459k, SmallFashionCnn  # noqa: E402
from job_process.training import evaluate_accuracy, make_loader, train_epochs  # noqa: E402

BASELINE = "FP32"
# Deploy models whose onnxruntime node times the report lists (the baseline, the two quantisation peers, ours).
PROFILED = (BASELINE, "ORT static PTQ (QDQ, per-channel)", "torchao PT2E QAT (x86)", "amct INT8 QAT")
IO_NAMES = {"input_names": ["x"], "output_names": ["logits"]}
DYNAMIC_AXES = {"x": {0: "n"}, "logits": {0: "n"}}
Row = dict[str, Any]
# The CNNs a setting can train: the engine table's (20k) and the deploy-speed section's larger one.
MODELS = {"small": SmallFashionCnn, "459k": FashionCnn459k}


@dataclass
class FashionSetup:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    base: nn.Module
    base_accuracy: float
    base_train_s: float
    workdir: Path
    base_epochs: int
    base_images: int
    train_limit: int
    epochs: int
    lr: float = 5e-4
    batch_size: int = 128
    seed: int = 0
    threads: int = 2
    latency_rounds: int = 20
    fp32_model: nn.Module | None = None  # the FP32 row's trained model, set by fp32_control
    cache: dict[str, Any] = field(default_factory=dict)  # rows that later rows build on (e.g. PTQ of a pruned model)

    @property
    def example(self) -> torch.Tensor:
        return self.x_test[:8]

    def loader(self):
        """The extra-epoch loader: a fresh one per method, same seed, so every method sees the same batches."""
        return make_loader(
            self.x_train[: self.train_limit],
            self.y_train[: self.train_limit],
            self.batch_size,
            shuffle=True,
            seed=self.seed + 1,
        )

    def base_copy(self) -> nn.Module:
        return copy.deepcopy(self.base)

    def folder(self, name: str) -> Path:
        path = self.workdir / "".join(c if c.isalnum() else "_" for c in name)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def describe(self) -> dict[str, Any]:
        params = sum(p.numel() for p in self.base.parameters())
        return {
            "model": f"{type(self.base).__name__} ({params:,} params)",
            "base_epochs": self.base_epochs,
            "base_images": self.base_images,
            "base_lr": 2e-3,
            "base_accuracy": self.base_accuracy,
            "base_train_s": self.base_train_s,
            "train_limit": self.train_limit,
            "epochs": self.epochs,
            "lr": self.lr,
            "optimizer": "adam",
            "batch_size": self.batch_size,
            "seed": self.seed,
            "threads": self.threads,
            "test_images": len(self.x_test),
            "latency_rounds": self.latency_rounds,
        }


def prepare(workdir: Path, quick: bool = False, seed: int = 0, threads: int = 2, model: str = "small") -> FashionSetup:
    """Load Fashion-MNIST and train the FP32 base (``MODELS[model]``) once. ``quick``: a few thousand images, for
    smoke runs."""
    sizes = (
        dict(base_images=4000, train_limit=2000, test=2000, epochs=1, rounds=5)
        if quick
        else dict(base_images=60000, train_limit=20000, test=10000, epochs=1, rounds=20)
    )
    x_train, y_train = load_fashion_mnist("train")
    x_test, y_test = load_fashion_mnist("test", limit=sizes["test"])
    torch.manual_seed(seed)
    base = MODELS[model]()
    start = time.perf_counter()
    loader = make_loader(x_train[: sizes["base_images"]], y_train[: sizes["base_images"]], 128, seed=seed)
    train_epochs(base, loader, 1, 2e-3)
    base_train_s = time.perf_counter() - start
    base.eval()
    return FashionSetup(
        x_train,
        y_train,
        x_test,
        y_test,
        base,
        evaluate_accuracy(base, x_test, y_test),
        base_train_s,
        workdir,
        1,
        sizes["base_images"],
        sizes["train_limit"],
        sizes["epochs"],
        seed=seed,
        threads=threads,
        latency_rounds=sizes["rounds"],
    )


def export_fp32(model: nn.Module, path: Path, example: torch.Tensor) -> str:
    """A float model to ONNX with the dynamic batch axis every deploy file of the table has."""
    export_onnx(copy.deepcopy(model).eval(), str(path), (example,), dynamic_axes=DYNAMIC_AXES, **IO_NAMES)
    return str(path)


def weight_counts(model: nn.Module) -> dict[str, int]:
    """Parameters, and non-zero weights of the conv and linear layers (4:2 masks must be baked in first)."""
    nonzero = sum(int((m.weight != 0).sum()) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear)))
    return {"params": sum(p.numel() for p in model.parameters()), "nonzero_weights": nonzero}


def timed_training(
    model: nn.Module, loader, epochs: int, lr: float, set_mode: bool = True, loss_fn=None
) -> dict[str, Any]:
    """Adam training with per-step wall time and loss: ``{step_s: {min, median, max}, losses, train_s}``.
    ``loss_fn``: as ``train_epochs``'s (None: cross-entropy)."""
    timer = StepTimer()
    start = time.perf_counter()
    timer.start()
    train_epochs(model, loader, epochs, lr, optimizer="adam", progress=timer, set_mode=set_mode, loss_fn=loss_fn)
    return {"step_s": summarize(timer.durations), "losses": timer.losses, "train_s": time.perf_counter() - start}


def fp32_control(setup: FashionSetup) -> Row:
    """The baseline row: the same extra epochs in plain FP32; its ONNX is the size and latency reference."""
    torch.manual_seed(setup.seed + 1)
    model = setup.base_copy()
    training = timed_training(model, setup.loader(), setup.epochs, setup.lr)
    onnx_path = export_fp32(model, setup.folder(BASELINE) / "fp32.onnx", setup.example)
    setup.fp32_model = model.eval()  # PTQ quantises this one: post-training means after the same training
    return {
        "torch_accuracy": evaluate_accuracy(model, setup.x_test, setup.y_test),
        "onnx": onnx_path,
        "deploy_kind": "FP32 ONNX",
        **weight_counts(model),
        **training,
    }


def run_row(name: str, family: str, fn: Callable[[], Row]) -> Row:
    """Run one method; an ImportError marks it ``unavailable``, any other error ``failed`` (with the reason)."""
    print(f"[engine] {name} …", file=sys.stderr, flush=True)
    start = time.perf_counter()
    try:
        row = fn()
        row["status"] = "ok"
    except ImportError as exc:
        row = {"status": "unavailable", "reason": error_summary(exc)}
    except Exception as exc:  # a broken method must not take the whole table down
        row = {"status": "failed", "reason": error_summary(exc)}
    row.update(name=name, family=family, total_s=time.perf_counter() - start)
    detail = f"torch top-1 {row['torch_accuracy']:.4f}" if "torch_accuracy" in row else row.get("reason")
    print(f"[engine] {name}: {row['status']}: {detail} ({row['total_s']:.1f} s)", file=sys.stderr, flush=True)
    return row


def measure_deploy(setup: FashionSetup, rows: list[Row]) -> None:
    """ORT accuracy, bytes and latency of every row's deploy ONNX; ratios against the FP32 row, in place."""
    print("[engine] onnxruntime accuracy and latency of every deploy model …", file=sys.stderr, flush=True)
    deployable = {row["name"]: row["onnx"] for row in rows if row["status"] == "ok" and row.get("onnx")}
    for row in rows:
        if row["name"] in deployable:
            try:
                row["accuracy"] = ort_accuracy(row["onnx"], setup.x_test, setup.y_test, setup.threads)
                # With only the basic graph rewrites (no QDQ fusion into QLinear* kernels): where this differs
                # from the default, onnxruntime's fused kernels compute something else than the graph says.
                row["accuracy_ort_basic"] = ort_accuracy(
                    row["onnx"], setup.x_test, setup.y_test, setup.threads, optimization="ORT_ENABLE_BASIC"
                )
                row["bytes"] = file_size(row["onnx"])
                row["ops"] = op_counts(row["onnx"])
            except Exception as exc:  # e.g. a peer's ONNX that onnxruntime cannot load
                row["deploy_error"] = error_summary(exc)
                deployable.pop(row["name"])
        elif row["status"] == "ok":
            row["accuracy"] = row["torch_accuracy"]  # no ONNX: the PyTorch model's accuracy stands in
    for batch in (1, 64):
        # One ORT thread: per-model latency without thread-pool scheduling noise on a shared machine.
        latency = interleaved_latency(
            deployable, batch, rounds=setup.latency_rounds, per_round=5 if batch == 64 else 20, threads=1
        )
        for row in rows:
            if row["name"] in latency:
                row[f"latency_b{batch}_s"] = latency[row["name"]]
    for row in rows:  # where the time goes, for the rows the latency comparison is about
        if row["name"] in PROFILED and row["name"] in deployable:
            row["ort_profile"] = [ort_node_profile(row["onnx"], batch) for batch in (1, 64)]
    add_ratios(rows)


def op_counts(path: str) -> dict[str, int]:
    """How many nodes of each op type the ONNX graph has (what onnxruntime is asked to run)."""
    import onnx

    counts: dict[str, int] = {}
    for node in onnx.load(path, load_external_data=False).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def add_ratios(rows: list[Row]) -> None:
    """Δ top-1, bytes, latency and train-step ratios of every row against the ``FP32`` row."""
    baseline = next((r for r in rows if r["name"] == BASELINE and r["status"] == "ok"), None)
    if baseline is None:
        return
    for row in rows:
        if row["status"] != "ok":
            continue
        if "accuracy" in row and "accuracy" in baseline:
            row["accuracy_delta"] = row["accuracy"] - baseline["accuracy"]
        if "bytes" in row and "bytes" in baseline:
            row["bytes_ratio"] = row["bytes"] / baseline["bytes"]
        if "params" in row and "params" in baseline:
            row["params_ratio"] = row["params"] / baseline["params"]
            row["nonzero_ratio"] = row["nonzero_weights"] / baseline["nonzero_weights"]
        for batch in (1, 64):
            key = f"latency_b{batch}_s"
            if key in row and key in baseline:
                row[f"latency_b{batch}_ratio"] = ratios(row[key], baseline[key])
        if "step_s" in row and "step_s" in baseline:
            row["step_ratio"] = row["step_s"]["median"] / baseline["step_s"]["median"]
            # The rows train one after another, so a load burst can hit one row's steps and not the FP32
            # row's: the fastest step is the figure least moved by that (the report leads with it).
            row["step_ratio_min"] = row["step_s"]["min"] / baseline["step_s"]["min"]
            if row.get("step_is_mean"):  # only a mean per batch exists (distillation): compare means
                row["step_ratio"] = row["step_ratio_min"] = row["step_s"]["median"] / mean_step_s(baseline)


def mean_step_s(row: Row) -> float:
    """Training time over steps (``losses`` has one entry per step)."""
    return row["train_s"] / max(1, len(row["losses"]))


def rows_by_name(result: Mapping[str, Any]) -> dict[str, Row]:
    return {row["name"]: row for row in result["rows"]}
