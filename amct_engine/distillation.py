"""Distillation API (docs/spec/engine.md §1.5). create_distill_config writes the distill JSON of
docs/spec/engine.md §3.1."""

from __future__ import annotations

import copy
import os

import torch
from torch import nn

from amct_engine.blockwise_distill.loop import distill
from amct_engine.blockwise_distill.sample import DistillSampleBase, ModelSingleTensorInput
from amct_engine.config.cfg_loader import load_distill_cfg
from amct_engine.config.layer_refs import check_layer_references
from amct_engine.config.quant_json import (
    DISTILL,
    QuantJsonConfig,
    layer_specs_from_cfg,
    read_json_config,
    write_json_config,
)
from amct_engine.export.deploy_target import DEFAULT_DEPLOY_TARGET, check_deploy_target
from amct_engine.export.formats import DEFAULT_DEPLOY_FORMAT, check_deploy_format
from amct_engine.export.save import quant_layers, save_quantized_onnx
from amct_engine.graph.analysis import quantizable_layers
from amct_engine.graph.capture import as_input_tuple, capture_model
from amct_engine.graph.distill_groups import distill_groups
from amct_engine.layer_table import distill_type_names
from amct_engine.quant.insert import insert_quant_layers
from amct_engine.quant_retrain import records_for_save
from amct_engine.record import RecordFile

__all__ = [
    "DistillSampleBase",
    "ModelSingleTensorInput",
    "create_distill_config",
    "create_distill_model",
    "distill",
    "save_distill_model",
]


def create_distill_config(config_file, model, input_data, config_defination=None) -> None:
    """Find the distillable layers, build the distill groups (docs/spec/engine.md §6.1) and write the JSON."""
    cfg = None
    if config_defination is not None:
        if not os.path.isfile(config_defination):
            raise FileNotFoundError(f"config_defination not found: {config_defination}")
        cfg = load_distill_cfg(config_defination)
    cm = capture_model(model, as_input_tuple(input_data))
    layers = {info.name: info.module for info in quantizable_layers(cm, distill_type_names())}
    if cfg is not None:
        # docs/spec/engine.md §2.1: as AMCT, the types are those of the model's distillable layers
        distillable = {type(m).__name__ for m in layers.values()}
        check_layer_references(cfg, cm.module_types(), str(config_defination), supported_types=distillable)
    user_groups = [(g.start_layer_name, g.end_layer_name) for g in cfg.distill_group] if cfg else []
    config = QuantJsonConfig(
        DISTILL,
        batch_num=cfg.batch_num if cfg else 1,
        group_size=cfg.group_size if cfg else 1,
        data_dump=cfg.data_dump if cfg else False,
        distill_groups=distill_groups(cm, group_size=cfg.group_size if cfg else 1, user_groups=user_groups),
    )
    config.layers = layer_specs_from_cfg(cfg, DISTILL, layers)
    write_json_config(config_file, config)


def create_distill_model(config_file, model, input_data) -> nn.Module:
    """A deep copy of `model` with every quant_enable Conv2d/Linear in its quantised form (docs/spec/engine.md §1.5)."""
    cm = capture_model(model, as_input_tuple(input_data))
    layer_types = {info.name: info.type_name for info in quantizable_layers(cm, distill_type_names())}
    config = read_json_config(config_file, DISTILL, layer_types)
    return insert_quant_layers(cm, config, record=None, distill=True)


def default_record_path(save_path) -> str:
    """Next to the saved models (AMCT used a fixed ./amct_log/scale_offset_record.txt)."""
    save_path = str(save_path)
    if save_path.endswith(("/", os.sep)):
        return os.path.join(save_path, "record.txt")
    return save_path + "_record.txt"


def save_distill_model(
    model,
    save_path,
    input_data,
    record_file=None,
    input_names=None,
    output_names=None,
    dynamic_axes=None,
    deploy_format=DEFAULT_DEPLOY_FORMAT,
    deploy_target=DEFAULT_DEPLOY_TARGET,
) -> dict[str, str]:
    """Write the record and the fake-quant and deploy ONNX models of a distilled student.

    Each BN that follows a quantised conv is folded in first (docs/spec/engine.md §6.3), exactly as the QAT save
    does, then the shared export pipeline runs. Returns the paths, `record` included.
    deploy_target: the CPU the "onnx" deploy model is for (amct_engine.export.deploy_target).
    """
    check_deploy_format(deploy_format)  # before the record is rewritten
    check_deploy_target(deploy_target)
    wrappers = quant_layers(model)
    if not wrappers:
        raise RuntimeError("model has no quantised layers: pass the model returned by create_distill_model")
    record = RecordFile(record_file or default_record_path(save_path))
    record.create_empty()
    inputs = as_input_tuple(input_data)
    student = copy.deepcopy(model).eval()
    for wrapper in quant_layers(student).values():
        if wrapper.following_bn is not None:
            wrapper.bn = student.get_submodule(wrapper.following_bn)
            student.set_submodule(wrapper.following_bn, nn.Identity())
        wrapper.record = record
        wrapper.invalidate()
    device = next(student.parameters()).device
    with torch.no_grad():
        student(*(t.to(device) for t in inputs))  # the eval forward writes every layer's factors
    records = records_for_save(student, record.path)
    paths = save_quantized_onnx(
        student, records, save_path, inputs, input_names, output_names, dynamic_axes, deploy_format, deploy_target
    )
    return {**paths, "record": record.path}
