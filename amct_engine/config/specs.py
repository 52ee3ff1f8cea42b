"""What the cfg asks of one layer, as plain values: quantiser and pruner settings.

The resolver (resolve) builds them from a ``.cfg``, the JSON reader (quant_json) from a JSON
config; the QAT layers and the prune passes read them. Torch-free on purpose.
"""

from __future__ import annotations

from dataclasses import dataclass

DST_BITS = {"INT4": 4, "INT8": 8, "INT16": 16}
BITS_DST = {bits: name for name, bits in DST_BITS.items()}

# docs/spec/engine.md §2.2 (RETRAIN_ACT_WTS_TYPES): the (activation, weight) bit widths QAT accepts.
# AMCT also lists A4W4, but refuses INT4 activations for training, so it is left out here.
RETRAIN_ACT_WTS_BITS = ((8, 8), (16, 8), (8, 4))

# AMCT's weight quantiser when a cfg or a JSON config names none (a WEIGHT_QUANTIZERS name).
DEFAULT_WEIGHT_ALGO = "arq"


def pair_name(act_bits: int, weight_bits: int) -> str:
    """``(8, 4)`` -> ``"A8W4"``."""
    return f"A{act_bits}W{weight_bits}"


@dataclass(frozen=True)
class ActQuantSpec:
    """ULQ activation quantiser settings (docs/spec/engine.md §4.1)."""

    bits: int = 8
    clip_max: float | None = None
    clip_min: float | None = None
    fixed_min: bool | None = None  # None: decided from the graph (input from a ReLU)


@dataclass(frozen=True)
class WeightQuantSpec:
    """Weight quantiser settings (docs/spec/engine.md §4.2); ``algo`` is a WEIGHT_QUANTIZERS name."""

    algo: str = DEFAULT_WEIGHT_ALGO
    channel_wise: bool = True
    bits: int = 8


@dataclass(frozen=True)
class LayerQuantSpec:
    enabled: bool
    act: ActQuantSpec = ActQuantSpec()
    weight: WeightQuantSpec = WeightQuantSpec()


DEFAULT_IMPORTANCE = "bcp"  # AMCT's criterion; an IMPORTANCE_CRITERIA name (amct_engine.prune.importance)


@dataclass(frozen=True)
class FilterPruneSpec:
    """``balanced_l2_norm_filter_prune`` (BCP, docs/spec/engine.md §4.4), with our extension: the
    importance criterion that ranks the channels (docs/spec/engine.md §2.2 "Extensions")."""

    prune_ratio: float
    ascend_optimized: bool = True
    importance: str = DEFAULT_IMPORTANCE
    schedule: PruneScheduleSpec | None = None  # progressive pruning (our extension); None: one shot, as AMCT
    granularity: str = "CHANNEL"  # our extension: "HEAD" prunes whole attention heads (docs/spec/engine.md §4.4)


@dataclass(frozen=True)
class PruneScheduleSpec:
    """``prune_schedule`` (our extension, docs/spec/engine.md §2.2): mask from ``start_ratio`` at
    creation up to the spec's ``prune_ratio`` in ``steps`` steps, one every ``interval`` training
    batches; the channels are removed at save."""

    steps: int
    start_ratio: float = 0.0
    interval: int = 1

    def ratio_at(self, step: int, target: float) -> float:
        """The share of channels masked after ``step`` steps (0: at creation)."""
        step = min(max(step, 0), self.steps)
        return self.start_ratio + (target - self.start_ratio) * step / self.steps


@dataclass(frozen=True)
class SelectivePruneSpec:
    """``l1_selective_prune`` (4-of-2, docs/spec/engine.md §4.5)."""

    n_out_of_m_type: str = "M4N2"
    update_freq: int = 0


PruneSpec = FilterPruneSpec | SelectivePruneSpec
