"""Peer methods of the engine table: torchao PT2E QAT, NNCF QAT and Torch-Pruning (bench extra only).

Each starts from a copy of the shared FP32 base (bench/fashion.py), trains the same extra epochs on the
same loader with the same Adam lr, and returns a row: PyTorch accuracy, per-step time and loss, the
time to prepare and convert, and the ONNX file that peer deploys to onnxruntime:

- torchao: ``torch.export`` → ``prepare_qat_pt2e(X86InductorQuantizer(is_qat))`` → train →
  ``convert_pt2e`` → ``torch.onnx.export(dynamo=True)`` (QuantizeLinear/DequantizeLinear);
- NNCF: ``nncf.quantize`` (calibration on the train loader) → train → ``nncf.strip`` →
  ``torch.onnx.export(dynamo=False)`` (QDQ; NNCF's own FakeQuantize op does not run in onnxruntime);
- Torch-Pruning: ``MetaPruner`` with group L2 magnitude importance at our filter-pruning ratios (fc
  excluded, as our pruner excludes the model output), FP32 fine-tuning, FP32 ONNX; the ``+ ORT PTQ``
  variant quantises that ONNX as bench/ptq.py does: the combination a user would assemble.

Run on its own: ``python bench/engine_table.py --quick --only peers``.
"""

from __future__ import annotations

import io
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

if __package__ in (None, ""):  # run as a script: make `bench` and `amct_engine` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ort_accuracy  # noqa: E402
from bench.fashion import IO_NAMES, export_fp32, timed_training, weight_counts  # noqa: E402
from job_process.training import evaluate_accuracy  # noqa: E402

Row = dict[str, Any]


def torchao_qat(setup) -> Row:
    """torchao PT2E QAT with the x86 quantiser; accuracy of the converted model (int8 reference ops)."""
    from torchao.quantization.pt2e import move_exported_model_to_eval, move_exported_model_to_train
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_qat_pt2e
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    torch.manual_seed(setup.seed + 1)
    loader = setup.loader()
    start = time.perf_counter()
    model = setup.base_copy().train()
    # The batch dim is dynamic: the last training batch and the evaluation chunks differ in size.
    exported = torch.export.export(model, (next(iter(loader))[0],), dynamic_shapes=({0: torch.export.Dim("batch")},))
    quantizer = X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config(is_qat=True))
    prepared = prepare_qat_pt2e(exported.module(), quantizer)
    # PT2E graph modules refuse .train()/.eval(); torchao flips the BN/dropout nodes instead.
    move_exported_model_to_train(prepared)
    prepare_s = time.perf_counter() - start
    training = timed_training(prepared, loader, setup.epochs, setup.lr, set_mode=False)
    start = time.perf_counter()
    converted = convert_pt2e(prepared)
    move_exported_model_to_eval(converted)
    convert_s = time.perf_counter() - start
    accuracy = evaluate_accuracy(converted, setup.x_test, setup.y_test, set_mode=False)
    path = setup.folder("torchao") / "torchao_qdq.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            converted,
            (setup.example,),
            dynamo=True,
            verbose=False,
            dynamic_shapes=({0: torch.export.Dim("n")},),
            **IO_NAMES,
        )
    program.save(str(path))
    return {
        "torch_accuracy": accuracy,
        "prepare_s": prepare_s,
        "convert_s": convert_s,
        "onnx": str(path),
        "deploy_kind": "QDQ ONNX (torch.onnx dynamo export)",
        **training,
    }


