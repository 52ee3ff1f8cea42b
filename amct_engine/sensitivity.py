"""Per-layer sensitivity analysis (docs/spec/engine.md §4.11): which layers hurt when quantised or pruned.

From the PTQ-calibrated model, one layer at a time is put at INT8 or INT4 (A8W4), or one channel
group loses a share of its channels (BCP's choice, docs/spec/engine.md §4.4, masked: the producers' rows and biases
zeroed, which is what removing them gives when the activation keeps 0 at 0), everything else
stays float; the output on held-out data is compared with the float model's. The table is sorted
by damage (top-1 drop in points for classifiers, else 100 x (1 - output cosine)) and gives each
layer's share of the model's multiply-accumulates and weight bytes.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from amct_engine.export.save import quant_layers
from amct_engine.graph.capture import as_input_tuple, capture_model
from amct_engine.layer_variants import (
    PRECISIONS,
    calibrate,
    deviation,
    float_twin,
    layer_costs,
    layer_types,
    outputs,
)
from amct_engine.layers import entry_of
from amct_engine.prune.bcp import bcp_importance, select_pruned_channels
from amct_engine.prune.dependency import build_channel_groups


@dataclass(frozen=True)
class SensitivityRow:
    layer: str  # module path; a channel group lists its producers joined by ","
    layer_type: str
    variant: str  # "INT8", "INT4", "prune 0.5"
    top1_drop: float | None
    cosine: float
    mse: float
    damage: float
    macs_share: float  # of the quantizable layers' total
    bytes_share: float


@dataclass
class SensitivityTable:
    fp32_top1: float | None
    rows: list[SensitivityRow] = field(default_factory=list)

    def ranking(self, variant: str) -> list[str]:
        """Layers of one variant, most damaged first."""
        return [r.layer for r in self.rows if r.variant == variant]

    def damage(self, layer: str, variant: str) -> float:
        return next(r.damage for r in self.rows if r.layer == layer and r.variant == variant)

    def to_json(self) -> dict:
        return {"fp32_top1": self.fp32_top1, "rows": [asdict(r) for r in self.rows]}


@contextlib.contextmanager
def swapped(model: nn.Module, modules: dict[str, nn.Module]):
    """`model` with `modules` put in at their paths for the duration, then restored."""
    saved = {path: model.get_submodule(path) for path in modules}
    try:
        for path, module in modules.items():
            model.set_submodule(path, module)
        yield model
    finally:
        for path, module in saved.items():
            model.set_submodule(path, module)


def _masked(model: nn.Module, group, ratio: float) -> dict[str, nn.Module]:
    """Copies of the group's producers with BCP's `ratio` of channels zeroed (weight rows and bias)."""
    pruned = select_pruned_channels(bcp_importance(group, model), ratio, ascend_optimized=False, group=group.divisions)
    out = {}
    for member in group.producers:
        layer = model.get_submodule(member.name)
        entry = entry_of(layer)
        if entry is None or not entry.behaviour().rows_are_output_channels:  # its filters are not weight rows
            return {}
        masked = out.get(member.name) or copy.deepcopy(layer)
        rows = torch.tensor(member.indices(pruned), dtype=torch.long)
        with torch.no_grad():
            masked.weight[rows] = 0
            if masked.bias is not None:
                masked.bias[rows] = 0
        out[member.name] = masked
    return out


def analyse_sensitivity(
    model: nn.Module,
    input_data,
    calibration_data: Sequence,
    eval_data,
    eval_labels: torch.Tensor | None = None,
    precisions: Sequence[str] = ("INT8", "INT4"),
    prune_ratios: Sequence[float] = (),
    progress: Callable[[int, int], None] | None = None,
) -> SensitivityTable:
    """The sensitivity table of `model` (float, eval mode).

    calibration_data: the PTQ calibration batches (tensors or input tuples); eval_data: held-out
    inputs (a tensor or tuple), eval_labels: their classes for a classifier, or None.
    progress(done, total) is called after each measured layer / group and ratio.
    """
    unknown = [p for p in precisions if p not in PRECISIONS or PRECISIONS[p] is None]
    if unknown:
        raise ValueError(f"precisions must be among {[p for p, v in PRECISIONS.items() if v]}, got {unknown}")
    if any(not 0 < r < 1 for r in prune_ratios):
        raise ValueError(f"prune_ratios must lie in (0, 1), got {list(prune_ratios)}")
    types = layer_types(model, input_data)
    models = {p: calibrate(model, input_data, calibration_data, {n: PRECISIONS[p] for n in types}) for p in precisions}
    base = float_twin(next(iter(models.values())))
    groups = []
    if prune_ratios:
        groups = [
            g for g in build_channel_groups(capture_model(base, as_input_tuple(input_data))).groups if not g.disabled
        ]
    rows = _Rows(
        base,
        input_data,
        types,
        eval_data,
        eval_labels,
        len(types) * len(precisions) + len(groups) * len(prune_ratios),
        progress,
    )
    for precision, calibrated in models.items():
        by_layer = {w.layer_name: (path, w) for path, w in quant_layers(calibrated).items()}
        for name in types:
            path, wrapper = by_layer[name]
            with swapped(base, {path: wrapper}) as mixed:
                rows.add([name], precision, mixed)
    for group in groups:
        for ratio in prune_ratios:
            masked = _masked(base, group, ratio)
            if masked:
                with swapped(base, masked) as pruned:
                    rows.add(group.producer_names, f"prune {ratio:g}", pruned)
    rows.table.rows.sort(key=lambda r: -r.damage)
    return rows.table


class _Rows:
    """The table being filled: each variant measured against the float model's outputs, with its layers' share
    of the model's multiply-accumulates and weights."""

    def __init__(self, base, input_data, types, eval_data, eval_labels, jobs: int, progress) -> None:
        self.types, self.eval_data, self.eval_labels = types, eval_data, eval_labels
        self.reference = outputs(base, eval_data)
        self.costs = layer_costs(base, input_data, types)
        self.totals = [max(1, sum(c[i] for c in self.costs.values())) for i in (0, 1)]
        top1 = None
        if eval_labels is not None:
            top1 = float((self.reference.argmax(1) == eval_labels.reshape(-1)).float().mean())
        self.table = SensitivityTable(top1)
        self.jobs, self.progress = jobs, progress

    def add(self, layers: list[str], variant: str, model: nn.Module) -> None:
        dev = deviation(outputs(model, self.eval_data), self.reference, self.eval_labels)
        macs, weights = (sum(self.costs[n][i] for n in layers if n in self.costs) for i in (0, 1))
        self.table.rows.append(
            SensitivityRow(
                ",".join(layers),
                ",".join(self.types.get(n, "?") for n in layers),
                variant,
                None if dev.top1_drop is None else round(dev.top1_drop, 4),
                dev.cosine,
                dev.mse,
                round(dev.damage, 4),
                macs / self.totals[0],
                weights / self.totals[1],
            )
        )
        if self.progress is not None:
            self.progress(len(self.table.rows), self.jobs)
