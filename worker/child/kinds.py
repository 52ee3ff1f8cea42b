"""One function per job kind: plain engine calls, the AMCT workflow a user would write by hand.

Each takes a JobContext and returns the trained model (for PyTorch-side checks) and the files it
wrote, keyed by artifact kind. Nothing here knows about Celery, HTTP or the database.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from amct_engine.data.training import make_loader, train_epochs
from worker.child.engine_api import resolve

IO_NAMES = {"input_names": ["input"], "output_names": ["output"],
            "dynamic_axes": {"input": {0: "batch"}, "output": {0: "batch"}}}


@dataclass
class JobContext:
    workdir: Path
    model_path: str
    cfg_path: str
    example: torch.Tensor
    train_x: torch.Tensor
    train_y: torch.Tensor
    params: dict
    device: torch.device
    on_step: Callable[[dict], None]
    phase: Callable[[str], None]
    files: dict[str, str] = field(default_factory=dict)

    def path(self, name: str) -> str:
        return str(self.workdir / "out" / name)


class DeviceLoader:
    """Moves each batch to the job's device; keeps len() so train_epochs can report total steps."""

    def __init__(self, loader, device: torch.device) -> None:
        self.loader, self.device = loader, device

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        for xb, yb in self.loader:
            yield xb.to(self.device), yb.to(self.device)


def _loader(ctx: JobContext):
    return make_loader(ctx.train_x, ctx.train_y, ctx.params["batch_size"], seed=ctx.params["seed"])


def train(ctx: JobContext, model: nn.Module) -> nn.Module:
    ctx.phase("training")
    model.to(ctx.device)
    train_epochs(model, DeviceLoader(_loader(ctx), ctx.device), ctx.params["epochs"], ctx.params["lr"],
                 progress=ctx.on_step)
    model.cpu()
    torch.save(model.state_dict(), ctx.path("checkpoint.pt"))
    ctx.files["checkpoint"] = ctx.path("checkpoint.pt")
    # One eval-mode forward writes the final quantisation factors to the record (spec §1.2).
    ctx.phase("calibrating")
    model.eval()
    with torch.no_grad():
        model(ctx.example)
    return model


def _export_options(ctx: JobContext) -> dict:
    """Input/output names and the deploy layout the job asked for (default: onnx)."""
    return {**IO_NAMES, "deploy_format": ctx.params.get("deploy_format", "onnx")}


def _saved(ctx: JobContext, paths) -> None:
    from amct_engine.export.save import output_paths

    paths = paths or output_paths(ctx.path("model"))
    ctx.files["fake_quant"], ctx.files["deploy"] = paths["fake_quant"], paths["deploy"]


def quant_retrain(ctx: JobContext) -> nn.Module:
    config, record = ctx.path("quant_config.json"), ctx.path("record.txt")
    ctx.phase("creating")
    resolve("create_quant_retrain_config")(config, ctx.model_path, ctx.example, ctx.cfg_path)
    model = resolve("create_quant_retrain_model")(config, ctx.model_path, record, ctx.example)
    model = train(ctx, model)
    ctx.phase("exporting_onnx")
    _saved(ctx, resolve("save_quant_retrain_model")(config, model, record, ctx.path("model"), ctx.example,
                                                     **_export_options(ctx)))
    ctx.files.update(config=config, record=record)
    return model


def compressed_retrain(ctx: JobContext) -> nn.Module:
    record = ctx.path("record.txt")
    ctx.phase("creating")
    model = resolve("create_compressed_retrain_model")(ctx.model_path, ctx.example, ctx.cfg_path, record)
    model = train(ctx, model)
    ctx.phase("exporting_onnx")
    _saved(ctx, resolve("save_compressed_retrain_model")(model, record, ctx.path("model"), ctx.example,
                                                          **_export_options(ctx)))
    ctx.files["record"] = record
    return model


def prune_retrain(ctx: JobContext) -> nn.Module:
    record = ctx.path("record.txt")
    ctx.phase("creating")
    model = resolve("create_prune_retrain_model")(ctx.model_path, ctx.example, ctx.cfg_path, record)
    model = train(ctx, model)
    ctx.phase("exporting_onnx")
    _saved(ctx, resolve("save_prune_retrain_model")(model, ctx.path("model"), ctx.example, **_export_options(ctx)))
    ctx.files["record"] = record
    return model


def distill(ctx: JobContext) -> nn.Module:
    config, record = ctx.path("distill_config.json"), ctx.path("record.txt")
    ctx.phase("creating")
    resolve("create_distill_config")(config, ctx.model_path, ctx.example, ctx.cfg_path)
    student = resolve("create_distill_model")(config, ctx.model_path, ctx.example)
    ctx.phase("distilling")
    run = resolve("distill")
    kwargs = {"epochs": ctx.params["epochs"], "lr": ctx.params["lr"]}
    if "progress" in inspect.signature(run).parameters:
        kwargs["progress"] = ctx.on_step
    # The teacher is the original model file: the engine captures it with its layer names.
    loader = DeviceLoader(_loader(ctx), ctx.device)
    student = run(ctx.model_path, student.to(ctx.device), config, loader, **kwargs).cpu()
    torch.save(student.state_dict(), ctx.path("checkpoint.pt"))
    ctx.files["checkpoint"] = ctx.path("checkpoint.pt")
    student.eval()
    ctx.phase("exporting_onnx")
    _saved(ctx, resolve("save_distill_model")(student, ctx.path("model"), ctx.example, record,
                                                 **_export_options(ctx)))
    ctx.files.update(config=config, record=record)
    return student


RUNNERS: dict[str, Callable[[JobContext], nn.Module]] = {
    "quant_retrain": quant_retrain,
    "compressed_retrain": compressed_retrain,
    "prune_retrain": prune_retrain,
    "distill": distill,
}