def torchao_ptq_onnx(
    model: torch.nn.Module, calibration: torch.Tensor, path: Path, input_name: str = "x", output_name: str = "y"
) -> str:
    """torchao PT2E static PTQ (x86 quantiser, int8 activations and weights) calibrated on ``calibration``,
    exported as a QDQ ONNX with torch.onnx's dynamo exporter (the flow torchao documents for deployment)."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    batch = torch.export.Dim("batch")
    exported = torch.export.export(model.eval(), (calibration[:2],), dynamic_shapes=({0: batch},))
    quantizer = X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(exported.module(), quantizer)
    with torch.no_grad():
        for chunk in calibration.split(32):
            prepared(chunk)
    converted = convert_pt2e(prepared)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            converted,
            (calibration[:2],),
            dynamo=True,
            verbose=False,
            dynamic_shapes=({0: torch.export.Dim("n")},),
            input_names=[input_name],
            output_names=[output_name],
        )
    program.save(str(path))
    return str(path)


def nncf_qat(setup) -> Row:
    """NNCF QAT (PyTorch backend): quantize with calibration, fine-tune, strip; accuracy of the stripped model."""
    # NNCF builds a C++ extension on first use; on a busy 2-core machine that outlasts its 60 s default.
    os.environ.setdefault("NNCF_EXTENSION_LOAD_TIMEOUT", "900")
    import nncf

    torch.manual_seed(setup.seed + 1)
    loader = setup.loader()
    start = time.perf_counter()
    model = setup.base_copy().eval()
    calibration = nncf.Dataset(loader, lambda batch: batch[0])
    # subset_size counts dataset items, i.e. batches here: 300 samples' worth is NNCF's default.
    subset = max(1, min(len(loader), 300 // setup.batch_size + 1))
    with _quiet_stdout():
        quantized = nncf.quantize(model, calibration, subset_size=subset)
    prepare_s = time.perf_counter() - start
    training = timed_training(quantized, loader, setup.epochs, setup.lr)
    start = time.perf_counter()
    quantized.eval()
    stripped = nncf.strip(
        quantized, do_copy=True, strip_format=nncf.StripFormat.NATIVE, example_input=setup.example[:1]
    )
    convert_s = time.perf_counter() - start
    accuracy = evaluate_accuracy(stripped, setup.x_test, setup.y_test)
    path = setup.folder("nncf") / "nncf_qdq.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            stripped,
            (setup.example,),
            str(path),
            dynamo=False,
            opset_version=17,
            dynamic_axes={"x": {0: "n"}, "logits": {0: "n"}},
            **IO_NAMES,
        )
    return {
        "torch_accuracy": accuracy,
        "prepare_s": prepare_s,
        "convert_s": convert_s,
        "onnx": str(path),
        "deploy_kind": "QDQ ONNX (nncf.strip + torch.onnx)",
        **training,
    }


def torch_pruning(setup, ratio: float) -> Row:
    """Torch-Pruning's MetaPruner at ``ratio`` of channels, then FP32 fine-tuning; FP32 ONNX."""
    import torch_pruning as tp

    torch.manual_seed(setup.seed + 1)
    start = time.perf_counter()
    model = setup.base_copy()
    classifier = _classifier(model)
    pruner = tp.pruner.MetaPruner(
        model,
        setup.example,
        importance=tp.importance.GroupMagnitudeImportance(p=2),
        pruning_ratio=ratio,
        pruning_ratio_dict=_same_counts(model, ratio, classifier),
        ignored_layers=[classifier],
    )
    pruner.step()
    prepare_s = time.perf_counter() - start
    after_pruning = evaluate_accuracy(model, setup.x_test, setup.y_test)  # before fine-tuning, as ours report it
    training = timed_training(model, setup.loader(), setup.epochs, setup.lr)
    model.eval()
    row = {
        "torch_accuracy": evaluate_accuracy(model, setup.x_test, setup.y_test),
        "prepare_s": prepare_s,
        "accuracy_after_pruning": after_pruning,
        **weight_counts(model),
        "deploy_kind": "FP32 ONNX",
        **training,
        "onnx": export_fp32(model, setup.folder(f"tp{ratio}") / "tp.onnx", setup.example),
    }
    setup.cache[f"torch-pruning {ratio}"] = row
    return row


def _same_counts(model: nn.Module, ratio: float, classifier: nn.Module) -> dict[nn.Module, float]:
    """Per layer, the ratio at which Torch-Pruning keeps the channels ours keeps: ours prunes round(N·ratio)
    (AMCT's count, docs/spec/engine.md §4.4 "Count"), Torch-Pruning keeps int(N·(1 − ratio)), one channel fewer
    on a layer of 64 at 30 %. round(N·ratio)/N gives its count back exactly for the power-of-two widths here."""
    layers = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear)) and m is not classifier]
    width = {m: m.out_channels if isinstance(m, nn.Conv2d) else m.out_features for m in layers}
    return {m: round(n * ratio) / n for m, n in width.items()}


def _classifier(model: nn.Module) -> nn.Module:
    """The last Linear: the class scores, which neither pruner may shrink (ours leaves the output layer whole)."""
    return [m for m in model.modules() if isinstance(m, nn.Linear)][-1]


def torch_pruning_ptq(setup, ratio: float) -> Row:
    """The Torch-Pruning row's FP32 ONNX quantised by ORT static PTQ (bench/ptq.py): no second training."""
    from bench import ptq

    pruned = setup.cache.get(f"torch-pruning {ratio}")
    if pruned is None:
        raise RuntimeError(f"the Torch-Pruning {ratio:.0%} row did not run: nothing to quantise")
    quantized = ptq.quantize(
        pruned["onnx"], setup.x_train[: ptq.CALIBRATION_IMAGES].numpy(), setup.folder(f"tp{ratio}") / "tp_ptq.onnx"
    )
    accuracy = ort_accuracy(quantized["onnx"], setup.x_test, setup.y_test, setup.threads)
    return {
        **pruned,
        "torch_accuracy": accuracy,
        "onnx": quantized["onnx"],
        "convert_s": quantized["calibrate_s"],
        "deploy_kind": "QDQ ONNX (ORT PTQ)",
    }


class _quiet_stdout:
    """NNCF prints progress bars to stdout; the benchmark's stdout is for results."""

    def __enter__(self) -> None:
        self._saved, sys.stdout = sys.stdout, io.StringIO()

    def __exit__(self, *exc: object) -> None:
        sys.stdout = self._saved


def qat_methods(setup) -> list[tuple[str, str, Callable[[], Row]]]:
    return [
        ("torchao PT2E QAT (x86)", "peer", lambda: torchao_qat(setup)),
        ("NNCF QAT", "peer", lambda: nncf_qat(setup)),
    ]


def prune_methods(setup) -> list[tuple[str, str, Callable[[], Row]]]:
    rows = []
    for ratio in (0.3, 0.5):
        pct = f"{round(ratio * 100)} %"
        rows.append((f"Torch-Pruning {pct}", "peer", lambda r=ratio: torch_pruning(setup, r)))
        rows.append((f"Torch-Pruning {pct} + ORT PTQ", "peer", lambda r=ratio: torch_pruning_ptq(setup, r)))
    return rows
