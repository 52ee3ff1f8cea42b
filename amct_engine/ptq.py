"""Post-training quantisation API with AMCT's names (docs/spec/engine.md §1.6).

    create_quant_config(config_file, model, input_data, ...)        -> the PTQ JSON (docs/spec/engine.md §3.3)
    quantize_model(config_file, modfied_onnx_file, record_file, model, input_data, ...)
                                                                   -> the calibration model
    (the user runs batch_num forward batches; each layer writes its record entry once calibrated)
    save_model(modfied_onnx_file, record_file, save_path)           -> fake-quant + deploy ONNX

The calibration model is the QAT model's layer (QuantRetrainLayer) with a calibration activation
quantiser (IFMR or HFMG, quant/calibration_act.py) and ARQ weights on BN-folded layers, so the
record, the export pipeline and the deploy formats are exactly QAT's (export/save.py).
"""

from __future__ import annotations

import os
import weakref

import torch
from torch import nn

from amct_engine.config.calibration_cfg import PtqConfig, load_calibration_cfg, resolve_ptq_layers
from amct_engine.config.cfg_document import CfgDocument
from amct_engine.config.errors import ConfigError
from amct_engine.config.ptq_json import read_ptq_config, write_ptq_config
from amct_engine.export.backends import FloatLayerWriter
from amct_engine.export.deploy_target import DEFAULT_DEPLOY_TARGET
from amct_engine.export.formats import DEFAULT_DEPLOY_FORMAT
from amct_engine.export.layer_graph import LayerPlaceholder, export_layer_graph, splice_layers
from amct_engine.export.save import quant_layers, save_quantized_onnx, write_checked_onnx
from amct_engine.graph.analysis import conv_bn_act_chains, quantizable_layers
from amct_engine.graph.capture import CapturedModel, as_input_tuple, capture_model
from amct_engine.layer_table import retrain_type_names
from amct_engine.quant.calibration_act import CalibrationActQuantizer
from amct_engine.quant.calibrators import CALIBRATORS
from amct_engine.quant.deployed import fold_batch_norm
from amct_engine.quant.lookup_tables import round_lookup_tables
from amct_engine.quant.registry import WEIGHT_QUANTIZERS
from amct_engine.quant.retrain_layer import out_channels, qat_layer_class
from amct_engine.record import RecordFile

PTQ_ATTR = "_amct_ptq"
# modfied_onnx_file -> its calibration model: AMCT's save_model takes only file names (docs/spec/engine.md §1.6).
_CALIBRATION_MODELS: dict[str, weakref.ref] = {}


def _layer_types(cm: CapturedModel) -> dict[str, str]:
    return {info.name: info.type_name for info in quantizable_layers(cm, retrain_type_names())}


def _check_cfg_layers(doc: CfgDocument, layer_types: dict[str, str]) -> None:
    """A layer name in skip_layers or override_layer_configs must be a quantizable layer."""
    msg = doc.message
    named = [(f"skip_layers[{i}]", n) for i, n in enumerate(msg.skip_layers)]
    named += [
        (f"override_layer_configs[{i}].layer_name", o.layer_name) for i, o in enumerate(msg.override_layer_configs)
    ]
    for path, name in named:
        if name not in layer_types:
            known = ", ".join(list(layer_types)[:8])
            raise doc.error(path, f'"{name}" is not a quantizable layer of the model (layers: {known})')


def create_quant_config(
    config_file, model, input_data, skip_layers=None, batch_num=1, activation_offset=True, config_defination=None
) -> None:
    """Write the PTQ JSON for `model`: the defaults (IFMR, ARQ INT8) or those of a calibration `.cfg`.

    With a `.cfg`, its batch_num / activation_offset / skip lists apply (AMCT: the cfg wins over
    the arguments); `skip_layers` is added to the cfg's.
    """
    if not isinstance(batch_num, int) or batch_num < 1:
        raise ValueError(f"batch_num must be an integer >= 1, got {batch_num!r}")
    cm = capture_model(model, as_input_tuple(input_data), copy_model=False)  # read only: the layer table
    layer_types = _layer_types(cm)
    unknown = [n for n in (skip_layers or []) if n not in layer_types]
    if unknown:
        raise ValueError(f"skip_layers names layers the model has no quantizable layer for: {unknown}")
    msg = None
    config = PtqConfig(batch_num=batch_num, activation_offset=bool(activation_offset))
    if config_defination is not None:
        doc = load_calibration_cfg(config_defination)
        _check_cfg_layers(doc, layer_types)
        msg = doc.message
        config = PtqConfig(
            batch_num=msg.batch_num,
            activation_offset=msg.activation_offset,
            do_fusion=msg.do_fusion,
            skip_fusion_layers=list(msg.skip_fusion_layers),
        )
    config.layers = resolve_ptq_layers(msg, layer_types, skip_layers or ())
    write_ptq_config(config_file, config)


