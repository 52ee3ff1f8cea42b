"""Semantic checks of parsed ``.cfg`` files: what the proto schema cannot express.

Every failure is a ``ConfigError`` located at the offending field (or, for a value left
at its default, at the closest block written in the file). When several things are
wrong, the one that comes first in the file is raised, as a compiler would.

A *scope* is the global config or one override entry (override_layer_configs /
override_layer_types, distill_override_layers / distill_override_layer_types; the list is
cfg_layout's). AMCT reads each override's quant configs on their own, falling back to the
proto defaults (INT8), not to the global config, so the dst_type pair is computed per scope
the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

from google.protobuf.message import Message

from amct_engine.config.cfg_document import CfgDocument
from amct_engine.config.cfg_layout import DISTILL_LAYOUT, RETRAIN_LAYOUT, CfgLayout, Scope
from amct_engine.config.errors import ConfigError
from amct_engine.config.specs import DST_BITS, RETRAIN_ACT_WTS_BITS, pair_name
from amct_engine.proto import distill_config_pytorch_pb2 as distill_pb2
from amct_engine.proto import retrain_config_pytorch_pb2 as retrain_pb2

CfgApi = Literal["quant", "prune", "compressed"]


# ----------------------------------------------------------------------------- helpers


def _fmt(value: float) -> str:
    # Floats in the proto are float32: print 0.3, not 0.30000001192092896.
    return f"{value:.7g}"


def _raise_first(errors: Iterable[ConfigError]) -> None:
    # Report the problem that comes first in the file; unlocated ones last.
    errors = list(errors)
    if errors:
        raise min(errors, key=lambda e: (e.line if e.line is not None else float("inf"), e.column or 0))


def _positive(doc: CfgDocument, name: str) -> Iterator[ConfigError]:
    value = getattr(doc.message, name)
    if value <= 0:
        yield doc.error(name, f"{name} must be greater than 0, got {value}")


def _act_dst(layout: CfgLayout, scope: Scope) -> tuple[int, str]:
    """Activation dst_type of a scope (proto default INT8) and the path to report it at."""
    data_config = getattr(scope.message, layout.data_config)
    return data_config.ulq_quantize.dst_type, scope.field_path(f"{layout.data_config}.ulq_quantize.dst_type")


def _weight_dst(layout: CfgLayout, scope: Scope) -> tuple[int, str]:
    """Effective weight dst_type of a scope and the path to report it at."""
    config = getattr(scope.message, layout.weight_config)
    algo = layout.chosen_weight_field(config)
    if algo is None:
        # No weight algorithm: AMCT's default quantiser at INT8 (INT8 is 1 in both protos).
        return retrain_pb2.INT8, scope.field_path(layout.weight_config)
    return getattr(config, algo).dst_type, scope.field_path(f"{layout.weight_config}.{algo}.dst_type")


def _clip_errors(doc: CfgDocument, layout: CfgLayout, scope: Scope) -> Iterator[ConfigError]:
    # docs/spec/engine.md §3.2: clip_max > 0 and clip_min < 0 (both required by the proto).
    data_path = scope.field_path(layout.data_config)
    ulq = getattr(scope.message, layout.data_config).ulq_quantize
    if not ulq.HasField("clip_max_min"):
        return
    clip, path = ulq.clip_max_min, f"{data_path}.ulq_quantize.clip_max_min"
    if clip.HasField("clip_max") and not clip.clip_max > 0:
        yield doc.error(f"{path}.clip_max", f"clip_max must be greater than 0, got {_fmt(clip.clip_max)}")
    if clip.HasField("clip_min") and not clip.clip_min < 0:
        yield doc.error(f"{path}.clip_min", f"clip_min must be less than 0, got {_fmt(clip.clip_min)}")


def _duplicate_overrides(doc: CfgDocument, layout: CfgLayout) -> Iterator[ConfigError]:
    # docs/spec/engine.md §2.2: repeated override names/types raise (AMCT: ValueError), here at the repeat.
    for override in layout.overrides:
        list_name, key = override.field, override.key
        first_seen: dict[str, str] = {}
        for i, entry in enumerate(getattr(doc.message, list_name)):
            name, path = getattr(entry, key), f"{list_name}[{i}].{key}"
            if name not in first_seen:
                first_seen[name] = path
                continue
            pos = doc.position_of(first_seen[name])
            where = f" (first at {pos[0]}:{pos[1]})" if pos else ""
            yield doc.error(path, f'{key} "{name}" has more than one {list_name} entry{where}; merge them into one')


def _dedupe_skip_lists(doc: CfgDocument, layout: CfgLayout) -> None:
    # docs/spec/engine.md §2.2: repeated skip items produce a warning and are de-duplicated (AMCT does the
    # same for the distill quant_skip lists).
    for list_name in layout.skip_lists():
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


def _prune_errors(doc: CfgDocument, scope: Scope) -> Iterator[ConfigError]:
    # One prune kind per scope is the PruneConfig oneof, enforced by the parser; a scope
    # with a kind but no algorithm would prune nothing (AMCT raises for it too).
    if not scope.message.HasField("prune_config"):
        return
    path, prune = scope.field_path("prune_config"), scope.message.prune_config
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
            # docs/spec/engine.md §2.2: prune_ratio must lie in (0, 1) exclusive.
            yield doc.error(
                f"{bcp_path}.prune_ratio",
                f"prune_ratio must be between 0 and 1 (both excluded), got {_fmt(bcp.prune_ratio)}",
            )
        elif bcp.HasField("prune_schedule"):
            yield from _schedule_errors(doc, bcp, f"{bcp_path}.prune_schedule")


def _schedule_errors(doc: CfgDocument, bcp: Message, path: str) -> Iterator[ConfigError]:
    """Our ``prune_schedule`` extension (docs/spec/engine.md §2.2): at least one step, one batch between
    steps, and a start below the target (the mask only grows)."""
    schedule = bcp.prune_schedule
    if bcp.importance == "taylor":
        # a step re-ranks the channels during training, from the weights alone: no calibration batches then
        yield doc.error(path, 'prune_schedule needs a weight-based importance ("bcp" or "group_l2"), not "taylor"')
    if schedule.steps < 1:
        yield doc.error(f"{path}.steps", f"prune_schedule needs steps >= 1, got {schedule.steps}")
    if schedule.HasField("interval") and schedule.interval < 1:
        yield doc.error(
            f"{path}.interval",
            f"prune_schedule needs interval >= 1 (training batches per step), got {schedule.interval}",
        )
    if not 0 <= schedule.start_ratio < bcp.prune_ratio:
        yield doc.error(
            f"{path}.start_ratio",
            f"prune_schedule start_ratio must be >= 0 and below prune_ratio "
            f"{_fmt(bcp.prune_ratio)}, got {_fmt(schedule.start_ratio)}",
        )


def check_importance_names(doc: CfgDocument, known: Iterable[str]) -> None:
    """A ConfigError at the first ``importance`` extension field (docs/spec/engine.md §2.2) naming no
    criterion of ``known`` (the names of amct_engine.prune.importance.IMPORTANCE_CRITERIA)."""
    known = list(known)
    errors = []
    for scope in RETRAIN_LAYOUT.scopes(doc.message):
        if not scope.message.HasField("prune_config"):
            continue
        bcp = scope.message.prune_config.filter_pruner.balanced_l2_norm_filter_prune
        if bcp.HasField("importance") and bcp.importance not in known:
            path = scope.field_path("prune_config.filter_pruner.balanced_l2_norm_filter_prune.importance")
            errors.append(
                doc.error(
                    path,
                    f'importance "{bcp.importance}" is not a pruning importance criterion; known: {", ".join(known)}',
                )
            )
    _raise_first(errors)


def _retrain_dtype_errors(doc: CfgDocument, scope: Scope) -> Iterator[ConfigError]:
    # docs/spec/engine.md §2.2: allowed (activation, weight) pairs, and INT4 activations are refused.
    act, act_path = _act_dst(RETRAIN_LAYOUT, scope)
    wts, wts_path = _weight_dst(RETRAIN_LAYOUT, scope)
    a, w = retrain_pb2.DataType.Name(act), retrain_pb2.DataType.Name(wts)
    if act == retrain_pb2.INT4:
        yield doc.error(
            act_path,
            f"Int4 quantization aware training is not supported: {scope.label} sets activation "
            "dst_type INT4; use INT8 (or INT16) activations",
        )
    elif (DST_BITS[a], DST_BITS[w]) not in RETRAIN_ACT_WTS_BITS:
        supported = ", ".join(pair_name(*pair) for pair in RETRAIN_ACT_WTS_BITS)
        yield doc.error(
            wts_path if doc.position_of(wts_path) else act_path,
            f"activation/weight dst_type pair {pair_name(DST_BITS[a], DST_BITS[w])} ({a} activations, "
            f"{w} weights) in {scope.label} is not supported; supported pairs: {supported}",
        )


def _retrain_errors(doc: CfgDocument) -> Iterator[ConfigError]:
    yield from _positive(doc, "batch_num")
    for scope in RETRAIN_LAYOUT.scopes(doc.message):
        yield from _prune_errors(doc, scope)
        yield from _clip_errors(doc, RETRAIN_LAYOUT, scope)
        yield from _retrain_dtype_errors(doc, scope)
    yield from _duplicate_overrides(doc, RETRAIN_LAYOUT)


def check_retrain_cfg(doc: CfgDocument) -> None:
    """Semantic checks of an AMCTRetrainConfig (docs/spec/engine.md §2.2). Raises the first ConfigError
    in file order; then warns about and removes repeated skip-list entries (in place)."""
    _raise_first(_retrain_errors(doc))
    _dedupe_skip_lists(doc, RETRAIN_LAYOUT)


# ----------------------------------------------------------------------------- distill


def _distill_dtype_errors(doc: CfgDocument, scope: Scope) -> Iterator[ConfigError]:
    # docs/spec/engine.md §2.1: activation and weight dst_type of a layer must be equal (INT4 or INT8).
    act, act_path = _act_dst(DISTILL_LAYOUT, scope)
    wts, wts_path = _weight_dst(DISTILL_LAYOUT, scope)
    if act != wts:
        a, w = distill_pb2.DataType.Name(act), distill_pb2.DataType.Name(wts)
        yield doc.error(
            wts_path if doc.position_of(wts_path) else act_path,
            f"activation dst_type {a} and weight dst_type {w} differ in {scope.label}; "
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
    for scope in DISTILL_LAYOUT.scopes(doc.message):
        yield from _clip_errors(doc, DISTILL_LAYOUT, scope)
        yield from _distill_dtype_errors(doc, scope)
    yield from _duplicate_overrides(doc, DISTILL_LAYOUT)


def check_distill_cfg(doc: CfgDocument) -> None:
    """Semantic checks of an AMCTDistillConfig (docs/spec/engine.md §2.1, §3.1). Raises the first
    ConfigError in file order; then de-duplicates the skip lists with a warning."""
    _raise_first(_distill_errors(doc))
    _dedupe_skip_lists(doc, DISTILL_LAYOUT)


# ----------------------------------------------------------------------------- per API


def _set_fields(msg: Message, global_fields, override_fields) -> Iterator[str]:
    """Paths of the given fields that are set (messages present, lists non-empty): the
    ``global_fields`` of the global config, the ``override_fields`` of each override."""
    for scope in RETRAIN_LAYOUT.scopes(msg):
        for name in global_fields if scope.path == "" else override_fields:
            value = getattr(scope.message, name)
            if scope.message.HasField(name) if isinstance(value, Message) else len(value) > 0:
                yield scope.field_path(name)


def _own_skip_lists(mine, other) -> tuple[str, ...]:
    """The skip lists of one mode only (skip_layers / skip_layer_types serve both)."""
    shared = set(other.layers + other.types)
    return tuple(f for f in mine.layers + mine.types if f not in shared)


_QUANT_CONFIGS = RETRAIN_LAYOUT.quant_configs
_QUANT_SKIPS = _own_skip_lists(RETRAIN_LAYOUT.quant_skips, RETRAIN_LAYOUT.prune_skips)
_PRUNE_CONFIGS = (RETRAIN_LAYOUT.prune_config,)
_PRUNE_SKIPS = _own_skip_lists(RETRAIN_LAYOUT.prune_skips, RETRAIN_LAYOUT.quant_skips)
_USE_COMPRESSED = "use the compressed API (create_compressed_retrain_model) to prune and quantize together"


def _reject(doc: CfgDocument, paths: list[str], kind: str, config: str) -> None:
    """Raise at the first of ``paths`` in the file, if any."""
    if paths:
        far = (float("inf"), float("inf"))
        bad = min(paths, key=lambda p: doc.locate(p) or far)
        raise doc.error(bad, f"{bad} is a {kind} setting, not allowed in {config}; {_USE_COMPRESSED}")


def check_cfg_for_api(cfg: CfgDocument | Message, api: CfgApi, path: str | Path | None = None) -> None:
    """Check that a retrain ``.cfg`` suits the API it is given to (docs/spec/engine.md §1.2-§1.4).

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
                "the config enables no pruning: add prune_config { ... } globally or in an override for the prune API",
            )
    elif not quant_on and not prune_on:
        raise doc.error(
            None,
            "the config enables neither quantization nor pruning: add "
            "retrain_data_quant_config / retrain_weight_quant_config to quantize or "
            "prune_config to prune (globally or in an override)",
        )
