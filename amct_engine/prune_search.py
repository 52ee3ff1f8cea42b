"""Budgeted channel-prune search (AMCT's auto_channel_prune_search role, docs/spec/engine.md §4.13).

1. The damage of each channel group at each ratio of a ladder, one group at a time, measured on the
   model `create_prune_retrain_model` builds (BCP's channels removed, BatchNorms re-estimated on the
   calibration batches).
2. Damages of a choice (a ratio per group) are estimated as their sum; the choices that reach the
   MACs target without cutting more than they need (the frontier) are ranked by that estimate, every
   combination tried when there are few, else one greedy choice (the step "one group one rung up"
   with the least added damage per multiply-accumulate saved, from no pruning).
3. The best few choices are built and measured whole, and the least damaged is taken: damages do not
   add up (cutting two neighbouring groups hurts less than the sum of each alone), so the estimate
   only ranks.

The result is a retrain ``.cfg`` with one BCP override per pruned producer, which
`create_prune_retrain_model` (and so `prune_retrain` / `compressed_retrain`) reads as it is.
"""

from __future__ import annotations

import itertools
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

RATIOS = (0.125, 0.25, 0.375, 0.5, 0.625, 0.75)
# Up to this many rung combinations (7 rungs: 5 groups) every one is tried; beyond, one greedy choice.
EXHAUSTIVE_LIMIT = 20_000
# How many of the best-estimated choices are built and measured whole.
MEASURED_CHOICES = 8


@dataclass
class PruneSearchResult:
    ratios: dict[str, float]  # producer layer -> prune ratio
    target_macs_ratio: float
    estimated_macs_ratio: float
    measured_macs_ratio: float  # of the model create_prune_retrain_model builds from the cfg
    estimated_damage: float  # sum of the single-group damages
    measured: dict  # deviation of the pruned model (BN recalibrated, not fine-tuned)
    cfg_file: str
    steps: list[dict] = field(default_factory=list)  # the choice applied group by group
    damages: list[dict] = field(default_factory=list)  # each group alone at each ratio
    choices: list[dict] = field(default_factory=list)  # the choices measured whole, best estimate first


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
        lines.append(
            f'override_layer_configs {{ layer_name: "{name}" prune_config {{ filter_pruner {{ '
            f"balanced_l2_norm_filter_prune {{ prune_ratio: {ratio:g} ascend_optimized: false }} }} }} }}"
        )
    return "\n".join(lines) + "\n"


def model_macs(model: nn.Module, input_data) -> int:
    """Multiply-accumulates of the model's Conv/Linear layers for one sample."""
    types = layer_types(model, input_data)
    return sum(
        c[0] for c in layer_costs(capture_model(model, as_input_tuple(input_data)).module, input_data, types).values()
    )


def _pruned(model, input_data, ratios: dict[str, float], batches: list, workdir: str) -> nn.Module:
    """What `create_prune_retrain_model` builds from the cfg of `ratios` (eval mode): channels removed, the
    BatchNorms re-estimated on the calibration batches.

    The search measures each group this way, not with masks on the BN-folded model: masks leave the
    following BatchNorms with the unpruned network's statistics, which overstated the damage of cutting
    a layer followed by conv + BN (Fashion-MNIST CNN, conv1 at 0.5: 16 points masked, 4.7 built), so
    the greedy cut conv2, the BN-free side, to a quarter instead (docs/spec/engine.md §4.13).
    """
    from amct_engine.prune_retrain import create_prune_retrain_model

    cfg = Path(workdir, "probe.cfg")
    cfg.write_text(retrain_cfg_text(ratios))
    pruned = create_prune_retrain_model(
        model, input_data, str(cfg), str(Path(workdir, "probe_record.txt")), calibration_data=batches
    )
    return pruned.eval()


