"""Semantic checks of parsed ``.cfg`` files: what the proto schema cannot express.

Every failure is a ``ConfigError`` located at the offending field (or, for a value left
at its default, at the closest block written in the file). When several things are
wrong, the one that comes first in the file is raised, as a compiler would.

A *scope* is the global config or one override entry (override_layer_configs /
override_layer_types, distill_override_layers / distill_override_layer_types). AMCT
reads each override's quant configs on their own, falling back to the proto defaults
(INT8), not to the global config, so the dst_type pair is computed per scope the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

from google.protobuf.message import Message

from amct_engine.config.cfg_document import CfgDocument
from amct_engine.config.errors import ConfigError
from amct_engine.proto import distill_config_pytorch_pb2 as distill_pb2
from amct_engine.proto import retrain_config_pytorch_pb2 as retrain_pb2

# Spec §2.2, RETRAIN_ACT_WTS_TYPES: A4W4, A8W8, A16W8, A8W4 (as (activation, weight)).
# A4W4 is listed by AMCT but INT4 activations are then refused (INT4_RETRAIN=False).
RETRAIN_ACT_WTS_TYPES = frozenset(
    {
        (retrain_pb2.INT4, retrain_pb2.INT4),
        (retrain_pb2.INT8, retrain_pb2.INT8),
        (retrain_pb2.INT16, retrain_pb2.INT8),
        (retrain_pb2.INT8, retrain_pb2.INT4),
    }
)
_BITS = {"INT4": 4, "INT8": 8, "INT16": 16}

_RETRAIN_OVERRIDES = (("override_layer_configs", "layer_name"), ("override_layer_types", "layer_type"))
_DISTILL_OVERRIDES = (
    ("distill_override_layers", "layer_name"),
    ("distill_override_layer_types", "layer_type"),
)

# Spec §2.2: repeated skip items produce a warning and are de-duplicated (AMCT does the
# same for the distill quant_skip lists).
_RETRAIN_SKIP_LISTS = (
    "skip_layers",
    "skip_layer_types",
    "quant_skip_layers",
    "quant_skip_types",
    "regular_prune_skip_layers",
    "regular_prune_skip_types",
)
_DISTILL_SKIP_LISTS = ("quant_skip_layers", "quant_skip_layer_types")

CfgApi = Literal["quant", "prune", "compressed"]


# ----------------------------------------------------------------------------- helpers


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _fmt(value: float) -> str:
    # Floats in the proto are float32: print 0.3, not 0.30000001192092896.
    return f"{value:.7g}"


def _scopes(msg: Message, overrides) -> Iterator[tuple[str, Message, str]]:
    """(path prefix, scope message, label for messages) for global + each override."""
    yield "", msg, "the global config"
    for list_name, key in overrides:
        for i, entry in enumerate(getattr(msg, list_name)):
            yield f"{list_name}[{i}]", entry, f'{list_name}[{i}] ({key} "{getattr(entry, key)}")'


def _raise_first(errors: Iterable[ConfigError]) -> None:
    # Report the problem that comes first in the file; unlocated ones last.
    errors = list(errors)
    if errors:
        raise min(errors, key=lambda e: (e.line if e.line is not None else float("inf"), e.column or 0))


def _positive(doc: CfgDocument, name: str) -> Iterator[ConfigError]:
    value = getattr(doc.message, name)
    if value <= 0:
        yield doc.error(name, f"{name} must be greater than 0, got {value}")


def _weight_dst(scope: Message, config_name: str, oneof: str, prefix: str) -> tuple[int, str]:
    """Effective weight dst_type of a scope and the path to report it at."""
    config = getattr(scope, config_name)
    algo = config.WhichOneof(oneof)
    if algo is None:
        # No weight algorithm: AMCT's default (arq, INT8; INT8 is 1 in both protos).
        return retrain_pb2.INT8, _join(prefix, config_name)
    return getattr(config, algo).dst_type, _join(prefix, f"{config_name}.{algo}.dst_type")


def _clip_errors(doc: CfgDocument, data_path: str, data_config: Message) -> Iterator[ConfigError]:
    # Spec §3.2: clip_max > 0 and clip_min < 0 (both required by the proto).
    ulq = data_config.ulq_quantize
    if not ulq.HasField("clip_max_min"):
        return
    clip, path = ulq.clip_max_min, f"{data_path}.ulq_quantize.clip_max_min"
    if clip.HasField("clip_max") and not clip.clip_max > 0:
        yield doc.error(f"{path}.clip_max", f"clip_max must be greater than 0, got {_fmt(clip.clip_max)}")
    if clip.HasField("clip_min") and not clip.clip_min < 0:
        yield doc.error(f"{path}.clip_min", f"clip_min must be less than 0, got {_fmt(clip.clip_min)}")


def _duplicate_overrides(doc: CfgDocument, list_name: str, key: str) -> Iterator[ConfigError]:
    # Spec §2.2: repeated override names/types raise (AMCT: ValueError), here at the repeat.
    first_seen: dict[str, str] = {}
    for i, entry in enumerate(getattr(doc.message, list_name)):
        name, path = getattr(entry, key), f"{list_name}[{i}].{key}"
        if name not in first_seen:
            first_seen[name] = path
            continue
        pos = doc.position_of(first_seen[name])
        where = f" (first at {pos[0]}:{pos[1]})" if pos else ""
        yield doc.error(
            path, f'{key} "{name}" has more than one {list_name} entry{where}; merge them into one'
        )


def _dedupe_skip_lists(doc: CfgDocument, list_names: Iterable[str]) -> None:
    for list_name in list_names:
        values = getattr(doc.message, list_name)
        kept: list[str] = []
        for i, value in enumerate(values):
            if value in kept:
                doc.warn(
                    f"{list_name}[{i}]",
                    f'"{value}" is listed more than once in {list_name}; the repeat is ignored',
                )
            else:
                kept.append(value)
        if len(kept) != len(values):
            del values[:]
            values.extend(kept)


# ----------------------------------------------------------------------------- retrain


def _prune_errors(doc: CfgDocument, prefix: str, scope: Message) -> Iterator[ConfigError]:
    # One prune kind per scope is the PruneConfig oneof, enforced by the parser; a scope
    # with a kind but no algorithm would prune nothing (AMCT raises for it too).
    if not scope.HasField("prune_config"):
        return
    path, prune = _join(prefix, "prune_config"), scope.prune_config
    kind = prune.WhichOneof("regular_prune_strategy")
    if kind is None:
        yield doc.error(
            path,
            "prune_config is empty: set filter_pruner { balanced_l2_norm_filter_prune "
            "{ prune_ratio: ... } } or n_out_of_m_pruner { l1_selective_prune { } }",
        )
    elif kind == "n_out_of_m_pruner":
        if not prune.n_out_of_m_pruner.HasField("l1_selective_prune"):
            yield doc.error(
                f"{path}.n_out_of_m_pruner",
                "n_out_of_m_pruner needs its algorithm: l1_selective_prune { n_out_of_m_type: M4N2 }",
            )
    elif not prune.filter_pruner.HasField("balanced_l2_norm_filter_prune"):
        yield doc.error(
            f"{path}.filter_pruner",
            "filter_pruner needs its algorithm: balanced_l2_norm_filter_prune { prune_ratio: ... }",
        )
    else:
        bcp = prune.filter_pruner.balanced_l2_norm_filter_prune
        bcp_path = f"{path}.filter_pruner.balanced_l2_norm_filter_prune"
        if not bcp.HasField("prune_ratio"):
            yield doc.error(bcp_path, 'missing required field "prune_ratio" in balanced_l2_norm_filter_prune')
        elif not 0 < bcp.prune_ratio < 1:
            # Spec §2.2: prune_ratio must lie in (0, 1) exclusive.
            yield doc.error(
                f"{bcp_path}.prune_ratio",
                f"prune_ratio must be between 0 and 1 (both excluded), got {_fmt(bcp.prune_ratio)}",
            )


def _retrain_dtype_errors(doc: CfgDocument, prefix: str, scope: Message, label: str) -> Iterator[ConfigError]:
    # Spec §2.2: allowed (activation, weight) pairs, and INT4 activations are refused.
    act = scope.retrain_data_quant_config.ulq_quantize.dst_type  # proto default INT8
    act_path = _join(prefix, "retrain_data_quant_config.ulq_quantize.dst_type")
    wts, wts_path = _weight_dst(scope, "retrain_weight_quant_config", "weights_retrain_algo", prefix)
    if act == retrain_pb2.INT4:
        yield doc.error(
            act_path,
            f"Int4 quantization aware training is not supported: {label} sets activation "
            "dst_type INT4; use INT8 (or INT16) activations",
        )
    elif (act, wts) not in RETRAIN_ACT_WTS_TYPES:
        a, w = retrain_pb2.DataType.Name(act), retrain_pb2.DataType.Name(wts)
        yield doc.error(
            wts_path if doc.position_of(wts_path) else act_path,
            f"activation/weight dst_type pair A{_BITS[a]}W{_BITS[w]} ({a} activations, {w} weights) "
            f"in {label} is not supported; supported pairs: A8W8, A16W8, A8W4",
        )


def _retrain_errors(doc: CfgDocument) -> Iterator[ConfigError]:
    yield from _positive(doc, "batch_num")
    for prefix, scope, label in _scopes(doc.message, _RETRAIN_OVERRIDES):
        yield from _prune_errors(doc, prefix, scope)
        yield from _clip_errors(
            doc, _join(prefix, "retrain_data_quant_config"), scope.retrain_data_quant_config
        )
        yield from _retrain_dtype_errors(doc, prefix, scope, label)
    for list_name, key in _RETRAIN_OVERRIDES:
        yield from _duplicate_overrides(doc, list_name, key)


def check_retrain_cfg(doc: CfgDocument) -> None:
    """Semantic checks of an AMCTRetrainConfig (spec §2.2). Raises the first ConfigError
    in file order; then warns about and removes repeated skip-list entries (in place)."""
    _raise_first(_retrain_errors(doc))
    _dedupe_skip_lists(doc, _RETRAIN_SKIP_LISTS)


# ----------------------------------------------------------------------------- distill


def _distill_dtype_errors(doc: CfgDocument, prefix: str, scope: Message, label: str) -> Iterator[ConfigError]:
    # Spec §2.1: activation and weight dst_type of a layer must be equal (INT4 or INT8).
    act = scope.distill_data_quant_config.ulq_quantize.dst_type
    act_path = _join(prefix, "distill_data_quant_config.ulq_quantize.dst_type")
    wts, wts_path = _weight_dst(scope, "distill_weight_quant_config", "weights_quant_algo", prefix)
    if act != wts:
        a, w = distill_pb2.DataType.Name(act), distill_pb2.DataType.Name(wts)
        yield doc.error(
            wts_path if doc.position_of(wts_path) else act_path,
            f"activation dst_type {a} and weight dst_type {w} differ in {label}; "
            "distillation needs the same dst_type for both",
        )


def _distill_group_errors(doc: CfgDocument) -> Iterator[ConfigError]:
    for i, group in enumerate(doc.message.distill_group):
        for key in ("start_layer_name", "end_layer_name"):
            if not getattr(group, key).strip():
                yield doc.error(f"distill_group[{i}].{key}", f"{key} of distill_group[{i}] must not be empty")


def _distill_errors(doc: CfgDocument) -> Iterator[ConfigError]:
    yield from _positive(doc, "batch_num")
    yield from _positive(doc, "group_size")
    yield from _distill_group_errors(doc)
    for prefix, scope, label in _scopes(doc.message, _DISTILL_OVERRIDES):
        yield from _clip_errors(
            doc, _join(prefix, "distill_data_quant_config"), scope.distill_data_quant_config
        )
        yield from _distill_dtype_errors(doc, prefix, scope, label)
    for list_name, key in _DISTILL_OVERRIDES:
        yield from _duplicate_overrides(doc, list_name, key)


def check_distill_cfg(doc: CfgDocument) -> None:
    """Semantic checks of an AMCTDistillConfig (spec §2.1, §3.1). Raises the first
    ConfigError in file order; then de-duplicates the skip lists with a warning."""
    _raise_first(_distill_errors(doc))
    _dedupe_skip_lists(doc, _DISTILL_SKIP_LISTS)


# ----------------------------------------------------------------------------- per API


def _set_fields(msg: Message, global_fields, override_fields) -> Iterator[str]:
    """Paths of the given fields that are set (messages present, lists non-empty)."""
    for name in global_fields:
        value = getattr(msg, name)
        if msg.HasField(name) if isinstance(value, Message) else len(value) > 0:
            yield name
    for list_name, _ in _RETRAIN_OVERRIDES:
        for i, entry in enumerate(getattr(msg, list_name)):
            yield from (f"{list_name}[{i}].{n}" for n in override_fields if entry.HasField(n))


_QUANT_CONFIGS = ("retrain_data_quant_config", "retrain_weight_quant_config")
_QUANT_SKIPS = ("quant_skip_layers", "quant_skip_types")
_PRUNE_CONFIGS = ("prune_config",)
_PRUNE_SKIPS = ("regular_prune_skip_layers", "regular_prune_skip_types")
_USE_COMPRESSED = "use the compressed API (create_compressed_retrain_model) to prune and quantize together"


def _reject(doc: CfgDocument, paths: list[str], kind: str, config: str) -> None:
    """Raise at the first of ``paths`` in the file, if any."""
    if paths:
        far = (float("inf"), float("inf"))
        bad = min(paths, key=lambda p: doc.locate(p) or far)
        raise doc.error(bad, f"{bad} is a {kind} setting, not allowed in {config}; {_USE_COMPRESSED}")


def check_cfg_for_api(cfg: CfgDocument | Message, api: CfgApi, path: str | Path | None = None) -> None:
    """Check that a retrain ``.cfg`` suits the API it is given to (spec §1.2-§1.4).

    ``quant`` (create_quant_retrain_config): no pruning settings anywhere.
    ``prune`` (create_prune_retrain_model): no quantization settings, and some pruning.
    ``compressed`` (create_compressed_retrain_model): quantization and/or pruning enabled.
    ``cfg`` is a CfgDocument (errors carry positions) or an AMCTRetrainConfig (positions
    are then read from ``path`` if it is a file).
    """
    if api not in ("quant", "prune", "compressed"):
        raise ValueError(f"api must be 'quant', 'prune' or 'compressed', got {api!r}")
    doc = CfgDocument.of(cfg, path)
    msg = doc.message
    if not isinstance(msg, retrain_pb2.AMCTRetrainConfig):
        raise TypeError(f"check_cfg_for_api needs an AMCTRetrainConfig, got {type(msg).__name__}")
    # AMCT's parse_proto_enable: only the configs themselves (global or override) switch
    # a mode on; AMCT's check_field also refuses the other mode's skip lists.
    quant_on = list(_set_fields(msg, _QUANT_CONFIGS, _QUANT_CONFIGS))
    prune_on = list(_set_fields(msg, _PRUNE_CONFIGS, _PRUNE_CONFIGS))
    if api == "quant":
        prune_any = list(_set_fields(msg, _PRUNE_CONFIGS + _PRUNE_SKIPS, _PRUNE_CONFIGS))
        _reject(doc, prune_any, "pruning", "a quantization-aware training config")
    elif api == "prune":
        quant_any = list(_set_fields(msg, _QUANT_CONFIGS + _QUANT_SKIPS, _QUANT_CONFIGS))
        _reject(doc, quant_any, "quantization", "a prune config")
        if not prune_on:
            raise doc.error(
                None,
                "the config enables no pruning: add prune_config { ... } globally or in "
                "an override for the prune API",
            )
    elif not quant_on and not prune_on:
        raise doc.error(
            None,
            "the config enables neither quantization nor pruning: add "
            "retrain_data_quant_config / retrain_weight_quant_config to quantize or "
            "prune_config to prune (globally or in an override)",
        )
