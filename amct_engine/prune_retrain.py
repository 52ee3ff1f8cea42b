"""Prune retrain and compressed retrain APIs (docs/spec/engine.md §1.3, §1.4).

create: parse the cfg → capture → BCP filter pruning (channels physically removed) → [compressed:
re-capture, insert QAT layers] → 4:2 selective masks → write the prune records → return the copy.
restore: the same, but pruning is replayed from the record (never recomputed), then the pth loads.
save: bake the 4:2 masks into the weights, then export (a plain float model twice, or the
fake-quant and deploy models of the QAT pipeline).

Every returned model carries ``amct_prune_report`` (a ``PruneReport``): what was pruned and why not.
"""

from __future__ import annotations

import os
import shutil

import torch
from torch import nn

from amct_engine.calibration import DEFAULT_CALIBRATION_BATCHES, calibration_batches, recalibrate_batch_norm
from amct_engine.config.cfg_checks import check_cfg_for_api, check_importance_names
from amct_engine.config.cfg_loader import CfgDocument, load_cfg_document
from amct_engine.config.layer_refs import check_layer_references
from amct_engine.config.quant_json import RETRAIN, QuantJsonConfig, layer_specs_from_cfg
from amct_engine.export.deploy_target import DEFAULT_DEPLOY_TARGET, check_deploy_target
from amct_engine.export.formats import DEFAULT_DEPLOY_FORMAT, check_deploy_format
from amct_engine.export.save import (
    FILE_MODE,
    export_onnx,
    output_paths,
    quant_layers,
    save_quantized_onnx,
    validate_dynamic_axes,
)
from amct_engine.graph.analysis import quantizable_layers
from amct_engine.graph.capture import CapturedModel, as_input_tuple, capture_model
from amct_engine.layer_table import retrain_type_names
from amct_engine.prune import progressive
from amct_engine.prune.dependency import build_channel_groups
from amct_engine.prune.importance import IMPORTANCE_CRITERIA, ImportanceData
from amct_engine.prune.layer_pruners import weight_layer_type_names
from amct_engine.prune.passes import (
    filter_prune,
    parameter_count,
    prune_records,
    replay_filter_prune,
    scheduled_filter_prune,
    selective_prune,
)
from amct_engine.prune.records import (
    read_prune_records,
    selective_masks_from_records,
    update_selective_records,
    write_prune_records,
)
from amct_engine.prune.report import REPLAYED, GroupDecision, PruneReport
from amct_engine.prune.selective import bake_selective_masks, selective_masks
from amct_engine.prune.settings import prune_settings_from_cfg
from amct_engine.quant.insert import insert_quant_layers
from amct_engine.quant_retrain import load_checkpoint, records_for_save
from amct_engine.record import RecordFile

REPORT_ATTR = "amct_prune_report"


# ---------------------------------------------------------------------- prune retrain (docs/spec/engine.md §1.3)


def create_prune_retrain_model(
    model,
    input_data,
    config_defination,
    record_file,
    calibration_data=None,
    *,
    sample_instance=None,
    calibration_batches=DEFAULT_CALIBRATION_BATCHES,
    recalibrate_bn=True,
) -> nn.Module:
    """A pruned copy of ``model``: BCP channels removed, 4:2 masks attached; the record lists both.

    Our extension: ``calibration_data`` (a DataLoader or iterable of batches; ``sample_instance`` picks
    the inputs as in ``distill``) gives the first ``calibration_batches`` batches to a data-driven
    importance criterion (``taylor``) and, after the channels are removed, re-estimates every
    BatchNorm's statistics on them (``recalibrate_bn``; no labels needed).
    """
    calibration = _calibration(calibration_data, sample_instance, calibration_batches, recalibrate_bn)
    return _create(model, input_data, config_defination, record_file, "prune", calibration)


def restore_prune_retrain_model(
    model, input_data, record_file, config_defination, pth_file, state_dict_name=None
) -> nn.Module:
    """Replay the record's pruning on an unloaded ``model``, then load ``pth_file``.

    Note the argument order (record_file before config_defination), as in AMCT.
    """
    return _restore(model, input_data, config_defination, record_file, pth_file, state_dict_name, "prune")