def _fold_bn(cm: CapturedModel, skip: set[str]) -> None:
    """docs/spec/engine.md §1.6 do_fusion: Conv+BN folded before calibration (BN becomes Identity)."""
    for chain in conv_bn_act_chains(cm):
        if chain.bn is None or chain.layer in skip:
            continue
        layer = cm.module.get_submodule(chain.layer)
        cm.module.set_submodule(chain.layer, fold_batch_norm(layer, cm.module.get_submodule(chain.bn)))
        cm.module.set_submodule(chain.bn, nn.Identity())


def _observer(spec, config: PtqConfig) -> nn.Module:
    asymmetric = config.activation_offset if spec.asymmetric is None else spec.asymmetric
    return CALIBRATORS[spec.act_algo].observer_class().from_spec(spec, config.batch_num, asymmetric)


def quantize_model(
    config_file,
    modfied_onnx_file,
    record_file,
    model,
    input_data,
    input_names=None,
    output_names=None,
    dynamic_axes=None,
) -> nn.Module:
    """The calibration model (a deep copy, eval mode): run `batch_num` batches through it, then save_model.

    Writes the BN-folded float model to `modfied_onnx_file` and empties `record_file`.
    """
    inputs = as_input_tuple(input_data)
    cm = capture_model(model, inputs)
    config = read_ptq_config(config_file, _layer_types(cm))
    if config.do_fusion:
        _fold_bn(cm, set(config.skip_fusion_layers))
    round_lookup_tables(cm)  # the deploy file's int8 rows (quant/lookup_tables.py)
    qmodel = cm.module.eval()
    layer_graph = _write_float_model(
        qmodel, config.enabled_layers(), str(modfied_onnx_file), inputs, input_names, output_names, dynamic_axes
    )
    record = RecordFile(record_file)
    record.create_empty()
    convs = [name for name in config.enabled_layers() if type(qmodel.get_submodule(name)) is nn.Conv2d]
    channels_last = _channels_last_runs_the_same(qmodel, convs, inputs)
    for name in config.enabled_layers():
        spec, layer = config.layers[name], qmodel.get_submodule(name)
        act = CalibrationActQuantizer(_observer(spec, config), spec.act_bits)
        weight = WEIGHT_QUANTIZERS[spec.wts_algo].quantizer_class()(
            bits=spec.wts_bits, channel_wise=spec.channel_wise, num_channels=out_channels(layer)
        )
        wrapper = qat_layer_class(layer)(name, layer, act, weight, record=record)
        wrapper.channels_last_output = channels_last and name in convs
        qmodel.set_submodule(name, wrapper)
    qmodel.eval()  # the new layers start in training mode; calibration is an eval forward
    # The layers that finish calibrating in one forward write the record once, at its end.
    qmodel.register_forward_pre_hook(_RecordHook(record, hold=True))
    qmodel.register_forward_hook(_RecordHook(record, hold=False), always_call=True)
    setattr(
        qmodel,
        PTQ_ATTR,
        dict(
            record_file=str(record_file),
            input_data=inputs,
            batch_num=config.batch_num,
            input_names=input_names,
            output_names=output_names,
            dynamic_axes=dynamic_axes,
            layer_graph=layer_graph,
        ),
    )
    _CALIBRATION_MODELS[os.path.abspath(str(modfied_onnx_file))] = weakref.ref(qmodel)
    return qmodel


def _write_float_model(
    model: nn.Module, layer_names: list[str], path: str, inputs: tuple, input_names, output_names, dynamic_axes
):
    """Write the BN-folded float model to `path`; returns its trace with `layer_names` as placeholders
    (export.layer_graph), from which save_model writes the fake-quant and deploy models without tracing again."""
    layers = {name: model.get_submodule(name) for name in layer_names}
    for name, layer in layers.items():
        model.set_submodule(name, LayerPlaceholder(name, layer))
    try:
        layer_graph = export_layer_graph(
            model, tuple(t.detach().cpu() for t in inputs), input_names, output_names, dynamic_axes
        )
    finally:
        for name, layer in layers.items():
            model.set_submodule(name, layer)
    placeholders = {name: LayerPlaceholder(name, layer) for name, layer in layers.items()}
    write_checked_onnx(splice_layers(layer_graph, placeholders, FloatLayerWriter), path, inputs, model)
    return layer_graph


