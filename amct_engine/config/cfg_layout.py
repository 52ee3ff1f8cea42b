"""What a ``.cfg`` of each kind holds, described once (docs/spec/engine.md §2.1, §2.2).

Both schemas have the same shape: a global quant config, override lists keyed by layer
name and by layer type that repeat it per layer, skip lists of names and of types, and
(retrain only) a prune config with its own skip lists. ``CfgLayout`` names those fields,
so the resolver (resolve), the semantic checks (cfg_checks), the layer-reference warnings
(layer_refs) and the JSON builder (quant_json) all read the same description instead of
spelling the field names each.

The weight-algorithm fields (``arq_retrain``, ``ulq_distill``, ...) come from the
weight-quantiser table (amct_engine.quant.registry); this module checks at import that
every member of the protos' weight oneofs has an entry there.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import zip_longest
from typing import Literal, NamedTuple

from google.protobuf.message import Message

from amct_engine.proto import distill_config_pytorch_pb2 as distill_pb2
from amct_engine.proto import retrain_config_pytorch_pb2 as retrain_pb2
from amct_engine.quant.registry import WEIGHT_QUANTIZERS

CfgKind = Literal["retrain", "distill"]


@dataclass(frozen=True)
class OverrideList:
    """A repeated field of per-layer overrides, e.g. ``override_layer_configs``."""

    field: str
    key: str  # the entry's field naming what it applies to ("layer_name")
    holds: Literal["name", "type"]  # whether ``key`` is a layer name or a layer type


@dataclass(frozen=True)
class SkipLists:
    """The repeated string fields that take layers out of one mode; a layer in any is skipped."""

    layers: tuple[str, ...]  # lists of layer names (module paths)
    types: tuple[str, ...]  # lists of layer types (module class names)


class Scope(NamedTuple):
    """The global config or one override entry: a place where quant / prune configs are set."""

    path: str  # "" for the global config, else "override_layer_configs[0]"
    message: Message
    label: str  # for messages: "the global config", 'override_layer_configs[0] (layer_name "fc")'

    def field_path(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name


@dataclass(frozen=True)
class CfgLayout:
    kind: CfgKind
    message_class: type[Message]
    data_config: str  # the activation quant config message field
    weight_config: str  # the weight quant config message field
    overrides: tuple[OverrideList, ...]  # precedence, highest first: by layer name, then by type
    quant_skips: SkipLists
    prune_config: str | None  # None: this kind of cfg does not prune
    prune_skips: SkipLists | None
    weight_field_attr: str  # the WeightQuantizerEntry attribute holding this kind's field name

    @property
    def quant_configs(self) -> tuple[str, str]:
        return (self.data_config, self.weight_config)

    @property
    def weight_oneof(self) -> str:
        """The oneof of the weight config message whose members are the algorithms."""
        weight_msg = self.message_class.DESCRIPTOR.fields_by_name[self.weight_config].message_type
        return weight_msg.oneofs[0].name

    def chosen_weight_field(self, weight_cfg: Message) -> str | None:
        """The weight-algorithm field set in a weight quant config message, or None."""
        return weight_cfg.WhichOneof(self.weight_oneof)

    def proto_weight_fields(self) -> tuple[str, ...]:
        """The weight-algorithm fields the proto's oneof lists."""
        weight_msg = self.message_class.DESCRIPTOR.fields_by_name[self.weight_config].message_type
        return tuple(f.name for f in weight_msg.oneofs_by_name[self.weight_oneof].fields)

    def weight_fields(self) -> tuple[str, ...]:
        """Every weight quantiser's field (cfg oneof member, JSON ``algo``), in table order."""
        return tuple(getattr(entry, self.weight_field_attr) for entry in WEIGHT_QUANTIZERS.values())

    def weight_field(self, algo: str) -> str:
        """``"arq"`` -> ``"arq_retrain"`` (or ``"arq_distill"``)."""
        return getattr(WEIGHT_QUANTIZERS[algo], self.weight_field_attr)

    def weight_algo(self, field: str) -> str:
        """``"arq_retrain"`` -> ``"arq"``: the table name of the algorithm a field selects."""
        for name, entry in WEIGHT_QUANTIZERS.items():
            if getattr(entry, self.weight_field_attr) == field:
                return name
        raise KeyError(f"{field!r} is not the {self.kind} field of any weight quantizer")

    def _skip_modes(self) -> tuple[SkipLists, ...]:
        return (self.quant_skips,) + ((self.prune_skips,) if self.prune_skips else ())

    def skip_lists(self) -> tuple[str, ...]:
        """Every skip list, each once: names and types of the quant lists, then of the prune lists."""
        pairs = (pair for s in self._skip_modes() for pair in zip_longest(s.layers, s.types))
        return tuple(dict.fromkeys(f for pair in pairs for f in pair if f is not None))

    def name_lists(self) -> tuple[str, ...]:
        """Skip lists that hold layer names."""
        return tuple(dict.fromkeys(f for s in self._skip_modes() for f in s.layers))

    def type_lists(self) -> tuple[str, ...]:
        """Skip lists that hold layer types."""
        return tuple(dict.fromkeys(f for s in self._skip_modes() for f in s.types))

    def scopes(self, msg: Message) -> Iterator[Scope]:
        """The global config, then each override entry in file-list order."""
        yield Scope("", msg, "the global config")
        for override in self.overrides:
            for i, entry in enumerate(getattr(msg, override.field)):
                path = f"{override.field}[{i}]"
                yield Scope(path, entry, f'{path} ({override.key} "{getattr(entry, override.key)}")')


