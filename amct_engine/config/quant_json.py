"""The detailed JSON configs of docs/spec/engine.md §3: build them from a parsed `.cfg`, write them, read them back.

The retrain JSON (docs/spec/engine.md §3.2) and the distill JSON (docs/spec/engine.md §3.1) carry the same per-layer
information under
different key names, so one `JsonDialect` describes the names and one builder/reader serves both.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from amct_engine.config.cfg_layout import DISTILL_LAYOUT, RETRAIN_LAYOUT, CfgLayout
from amct_engine.config.errors import ConfigError
from amct_engine.config.resolve import resolve_layers
from amct_engine.config.specs import (
    BITS_DST,
    DEFAULT_WEIGHT_ALGO,
    DST_BITS,
    RETRAIN_ACT_WTS_BITS,
    ActQuantSpec,
    LayerQuantSpec,
    WeightQuantSpec,
    pair_name,
)
from amct_engine.layer_table import per_tensor_default_types

if TYPE_CHECKING:
    from torch import nn

__all__ = [
    "BITS_DST",
    "DISTILL",
    "DST_BITS",
    "RETRAIN",
    "ActQuantSpec",
    "JsonDialect",
    "LayerQuantSpec",
    "QuantJsonConfig",
    "WeightQuantSpec",
    "config_to_json",
    "layer_specs_from_cfg",
    "read_json_config",
    "write_json_config",
]


@dataclass(frozen=True)
class JsonDialect:
    """Key names of one JSON config family (docs/spec/engine.md §3.1 vs docs/spec/engine.md §3.2), and the .cfg it is
    built from."""

    kind: str
    enable_key: str
    data_key: str
    weight_key: str
    act_types: tuple[str, ...]
    cfg: CfgLayout

    def weight_json_algo(self, algo: str) -> str:
        """The JSON ``algo`` of a weight quantiser: its cfg field (``arq_retrain``)."""
        return self.cfg.weight_field(algo)


RETRAIN = JsonDialect(
    kind="retrain",
    enable_key="retrain_enable",
    data_key="retrain_data_config",
    weight_key="retrain_weight_config",
    act_types=("INT8", "INT16"),
    cfg=RETRAIN_LAYOUT,
)

DISTILL = JsonDialect(
    kind="distill",
    enable_key="quant_enable",
    data_key="distill_data_config",
    weight_key="distill_weight_config",
    act_types=("INT4", "INT8"),
    cfg=DISTILL_LAYOUT,
)


@dataclass
class QuantJsonConfig:
    """A parsed and validated JSON config."""

    dialect: JsonDialect
    batch_num: int = 1
    layers: dict[str, LayerQuantSpec] = field(default_factory=dict)
    group_size: int = 1
    data_dump: bool = False
    distill_groups: list[list[str]] = field(default_factory=list)
    fakequant_precision_mode: str = "DEFAULT"

    def enabled_layers(self) -> list[str]:
        return [name for name, spec in self.layers.items() if spec.enabled]


# ---------------------------------------------------------------------------------------------
# .cfg message -> per-layer specs


def layer_specs_from_cfg(
    cfg, dialect: JsonDialect, layers: dict[str, nn.Module], only_configured: bool = False
) -> dict[str, LayerQuantSpec]:
    """Per-layer quantisation settings of the quantisable ``layers`` (module path -> module, in
    topological order); the cfg's precedence is the resolver's (resolve). ``cfg`` None: defaults.

    `only_configured`: compressed mode (docs/spec/engine.md §2.2) enables quant only on layers that the cfg
    configures (a global quant config, or an override for the layer or its type).
    """
    message = cfg if cfg is not None else dialect.cfg.message_class()
    types = {name: type(module).__name__ for name, module in layers.items()}
    specs = {}
    # A loop, not a comprehension: the INT4 warning (stacklevel) must name our caller's line.
    for name, layer in resolve_layers(message, types, quant_only_configured=only_configured).items():
        weight = _fit_weight_to_layer(name, layers[name], layer.quant.weight)
        specs[name] = LayerQuantSpec(layer.quantized, layer.quant.act, weight)
    return specs


def _fit_weight_to_layer(name: str, module: nn.Module, weight: WeightQuantSpec) -> WeightQuantSpec:
    """Layer-shape adjustments AMCT makes at config time (docs/spec/engine.md §2.2): INT4 needs plain convs."""
    groups = getattr(module, "groups", 1)
    in_channels = getattr(module, "in_channels", getattr(module, "in_features", 0))
    if weight.bits == 4 and (groups > 1 or in_channels % 2):
        warnings.warn(
            f"layer {name}: INT4 weights are not supported on grouped/depthwise convs or odd input "
            "channel counts; using INT8 weights",
            stacklevel=3,
        )
        weight = WeightQuantSpec(weight.algo, weight.channel_wise, 8)
    return weight


# ---------------------------------------------------------------------------------------------
# per-layer specs -> JSON dict


def _act_json(act: ActQuantSpec) -> dict:
    out: dict = {"algo": "ulq_quantize"}
    if act.clip_max is not None:
        out["clip_max"] = act.clip_max
        out["clip_min"] = act.clip_min
    if act.fixed_min is not None:
        out["fixed_min"] = act.fixed_min
    out["dst_type"] = BITS_DST[act.bits]
    return out


def _weight_json(weight: WeightQuantSpec, dialect: JsonDialect) -> dict:
    algo = dialect.weight_json_algo(weight.algo)
    return {"algo": algo, "channel_wise": weight.channel_wise, "dst_type": BITS_DST[weight.bits]}


def config_to_json(config: QuantJsonConfig) -> dict:
    d = config.dialect
    out: dict = {"version": 1, "batch_num": config.batch_num}
    if d is DISTILL:
        out.update(group_size=config.group_size, data_dump=config.data_dump)
        out["distill_group"] = config.distill_groups
    elif config.fakequant_precision_mode != "DEFAULT":
        out["fakequant_precision_mode"] = config.fakequant_precision_mode
    for name, spec in config.layers.items():
        entry: dict = {d.enable_key: spec.enabled}
        if spec.enabled:
            entry[d.data_key] = _act_json(spec.act)
            entry[d.weight_key] = _weight_json(spec.weight, d)
        out[name] = entry
    return out


def write_json_config(config_file: str | os.PathLike, config: QuantJsonConfig) -> None:
    """Write the JSON (indent 4, as AMCT); an existing file is overwritten with a warning."""
    if os.path.exists(config_file):
        warnings.warn(f"{config_file} already exists and is overwritten", stacklevel=3)
    directory = os.path.dirname(os.path.abspath(config_file))
    os.makedirs(directory, exist_ok=True)
    with open(config_file, "w", encoding="utf-8") as f:
        json.dump(config_to_json(config), f, indent=4)
        f.write("\n")


# ---------------------------------------------------------------------------------------------
# JSON file -> validated QuantJsonConfig


class _JsonReader:
    """Validates one JSON config file; every error names the key and its line in the file."""

    def __init__(self, path: str, text: str, dialect: JsonDialect):
        self.path, self.text, self.dialect = path, text, dialect

    def error(self, message: str, key: str | None = None) -> ConfigError:
        line, column = self._locate(key)
        return ConfigError(message, path=self.path, line=line, column=column, field=key)

    def _locate(self, key: str | None) -> tuple[int | None, int | None]:
        if key is None:
            return None, None
        match = re.search(rf'"{re.escape(key)}"\s*:', self.text)
        if not match:
            return None, None
        line = self.text.count("\n", 0, match.start()) + 1
        return line, match.start() - (self.text.rfind("\n", 0, match.start()) + 1) + 1

    def load(self) -> dict:
        def no_duplicates(pairs):
            seen = {}
            for key, value in pairs:
                if key in seen:
                    raise self.error(f'duplicated key "{key}"', key)
                seen[key] = value
            return seen

        try:
            data = json.loads(self.text, object_pairs_hook=no_duplicates)
        except json.JSONDecodeError as exc:
            raise ConfigError(exc.msg, path=self.path, line=exc.lineno, column=exc.colno) from None
        if not isinstance(data, dict):
            raise self.error("the config must be a JSON object")
        return data

    def positive_int(self, data: dict, key: str, default: int) -> int:
        value = data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self.error(f'"{key}" must be an integer > 0, got {value!r}', key)
        return value

    def act(self, name: str, cfg: dict) -> ActQuantSpec:
        key = self.dialect.data_key
        self._only_keys(name, key, cfg, {"algo", "clip_max", "clip_min", "fixed_min", "dst_type"})
        if cfg.get("algo", "ulq_quantize") != "ulq_quantize":
            raise self.error(f'{name}.{key}.algo must be "ulq_quantize", got {cfg["algo"]!r}', name)
        if ("clip_max" in cfg) != ("clip_min" in cfg):
            raise self.error(f"{name}.{key}: clip_max and clip_min must be given together", name)
        clip_max, clip_min = cfg.get("clip_max"), cfg.get("clip_min")
        if clip_max is not None and not (clip_max > 0 > (clip_min or 0)):
            raise self.error(f"{name}.{key}: need clip_max > 0 and clip_min < 0", name)
        fixed_min = cfg.get("fixed_min")
        if fixed_min is not None and not isinstance(fixed_min, bool):
            raise self.error(f"{name}.{key}.fixed_min must be true or false", name)
        bits = self._dst(name, key, cfg, self.dialect.act_types)
        return ActQuantSpec(bits, clip_max, clip_min, fixed_min)

    def weight(self, name: str, type_name: str, cfg: dict) -> WeightQuantSpec:
        key = self.dialect.weight_key
        self._only_keys(name, key, cfg, {"algo", "channel_wise", "dst_type"})
        layout = self.dialect.cfg
        algos = layout.weight_fields()
        algo = cfg.get("algo", layout.weight_field(DEFAULT_WEIGHT_ALGO))
        if algo not in algos:
            allowed = " or ".join(f'"{a}"' for a in algos)
            raise self.error(f"{name}.{key}.algo must be {allowed}, got {algo!r}", name)
        default_cw = type_name not in per_tensor_default_types()
        channel_wise = cfg.get("channel_wise", default_cw)
        if not isinstance(channel_wise, bool):
            raise self.error(f"{name}.{key}.channel_wise must be true or false", name)
        bits = self._dst(name, key, cfg, ("INT4", "INT8"))
        return WeightQuantSpec(layout.weight_algo(algo), channel_wise, bits)

    def _dst(self, name: str, key: str, cfg: dict, allowed: tuple[str, ...]) -> int:
        dst = cfg.get("dst_type", "INT8")
        if dst not in allowed:
            raise self.error(f"{name}.{key}.dst_type must be one of {', '.join(allowed)}, got {dst!r}", name)
        return DST_BITS[dst]

    def _only_keys(self, name: str, key: str, cfg, allowed: set[str]) -> None:
        if not isinstance(cfg, dict):
            raise self.error(f"{name}.{key} must be an object", name)
        unknown = sorted(set(cfg) - allowed)
        if unknown:
            raise self.error(f'{name}.{key}: unknown key "{unknown[0]}"', name)


_GLOBAL_KEYS = {
    "retrain": {"version", "batch_num", "fakequant_precision_mode"},
    "distill": {"version", "batch_num", "group_size", "data_dump", "distill_group"},
}


def read_json_config(
    config_file: str | os.PathLike, dialect: JsonDialect, layer_types: dict[str, str]
) -> QuantJsonConfig:
    """Read and validate a JSON config against the model's supported layers (name -> type)."""
    path = str(config_file)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"config file not found: {path}")
    with open(path, encoding="utf-8") as f:
        reader = _JsonReader(path, f.read(), dialect)
    data = reader.load()
    if data.get("version", 1) != 1:
        raise reader.error(f'"version" must be 1, got {data.get("version")!r}', "version")
    config = QuantJsonConfig(dialect, batch_num=reader.positive_int(data, "batch_num", 1))
    if dialect is DISTILL:
        _read_distill_globals(reader, data, config, layer_types)
    else:
        mode = data.get("fakequant_precision_mode", "DEFAULT")
        if mode not in ("DEFAULT", "FORCE_FP16_QUANT"):
            raise reader.error(
                '"fakequant_precision_mode" must be "DEFAULT" or "FORCE_FP16_QUANT"', "fakequant_precision_mode"
            )
        config.fakequant_precision_mode = mode
    for name, entry in data.items():
        if name in _GLOBAL_KEYS[dialect.kind]:
            continue
        if name not in layer_types:
            raise reader.error(f'unsupported layer "{name}" for {dialect.kind}', name)
        config.layers[name] = _read_layer(reader, name, layer_types[name], entry)
    for name in layer_types:  # supported layers missing from the JSON are not quantised
        config.layers.setdefault(name, LayerQuantSpec(False))
    config.layers = {name: config.layers[name] for name in layer_types}  # model order
    if not config.enabled_layers():
        raise reader.error(f"no layer is enabled for {dialect.kind} quantisation")
    return config


