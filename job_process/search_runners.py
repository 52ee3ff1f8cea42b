"""Runners of the job kinds without training: ptq, sensitivity, auto_mixed_precision
(docs/spec/engine.md §1.6, §4.11, §4.12).

Calibration batches are the first `batch_num` x `batch_size` samples of the job's training split (each
batch a tuple of the model's inputs in signature order, so a model of several inputs calibrates too); the
sensitivity and mixed-precision measurements use the last `SEARCH_SAMPLES` of it (a fifth at most,
never the calibration samples when the split is large enough), so the report's held-out split stays
untouched by every decision. Progress events count calibration batches, then layers measured.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

import amct_engine as amct
from amct_engine.config.calibration_cfg import load_calibration_cfg, search_settings
from amct_engine.mixed_precision import Budget
from amct_engine.mixed_precision import auto_mixed_precision as search_mixed_precision
from amct_engine.prune_search import auto_channel_prune_search
from amct_engine.sensitivity import analyse_sensitivity
from job_process.runners import JobContext, add_saved_models, export_options, train
from job_process.training import samples, take

SEARCH_SAMPLES = 2000


def _batches(ctx: JobContext, batch_num: int) -> list[tuple[torch.Tensor, ...]]:
    """The calibration batches: the first batch_num x batch_size training samples, each batch a tuple of the
    model's inputs in signature order (one tensor for a one-input model)."""
    size, count = ctx.params.batch_size, samples(ctx.train_x)
    if count < batch_num * size:
        raise ValueError(
            f"PTQ needs batch_num x batch_size = {batch_num} x {size} calibration samples; the "
            f"training split has {count}: lower batch_size or the cfg's batch_num"
        )
    return [take(ctx.train_x, slice(i * size, (i + 1) * size)) for i in range(batch_num)]


def _progress(ctx: JobContext):
    def report(done: int, total: int) -> None:
        ctx.on_step({"step": done, "total_steps": total})
        ctx.checkpoints.check_cancel()

    return report


