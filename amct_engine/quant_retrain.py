"""QAT retrain API (docs/spec/engine.md §1.2): create_quant_retrain_config / _model, restore_…, save_…."""

from __future__ import annotations

import os

import torch
from torch import nn

from amct_engine.config.cfg_checks import check_cfg_for_api
from amct_engine.config.cfg_loader import load_retrain_cfg
from amct_engine.config.layer_refs import check_layer_references
from amct_engine.config.quant_json import (
    RETRAIN,
    QuantJsonConfig,
    layer_specs_from_cfg,
    read_json_config,
    write_json_config,
)
from amct_engine.export.deploy_target import DEFAULT_DEPLOY_TARGET
from amct_engine.export.formats import DEFAULT_DEPLOY_FORMAT
from amct_engine.export.save import quant_layers, save_quantized_onnx
from amct_engine.graph.analysis import quantizable_layers
from amct_engine.graph.capture import CapturedModel, as_input_tuple, capture_model
from amct_engine.layer_table import retrain_type_names
from amct_engine.quant.insert import insert_quant_layers
from amct_engine.record import RecordFile

CONFIG_ATTR = "_amct_retrain_config"


def _layer_modules(cm: CapturedModel) -> dict[str, nn.Module]:
    return {info.name: info.module for info in quantizable_layers(cm, retrain_type_names())}


def create_quant_retrain_config(config_file, model, input_data, config_defination=None) -> None:
    """Write the retrain JSON (docs/spec/engine.md §3.2) for `model`, from the defaults or a simple `.cfg`."""
    cfg = None
    if config_defination is not None:
        if not os.path.isfile(config_defination):
            raise FileNotFoundError(f"config_defination not found: {config_defination}")
        cfg = load_retrain_cfg(config_defination)
        check_cfg_for_api(cfg, "quant")
    cm = capture_model(model, as_input_tuple(input_data))
    layers = _layer_modules(cm)
    if cfg is not None:
        check_layer_references(cfg, cm.module_types(), str(config_defination), supported_types=retrain_type_names())
    config = QuantJsonConfig(RETRAIN, batch_num=cfg.batch_num if cfg else 1)
    if cfg is not None and cfg.HasField("fakequant_precision_mode"):
        config.fakequant_precision_mode = "FORCE_FP16_QUANT"
    config.layers = layer_specs_from_cfg(cfg, RETRAIN, layers)
    write_json_config(config_file, config)


def _read_config(config_file, cm: CapturedModel) -> QuantJsonConfig:
    layer_types = {name: type(m).__name__ for name, m in _layer_modules(cm).items()}
    return read_json_config(config_file, RETRAIN, layer_types)


def _config_text(config_file) -> str:
    with open(config_file, encoding="utf-8") as f:
        return f.read()


def create_quant_retrain_model(config_file, model, record_file, input_data) -> nn.Module:
    """A deep copy of `model` with every retrain_enable layer in its quantised training form."""
    cm = capture_model(model, as_input_tuple(input_data))
    config = _read_config(config_file, cm)
    record = RecordFile(record_file)
    record.create_empty()
    qmodel = insert_quant_layers(cm, config, record)
    # save_* checks that the config did not change since create (docs/spec/engine.md §1.2).
    setattr(qmodel, CONFIG_ATTR, _config_text(config_file))
    return qmodel


def restore_quant_retrain_model(
    config_file, model, record_file, input_data, pth_file, state_dict_name=None
) -> nn.Module:
    """Re-create the quantised model from an unloaded `model`, then load a checkpoint into it."""
    qmodel = create_quant_retrain_model(config_file, model, record_file, input_data)
    load_checkpoint(qmodel, pth_file, state_dict_name)
    return qmodel


def load_checkpoint(model: nn.Module, pth_file, state_dict_name=None) -> None:
    # weights_only: a checkpoint is data; never unpickle arbitrary objects.
    checkpoint = torch.load(pth_file, map_location="cpu", weights_only=True)
    if state_dict_name is not None:
        if state_dict_name not in checkpoint:
            raise KeyError(f"{pth_file} has no entry {state_dict_name!r}; keys: {sorted(checkpoint)}")
        checkpoint = checkpoint[state_dict_name]
    model.load_state_dict(checkpoint)


def save_quant_retrain_model(
    config_file,
    model,
    record_file,
    save_path,
    input_data,
    input_names=None,
    output_names=None,
    dynamic_axes=None,
    deploy_format=DEFAULT_DEPLOY_FORMAT,
    deploy_target=DEFAULT_DEPLOY_TARGET,
) -> dict[str, str]:
    """Write `<save_path>_fake_quant_model.onnx` and `<save_path>_deploy_model.onnx`.

    deploy_format: a name in amct_engine.export.formats.DEPLOY_FORMATS: "onnx" (integer model for
    onnxruntime) or "ascend" (AMCT layout, docs/spec/engine.md §5).
    deploy_target: the CPU the "onnx" deploy model is for ("auto": this machine; "x86_amx", "x86_vnni", "x86_avx2",
    "x86_avx2_reduce_range", "x86_avx2_u8u8", "arm"), which picks how its weight codes are stored: int8, 7-bit
    int8 on AVX2 or uint8 + 128 (amct_engine.export.deploy_target).
    """
    if getattr(model, CONFIG_ATTR, None) is None or not quant_layers(model):
        raise RuntimeError("model has no quantised layers: pass the model returned by create_quant_retrain_model")
    if _config_text(config_file) != getattr(model, CONFIG_ATTR):
        raise RuntimeError(f"{config_file} differs from the config the model was created with")
    records = records_for_save(model, record_file)
    return save_quantized_onnx(
        model,
        records,
        save_path,
        as_input_tuple(input_data),
        input_names,
        output_names,
        dynamic_axes,
        deploy_format,
        deploy_target,
    )


def records_for_save(model: nn.Module, record_file) -> dict:
    """The record entries of every quantised layer, or the error AMCT users know (docs/spec/engine.md §1.2)."""
    records = RecordFile(record_file).quant_layers()
    wrappers = quant_layers(model)
    missing = [w.layer_name for w in wrappers.values() if w.layer_name not in records or w._record_pending]
    if missing:
        raise RuntimeError(
            f"record_file {record_file} has no up-to-date quantisation factors for {', '.join(missing[:5])}"
            f"{' …' if len(missing) > 5 else ''}: run one inference pass after training "
            "(model.eval(); model(x)) before saving"
        )
    return records