def _read_layer(reader: _JsonReader, name: str, type_name: str, entry) -> LayerQuantSpec:
    d = reader.dialect
    reader._only_keys(name, name, entry, {d.enable_key, d.data_key, d.weight_key})
    enabled = entry.get(d.enable_key, True)
    if not isinstance(enabled, bool):
        raise reader.error(f"{name}.{d.enable_key} must be true or false", name)
    act = reader.act(name, entry.get(d.data_key, {}))
    weight = reader.weight(name, type_name, entry.get(d.weight_key, {}))
    if d is DISTILL and act.bits != weight.bits:
        raise reader.error(f"{name}: activation and weight dst_type must be equal for distillation", name)
    if d is RETRAIN and (act.bits, weight.bits) not in RETRAIN_ACT_WTS_BITS:
        *others, last = (pair_name(*pair) for pair in RETRAIN_ACT_WTS_BITS)
        raise reader.error(
            f"{name}: {pair_name(act.bits, weight.bits)} is not supported; use {', '.join(others)} or {last}", name
        )
    return LayerQuantSpec(enabled, act, weight)


def _read_distill_globals(reader, data: dict, config: QuantJsonConfig, layer_types: dict) -> None:
    config.group_size = reader.positive_int(data, "group_size", 1)
    data_dump = data.get("data_dump", False)
    if not isinstance(data_dump, bool):
        raise reader.error('"data_dump" must be true or false', "data_dump")
    config.data_dump = data_dump
    if "distill_group" not in data:
        raise reader.error('"distill_group" is missing')
    groups = data["distill_group"]
    if not isinstance(groups, list) or not all(
        isinstance(g, list) and g and all(isinstance(n, str) for n in g) for g in groups
    ):
        raise reader.error('"distill_group" must be a list of lists of module names', "distill_group")
    config.distill_groups = groups
