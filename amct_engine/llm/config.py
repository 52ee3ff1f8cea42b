"""The LLM quantisation config: AMCT's dict format, checked once (docs/spec/llm.md §2).

``amct.quantize(model, cfg)`` takes a plain dict such as
``{'batch_num': 1, 'quant_cfg': {'weights': {'type': 'int4', 'symmetric': False, 'strategy': 'group',
'group_size': 32}}, 'algorithm': {'gptq'}, 'skip_layers': {'lm_head'}}``. ``parse_config`` turns it into
a frozen ``LlmQuantConfig`` or raises ``LlmConfigError`` naming the field path (``quant_cfg.weights.group_size``).
Torch-free.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from amct_engine.config.errors import ConfigError

WEIGHT_TYPES = {"int4": 4, "int8": 8}
WEIGHT_STRATEGIES = ("tensor", "channel", "group")
GROUP_SIZES = (32, 64, 128)
ZERO_POINTS = ("integer", "float")  # "float": our extension, the form of ORT's HQQ files (docs/spec/llm.md §3.1)
# 'tensor': one static scale calibrated on the calibration forward; 'token': one scale per token, at run time.
INPUT_STRATEGIES = ("tensor", "token")
ALGORITHMS = ("minmax", "gptq", "awq", "smoothquant")
# Defaults of each algorithm's parameters (docs/spec/llm.md §3); AMCT names grids_num and smooth_strength.
ALGORITHM_PARAMS: dict[str, dict[str, float | int]] = {
    "minmax": {},
    "gptq": {"percdamp": 0.01, "block_size": 128},
    "awq": {"grids_num": 20, "clip_grids": 10},
    "smoothquant": {"smooth_strength": 0.5},
}
TOP_LEVEL = ("batch_num", "quant_cfg", "algorithm", "skip_layers")


class LlmConfigError(ConfigError):
    """A bad ``amct.quantize`` config dict: ``str()`` starts with the field path."""

    def __init__(self, message: str, field: str | None = None, **kwargs: Any) -> None:
        super().__init__(message, field=field, **kwargs)

    def _render(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message

    def __reduce__(self):
        return (type(self), (self.message, self.field))


@dataclass(frozen=True)
class WeightSpec:
    bits: int
    symmetric: bool
    strategy: str  # tensor | channel | group
    group_size: int | None  # only for strategy 'group'
    float_zero_point: bool = False  # unrounded zero points, ranges not widened to 0 (docs/spec/llm.md §3.1)


@dataclass(frozen=True)
class InputSpec:
    bits: int
    symmetric: bool
    strategy: str  # tensor (static) | token (dynamic)


@dataclass(frozen=True)
class LlmQuantConfig:
    batch_num: int
    weights: WeightSpec
    inputs: InputSpec | None
    algorithm: str
    params: Mapping[str, float | int] = field(default_factory=dict)
    skip_layers: frozenset[str] = frozenset()


def _need(mapping: Mapping[str, Any], key: str, path: str) -> Any:
    if key not in mapping:
        raise LlmConfigError("is required", field=f"{path}.{key}" if path else key)
    return mapping[key]


def _check_keys(mapping: Any, allowed: tuple[str, ...], path: str) -> None:
    if not isinstance(mapping, Mapping):
        raise LlmConfigError(f"must be a dict, got {type(mapping).__name__}", field=path or "<config>")
    for key in mapping:
        if key not in allowed:
            where = f"{path}.{key}" if path else str(key)
            raise LlmConfigError(f"unknown field; expected one of {', '.join(allowed)}", field=where)


def _bool(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise LlmConfigError(f"must be true or false, got {value!r}", field=path)
    return value


def _choice(value: Any, choices: tuple[str, ...] | Mapping[str, Any], path: str) -> str:
    if value not in choices:
        raise LlmConfigError(f"must be one of {', '.join(map(repr, choices))}, got {value!r}", field=path)
    return str(value)


def _weights(raw: Any) -> WeightSpec:
    path = "quant_cfg.weights"
    _check_keys(raw, ("type", "symmetric", "strategy", "group_size", "zero_point"), path)
    bits = WEIGHT_TYPES[_choice(_need(raw, "type", path), WEIGHT_TYPES, f"{path}.type")]
    symmetric = _bool(raw.get("symmetric", True), f"{path}.symmetric")
    strategy = _choice(raw.get("strategy", "channel"), WEIGHT_STRATEGIES, f"{path}.strategy")
    group_size = raw.get("group_size")
    if strategy == "group":
        group_size = _need(raw, "group_size", path)
        if isinstance(group_size, bool) or group_size not in GROUP_SIZES:
            raise LlmConfigError(
                f"must be one of {', '.join(map(str, GROUP_SIZES))}, got {group_size!r}", field=f"{path}.group_size"
            )
    elif group_size is not None:
        raise LlmConfigError(f"is only allowed with strategy 'group' (strategy is {strategy!r})", f"{path}.group_size")
    zero_point = _choice(raw.get("zero_point", "integer"), ZERO_POINTS, f"{path}.zero_point")
    if zero_point == "float" and symmetric:
        raise LlmConfigError("float zero points need asymmetric weights (symmetric: false)", f"{path}.zero_point")
    return WeightSpec(bits, symmetric, strategy, group_size, zero_point == "float")


def _inputs(raw: Any) -> InputSpec:
    path = "quant_cfg.inputs"
    _check_keys(raw, ("type", "symmetric", "strategy"), path)
    _choice(_need(raw, "type", path), ("int8",), f"{path}.type")
    if not _bool(raw.get("symmetric", True), f"{path}.symmetric"):
        raise LlmConfigError("only symmetric int8 activations are supported", field=f"{path}.symmetric")
    strategy = _choice(raw.get("strategy", "tensor"), INPUT_STRATEGIES, f"{path}.strategy")
    return InputSpec(8, True, strategy)


def _algorithm(raw: Any) -> tuple[str, dict[str, float | int]]:
    """AMCT writes the algorithm as a set (``{'gptq'}``) or a dict of name -> parameters."""
    if raw is None:
        return "minmax", {}
    if isinstance(raw, str):
        raw = {raw}
    if isinstance(raw, (set, frozenset, list, tuple)):
        raw = {name: None for name in raw}
    if not isinstance(raw, Mapping):
        raise LlmConfigError(f"must be a set or dict of algorithm names, got {type(raw).__name__}", field="algorithm")
    if len(raw) != 1:
        raise LlmConfigError(f"name exactly one of {', '.join(ALGORITHMS)}, got {sorted(raw)!r}", field="algorithm")
    ((name, given),) = raw.items()
    _choice(name, ALGORITHMS, "algorithm")
    params = dict(ALGORITHM_PARAMS[name])
    if given is not None:
        _check_keys(given, tuple(params), f"algorithm.{name}")
        for key, value in given.items():
            params[key] = _param(name, key, value)
    return name, params


def _param(algorithm: str, key: str, value: Any) -> float | int:
    path = f"algorithm.{algorithm}.{key}"
    if key == "smooth_strength" or key == "percdamp":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise LlmConfigError(f"must be a number in [0, 1], got {value!r}", field=path)
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LlmConfigError(f"must be a positive integer, got {value!r}", field=path)
    if key == "block_size" and value % 32:
        raise LlmConfigError(f"must be a multiple of 32 (the group sizes), got {value}", field=path)
    return value


def _skip_layers(raw: Any) -> frozenset[str]:
    if raw is None:
        return frozenset()
    if isinstance(raw, str) or not isinstance(raw, (set, frozenset, list, tuple)):
        raise LlmConfigError(f"must be a set of layer names or type names, got {raw!r}", field="skip_layers")
    for item in raw:
        if not isinstance(item, str) or not any(c.isalnum() for c in item):
            raise LlmConfigError(f"entries must be names with a letter or digit, got {item!r}", field="skip_layers")
    return frozenset(raw)


def _check_combination(weights: WeightSpec, inputs: InputSpec | None, algorithm: str) -> None:
    if algorithm == "smoothquant" and inputs is None:
        raise LlmConfigError(
            "smoothquant quantises activations: quant_cfg.inputs is required", field="quant_cfg.inputs"
        )
    if inputs is None:
        return
    if algorithm in ("gptq", "awq"):
        raise LlmConfigError(f"{algorithm} is weight-only: remove quant_cfg.inputs", field="quant_cfg.inputs")
    if weights.bits != 8:
        raise LlmConfigError("activation quantisation needs int8 weights (W8A8)", field="quant_cfg.weights.type")
    if weights.strategy == "group":
        raise LlmConfigError("W8A8 needs 'channel' or 'tensor' weights", field="quant_cfg.weights.strategy")
    if not weights.symmetric:
        raise LlmConfigError("W8A8 needs symmetric weights", field="quant_cfg.weights.symmetric")


def parse_config(cfg: Any) -> LlmQuantConfig:
    """The checked config, or ``LlmConfigError`` naming the first bad field."""
    _check_keys(cfg, TOP_LEVEL, "")
    batch_num = cfg.get("batch_num", 1)
    if isinstance(batch_num, bool) or not isinstance(batch_num, int) or batch_num < 1:
        raise LlmConfigError(f"must be a positive integer, got {batch_num!r}", field="batch_num")
    quant_cfg = _need(cfg, "quant_cfg", "")
    _check_keys(quant_cfg, ("weights", "inputs"), "quant_cfg")
    weights = _weights(_need(quant_cfg, "weights", "quant_cfg"))
    inputs = _inputs(quant_cfg["inputs"]) if quant_cfg.get("inputs") is not None else None
    algorithm, params = _algorithm(cfg.get("algorithm"))
    _check_combination(weights, inputs, algorithm)
    return LlmQuantConfig(batch_num, weights, inputs, algorithm, params, _skip_layers(cfg.get("skip_layers")))


def load_config_json(text: str | bytes) -> dict[str, Any]:
    """A config dict from JSON (the service's upload, docs/spec/llm.md §2.3), checked by ``parse_config``.

    JSON has no sets: AMCT's ``{'gptq'}`` and ``{'lm_head'}`` are written as lists (``["gptq"]``), a string, or a
    dict of parameters. ``LlmConfigError`` with ``line``/``column`` for JSON that does not parse."""
    try:
        cfg = json.loads(text)
    except UnicodeDecodeError as e:
        raise LlmConfigError(f"the config is not UTF-8 text ({e.reason})") from None
    except json.JSONDecodeError as e:
        raise LlmConfigError(f"not valid JSON: {e.msg}", line=e.lineno, column=e.colno) from None
    parse_config(cfg)
    return cfg


def describe_config(cfg: LlmQuantConfig) -> dict[str, Any]:
    """The parsed config in a few words (what the service shows for an uploaded config)."""
    w = cfg.weights
    weights = f"int{w.bits} {'symmetric' if w.symmetric else 'asymmetric'} {w.strategy}"
    if w.group_size:
        weights += f" {w.group_size}"
    if w.float_zero_point:
        weights += ", float zero points"
    summary: dict[str, Any] = {"algorithm": cfg.algorithm, "weights": weights, "batch_num": cfg.batch_num}
    if cfg.inputs is not None:
        summary["inputs"] = f"int8 per {cfg.inputs.strategy}"
    if cfg.params:
        summary["params"] = dict(cfg.params)
    if cfg.skip_layers:
        summary["skip_layers"] = sorted(cfg.skip_layers)
    return summary
