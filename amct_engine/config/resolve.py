"""Per-layer settings from a parsed ``.cfg``: the one place that applies its precedence.

For each layer of the model (its module path and class name) the resolver says what the
cfg asks: the quantiser settings, the prune spec, and, for each mode, why the layer is
left out if it is (a skip list, no config for it, a type the mode does not handle).

Precedence (docs/spec/engine.md §2.2): an override of the layer's name > an override of its
type > the global config. For quantization each config message (activation, weight) is
taken whole from the most specific scope that sets it; AMCT then reads unset fields from
the proto defaults, not from the less specific scope. Skip lists win over everything: a
skipped layer is never quantized / pruned, whatever its overrides say.

Torch-free: callers pass names and type names; layer-shape adjustments (INT4 on grouped
convs) are the JSON builder's (quant_json), which has the modules.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Literal

from google.protobuf.message import Message

from amct_engine.config.cfg_document import CfgDocument
from amct_engine.config.cfg_layout import CfgLayout, SkipLists, layout_of
from amct_engine.config.specs import (
    DST_BITS,
    ActQuantSpec,
    FilterPruneSpec,
    PruneScheduleSpec,
    PruneSpec,
    SelectivePruneSpec,
    WeightQuantSpec,
)
from amct_engine.layer_table import per_tensor_default_types

SkipCause = Literal["skip_layer", "skip_type", "unsupported_type", "not_configured"]


@dataclass(frozen=True)
class Skip:
    """Why one mode (quantization or pruning) leaves a layer alone."""

    cause: SkipCause
    fields: tuple[str, ...]  # the cfg fields behind it: the skip lists naming the layer, or the configs
    text: str  # a sentence about the layer, e.g. "is in skip_layers / regular_prune_skip_layers"


@dataclass(frozen=True)
class QuantSettings:
    act: ActQuantSpec
    weight: WeightQuantSpec
    configured: bool  # a quant config is set for it: globally, for its type or for its name


@dataclass(frozen=True)
class LayerSettings:
    """What the cfg asks of one layer."""

    name: str
    type_name: str
    quant: QuantSettings  # resolved even when skipped (the JSON writes only enabled layers)
    quant_skip: Skip | None
    prune: PruneSpec | None  # what the scopes configure; applies only when ``prune_skip`` is None
    prune_skip: Skip | None

    @property
    def quantized(self) -> bool:
        return self.quant_skip is None

    @property
    def prune_spec(self) -> PruneSpec | None:
        """The spec the layer is pruned with, None when it is not pruned."""
        return self.prune if self.prune_skip is None else None


def resolve_layers(
    cfg: CfgDocument | Message,
    layers: Mapping[str, str],
    *,
    quant_types: Collection[str] | None = None,
    prune_types: Collection[str] | None = None,
    quant_only_configured: bool = False,
) -> dict[str, LayerSettings]:
    """Settings of every layer in ``layers`` (module path -> class name), in the same order.

    ``quant_types`` / ``prune_types``: the layer types each mode handles (None: every layer
    given). ``quant_only_configured``: compressed mode (docs/spec/engine.md §2.2) quantizes only the layers
    the cfg configures (a global quant config, or an override for the layer or its type).
    """
    msg = cfg.message if isinstance(cfg, CfgDocument) else cfg
    resolver = _Resolver(msg, layout_of(msg), quant_types, prune_types, quant_only_configured)
    return {name: resolver.layer(name, type_name) for name, type_name in layers.items()}


class _Resolver:
    def __init__(
        self,
        msg: Message,
        layout: CfgLayout,
        quant_types: Collection[str] | None,
        prune_types: Collection[str] | None,
        quant_only_configured: bool,
    ) -> None:
        self.msg, self.layout = msg, layout
        self.quant_types, self.prune_types = quant_types, prune_types
        self.quant_only_configured = quant_only_configured
        # key -> entry per override list (cfg_checks refuses a key given twice)
        self.overrides = [(o.holds, {getattr(e, o.key): e for e in getattr(msg, o.field)}) for o in layout.overrides]
        self.members = {f: set(getattr(msg, f)) for f in layout.skip_lists()}
        self.global_act = _act_from_cfg(_sub(msg, layout.data_config), ActQuantSpec())
        self.global_weight = _weight_from_cfg(_sub(msg, layout.weight_config), WeightQuantSpec(), layout)
        self.global_quant = any(msg.HasField(f) for f in layout.quant_configs)
        self.global_prune = (
            prune_spec_from_cfg(getattr(msg, layout.prune_config))
            if layout.prune_config and msg.HasField(layout.prune_config)
            else None
        )

    def layer(self, name: str, type_name: str) -> LayerSettings:
        keys = {"name": name, "type": type_name}
        scopes = [e for holds, by_key in self.overrides if (e := by_key.get(keys[holds])) is not None]
        quant = self._quant(scopes, type_name)
        quant_skip = self._skip(name, type_name, self.layout.quant_skips, self.quant_types, "quantization")
        if quant_skip is None and self.quant_only_configured and not quant.configured:
            quant_skip = Skip(
                "not_configured",
                self.layout.quant_configs,
                f"has no quantization config (set {' / '.join(self.layout.quant_configs)} "
                "globally or in an override for it)",
            )
        prune = self._prune(scopes)
        prune_skip = self._prune_skip(name, type_name, prune)
        return LayerSettings(name, type_name, quant, quant_skip, prune, prune_skip)

    def _quant(self, scopes: list[Message], type_name: str) -> QuantSettings:
        layout = self.layout
        act, weight, configured = self.global_act, self.global_weight, self.global_quant
        per_channel_requested = False
        for scope in reversed(scopes):  # least specific first: the later one wins
            data_cfg, weight_cfg = _sub(scope, layout.data_config), _sub(scope, layout.weight_config)
            configured = configured or data_cfg is not None or weight_cfg is not None
            act = _act_from_cfg(data_cfg, act)
            weight = _weight_from_cfg(weight_cfg, weight, layout)
            per_channel_requested = _explicit_channel_wise(weight_cfg, per_channel_requested, layout)
        # A global `channel_wise` (meant for convs) leaves Linear per-tensor, as in AMCT; an override
        # of the layer or of its type that states `channel_wise: true` is honoured (docs/spec/engine.md §4.9).
        if type_name in per_tensor_default_types() and weight.channel_wise and not per_channel_requested:
            weight = replace(weight, channel_wise=False)
        return QuantSettings(act, weight, configured)

    def _prune(self, scopes: list[Message]) -> PruneSpec | None:
        field = self.layout.prune_config
        if field is None:
            return None
        for scope in scopes:  # most specific first
            if scope.HasField(field):
                return prune_spec_from_cfg(getattr(scope, field))
        return self.global_prune

    def _prune_skip(self, name: str, type_name: str, prune: PruneSpec | None) -> Skip | None:
        layout = self.layout
        if layout.prune_skips is None:
            return Skip("not_configured", (), f"has no prune config (a {layout.kind} cfg does not prune)")
        skip = self._skip(name, type_name, layout.prune_skips, self.prune_types, "pruning")
        if skip is None and prune is None:
            skip = Skip(
                "not_configured",
                (layout.prune_config,) if layout.prune_config else (),
                f"has no prune config (no global {layout.prune_config} and no override for it)",
            )
        return skip

    def _skip(
        self, name: str, type_name: str, lists: SkipLists, supported: Collection[str] | None, mode: str
    ) -> Skip | None:
        if supported is not None and type_name not in supported:
            return Skip("unsupported_type", (), f"has type {type_name}, which {mode} does not handle")
        if named := tuple(f for f in lists.layers if name in self.members[f]):
            return Skip("skip_layer", named, f"is in {' / '.join(lists.layers)}")
        if typed := tuple(f for f in lists.types if type_name in self.members[f]):
            return Skip("skip_type", typed, f"has type {type_name}, listed in {' / '.join(lists.types)}")
        return None


# ----------------------------------------------------------------------------- proto -> specs


def _sub(msg: Message, name: str) -> Message | None:
    return getattr(msg, name) if msg.HasField(name) else None


def _enum_name(msg: Message, field_name: str) -> str:
    descriptor = msg.DESCRIPTOR.fields_by_name[field_name].enum_type
    return descriptor.values_by_number[getattr(msg, field_name)].name


def _act_from_cfg(data_cfg: Message | None, default: ActQuantSpec) -> ActQuantSpec:
    """One `*_data_quant_config` message (oneof ulq_quantize) -> ActQuantSpec."""
    if data_cfg is None or not data_cfg.HasField("ulq_quantize"):
        return default
    ulq = data_cfg.ulq_quantize
    clip = ulq.clip_max_min if ulq.HasField("clip_max_min") else None
    return ActQuantSpec(
        bits=DST_BITS[_enum_name(ulq, "dst_type")],
        clip_max=float(clip.clip_max) if clip else None,
        clip_min=float(clip.clip_min) if clip else None,
        fixed_min=ulq.fixed_min if ulq.HasField("fixed_min") else None,
    )


def _weight_from_cfg(weight_cfg: Message | None, default: WeightQuantSpec, layout: CfgLayout) -> WeightQuantSpec:
    algo_field = layout.chosen_weight_field(weight_cfg) if weight_cfg is not None else None
    if algo_field is None:
        return default
    algo_msg = getattr(weight_cfg, algo_field)
    return WeightQuantSpec(
        algo=layout.weight_algo(algo_field),
        channel_wise=algo_msg.channel_wise if algo_msg.HasField("channel_wise") else True,
        bits=DST_BITS[_enum_name(algo_msg, "dst_type")],
    )


def _explicit_channel_wise(weight_cfg: Message | None, current: bool, layout: CfgLayout) -> bool:
    """The `channel_wise` an override states explicitly, else `current`."""
    algo_field = layout.chosen_weight_field(weight_cfg) if weight_cfg is not None else None
    if algo_field is None or not getattr(weight_cfg, algo_field).HasField("channel_wise"):
        return current
    return getattr(weight_cfg, algo_field).channel_wise


def prune_spec_from_cfg(prune_config: Message) -> PruneSpec | None:
    """A retrain `PruneConfig` message -> its spec (None when it names no algorithm)."""
    kind = prune_config.WhichOneof("regular_prune_strategy")
    if kind == "filter_pruner":
        bcp = prune_config.filter_pruner.balanced_l2_norm_filter_prune
        schedule = None
        if bcp.HasField("prune_schedule"):
            ps = bcp.prune_schedule
            schedule = PruneScheduleSpec(int(ps.steps), float(ps.start_ratio), int(ps.interval))
        granularity = _enum_name(bcp, "granularity")
        return FilterPruneSpec(
            float(bcp.prune_ratio), bool(bcp.ascend_optimized), bcp.importance, schedule, granularity
        )
    if kind == "n_out_of_m_pruner":
        l1 = prune_config.n_out_of_m_pruner.l1_selective_prune
        return SelectivePruneSpec(_enum_name(l1, "n_out_of_m_type"), int(l1.update_freq))
    return None
