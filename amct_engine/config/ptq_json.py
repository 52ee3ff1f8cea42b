"""The PTQ JSON config (docs/spec/engine.md §3.3): written by create_quant_config, read by quantize_model.

Top-level keys ``version``, ``batch_num``, ``activation_offset``, ``do_fusion``,
``skip_fusion_layers``, then one object per quantizable layer (its module path) with
``quant_enable``, ``activation_quant_params`` and ``weight_quant_params``. Users may edit it;
reading checks every value and names the layer and key it rejects. Torch-free.
"""

from __future__ import annotations

import json
import os
from dataclasses import fields

from amct_engine.config.calibration_cfg import ARQ_BITS, PTQ_ACT_WTS_BITS, PtqConfig, PtqLayerSpec
from amct_engine.quant.calibrators import CALIBRATORS, by_cfg_field, cfg_fields

VERSION = 1
_TOP = ("version", "batch_num", "activation_offset", "do_fusion", "skip_fusion_layers")


def _layer_json(spec: PtqLayerSpec) -> dict:
    calibrator = CALIBRATORS[spec.act_algo]
    act = {"act_algo": calibrator.cfg_field, "num_bits": spec.act_bits}
    if spec.asymmetric is not None:
        act["asymmetric"] = spec.asymmetric
    act.update({name: getattr(spec, name) for name in calibrator.params})
    return {
        "quant_enable": spec.enabled,
        "activation_quant_params": act,
        "weight_quant_params": {
            "wts_algo": "arq_quantize",
            "num_bits": spec.wts_bits,
            "channel_wise": spec.channel_wise,
        },
    }


def write_ptq_config(path, config: PtqConfig) -> None:
    data = {
        "version": VERSION,
        "batch_num": config.batch_num,
        "activation_offset": config.activation_offset,
        "do_fusion": config.do_fusion,
        "skip_fusion_layers": list(config.skip_fusion_layers),
    }
    data.update({name: _layer_json(spec) for name, spec in config.layers.items()})
    directory = os.path.dirname(os.path.abspath(str(path)))
    os.makedirs(directory, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=4)
        f.write("\n")


def _bad(path, where: str, message: str) -> ValueError:
    return ValueError(f"{path}: {where}: {message}")


def _layer_spec(path, name: str, entry) -> PtqLayerSpec:
    if not isinstance(entry, dict):
        raise _bad(path, name, "expected an object with quant_enable / activation_quant_params / weight_quant_params")
    act = entry.get("activation_quant_params", {})
    wts = entry.get("weight_quant_params", {})
    calibrator = by_cfg_field(act.get("act_algo", CALIBRATORS[PtqLayerSpec.act_algo].cfg_field))
    if calibrator is None:
        raise _bad(path, f"{name}.activation_quant_params.act_algo", f"must be one of {', '.join(cfg_fields())}")
    known = {f.name for f in fields(PtqLayerSpec)}
    values = {k: v for k, v in act.items() if k in known and k != "act_algo"}
    spec = PtqLayerSpec(
        enabled=bool(entry.get("quant_enable", True)),
        act_algo=calibrator.name,
        act_bits=int(act.get("num_bits", 8)),
        wts_bits=int(wts.get("num_bits", 8)),
        channel_wise=bool(wts.get("channel_wise", True)),
        **values,
    )
    if (spec.act_bits, spec.wts_bits) not in PTQ_ACT_WTS_BITS or spec.wts_bits not in ARQ_BITS:
        raise _bad(
            path,
            name,
            f"A{spec.act_bits}W{spec.wts_bits} is not supported; use one of "
            + ", ".join(f"A{a}W{w}" for a, w in PTQ_ACT_WTS_BITS),
        )
    for param, message in calibrator.problems({p: getattr(spec, p) for p in calibrator.params}):
        raise _bad(path, f"{name}.activation_quant_params" + (f".{param}" if param else ""), message)
    return spec


def read_ptq_config(path, layer_types: dict[str, str]) -> PtqConfig:
    """Read and check the JSON; every layer it names must be a quantizable layer of the model."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise _bad(path, "top level", "expected a JSON object")
    batch_num = data.get("batch_num", 1)
    if not isinstance(batch_num, int) or batch_num < 1:
        raise _bad(path, "batch_num", f"must be an integer >= 1, got {batch_num!r}")
    config = PtqConfig(
        batch_num=batch_num,
        activation_offset=bool(data.get("activation_offset", True)),
        do_fusion=bool(data.get("do_fusion", True)),
        skip_fusion_layers=list(data.get("skip_fusion_layers", [])),
    )
    for name, entry in data.items():
        if name in _TOP:
            continue
        if name not in layer_types:
            raise _bad(path, name, "is not a quantizable layer of the model")
        config.layers[name] = _layer_spec(path, name, entry)
    return config
