"""Per-layer prune settings from a retrain ``.cfg`` (spec §2.2, §3.2 ``regular_prune_config``).

Precedence: override_layer_configs > override_layer_types > the global prune_config. The skip lists
are unions: ``skip_layers`` ∪ ``regular_prune_skip_layers`` and ``skip_layer_types`` ∪
``regular_prune_skip_types``; a skipped layer is never pruned, whatever its overrides say.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from amct_engine.proto import retrain_config_pytorch_pb2 as retrain_pb2


@dataclass(frozen=True)
class FilterPruneSpec:
    """``balanced_l2_norm_filter_prune`` (BCP, spec §4.4)."""

    prune_ratio: float
    ascend_optimized: bool = True


@dataclass(frozen=True)
class SelectivePruneSpec:
    """``l1_selective_prune`` (4-of-2, spec §4.5)."""

    n_out_of_m_type: str = "M4N2"
    update_freq: int = 0


PruneSpec = FilterPruneSpec | SelectivePruneSpec

# Layers a prune config can apply to (spec §4.9); the passes decide which of them can really be pruned.
WEIGHT_LAYER_TYPES = frozenset({
    "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d", "Linear",
})


@dataclass
class LayerPruneSettings:
    """What the cfg asks of each layer: a spec, or why the layer is left alone."""

    specs: dict[str, PruneSpec] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def filter(self) -> dict[str, FilterPruneSpec]:
        return {n: s for n, s in self.specs.items() if isinstance(s, FilterPruneSpec)}

    def selective(self) -> dict[str, SelectivePruneSpec]:
        return {n: s for n, s in self.specs.items() if isinstance(s, SelectivePruneSpec)}

    def why_not_filter(self, layer: str) -> str:
        """Why a layer is not filter-pruned (for the report)."""
        if layer in self.skipped:
            return self.skipped[layer]
        spec = self.specs.get(layer)
        if isinstance(spec, SelectivePruneSpec):
            return "is configured for 4:2 selective pruning, not filter pruning"
        return "has no filter prune config (no global prune_config and no override for it)"


def spec_from_prune_config(prune_config: retrain_pb2.PruneConfig) -> PruneSpec | None:
    kind = prune_config.WhichOneof("regular_prune_strategy")
    if kind == "filter_pruner":
        bcp = prune_config.filter_pruner.balanced_l2_norm_filter_prune
        return FilterPruneSpec(float(bcp.prune_ratio), bool(bcp.ascend_optimized))
    if kind == "n_out_of_m_pruner":
        l1 = prune_config.n_out_of_m_pruner.l1_selective_prune
        return SelectivePruneSpec(retrain_pb2.NOutOfMType.Name(l1.n_out_of_m_type), int(l1.update_freq))
    return None


def prune_settings_from_cfg(
    cfg: retrain_pb2.AMCTRetrainConfig, layer_types: Mapping[str, str]
) -> LayerPruneSettings:
    """Settings of the conv / linear layers in ``layer_types`` (module path → class name)."""
    skip_names = set(cfg.skip_layers) | set(cfg.regular_prune_skip_layers)
    skip_types = set(cfg.skip_layer_types) | set(cfg.regular_prune_skip_types)
    base = spec_from_prune_config(cfg.prune_config) if cfg.HasField("prune_config") else None
    by_type = {o.layer_type: spec_from_prune_config(o.prune_config)
               for o in cfg.override_layer_types if o.HasField("prune_config")}
    by_name = {o.layer_name: spec_from_prune_config(o.prune_config)
               for o in cfg.override_layer_configs if o.HasField("prune_config")}
    settings = LayerPruneSettings()
    for name, type_name in layer_types.items():
        if type_name not in WEIGHT_LAYER_TYPES:
            continue
        if name in skip_names:
            settings.skipped[name] = "is in skip_layers / regular_prune_skip_layers"
            continue
        if type_name in skip_types:
            settings.skipped[name] = f"has type {type_name}, listed in skip_layer_types / regular_prune_skip_types"
            continue
        spec = by_name.get(name, by_type.get(type_name, base))
        if spec is not None:
            settings.specs[name] = spec
    return settings
