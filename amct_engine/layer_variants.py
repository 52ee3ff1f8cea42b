"""Per-layer variants of one model for the sensitivity analysis and the mixed-precision search.

A *variant* of a layer is its PTQ form at one (activation, weight) bit pair, calibrated once per
pair with every layer quantised (docs/spec/engine.md §4.11), or its BN-folded float form with a
share of its output channels masked. Any mix of variants is composed by module path onto the
BN-folded float model, so a candidate is measured without calibrating again; the PTQ layers
compute what the deploy model computes (docs/spec/engine.md §1.6).
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from amct_engine.config.calibration_cfg import PtqConfig, PtqLayerSpec
from amct_engine.config.ptq_json import write_ptq_config
from amct_engine.export.save import quant_layers
from amct_engine.graph.analysis import quantizable_layers
from amct_engine.graph.capture import as_input_tuple, capture_model
from amct_engine.layer_table import retrain_type_names
from amct_engine.layers import behaviour_of

# The precisions a layer may get, as (activation bits, weight bits); None keeps it float.
PRECISIONS: dict[str, tuple[int, int] | None] = {"INT4": (8, 4), "INT8": (8, 8), "INT16": (16, 8), "FP32": None}
EVAL_CHUNK = 500


def layer_types(model: nn.Module, example) -> dict[str, str]:
    cm = capture_model(model, as_input_tuple(example))
    return {info.name: info.type_name for info in quantizable_layers(cm, retrain_type_names())}


def calibrate(
    model: nn.Module, example, batches: Sequence, pairs: dict[str, tuple[int, int]], activation_offset: bool = True
) -> nn.Module:
    """The PTQ calibration model with each layer at its (act, weight) pair, after `batches`."""
    from amct_engine.ptq import quantize_model

    types = layer_types(model, example)
    config = PtqConfig(batch_num=len(batches), activation_offset=activation_offset)
    config.layers = {
        name: PtqLayerSpec(
            enabled=name in pairs, act_bits=pairs.get(name, (8, 8))[0], wts_bits=pairs.get(name, (8, 8))[1]
        )
        for name in types
    }
    with tempfile.TemporaryDirectory() as tmp:
        write_ptq_config(Path(tmp, "ptq.json"), config)
        calibration = quantize_model(
            str(Path(tmp, "ptq.json")), str(Path(tmp, "fused.onnx")), str(Path(tmp, "record.txt")), model, example
        )
        with torch.no_grad():
            for batch in batches:
                calibration(*as_input_tuple(batch))
    return calibration


def float_twin(calibration: nn.Module) -> nn.Module:
    """The BN-folded float model under a calibration model: every PTQ layer back to its layer."""
    twin = copy.deepcopy(calibration)
    for path, wrapper in quant_layers(twin).items():
        twin.set_submodule(path, wrapper.layer)
    return twin


@torch.no_grad()
def outputs(model: nn.Module, inputs) -> torch.Tensor:
    """The model's (first) output over held-out inputs, in chunks, flattened per sample."""
    inputs = as_input_tuple(inputs)
    parts = []
    for begin in range(0, len(inputs[0]), EVAL_CHUNK):
        y = model(*(t[begin : begin + EVAL_CHUNK] for t in inputs))
        y = y[0] if isinstance(y, (tuple, list)) else y
        parts.append(y.float().reshape(len(y), -1))
    return torch.cat(parts)


@dataclass(frozen=True)
class Deviation:
    """How far a model's outputs are from the float reference on held-out data."""

    top1_drop: float | None  # accuracy points lost (percentage points), None without labels
    cosine: float  # mean per-sample cosine to the reference output
    mse: float

    @property
    def damage(self) -> float:
        """What the tables sort by: the top-1 drop for classifiers, else 100 x (1 - cosine)."""
        return self.top1_drop if self.top1_drop is not None else 100.0 * (1.0 - self.cosine)


def deviation(out: torch.Tensor, reference: torch.Tensor, labels: torch.Tensor | None) -> Deviation:
    drop = None
    if labels is not None:
        labels = labels.reshape(-1)
        drop = 100.0 * float((reference.argmax(1) == labels).float().mean() - (out.argmax(1) == labels).float().mean())
    cosine = float(F.cosine_similarity(out, reference, dim=1).mean())
    return Deviation(drop, cosine, float((out - reference).square().mean()))


def layer_costs(model: nn.Module, example, names: Iterable[str]) -> dict[str, tuple[int, int]]:
    """(multiply-accumulates per sample, weight parameters) of each named Conv/Linear layer."""
    names, costs, hooks = list(names), {}, []

    def hook(name):
        def record(module, args, out):
            weight = module.weight
            macs = behaviour_of(module).macs(module, args[0][0], out[0])
            costs[name] = (int(macs), int(weight.numel()))

        return record

    for name in names:
        hooks.append(model.get_submodule(name).register_forward_hook(hook(name)))
    try:
        with torch.no_grad():
            model(*(t[:1] for t in as_input_tuple(example)))
    finally:
        for h in hooks:
            h.remove()
    return costs