def _search_data(ctx: JobContext, used: int):
    """Held-out samples for the searches: the training split's tail, after the calibration samples
    (a tuple of the model's inputs, and their labels or None)."""
    available = samples(ctx.train_x)
    count = min(SEARCH_SAMPLES, max(1, available // 5), max(1, available - used))
    tail = slice(available - count, available)
    return take(ctx.train_x, tail), take(ctx.train_y, tail) if ctx.labelled else None


def _settings(ctx: JobContext) -> dict:
    """The cfg's search settings, with its batch_num (the cfg read once per job)."""
    message = load_calibration_cfg(ctx.cfg_path).message
    return {**search_settings(message, ctx.labelled), "batch_num": message.batch_num}


def ptq(ctx: JobContext) -> nn.Module:
    config, fused, record = ctx.path("ptq_config.json"), ctx.path("fused_model.onnx"), ctx.path("record.txt")
    ctx.phase("creating")
    amct.create_quant_config(config, ctx.model_path, ctx.example, config_defination=ctx.cfg_path)
    with open(config) as f:
        batch_num = json.load(f)["batch_num"]
    batches = _batches(ctx, batch_num)
    model = amct.quantize_model(config, fused, record, ctx.model_path, ctx.example, **ctx.io)
    ctx.phase("calibrating")
    progress = _progress(ctx)
    with torch.no_grad():
        for i, batch in enumerate(batches, 1):
            model(*batch)
            progress(i, len(batches))
    ctx.phase("exporting_onnx")
    add_saved_models(
        ctx,
        amct.save_model(fused, record, ctx.path("model"), model=model, deploy_format=ctx.params.deploy_format),
    )
    ctx.files.update(config=config, record=record, fused_onnx=fused)
    ctx.report["ptq"] = {"batch_num": batch_num, "calibration_samples": batch_num * ctx.params.batch_size}
    return model


def sensitivity(ctx: JobContext) -> nn.Module:
    model = ptq(ctx)
    settings = _settings(ctx)
    batches = _batches(ctx, ctx.report["ptq"]["batch_num"])
    x_eval, y_eval = _search_data(ctx, ctx.report["ptq"]["calibration_samples"])
    ctx.phase("sensitivity")
    table = analyse_sensitivity(
        ctx.model_path,
        ctx.example,
        batches,
        x_eval,
        y_eval,
        precisions=[p for p in settings["precisions"] if p != "INT16"] or ("INT8", "INT4"),
        prune_ratios=settings["prune_ratios"],
        progress=_progress(ctx),
    )
    ctx.report["sensitivity"] = {
        **table.to_json(),
        "metric": "top1_drop" if y_eval is not None else "cosine",
        "samples": samples(x_eval),
    }
    path = ctx.path("sensitivity.json")
    with open(path, "w") as f:
        json.dump(ctx.report["sensitivity"], f, indent=2)
    ctx.files["sensitivity"] = path
    return model


def auto_mixed_precision(ctx: JobContext) -> nn.Module:
    settings = _settings(ctx)
    batch_num = settings["batch_num"]
    batches = _batches(ctx, batch_num)
    x_eval, y_eval = _search_data(ctx, batch_num * ctx.params.batch_size)
    candidates = settings["precisions"] or ["INT4", "INT8", "INT16"]
    candidates = [*candidates, "FP32"] if settings["keep_float"] else candidates
    ctx.phase("searching")
    result = search_mixed_precision(
        ctx.model_path,
        ctx.example,
        batches,
        x_eval,
        y_eval,
        Budget(**settings["budget"]),
        ctx.path("mixed_precision"),
        candidates,
        progress=_progress(ctx),
        io=ctx.io,
    )
    deploy = result.files["ascend_deploy" if ctx.params.deploy_format == "ascend" else "deploy"]
    add_saved_models(ctx, {"fake_quant": result.files["fake_quant"], "deploy": deploy})
    ctx.files["mixed_precision_cfg"] = result.cfg_file
    report = result.to_json()
    report["files"] = {k: os.path.basename(v) for k, v in report["files"].items()}
    report["cfg_file"] = os.path.basename(result.cfg_file)
    ctx.report["mixed_precision"] = {
        **report,
        "budget": settings["budget"],
        "samples": samples(x_eval),
        "cfg_text": Path(result.cfg_file).read_text(),
    }
    return result.model


def prune_search(ctx: JobContext) -> nn.Module:
    """The prune search (docs/spec/engine.md §4.13), then `epochs` of prune retraining on its cfg."""
    settings = _settings(ctx)
    batch_num = settings["batch_num"]
    batches = _batches(ctx, batch_num)
    x_eval, y_eval = _search_data(ctx, batch_num * ctx.params.batch_size)
    ctx.phase("searching")
    result = auto_channel_prune_search(
        ctx.model_path,
        ctx.example,
        batches,
        x_eval,
        y_eval,
        settings["target_macs_ratio"],
        ctx.path("prune_search.cfg"),
        progress=_progress(ctx),
    )
    record = ctx.path("record.txt")
    ctx.phase("creating")
    # A batch (inputs,) whose inputs are the tuple: the calibration reader's (inputs, labels, ...) form.
    model = amct.create_prune_retrain_model(
        ctx.model_path, ctx.example, result.cfg_file, record, calibration_data=[(batch,) for batch in batches]
    )
    model = train(ctx, model)
    ctx.phase("exporting_onnx")
    add_saved_models(ctx, amct.save_prune_retrain_model(model, ctx.path("model"), ctx.example, **export_options(ctx)))
    ctx.files.update(record=record, prune_search_cfg=result.cfg_file)
    report = {k: v for k, v in vars(result).items() if k != "cfg_file"}
    ctx.report["prune_search"] = {**report, "cfg_text": Path(result.cfg_file).read_text(), "samples": samples(x_eval)}
    return model