def save_prune_retrain_model(
    model,
    save_path,
    input_data,
    input_names=None,
    output_names=None,
    dynamic_axes=None,
    deploy_format=DEFAULT_DEPLOY_FORMAT,
    deploy_target=DEFAULT_DEPLOY_TARGET,
) -> dict[str, str]:
    """Bake the 4:2 masks and write the pruned float model twice: ``_deploy_model.onnx`` and
    ``_fake_quant_model.onnx`` with identical content (docs/spec/engine.md §1.3). `deploy_target` is
    accepted for a uniform API (export.deploy_target); a float model has no weight codes to choose."""
    _check_save_args(save_path, dynamic_axes, deploy_format)
    check_deploy_target(deploy_target)
    if quant_layers(model):
        raise RuntimeError("the model has quantised layers: save it with save_compressed_retrain_model")
    _flush_selective_records(model, None)
    return _save_float(
        _baked_copy(model), save_path, as_input_tuple(input_data), input_names, output_names, dynamic_axes
    )


# ---------------------------------------------------------------------- compressed retrain (docs/spec/engine.md §1.4)


def create_compressed_retrain_model(
    model,
    input_data,
    config_defination,
    record_file,
    calibration_data=None,
    *,
    sample_instance=None,
    calibration_batches=DEFAULT_CALIBRATION_BATCHES,
    recalibrate_bn=True,
    recalibrate_quantized_bn=False,
) -> nn.Module:
    """Prune (BCP and/or 4:2), re-capture, insert QAT layers; a new copy of ``model``.

    Quantisation factors reach the record at the first eval forward after training (docs/spec/engine.md §1.2).
    ``calibration_data`` and the keywords after it: as in ``create_prune_retrain_model`` (the BatchNorms
    are recalibrated on the pruned float model, before the QAT layers go in). ``recalibrate_quantized_bn``:
    once more after the QAT layers are in, on the fake-quantised forward (the activation quantisers
    take their IFMR start from the first calibration batches then).
    """
    calibration = _calibration(calibration_data, sample_instance, calibration_batches, recalibrate_bn)
    return _create(
        model,
        input_data,
        config_defination,
        record_file,
        "compressed",
        calibration,
        recalibrate_quantized_bn and calibration is not None,
    )


def restore_compressed_retrain_model(
    model, input_data, config_defination, record_file, pth_file, state_dict_name=None
) -> nn.Module:
    """The compressed model of ``create`` rebuilt from the record, with ``pth_file`` loaded."""
    return _restore(model, input_data, config_defination, record_file, pth_file, state_dict_name, "compressed")