def _damage_table(
    model, input_data, groups, ratios, batches, eval_data, reference, eval_labels, report
) -> dict[tuple[int, int], float]:
    """damages[(group id, rung)] of each group alone at each rung (1-based).

    Made non-decreasing along the ladder: cutting more of a group is never scored better than cutting
    less; a dip is measurement noise (one image of 2,000 is 0.05 points) that the ranking would chase.
    """
    damages = {}
    with tempfile.TemporaryDirectory() as tmp:
        for group in groups:
            worst = 0.0
            for rung, ratio in enumerate(ratios, 1):
                pruned = _pruned(model, input_data, {name: ratio for name in group.producer_names}, batches, tmp)
                worst = max(worst, deviation(outputs(pruned, eval_data), reference, eval_labels).damage)
                damages[(group.id, rung)] = worst
                report()
    return damages


def _shares(shares: dict[tuple[int, int], float], rungs: dict[int, int]) -> dict[int, float]:
    return {gid: shares[(gid, r)] for gid, r in rungs.items() if r}


def _frontier(groups, shares, costs, target: float, rungs: int) -> list[dict[int, int]]:
    """Every choice of rungs whose MACs are at most `target` and that no group could take one rung lower
    without leaving it; none within the target: every group at the top rung."""
    found = []
    for combo in itertools.product(range(rungs + 1), repeat=len(groups)):
        choice = {g.id: r for g, r in zip(groups, combo, strict=True)}
        if _macs(costs, groups, _shares(shares, choice)) > target:
            continue
        if not any(
            r and _macs(costs, groups, _shares(shares, {**choice, gid: r - 1})) <= target for gid, r in choice.items()
        ):
            found.append(choice)
    return found or [{g.id: rungs for g in groups}]


def _greedy(groups, damages, shares, costs, total: float, target: float, rungs: int) -> dict[int, int]:
    """From no pruning, the step "one group one rung up" with the least added damage per MAC saved,
    until the MACs are at most `target`."""
    rung, macs = {g.id: 0 for g in groups}, total
    while macs > target:
        best = None
        for g in groups:
            if rung[g.id] == rungs:
                continue
            trial = {**rung, g.id: rung[g.id] + 1}
            gain = macs - _macs(costs, groups, _shares(shares, trial))
            added = damages[(g.id, trial[g.id])] - damages.get((g.id, rung[g.id]), 0.0)
            if gain > 0 and (best is None or added / gain < best[0]):
                best = (added / gain, g, gain)
        if best is None:
            break
        rung[best[1].id] += 1
        macs -= best[2]
    return rung


def _progress(total: int, progress: Callable[[int, int], None] | None) -> Callable[[], None]:
    done = [0]

    def report() -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0], total)

    return report


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
    """Find per-group prune ratios that bring the MACs to `target_macs_ratio` of the model's.

    `progress(done, total)` after each group and ratio measured, then after each choice measured whole.
    """
    if not 0 < target_macs_ratio < 1:
        raise ValueError(f"target_macs_ratio must lie in (0, 1), got {target_macs_ratio}")
    space = _SearchSpace(model, input_data, calibration_data, eval_data, ratios, target_macs_ratio)
    frontier = space.frontier()
    report = _progress(
        len(space.groups) * len(ratios) + (min(MEASURED_CHOICES, len(frontier)) if frontier else 1), progress
    )
    batches = [(as_input_tuple(b),) for b in calibration_data]  # (inputs,): the calibration reader's batch form
    space.damages = _damage_table(
        model, input_data, space.groups, ratios, batches, eval_data, space.reference, eval_labels, report
    )
    if frontier is None:
        candidates = [
            _greedy(space.groups, space.damages, space.shares, space.costs, space.total, space.target, len(ratios))
        ]
    else:
        candidates = sorted(frontier, key=lambda c: (space.estimate(c), -space.macs(c)))[:MEASURED_CHOICES]
    measured = []
    with tempfile.TemporaryDirectory() as tmp:
        for choice in candidates:
            pruned = _pruned(model, input_data, space.named(choice), batches, tmp)
            dev = deviation(outputs(pruned, eval_data), space.reference, eval_labels)
            measured.append(
                (dev.damage, -space.macs(choice), len(measured), choice, dev, model_macs(pruned, input_data))
            )
            report()
    _, _, _, choice, dev, built_macs = min(measured)
    Path(cfg_file).write_text(retrain_cfg_text(space.named(choice)))
    return space.result(choice, dev, built_macs, measured, str(cfg_file))


