"""The runners of the built-in job kinds: plain engine calls, the AMCT workflow a user would write by hand.

The job-kind table (kinds.py) names these functions. Each takes a JobContext, puts the files it wrote
in `ctx.files` keyed by artifact kind, and returns the trained model (for PyTorch-side checks).
Nothing here knows about Celery, HTTP or the database.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

import amct_engine as amct
from amct_engine.prune.report import NOT_CONFIGURED, PRUNED, REPLAYED
from job_host.spec import JobParams
from job_process import distributed
from job_process.checkpoints import Checkpoints
from job_process.distributed import SINGLE, Rank, shard
from job_process.quality_gate import check_step_loss
from job_process.training import Inputs, ResumableLoader, Targets, make_loader, make_optimizer, train_epochs

# The export names of a one-input, one-output model; a job names its inputs and outputs after the
# model's signature (job_host/signature.py io_names), put in JobContext.io.
IO_NAMES = {
    "input_names": ["input"],
    "output_names": ["output"],
    "dynamic_axes": {"input": {0: "batch"}, "output": {0: "batch"}},
}


@dataclass
class JobContext:
    workdir: Path
    model_path: str
    cfg_path: str
    example: tuple[torch.Tensor, ...]  # one tensor per input, in the signature's order
    train_x: Inputs
    train_y: Targets
    params: JobParams
    device: torch.device
    on_step: Callable[[dict], None]
    phase: Callable[[str], None]
    checkpoints: Checkpoints
    files: dict[str, str] = field(default_factory=dict)
    labelled: bool = True  # False: the dataset has no labels (train_y is None or the mse/l1 targets)
    report: dict = field(default_factory=dict)  # sections the kind adds to report.json (its tables)
    io: dict = field(default_factory=lambda: dict(IO_NAMES))  # input/output names and dynamic axes
    loss_fn: Callable | None = None  # the job's objective (job_process/objectives.py); None: cross-entropy
    losses: list[float] = field(default_factory=list)  # every training step's loss, for the quality gate
    rank: Rank = SINGLE  # this process's rank of a distributed job (job_process/distributed.py)

    def path(self, name: str) -> str:
        return str(self.rank.out_dir(self.workdir) / name)


class DeviceLoader:
    """Moves each batch to the job's device; keeps len() so train_epochs can report total steps.

    `shuffle` replays the data order from a checkpoint (ResumableLoader).
    """

    def __init__(self, loader, device: torch.device, rank: Rank = SINGLE) -> None:
        self.shuffle, self.device, self.rank = ResumableLoader(loader), device, rank

    def __len__(self) -> int:
        return len(self.shuffle)

    def __iter__(self):
        # Every rank draws the same global batch (same seed) and trains on its slice of it.
        for xb, yb in self.shuffle:
            yield _to(shard(xb, self.rank), self.device), _to(shard(yb, self.rank), self.device)


def _to(value, device: torch.device):
    if value is None:
        return None
    if isinstance(value, tuple):
        return tuple(t.to(device) for t in value)
    if isinstance(value, dict):
        return {k: t.to(device) for k, t in value.items()}
    return value.to(device)


def _loader(ctx: JobContext):
    return make_loader(ctx.train_x, ctx.train_y, ctx.params.batch_size, seed=ctx.params.seed)


def create_pruned(ctx: JobContext, create: Callable, record: str) -> nn.Module:
    """`create` (create_compressed_retrain_model or create_prune_retrain_model) on the job's files. With
    `bn_recalibration_batches`, that many training batches (the job's batch size and shuffle) re-estimate
    the pruned model's BatchNorms before it trains; report.json says how many BatchNorms."""
    batches = ctx.params.bn_recalibration_batches
    extra = {"calibration_data": _loader(ctx), "calibration_batches": batches} if batches else {}
    model = create(ctx.model_path, ctx.example, ctx.cfg_path, record, **extra)
    prune_report = getattr(model, "amct_prune_report", None)
    if prune_report is not None:
        ctx.report["pruning"] = pruning_section(prune_report)
    if batches:
        ctx.report["bn_recalibration"] = {
            "batches": batches,
            "batch_norms": prune_report.bn_recalibrated if prune_report else 0,
        }
    return model


def pruning_section(prune_report) -> dict:
    """report.json's `pruning`: what the engine removed (amct_engine/prune/report.py's PruneReport), the
    attention heads and the channels (a transformer's FFN neurons, a CNN's filters) counted apart, and every
    pruned group with its layers."""
    pruned = prune_report.pruned_groups
    totals = {}
    for unit in ("heads", "channels"):
        groups = [g for g in pruned if g.unit == unit]
        totals[unit] = {
            "groups": len(groups),
            "before": sum(g.channels for g in groups),
            "after": sum(g.kept for g in groups),
        }
    return {
        "parameters": {"before": prune_report.params_before, "after": prune_report.params_after},
        **totals,
        "groups": [
            {"layers": g.producers, "unit": g.unit, "before": g.channels, "after": g.kept, "importance": g.importance}
            for g in pruned
        ],
        # the groups the cfg reaches that kept every channel (disabled by the graph, or a ratio that rounds to 0)
        "not_pruned": sum(1 for g in prune_report.groups if g.status not in (PRUNED, REPLAYED, NOT_CONFIGURED)),
    }


def train(ctx: JobContext, model: nn.Module) -> nn.Module:
    """Train with progress, checkpoints, resume and cancel; in a distributed job, data-parallel over the ranks
    (job_process/distributed.py), after which only rank 0 returns (the others raise RankDone)."""
    ctx.phase("training")
    model.to(ctx.device)
    loader = DeviceLoader(_loader(ctx), ctx.device, ctx.rank)
    trained = distributed.wrap(model, ctx.rank, ctx.device)  # DDP: rank 0's weights broadcast to all
    optimizer = make_optimizer("adam", [p for p in model.parameters() if p.requires_grad], ctx.params.lr)
    start_step = ctx.checkpoints.restore_training(model, optimizer, loader)
    after_step = ctx.checkpoints.training_hook(model, optimizer, loader)

    def on_step(event: dict) -> None:
        check_step_loss(event, ctx.params.lr)  # a NaN step stops here, before it is checkpointed
        ctx.losses.append(event["loss"])
        ctx.on_step(event)
        after_step(event)

    train_epochs(
        trained,
        loader,
        ctx.params.epochs,
        ctx.params.lr,
        optimizer=optimizer,
        progress=on_step,
        start_step=start_step,
        loss_fn=ctx.loss_fn,
    )
    distributed.sync_buffers(model, ctx.rank)  # one set of BatchNorm statistics: the ranks' averaged
    model.cpu()
    torch.save(model.state_dict(), ctx.path("checkpoint.pt"))
    ctx.files["checkpoint"] = ctx.path("checkpoint.pt")
    # One eval-mode forward writes the final quantisation factors to the record (docs/spec/engine.md §1.2).
    ctx.phase("calibrating")
    model.eval()
    with torch.no_grad():
        model(*ctx.example)
    if ctx.rank.distributed:
        ctx.report["distributed"] = distributed.compare_ranks(ctx.rank, model, Path(ctx.path("record.txt")), ctx.device)
    return model


def export_options(ctx: JobContext) -> dict:
    """Input/output names, the deploy layout and the deploy CPU the job asked for (default: onnx, auto)."""
    return {
        **ctx.io,
        "deploy_format": ctx.params.deploy_format,
        "deploy_target": ctx.params.deploy_target,
    }


def add_saved_models(ctx: JobContext, paths) -> None:
    """Record the fake-quant and deploy files a `save_*` call wrote (its return value, or the default names)."""
    from amct_engine.export.save import output_paths

    paths = paths or output_paths(ctx.path("model"))
    ctx.files["fake_quant"], ctx.files["deploy"] = paths["fake_quant"], paths["deploy"]


def quant_retrain(ctx: JobContext) -> nn.Module:
    config, record = ctx.path("quant_config.json"), ctx.path("record.txt")
    ctx.phase("creating")
    amct.create_quant_retrain_config(config, ctx.model_path, ctx.example, ctx.cfg_path)
    model = amct.create_quant_retrain_model(config, ctx.model_path, record, ctx.example)
    model = train(ctx, model)
    ctx.phase("exporting_onnx")
    add_saved_models(
        ctx, amct.save_quant_retrain_model(config, model, record, ctx.path("model"), ctx.example, **export_options(ctx))
    )
    ctx.files.update(config=config, record=record)
    return model


def compressed_retrain(ctx: JobContext) -> nn.Module:
    record = ctx.path("record.txt")
    ctx.phase("creating")
    model = create_pruned(ctx, amct.create_compressed_retrain_model, record)
    model = train(ctx, model)
    ctx.phase("exporting_onnx")
    add_saved_models(
        ctx, amct.save_compressed_retrain_model(model, record, ctx.path("model"), ctx.example, **export_options(ctx))
    )
    ctx.files["record"] = record
    return model


def prune_retrain(ctx: JobContext) -> nn.Module:
    record = ctx.path("record.txt")
    ctx.phase("creating")
    model = create_pruned(ctx, amct.create_prune_retrain_model, record)
    model = train(ctx, model)
    ctx.phase("exporting_onnx")
    add_saved_models(ctx, amct.save_prune_retrain_model(model, ctx.path("model"), ctx.example, **export_options(ctx)))
    ctx.files["record"] = record
    return model


def distill(ctx: JobContext) -> nn.Module:
    config, record = ctx.path("distill_config.json"), ctx.path("record.txt")
    ctx.phase("creating")
    amct.create_distill_config(config, ctx.model_path, ctx.example, ctx.cfg_path)
    student = amct.create_distill_model(config, ctx.model_path, ctx.example)
    ctx.phase("distilling")
    # The teacher is the original model file: the engine captures it with its layer names.
    loader = DeviceLoader(_loader(ctx), ctx.device)
    student = _distill_groups(ctx, student.to(ctx.device), config, loader).cpu()
    torch.save(student.state_dict(), ctx.path("checkpoint.pt"))
    ctx.files["checkpoint"] = ctx.path("checkpoint.pt")
    student.eval()
    ctx.phase("exporting_onnx")
    paths = amct.save_distill_model(student, ctx.path("model"), ctx.example, record, **export_options(ctx))
    add_saved_models(ctx, paths)
    ctx.files.update(config=config, record=record)
    return student


def _distill_groups(ctx: JobContext, student: nn.Module, config: str, loader: DeviceLoader) -> nn.Module:
    """amct.distill over the groups not trained yet, with a checkpoint after each group.

    The engine trains group after group with a fresh optimizer each, so a finished group is a
    complete resume point: a resumed attempt loads the student and distills the remaining groups
    (a copy of the config listing only those). The data order of the resumed groups repeats with the
    seed but is not the uninterrupted run's when the teacher is not dumped (`data_dump: false`).
    """
    with open(config) as f:
        body = json.load(f)
    groups = body["distill_group"]
    per_group = ctx.params.epochs * len(loader)
    done = ctx.checkpoints.restore_distill(student, len(groups), per_group)
    if done == len(groups):  # the crash came after the last group: nothing left to train
        return student.eval()
    if done:
        config = ctx.path("distill_config.resume.json")
        with open(config, "w") as f:
            json.dump({**body, "distill_group": groups[done:]}, f)

    def on_step(event: dict) -> None:
        step = done * per_group + event["step"]  # the engine counts this call's steps from 1
        # Groups are numbered from 1 for people (distill-config, checkpoint events); the engine's is an index.
        ctx.on_step({**event, "group": done + event["group"] + 1, "step": step, "total_steps": len(groups) * per_group})
        ctx.checkpoints.check_cancel()
        if step % per_group == 0:
            ctx.checkpoints.save_distill(student, step // per_group, step, len(groups), per_group)

    return amct.distill(
        ctx.model_path, student, config, loader, epochs=ctx.params.epochs, lr=ctx.params.lr, progress=on_step
    )
