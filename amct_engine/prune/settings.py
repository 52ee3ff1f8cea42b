"""Per-layer prune settings from a retrain ``.cfg`` (docs/spec/engine.md §2.2, §3.2 ``regular_prune_config``).

What the cfg asks of each layer is the resolver's answer (amct_engine.config.resolve: override
of the layer > override of its type > the global prune_config; ``skip_layers`` ∪
``regular_prune_skip_layers`` and ``skip_layer_types`` ∪ ``regular_prune_skip_types`` win over
all). This module keeps the layers the layer-pruner table can prune and groups the answer for the prune passes.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from amct_engine.config.resolve import prune_spec_from_cfg, resolve_layers
from amct_engine.config.specs import FilterPruneSpec, PruneSpec, SelectivePruneSpec
from amct_engine.proto import retrain_config_pytorch_pb2 as retrain_pb2

__all__ = [
    "FilterPruneSpec",
    "LayerPruneSettings",
    "PruneSpec",
    "SelectivePruneSpec",
    "prune_settings_from_cfg",
    "spec_from_prune_config",
]

spec_from_prune_config = prune_spec_from_cfg


@dataclass
class LayerPruneSettings:
    """What the cfg asks of each layer: a spec, or why the layer is left alone."""

    specs: dict[str, PruneSpec] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def filter(self) -> dict[str, FilterPruneSpec]:
        return {n: s for n, s in self.specs.items() if isinstance(s, FilterPruneSpec)}

    def selective(self) -> dict[str, SelectivePruneSpec]:
        return {n: s for n, s in self.specs.items() if isinstance(s, SelectivePruneSpec)}

    def progressive(self) -> bool:
        """Whether any filter-pruned layer has a ``prune_schedule`` (then every group is masked until save)."""
        return any(s.schedule is not None for s in self.filter().values())

    def why_not_filter(self, layer: str) -> str:
        """Why a layer is not filter-pruned (for the report)."""
        if layer in self.skipped:
            return self.skipped[layer]
        spec = self.specs.get(layer)
        if isinstance(spec, SelectivePruneSpec):
            return "is configured for 4:2 selective pruning, not filter pruning"
        return "has no filter prune config (no global prune_config and no override for it)"


def prune_settings_from_cfg(
    cfg: retrain_pb2.AMCTRetrainConfig, layer_types: Mapping[str, str], prunable_types: Collection[str]
) -> LayerPruneSettings:
    """Settings of the layers in ``layer_types`` (module path → class name) whose class is in
    ``prunable_types`` (``layer_pruners.weight_layer_type_names()``: the types the layer-pruner table
    knows, so a registered user layer type is configurable like a built-in one)."""
    settings = LayerPruneSettings()
    for name, layer in resolve_layers(cfg, layer_types, prune_types=prunable_types).items():
        skip = layer.prune_skip
        if skip is None:
            settings.specs[name] = layer.prune
        elif skip.cause in ("skip_layer", "skip_type"):
            settings.skipped[name] = skip.text
    return settings
