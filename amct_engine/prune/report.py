"""What pruning did and why: one decision per channel group and per 4:2 layer, logged and returned.

AMCT users see "no pruning happened" without a reason (docs/spec/engine.md §8); here every group says whether it
was pruned, how much, or what stopped it. ``create_*`` attach the report to the returned model as
``model.amct_prune_report`` and log it on the ``amct_engine.prune`` logger.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field

logger = logging.getLogger("amct_engine.prune")

PRUNED = "pruned"  # channels removed
UNCHANGED = "unchanged"  # enabled, but the ratio and rounding keep every channel
DISABLED = "disabled"  # the graph forbids it (unknown consumer, model output, reuse…)
NOT_CONFIGURED = "not_configured"  # a producer is skipped or has no filter prune config
RESTORED = "restored"  # removal broke the forward; the group was put back (bisection)
REPLAYED = "replayed"  # restore_*: removed as the record says


@dataclass
class GroupDecision:
    group: int
    producers: list[str]
    consumers: list[str]
    channels: int
    kept: int
    status: str
    reason: str = ""
    prune_ratio: float | None = None
    ascend_optimized: bool | None = None
    divisions: int = 1
    importance: str | None = None  # the criterion that ranked its channels (importance.py)
    schedule: str | None = None  # progressive pruning (progressive.py): how the mask grows; None: one shot
    unit: str = "channels"  # what its channels are: "heads" for an attention-head group (attention_heads.py)

    def describe(self) -> str:
        who = ", ".join(self.producers)
        if self.status in (PRUNED, REPLAYED):
            how = f", ranked by {self.importance}" if self.importance else ""
            how += f"; {self.schedule}" if self.schedule else ""
            return (
                f"channel group {self.group} [{who}]: {self.channels} → {self.kept} {self.unit} "
                f"({self.channels - self.kept} pruned{how})"
            )
        return f"channel group {self.group} [{who}] not pruned ({self.status}): {self.reason}"


@dataclass
class SelectiveDecision:
    layer: str
    status: str  # "masked" | "skipped"
    reason: str = ""
    sparsity: float = 0.0

    def describe(self) -> str:
        if self.status == "masked":
            return f"4:2 selective pruning on {self.layer}: {self.sparsity:.0%} of the weight masked"
        return f"4:2 selective pruning skips {self.layer}: {self.reason}"


@dataclass
class PruneReport:
    groups: list[GroupDecision] = field(default_factory=list)
    layers: dict[str, str] = field(default_factory=dict)  # configured layers that lead no group, and why
    selective: list[SelectiveDecision] = field(default_factory=list)
    params_before: int = 0
    params_after: int = 0
    bn_recalibrated: int = 0  # BatchNorms whose statistics were re-estimated after pruning (calibration.py)
    bn_recalibrated_quantized: int = 0  # … and again after the QAT layers went in (recalibrate_quantized_bn)

    @property
    def pruned_groups(self) -> list[GroupDecision]:
        return [g for g in self.groups if g.status in (PRUNED, REPLAYED)]

    def as_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        lines = [f"parameters {self.params_before} → {self.params_after}"]
        lines += [g.describe() for g in self.groups if g.status != NOT_CONFIGURED or g.reason]
        lines += [f"layer {name} is not pruned: {why}" for name, why in self.layers.items()]
        lines += [s.describe() for s in self.selective]
        if self.bn_recalibrated:
            lines.append(f"{self.bn_recalibrated} BatchNorms recalibrated on the calibration batches after pruning")
        if self.bn_recalibrated_quantized:
            lines.append(
                f"{self.bn_recalibrated_quantized} BatchNorms recalibrated on the fake-quantised model "
                "after the QAT layers went in"
            )
        return "\n".join(lines)

    def log(self, filter_configured: bool) -> None:
        for g in self.groups:
            if g.status in (PRUNED, REPLAYED):
                logger.info(g.describe())
            elif g.status == RESTORED:
                logger.warning(
                    "%s; add %s to regular_prune_skip_layers to silence this", g.describe(), ", ".join(g.producers)
                )
            elif g.status == NOT_CONFIGURED:
                logger.debug(g.describe())
            else:
                logger.info(g.describe())
        for name, why in self.layers.items():
            logger.info("layer %s is not pruned: %s", name, why)
        for s in self.selective:
            logger.info(s.describe())
        if filter_configured and not self.pruned_groups:
            reasons = "; ".join(g.describe() for g in self.groups if g.status != NOT_CONFIGURED)
            logger.warning(
                "filter pruning is configured but no channel was pruned: %s",
                reasons or "no channel group has a configured producer",
            )
        logger.info("pruning: parameters %d → %d", self.params_before, self.params_after)
