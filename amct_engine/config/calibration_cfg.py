"""The PTQ "simple config" (AMCT's ``AMCTConfig`` in calibration_config_pytorch.proto, docs/spec/engine.md §2.5).

Parsed like the retrain and distill cfgs (protobuf ``text_format.Parse``, every error a
``ConfigError`` at ``path:line:column`` naming the field), then checked and resolved into one
``PtqLayerSpec`` per layer: override_layer_configs > override_layer_types > common_config,
skip_layers / skip_layer_types take a layer out. Torch-free.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from amct_engine.config.cfg_document import CfgDocument, read_cfg_file
from amct_engine.config.cfg_parse_errors import parse_cfg_message
from amct_engine.config.errors import ConfigError
from amct_engine.proto import calibration_config_pytorch_pb2 as calibration_pb2
from amct_engine.quant.calibrators import by_cfg_field

# (activation, weight) bit widths PTQ writes; the same as QAT's so a generated cfg carries over.
PTQ_ACT_WTS_BITS = ((8, 8), (16, 8), (8, 4))
ARQ_BITS = (4, 8)
_DST_BITS = {calibration_pb2.INT4: 4, calibration_pb2.INT8: 8, calibration_pb2.INT16: 16}


@dataclass(frozen=True)
class PtqLayerSpec:
    """What PTQ does to one layer (docs/spec/engine.md §3.3: one entry of the PTQ JSON)."""

    enabled: bool = True
    act_algo: str = "ifmr"  # a CALIBRATORS name (quant/calibrators.py)
    act_bits: int = 8
    asymmetric: bool | None = None  # None: the config's activation_offset
    search_range_start: float = 0.7
    search_range_end: float = 1.3
    search_step: float = 0.01
    max_percentile: float = 0.999999
    min_percentile: float = 0.999999
    num_of_bins: int = 4096
    channel_wise: bool = True
    wts_bits: int = 8
    wts_algo: str = "arq"  # a WEIGHT_QUANTIZERS name; the calibration cfg only has arq_quantize


@dataclass
class PtqConfig:
    """The PTQ JSON as values (docs/spec/engine.md §3.3)."""

    batch_num: int = 1
    activation_offset: bool = True
    do_fusion: bool = True
    skip_fusion_layers: list[str] = field(default_factory=list)
    layers: dict[str, PtqLayerSpec] = field(default_factory=dict)

    def enabled_layers(self) -> list[str]:
        return [name for name, spec in self.layers.items() if spec.enabled]


def parse_calibration_cfg(text: str | bytes, path: str = "<string>", check: bool = True) -> CfgDocument:
    """Parse and (when ``check``) check a calibration ``.cfg``; ConfigError with its position otherwise."""
    doc = parse_cfg_message(text, calibration_pb2.AMCTConfig, str(path))
    if check:
        check_calibration_cfg(doc)
    return doc


def load_calibration_cfg(path: str | Path) -> CfgDocument:
    return parse_calibration_cfg(read_cfg_file(path), str(path))


def _scopes(msg) -> Iterator[tuple[str, object]]:
    """(field path, CalibrationConfig) of the common config and every override."""
    if msg.HasField("common_config"):
        yield "common_config", msg.common_config
    for list_name in ("override_layer_configs", "override_layer_types"):
        for i, entry in enumerate(getattr(msg, list_name)):
            yield f"{list_name}[{i}].calibration_config", entry.calibration_config


def _scope_errors(doc: CfgDocument, path: str, config) -> Iterator[ConfigError]:
    act_field = config.WhichOneof("act_algo")
    act = getattr(config, act_field) if act_field else None
    calibrator = by_cfg_field(act_field) if act_field else None
    if calibrator is not None:
        values = {name: getattr(act, name) for name in calibrator.params}
        for param, message in calibrator.problems(values):
            yield doc.error(f"{path}.{act_field}" + (f".{param}" if param else ""), message)
    if config.HasField("arq_quantize") and config.arq_quantize.quant_bits not in ARQ_BITS:
        yield doc.error(
            f"{path}.arq_quantize.quant_bits", f"quant_bits must be 4 or 8, got {config.arq_quantize.quant_bits}"
        )
    act_bits = _DST_BITS[act.dst_type] if act is not None else 8
    wts_bits = config.arq_quantize.quant_bits if config.HasField("arq_quantize") else 8
    if act_field and config.HasField("arq_quantize") and (act_bits, wts_bits) not in PTQ_ACT_WTS_BITS:
        pairs = ", ".join(f"A{a}W{w}" for a, w in PTQ_ACT_WTS_BITS)
        yield doc.error(f"{path}.{act_field}.dst_type", f"A{act_bits}W{wts_bits} is not supported; use one of {pairs}")


def _duplicate_errors(doc: CfgDocument) -> Iterator[ConfigError]:
    for list_name, key in (("override_layer_configs", "layer_name"), ("override_layer_types", "layer_type")):
        seen: set[str] = set()
        for i, entry in enumerate(getattr(doc.message, list_name)):
            value = getattr(entry, key)
            if value in seen:
                yield doc.error(f"{list_name}[{i}].{key}", f'{key} "{value}" has more than one {list_name} entry')
            seen.add(value)


def _search_errors(doc: CfgDocument) -> Iterator[ConfigError]:
    search = doc.message.search_config
    if search.HasField("max_top1_drop") and search.max_top1_drop < 0:
        yield doc.error("search_config.max_top1_drop", "max_top1_drop must be >= 0 (accuracy points)")
    if search.HasField("min_cosine") and not -1 <= search.min_cosine <= 1:
        yield doc.error("search_config.min_cosine", "min_cosine must lie in [-1, 1]")
    if not 0 < search.target_macs_ratio < 1:
        yield doc.error("search_config.target_macs_ratio", "target_macs_ratio must lie in (0, 1)")
    for i, ratio in enumerate(search.prune_ratios):
        if not 0 < ratio < 1:
            yield doc.error(f"search_config.prune_ratios[{i}]", f"a prune ratio must lie in (0, 1), got {ratio:g}")


def search_settings(msg, labelled: bool) -> dict:
    """The search_config extension as engine arguments, with the defaults of docs/spec/engine.md §2.5."""
    search = msg.search_config
    names = {calibration_pb2.INT4: "INT4", calibration_pb2.INT8: "INT8", calibration_pb2.INT16: "INT16"}
    budget = {}
    if search.HasField("max_top1_drop"):
        budget["max_top1_drop"] = search.max_top1_drop
    if search.HasField("min_cosine"):
        budget["min_cosine"] = search.min_cosine
    if not budget:
        budget = {"max_top1_drop": 0.5} if labelled else {"min_cosine": 0.99}
    return {
        "budget": budget,
        "prune_ratios": [round(r, 6) for r in search.prune_ratios],
        "precisions": [names[p] for p in search.precisions],
        "keep_float": search.keep_float,
        "target_macs_ratio": round(search.target_macs_ratio, 6),
    }


def check_calibration_cfg(doc: CfgDocument) -> None:
    """The checks the schema cannot express; the first error found in file order is raised."""
    msg = doc.message
    errors: list[ConfigError] = []
    if msg.batch_num < 1:
        errors.append(doc.error("batch_num", "batch_num must be >= 1"))
    for path, config in _scopes(msg):
        errors.extend(_scope_errors(doc, path, config))
    errors.extend(_duplicate_errors(doc))
    errors.extend(_search_errors(doc))
    if errors:
        errors.sort(key=lambda e: (e.line or 0, e.column or 0))
        raise errors[0]


def _apply(spec: PtqLayerSpec, config) -> PtqLayerSpec:
    """``spec`` with what the CalibrationConfig message sets."""
    act_field = config.WhichOneof("act_algo")
    if act_field is not None:
        act = getattr(config, act_field)
        calibrator = by_cfg_field(act_field)
        assert calibrator is not None  # the oneof's fields are the table's (quant/calibrators.py)
        spec = replace(
            spec,
            act_algo=calibrator.name,
            act_bits=_DST_BITS[act.dst_type],
            asymmetric=act.asymmetric if act.HasField("asymmetric") else None,
            **{name: getattr(act, name) for name in calibrator.params},
        )
    if config.HasField("arq_quantize"):
        spec = replace(spec, channel_wise=config.arq_quantize.channel_wise, wts_bits=config.arq_quantize.quant_bits)
    return spec


def resolve_ptq_layers(msg, layer_types: dict[str, str], skip_layers=()) -> dict[str, PtqLayerSpec]:
    """Every layer's spec: layer override > type override > common_config > defaults; skips disable."""
    by_name = {o.layer_name: o.calibration_config for o in msg.override_layer_configs} if msg else {}
    by_type = {o.layer_type: o.calibration_config for o in msg.override_layer_types} if msg else {}
    skipped = set(skip_layers) | (set(msg.skip_layers) if msg else set())
    skipped_types = set(msg.skip_layer_types) if msg else set()
    out = {}
    for name, type_name in layer_types.items():
        spec = PtqLayerSpec()
        if msg is not None and msg.HasField("common_config"):
            spec = _apply(spec, msg.common_config)
        if type_name in by_type:
            spec = _apply(spec, by_type[type_name])
        if name in by_name:
            spec = _apply(spec, by_name[name])
        if name in skipped or type_name in skipped_types:
            spec = replace(spec, enabled=False)
        out[name] = spec
    return out