def save_compressed_retrain_model(
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
    """Bake the 4:2 masks, then write ``<save_path>_fake_quant_model.onnx`` and ``_deploy_model.onnx``.

    Without quantised layers (a prune-only cfg) the float model is written twice (docs/spec/engine.md §1.4).
    deploy_format: a name in amct_engine.export.formats.DEPLOY_FORMATS: "onnx" (integer model for
    onnxruntime) or "ascend" (AMCT layout, docs/spec/engine.md §5).
    deploy_target: the CPU the "onnx" deploy model is for ("auto": this machine; "x86_amx", "x86_vnni", "x86_avx2",
    "x86_avx2_reduce_range", "x86_avx2_u8u8", "arm"), which picks how its weight codes are stored: int8, 7-bit
    int8 on AVX2 or uint8 + 128 (amct_engine.export.deploy_target).
    """
    _check_path(record_file, "record_file")
    _check_save_args(save_path, dynamic_axes, deploy_format)
    inputs = as_input_tuple(input_data)
    _flush_selective_records(model, record_file)
    baked = _baked_copy(model)
    if not quant_layers(baked):
        if not read_prune_records(record_file):
            raise RuntimeError(
                f"the model has no quantised layers and {record_file} has no prune record: pass "
                "the model returned by create_compressed_retrain_model"
            )
        return _save_float(baked, save_path, inputs, input_names, output_names, dynamic_axes)
    if progressive.schedule_of(model) is not None:
        _refresh_records(baked, inputs)
        model = baked  # the record now holds the factors of the layers without the removed channels
    records = records_for_save(model, record_file)
    return save_quantized_onnx(
        baked, records, save_path, inputs, input_names, output_names, dynamic_axes, deploy_format, deploy_target
    )


# ---------------------------------------------------------------------- shared steps


def _calibration(data, sample_instance, limit: int, recalibrate_bn: bool) -> tuple[list, bool] | None:
    if data is None:
        return None
    return calibration_batches(data, limit, sample_instance), recalibrate_bn


def _create(
    model, input_data, config_defination, record_file, api: str, calibration=None, recalibrate_quantized: bool = False
) -> nn.Module:
    _check_path(record_file, "record_file")
    doc = _load_cfg(config_defination, api)
    cm = _capture(model, input_data, doc, api)
    record = RecordFile(record_file)
    record.create_empty()
    report = PruneReport(params_before=parameter_count(cm.module))
    settings = prune_settings_from_cfg(doc.message, cm.module_types(), weight_layer_type_names())
    batches, recalibrate = calibration or ([], False)
    data = ImportanceData([(b.inputs, b.labels) for b in batches]) if batches else None
    if settings.progressive():  # our prune_schedule extension: masks now, channels removed at save
        cuts = []
        schedule = scheduled_filter_prune(cm, settings, report, data)
        if schedule is not None:
            schedule.state_file = progressive.state_path(record_file)
            progressive.attach(cm.module, schedule)  # re-capture and QAT insertion carry it along
        pruned = schedule is not None
    else:
        cuts = filter_prune(cm, settings, report, data=data)
        pruned = bool(cuts)
    if pruned and recalibrate:
        report.bn_recalibrated = recalibrate_batch_norm(cm.module, batches)  # pruned BNs start from real data
    report.params_after = _params_after_save(cm.module)
    result, cm = _quantise(cm, doc, record, api)
    if recalibrate_quantized and quant_layers(result):
        report.bn_recalibrated_quantized = recalibrate_batch_norm(result, batches)
    masks = selective_prune(result, cm, settings, record, report)
    write_prune_records(record, prune_records(cuts, masks))
    report.log(filter_configured=bool(settings.filter()))
    setattr(result, REPORT_ATTR, report)
    return result


def _restore(model, input_data, config_defination, record_file, pth_file, state_dict_name, api) -> nn.Module:
    _check_path(record_file, "record_file")
    _check_path(pth_file, "pth_file")
    doc = _load_cfg(config_defination, api)
    records = read_prune_records(record_file)
    cm = _capture(model, input_data, doc, api)
    report = PruneReport(params_before=parameter_count(cm.module))
    settings = prune_settings_from_cfg(doc.message, cm.module_types(), weight_layer_type_names())
    replay_filter_prune(cm, records, str(record_file), report)
    if settings.progressive():
        _replay_schedule(cm, progressive.state_path(record_file), report)
    report.params_after = _params_after_save(cm.module)
    record = RecordFile(record_file)
    # the quantisation factors are rewritten by the first eval forward; the prune records stay
    record.create_empty()
    write_prune_records(record, records)
    result, cm = _quantise(cm, doc, record, api)
    masks = selective_masks_from_records(records, str(record_file))
    selective_prune(result, cm, settings, record, report, masks=masks)
    load_checkpoint(result, pth_file, state_dict_name)
    report.log(filter_configured=False)
    setattr(result, REPORT_ATTR, report)
    return result


def _replay_schedule(cm: CapturedModel, path: str, report: PruneReport) -> None:
    """Restore of a progressive model: the masks, steps and batch count of the state file, as they were."""
    state = progressive.read_state(path)
    entries = progressive.restored_groups(state, build_channel_groups(cm).groups, path)
    schedule = progressive.ProgressivePruning(
        entries,
        progressive.float_modules(cm.module, [e.group for e in entries]),
        state_file=path,
        batches=state["batches"],
        history=state["history"],
    )
    progressive.attach(cm.module, schedule, restored=True)
    for i, e in enumerate(entries):
        report.groups.append(
            GroupDecision(
                i,
                e.group.producer_names,
                [],
                e.group.size,
                e.group.size - len(e.masked),
                REPLAYED,
                importance=e.importance,
                schedule=progressive.describe_schedule(e.schedule, e.target_ratio),
            )
        )


def _params_after_save(model: nn.Module) -> int:
    """Parameters of the saved model: with a schedule, after its channels are removed."""
    if progressive.schedule_of(model) is None:
        return parameter_count(model)
    trial = progressive.copy_model(model)
    progressive.remove_channels(trial)
    return parameter_count(trial)


def _quantise(cm: CapturedModel, doc: CfgDocument, record: RecordFile, api: str):
    """Compressed mode: re-capture the pruned model and insert QAT layers where the cfg asks
    (docs/spec/engine.md §2.2)."""
    if api != "compressed":
        return cm.module, cm
    float_model = cm.module
    cm = capture_model(float_model, cm.example_inputs)
    progressive.carry_over(float_model, cm.module)
    cfg = doc.message
    layers = {info.name: info.module for info in quantizable_layers(cm, retrain_type_names())}
    config = QuantJsonConfig(RETRAIN, batch_num=cfg.batch_num)
    if cfg.HasField("fakequant_precision_mode"):
        config.fakequant_precision_mode = "FORCE_FP16_QUANT"
    config.layers = layer_specs_from_cfg(cfg, RETRAIN, layers, only_configured=True)
    return insert_quant_layers(cm, config, record), cm


def _load_cfg(config_defination, api: str) -> CfgDocument:
    _check_path(config_defination, "config_defination")
    doc = load_cfg_document(config_defination, "retrain")
    check_cfg_for_api(doc, api)
    check_importance_names(doc, IMPORTANCE_CRITERIA.names())
    return doc


def _capture(model, input_data, doc: CfgDocument, api: str) -> CapturedModel:
    cm = capture_model(model, as_input_tuple(input_data))
    layer_types = {name: type(m).__name__ for name, m in cm.module.named_modules()}
    supported = set(weight_layer_type_names()) | (set(retrain_type_names()) if api == "compressed" else set())
    # ConfigError for names and types the model lacks (docs/spec/engine.md §1.1)
    check_layer_references(doc, layer_types, doc.path, supported_types=supported)
    return cm


def _check_path(value, what: str) -> None:
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{what} must be a str or os.PathLike, got {type(value).__name__}")


def _check_save_args(save_path, dynamic_axes, deploy_format) -> None:
    _check_path(save_path, "save_path")
    check_deploy_format(deploy_format)
    validate_dynamic_axes(dynamic_axes)


def _flush_selective_records(model: nn.Module, record_file) -> None:
    """Write the current 4:2 masks to the record (a refresh is only written at the next eval forward)."""
    masks = selective_masks(model)
    if not masks:
        return
    if record_file is not None:
        update_selective_records(RecordFile(record_file), {n: m.mask for n, m in masks.items()})
        for m in masks.values():
            m._record_pending = False
    else:
        for m in masks.values():
            if m._record_pending:
                m.flush_record()


@torch.no_grad()
def _refresh_records(model: nn.Module, inputs) -> None:
    """An eval forward of the saved copy after its schedule removed channels: the QAT layers write their
    (fewer) per-channel factors to the record, as after training (docs/spec/engine.md §1.2)."""
    model.eval()
    model(*inputs)


def _baked_copy(model: nn.Module) -> nn.Module:
    """The model to export: 4:2 masks baked in, a schedule's channels removed (its state written)."""
    baked = progressive.copy_model(model).eval()
    bake_selective_masks(baked)
    progressive.remove_channels(baked)
    return baked


def _save_float(model: nn.Module, save_path, inputs, input_names, output_names, dynamic_axes) -> dict[str, str]:
    """The pruned float model, written as both files (AMCT: one export, two names)."""
    paths = output_paths(str(save_path))
    cpu_inputs = tuple(t.detach().cpu() for t in inputs)
    export_onnx(model.cpu(), paths["deploy"], cpu_inputs, input_names, output_names, dynamic_axes)  # checked
    shutil.copyfile(paths["deploy"], paths["fake_quant"])
    os.chmod(paths["fake_quant"], FILE_MODE)
    return paths