def _channels_last_runs_the_same(model: nn.Module, conv_names: list[str], inputs: tuple) -> bool:
    """Whether the float model computes the same on the example input when these convs' outputs are made
    channels-last (a `.view` of such an output raises: those models keep torch's default layout).

    On CPU, torch's convolutions and pooling run 3.8x faster on the Fashion-MNIST CNN in that layout,
    and the calibration forward is most of PTQ's time; the values it sees are the same. Only CPU:
    elsewhere the faster layout depends on the device and its kernels.
    """
    if not conv_names or any(p.device.type != "cpu" for p in model.parameters()):
        return False
    with torch.no_grad():
        expected = model(*inputs)
        hooks = [model.get_submodule(name).register_forward_hook(_channels_last) for name in conv_names]
        try:
            return _outputs_close(expected, model(*inputs))
        except RuntimeError:
            return False
        finally:
            for hook in hooks:
                hook.remove()


def _channels_last(module, args, output: torch.Tensor) -> torch.Tensor:
    return output.contiguous(memory_format=torch.channels_last)


def _outputs_close(a, b) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and torch.allclose(a, b, rtol=1e-4, atol=1e-5)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) and len(a) == len(b):
        return all(_outputs_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        return all(_outputs_close(a[k], b[k]) for k in a)
    return False


class _RecordHook:
    """A forward (pre-)hook that holds (releases) the record's writes (RecordFile.hold); a class, not a
    closure, so the calibration model still deep-copies and pickles."""

    def __init__(self, record: RecordFile, hold: bool) -> None:
        self.record, self.hold = record, hold

    def __call__(self, module, args, output=None) -> None:
        if self.hold:
            self.record.hold()
        else:
            self.record.release()


def calibration_model_of(modfied_onnx_file) -> nn.Module:
    ref = _CALIBRATION_MODELS.get(os.path.abspath(str(modfied_onnx_file)))
    model = ref() if ref is not None else None
    if model is None:
        raise RuntimeError(
            f"no calibration model was made for {modfied_onnx_file} in this process: "
            "call quantize_model first (or pass model=)"
        )
    return model


def _record_file(model: nn.Module, record_file) -> RecordFile:
    """The calibration layers' RecordFile when it is `record_file`: it holds the record it wrote, parsed
    (RecordFile.read parses again only if the file changed since)."""
    for wrapper in quant_layers(model).values():
        if wrapper.record is not None and os.path.abspath(wrapper.record.path) == os.path.abspath(str(record_file)):
            return wrapper.record
    return RecordFile(record_file)


def save_model(
    modfied_onnx_file,
    record_file,
    save_path,
    model=None,
    deploy_format=DEFAULT_DEPLOY_FORMAT,
    deploy_target=DEFAULT_DEPLOY_TARGET,
) -> dict[str, str]:
    """Write `<save_path>_fake_quant_model.onnx` and `<save_path>_deploy_model.onnx` (docs/spec/engine.md §1.6).

    `model`: the calibration model; by default the one quantize_model made for `modfied_onnx_file`.
    `deploy_format`, `deploy_target`: as for QAT (amct_engine.export.formats, amct_engine.export.deploy_target).
    """
    model = calibration_model_of(modfied_onnx_file) if model is None else model
    state = getattr(model, PTQ_ATTR, None)
    if state is None or not quant_layers(model):
        raise RuntimeError("model is not a calibration model: pass the model returned by quantize_model")
    records = _record_file(model, record_file).quant_layers()
    pending = [w.layer_name for w in quant_layers(model).values() if w._record_pending or w.layer_name not in records]
    if pending:
        raise RuntimeError(
            f"record_file {record_file} has no quantisation factors for {', '.join(pending[:5])}: run "
            f"batch_num={state['batch_num']} calibration batches through the model (model(x)) before save_model"
        )
    return save_quantized_onnx(
        model,
        records,
        str(save_path),
        state["input_data"],
        state["input_names"],
        state["output_names"],
        state["dynamic_axes"],
        deploy_format,
        deploy_target,
        layer_graph=state["layer_graph"],
    )


__all__ = ["ConfigError", "calibration_model_of", "create_quant_config", "quantize_model", "save_model"]
