"""What a job works on: its dataset as tensors, split by the job's seed into what it trains on and what its
report is measured on, and the original model with its FP32 ONNX file (docs/service.md, "Report per output")."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from job_host.objective_names import CROSS_ENTROPY, TARGET_OBJECTIVES
from job_host.spec import JobSpec
from job_process.distributed import Rank


def _split(x, y, fraction: float, seed: int, targets=None):
    """A seeded held-out split: the report's numbers come from samples the job never trained on.

    `x` is a tuple of input tensors, `y` labels and `targets` a dict of targets or None (training.take):
    train x, train y, eval x, eval y, train targets."""
    import torch

    from job_process.training import samples, take

    n = samples(x)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_eval = int(round(n * fraction))
    if n - n_eval < 1:
        n_eval = n - 1
    ev, tr = order[:n_eval], order[n_eval:]
    return take(x, tr), take(y, tr), take(x, ev), take(y, ev), take(targets, tr)


def _tensors(spec: JobSpec, arrays: dict):
    """The inputs (a tuple in signature order), labels and targets of the dataset as tensors.

    Inputs take their signature's dtype: floats are cast (an integer image stays unscaled, as
    uploaded), integer inputs (token ids, masks) keep their values and are never normalised.
    """
    import numpy as np
    import torch

    from job_host.signature import input_arrays, target_arrays

    signature = spec.inputs
    sources = input_arrays(signature, arrays)
    x = tuple(
        torch.from_numpy(np.ascontiguousarray(arrays[sources[s["name"]]])).to(getattr(torch, s["dtype"]))
        for s in signature
    )
    labels = torch.from_numpy(arrays["labels"].astype(np.int64)) if "labels" in arrays else None
    targets = {
        out: torch.from_numpy(np.ascontiguousarray(arrays[name])).float()
        for out, name in target_arrays(spec.outputs, arrays).items()
    }
    return x, labels, targets


@dataclass
class JobData:
    """The dataset split for one job: what it trains on, what its report is measured on, and its example."""

    train_x: Any
    train_y: Any
    train_labels: Any
    eval_x: Any
    eval_labels: Any
    split: str  # "held_out", or "train" when the dataset is too small to hold any out
    has_labels: bool
    example: tuple
    batch: int


@dataclass
class Baseline:
    """The original model and what the job measures against: its FP32 ONNX file and its signature's names."""

    model: Any
    io: dict
    fp32_onnx: str
    parameters: int


def prepare_data(spec: JobSpec) -> JobData:
    """The dataset as tensors, split by the job's seed (the targets of mse / l1 alongside), and the example."""
    import torch

    from job_host.arrays import load_arrays
    from job_process.training import samples, take

    params = spec.params
    torch.manual_seed(params.seed)
    arrays = load_arrays(spec.dataset, spec.dataset_format)
    x, labels, targets = _tensors(spec, arrays)
    del arrays
    train_x, train_labels, eval_x, eval_labels, train_targets = _split(
        x, labels, params.eval_fraction, params.seed, targets or None
    )
    train_y = train_targets if (params.objective or CROSS_ENTROPY) in TARGET_OBJECTIVES else train_labels
    split = "held_out"
    if samples(eval_x) == 0:
        first = slice(0, 1000)
        eval_x, eval_labels, split = take(train_x, first), take(train_labels, first), "train"
    batch = spec.input_shape[0]
    example = take(train_x, slice(0, max(1, min(batch, samples(train_x)))))
    return JobData(train_x, train_y, train_labels, eval_x, eval_labels, split, labels is not None, example, batch)


def baseline(spec: JobSpec, workdir: Path, data: JobData, rank: Rank) -> Baseline:
    """The original model, its outputs' structure and ONNX names, and its FP32 file (rank 0 writes it)."""
    import torch

    from amct_engine.export.save import export_onnx
    from job_host.signature import io_names, output_structure

    original = torch.jit.load(spec.model, map_location="cpu").eval()
    if spec.outputs is None:  # `amct compress` (no upload check recorded them) or a pre-signature model
        spec.outputs = output_structure(original, spec.inputs, data.batch)
    io = io_names(spec.inputs, spec.outputs, data.batch)
    fp32_onnx = str(workdir / "out" / "fp32.onnx")
    if rank.leader:
        export_onnx(original, fp32_onnx, data.example, **io)
    return Baseline(original, io, fp32_onnx, sum(p.numel() for p in original.parameters()))