RETRAIN_LAYOUT = CfgLayout(
    kind="retrain",
    message_class=retrain_pb2.AMCTRetrainConfig,
    data_config="retrain_data_quant_config",
    weight_config="retrain_weight_quant_config",
    overrides=(
        OverrideList("override_layer_configs", "layer_name", "name"),
        OverrideList("override_layer_types", "layer_type", "type"),
    ),
    # docs/spec/engine.md §2.2: skip_layers / skip_layer_types apply to quantization and pruning.
    quant_skips=SkipLists(("skip_layers", "quant_skip_layers"), ("skip_layer_types", "quant_skip_types")),
    prune_config="prune_config",
    prune_skips=SkipLists(
        ("skip_layers", "regular_prune_skip_layers"), ("skip_layer_types", "regular_prune_skip_types")
    ),
    weight_field_attr="retrain_field",
)

DISTILL_LAYOUT = CfgLayout(
    kind="distill",
    message_class=distill_pb2.AMCTDistillConfig,
    data_config="distill_data_quant_config",
    weight_config="distill_weight_quant_config",
    overrides=(
        OverrideList("distill_override_layers", "layer_name", "name"),
        OverrideList("distill_override_layer_types", "layer_type", "type"),
    ),
    quant_skips=SkipLists(("quant_skip_layers",), ("quant_skip_layer_types",)),
    prune_config=None,
    prune_skips=None,
    weight_field_attr="distill_field",
)

LAYOUTS: dict[str, CfgLayout] = {"retrain": RETRAIN_LAYOUT, "distill": DISTILL_LAYOUT}


def layout_of(msg: Message) -> CfgLayout:
    """The layout of a parsed AMCTRetrainConfig / AMCTDistillConfig."""
    for layout in LAYOUTS.values():
        if isinstance(msg, layout.message_class):
            return layout
    raise TypeError(f"expected an AMCTRetrainConfig or AMCTDistillConfig, got {type(msg).__name__}")


def weight_fields_without_quantizer(layout: CfgLayout) -> list[str]:
    """Members of the proto's weight oneof that no weight-quantiser entry names."""
    known = set(layout.weight_fields())
    return [f for f in layout.proto_weight_fields() if f not in known]


def _check_weight_quantizers() -> None:
    # A proto field without a table entry could be parsed but never built: fail at import.
    for layout in LAYOUTS.values():
        missing = weight_fields_without_quantizer(layout)
        if missing:
            raise RuntimeError(
                f"{layout.message_class.__name__}.{layout.weight_config} lists {', '.join(missing)}, which no "
                "entry of amct_engine.quant.registry.WEIGHT_QUANTIZERS names; register the weight quantizer"
            )


_check_weight_quantizers()