class _SearchSpace:
    """The groups that may lose channels, the MACs each ratio saves, and (once measured) the damage each does
    alone; a choice maps a group id to its rung (0: untouched, r: ratios[r - 1])."""

    def __init__(self, model, input_data, calibration_data, eval_data, ratios, target_macs_ratio: float) -> None:
        base = float_twin(calibrate(model, input_data, calibration_data[:1], {}))
        self.reference = outputs(base, eval_data)
        self.costs = layer_costs(base, input_data, layer_types(base, input_data))
        self.total = sum(c[0] for c in self.costs.values())
        self.target_ratio, self.target = target_macs_ratio, target_macs_ratio * self.total
        captured = capture_model(base, as_input_tuple(input_data))
        self.groups = [g for g in build_channel_groups(captured).groups if not g.disabled]
        self.ratios = ratios
        self.shares = {
            (g.id, rung): 1 - remain_count(g.size, ratio, False, g.divisions) / g.size
            for g in self.groups
            for rung, ratio in enumerate(ratios, 1)
        }
        self.damages: dict[tuple[int, int], float] = {}

    def frontier(self) -> list[dict[int, int]] | None:
        """Every choice on the MACs target's frontier, or None when there are too many to enumerate."""
        rungs = len(self.ratios)
        if (rungs + 1) ** len(self.groups) > EXHAUSTIVE_LIMIT:
            return None
        return _frontier(self.groups, self.shares, self.costs, self.target, rungs)

    def estimate(self, choice: dict[int, int]) -> float:
        return sum(self.damages[(gid, r)] for gid, r in choice.items() if r)

    def macs(self, choice: dict[int, int]) -> float:
        return _macs(self.costs, self.groups, _shares(self.shares, choice))

    def named(self, choice: dict[int, int]) -> dict[str, float]:
        return {name: self.ratios[choice[g.id] - 1] for g in self.groups if choice[g.id] for name in g.producer_names}

    def result(self, choice, dev, built_macs: float, measured: list, cfg_file: str) -> PruneSearchResult:
        steps, applied = [], {}
        for g in self.groups:  # the choice, applied group by group
            if choice[g.id]:
                applied[g.id] = choice[g.id]
                steps.append(
                    {
                        "group": g.producer_names,
                        "ratio": self.ratios[choice[g.id] - 1],
                        "damage": self.damages[(g.id, choice[g.id])],
                        "macs_ratio": self.macs(applied) / self.total,
                    }
                )
        return PruneSearchResult(
            ratios=self.named(choice),
            target_macs_ratio=self.target_ratio,
            estimated_macs_ratio=self.macs(choice) / self.total,
            measured_macs_ratio=built_macs / self.total,
            estimated_damage=self.estimate(choice),
            measured={"top1_drop": dev.top1_drop, "cosine": dev.cosine},
            cfg_file=cfg_file,
            steps=steps,
            damages=[
                {
                    "group": g.producer_names,
                    "ratio": self.ratios[r - 1],
                    "damage": self.damages[(g.id, r)],
                    "share": self.shares[(g.id, r)],
                }
                for g in self.groups
                for r in range(1, len(self.ratios) + 1)
            ],
            choices=[
                {
                    "ratios": self.named(c),
                    "estimated_damage": self.estimate(c),
                    "damage": d,
                    "macs_ratio": -m / self.total,
                }
                for d, m, _, c, _, _ in measured
            ],
        )
