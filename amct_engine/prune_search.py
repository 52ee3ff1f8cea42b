"""Budgeted channel-prune search (AMCT's auto_channel_prune_search role, docs/spec/engine.md §4.13).

Greedy over the sensitivity of each channel group at a ladder of prune ratios: starting from no
pruning, the step (one group one rung up) with the least added damage per multiply-accumulate
saved is taken until the model's MACs reach the target share. Damages are measured one group at a
time (docs/spec/engine.md §4.11, BCP's channels masked) and added up; the result is a retrain
``.cfg`` with one BCP override per pruned producer, which `create_prune_retrain_model` (and so
`prune_retrain` / `compressed_retrain`) reads as it is, and which is applied once here to measure
the MACs and the accuracy (no fine-tuning) it really gives.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from amct_engine.graph.capture import as_input_tuple, capture_model
from amct_engine.layer_variants import calibrate, deviation, float_twin, layer_costs, layer_types, outputs
from amct_engine.prune.bcp import remain_count
from amct_engine.prune.channel_groups import IN, OUT
from amct_engine.prune.dependency import build_channel_groups
from amct_engine.sensitivity import _masked, swapped

RATIOS = (0.125, 0.25, 0.375, 0.5, 0.625, 0.75)


@dataclass
class PruneSearchResult:
    ratios: dict[str, float]  # producer layer -> prune ratio
    target_macs_ratio: float
    estimated_macs_ratio: float
    measured_macs_ratio: float  # of the model create_prune_retrain_model builds from the cfg
    estimated_damage: float  # sum of the single-group damages
    measured: dict  # deviation of the pruned model (BN recalibrated, not fine-tuned)
    cfg_file: str
    steps: list[dict] = field(default_factory=list)


def _macs(costs: dict[str, tuple[int, int]], groups, shares: dict[int, float]) -> float:
    """The layers' MACs when each group loses its share of channels: a layer keeps (1 - share of the
    group it feeds from) x (1 - share of the group it produces), so two pruned neighbours multiply."""
    keep = {name: 1.0 for name in costs}
    for g in groups:
        for name in {m.name for m in g.members if m.kind in (OUT, IN) and m.name in costs}:
            keep[name] *= 1.0 - shares.get(g.id, 0.0)
    return sum(costs[n][0] * keep[n] for n in costs)


def retrain_cfg_text(ratios: dict[str, float]) -> str:
    """A retrain cfg (docs/spec/engine.md §2.2) pruning each named producer at its ratio with BCP."""
    lines = ["# written by amct_engine.prune_search: one BCP override per pruned producer"]
    for name, ratio in ratios.items():
        lines.append(f'override_layer_configs {{ layer_name: "{name}" prune_config {{ filter_pruner {{ '
                     f'balanced_l2_norm_filter_prune {{ prune_ratio: {ratio:g} ascend_optimized: false }} }} }} }}')
    return "\n".join(lines) + "\n"


def _model_macs(model: nn.Module, input_data) -> int:
    types = layer_types(model, input_data)
    return sum(c[0] for c in layer_costs(capture_model(model, as_input_tuple(input_data)).module, input_data,
                                         types).values())


def auto_channel_prune_search(
    model: nn.Module,
    input_data,
    calibration_data: Sequence,
    eval_data,
    eval_labels: torch.Tensor | None,
    target_macs_ratio: float,
    cfg_file: str | os.PathLike,
    ratios: Sequence[float] = RATIOS,
    progress: Callable[[int, int], None] | None = None,
) -> PruneSearchResult:
    """Find per-group prune ratios that bring the MACs to `target_macs_ratio` of the model's."""
    from amct_engine.prune_retrain import create_prune_retrain_model

    if not 0 < target_macs_ratio < 1:
        raise ValueError(f"target_macs_ratio must lie in (0, 1), got {target_macs_ratio}")
    base = float_twin(calibrate(model, input_data, calibration_data[:1], {}))
    reference = outputs(base, eval_data)
    types = layer_types(base, input_data)
    costs = layer_costs(base, input_data, types)
    total = sum(c[0] for c in costs.values())
    groups = [g for g in build_channel_groups(capture_model(base, as_input_tuple(input_data))).groups if not g.disabled]
    # table[(group, rung)] = (damage, channel share removed); rung 0 is no pruning.
    table, jobs, done = {}, len(groups) * len(ratios), 0
    for group in groups:
        for rung, ratio in enumerate(ratios, 1):
            masked = _masked(base, group, ratio)
            share = 1 - remain_count(group.size, ratio, False, group.divisions) / group.size
            with swapped(base, masked) as pruned:
                dev = deviation(outputs(pruned, eval_data), reference, eval_labels)
            table[(group.id, rung)] = (max(dev.damage, 0.0), share)
            done += 1
            if progress is not None:
                progress(done, jobs)
    rung = {g.id: 0 for g in groups}

    def shares(rungs) -> dict[int, float]:
        return {gid: table[(gid, r)][1] for gid, r in rungs.items() if r}

    macs, damage, steps = float(total), 0.0, []
    while macs > target_macs_ratio * total:
        best = None
        for g in groups:
            if rung[g.id] == len(ratios):
                continue
            trial = {**rung, g.id: rung[g.id] + 1}
            gain = macs - _macs(costs, groups, shares(trial))
            added = table[(g.id, trial[g.id])][0] - table.get((g.id, rung[g.id]), (0.0, 0.0))[0]
            if gain > 0 and (best is None or added / gain < best[0]):
                best = (added / gain, g, added, gain)
        if best is None:
            break
        _, g, added, gain = best
        rung[g.id] += 1
        macs, damage = macs - gain, damage + added
        steps.append({"group": g.producer_names, "ratio": ratios[rung[g.id] - 1], "damage": added,
                      "macs_ratio": macs / total})
    chosen = {name: ratios[rung[g.id] - 1] for g in groups if rung[g.id] for name in g.producer_names}
    Path(cfg_file).write_text(retrain_cfg_text(chosen))
    with tempfile.TemporaryDirectory() as tmp:
        pruned = create_prune_retrain_model(model, input_data, str(cfg_file), str(Path(tmp, "record.txt")),
                                            calibration_data=[as_input_tuple(b)[0] for b in calibration_data])
    pruned.eval()
    measured = deviation(outputs(pruned, eval_data), reference, eval_labels)
    return PruneSearchResult(
        ratios=chosen, target_macs_ratio=target_macs_ratio, estimated_macs_ratio=macs / total,
        measured_macs_ratio=_model_macs(pruned, input_data) / total, estimated_damage=damage,
        measured={"top1_drop": measured.top1_drop, "cosine": measured.cosine}, cfg_file=str(cfg_file), steps=steps)
