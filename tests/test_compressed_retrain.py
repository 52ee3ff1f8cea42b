"""Compressed retrain API (docs/spec/engine.md §1.4): prune, re-capture, QAT; restore bit-exactly; export both
models."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper
from torch import nn

import amct_engine.prune_retrain as amct
from amct_engine.config.errors import ConfigError, ConfigWarning
from amct_engine.prune.selective import SelectiveMask, selective_masks
from amct_engine.quant.retrain_layer import QuantRetrainLayer
from tests.prune_models import PruneResNet, example_input

FIXTURES = Path(__file__).parent / "fixtures" / "cfg"
QUANT = """
retrain_data_quant_config { ulq_quantize { } }
retrain_weight_quant_config { arq_retrain { channel_wise: true dst_type: INT8 } }
"""
FILTER_INT8 = "prune_config { filter_pruner { balanced_l2_norm_filter_prune { prune_ratio: 0.5 } } }" + QUANT
M4N2_INT8 = "prune_config { n_out_of_m_pruner { l1_selective_prune { n_out_of_m_type: M4N2 update_freq: 1 } } }"
M4N2_INT8 += QUANT


def _cfg(tmp_path, text: str) -> str:
    path = tmp_path / "compressed.cfg"
    path.write_text(text)
    return str(path)


def _train_then_eval(model: nn.Module, steps: int = 3) -> torch.Tensor:
    """A few SGD steps, then the eval forward that writes the quantisation factors (docs/spec/engine.md §1.2)."""
    gen = torch.Generator().manual_seed(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.02)
    model.train()
    for _ in range(steps):
        loss = model(torch.randn(4, 3, 16, 16, generator=gen)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        return model(example_input(PruneResNet, seed=7))


def _create(tmp_path, text: str):
    torch.manual_seed(0)
    record = tmp_path / "record.txt"
    cfg = _cfg(tmp_path, text)
    model = amct.create_compressed_retrain_model(PruneResNet(), example_input(PruneResNet), cfg, str(record))
    return model, cfg, record


def _restore(tmp_path, model, cfg, record) -> nn.Module:
    torch.save(model.state_dict(), tmp_path / "compressed.pth")
    return amct.restore_compressed_retrain_model(
        PruneResNet(), example_input(PruneResNet), cfg, str(record), str(tmp_path / "compressed.pth")
    ).eval()


def _deploy_weights(path: str) -> dict[str, np.ndarray]:
    """Integer weights of the deploy model by layer scope (``layer1/conv1``): the int8 tensor each
    Conv / Gemm / MatMul (or ConvInteger / MatMulInteger) reads, directly or through a DequantizeLinear."""
    graph = onnx.load(path).graph
    constants = {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in graph.node if n.op_type == "Constant"}
    constants.update({i.name: numpy_helper.to_array(i) for i in graph.initializer})
    producer = {out: node for node in graph.node for out in node.output}
    weights = {}
    for node in graph.node:
        if node.op_type not in ("Conv", "Gemm", "MatMul", "ConvInteger", "MatMulInteger") or len(node.input) < 2:
            continue
        name, zero = node.input[1], node.input[3] if len(node.input) > 3 else None
        if name in producer and producer[name].op_type == "DequantizeLinear":
            dequantize = producer[name]
            name, zero = dequantize.input[0], dequantize.input[2] if len(dequantize.input) > 2 else None
        if name in constants and constants[name].dtype in (np.int8, np.uint8):
            codes = constants[name]
            if codes.dtype == np.uint8:  # uint8 codes + 128 for onnxruntime's exact u8u8 kernels
                zero_point = constants[zero].reshape(-1)
                zero_point = zero_point.reshape((-1,) + (1,) * (codes.ndim - 1)) if zero_point.size > 1 else zero_point
                codes = (codes.astype(np.int16) - zero_point.astype(np.int16)).astype(np.int8)
            # Deploy nodes are named `<layer path>/<Op>` (layer1.conv1/Conv); keyed as scopes, layer1/conv1.
            weights[node.name.rsplit("/", 1)[0].strip("/").replace(".", "/")] = codes
    return weights


def _ort(path: str, x: torch.Tensor) -> np.ndarray:
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]


@pytest.fixture(scope="module")
def filter_int8(tmp_path_factory):
    """A 50 % filter-pruned INT8 PruneResNet, trained a little and evaluated once."""
    tmp_path = tmp_path_factory.mktemp("filter_int8")
    model, cfg, record = _create(tmp_path, FILTER_INT8)
    expected = _train_then_eval(model)
    return tmp_path, model, cfg, record, expected


def test_filter_pruned_int8_model_restores_bit_exactly(filter_int8):
    tmp_path, model, cfg, record, expected = filter_int8
    assert isinstance(model.layer1.conv1, QuantRetrainLayer)
    assert model.layer1.conv1.layer.out_channels == 16 and model.fc.layer.in_features == 256
    restored = _restore(tmp_path, model, cfg, record)
    with torch.no_grad():
        assert torch.equal(restored(example_input(PruneResNet, seed=7)), expected)


def test_filter_pruned_int8_exports_match_and_the_deploy_model_is_pruned(filter_int8):
    tmp_path, model, _, record, expected = filter_int8
    x = example_input(PruneResNet, seed=7)
    paths = amct.save_compressed_retrain_model(model, str(record), str(tmp_path / "net"), x)
    assert np.abs(_ort(paths["fake_quant"], x) - expected.numpy()).max() <= 1e-3
    weights = _deploy_weights(paths["deploy"])
    assert weights["layer1/conv1"].dtype == np.int8 and weights["layer1/conv1"].shape == (16, 16, 3, 3)
    assert weights["layer2/conv2"].shape == (32, 32, 3, 3) and weights["pw"].shape == (16, 32, 1, 1)
    assert weights["dw"].shape == (32, 1, 3, 3)


def test_m4n2_keeps_two_zeros_of_four_after_training_and_in_the_deploy_model(tmp_path):
    model, cfg, record = _create(tmp_path, M4N2_INT8)
    masks = selective_masks(model)
    assert set(masks) >= {"layer1.conv1", "layer2.conv2", "pw", "fc"} and "conv1" not in masks
    expected = _train_then_eval(model, steps=4)
    for name, mask in masks.items():
        layer = model.get_submodule(name).layer
        effective = layer.weight.detach() * mask.mask
        groups = effective.reshape(effective.shape[0], -1, 4, *effective.shape[2:])
        assert torch.all((groups == 0).sum(dim=2) >= 2), name
    assert all(int(m.prune_cur_batch) == 4 for m in masks.values())
    paths = amct.save_compressed_retrain_model(model, str(record), str(tmp_path / "m4n2"), example_input(PruneResNet))
    checked = 0
    for scope, weight in _deploy_weights(paths["deploy"]).items():
        if weight.ndim == 2 and weight.shape != tuple(model.fc.layer.weight.shape):
            weight = weight.T  # a MatMul holds [in, out]
        if scope.replace("/", ".") not in masks:  # conv1 (3 inputs, padded to 4 with zero weights on
            continue  # x86_vnni by export.conv_layout) and the depthwise conv are not masked
        grouped = np.moveaxis(weight, 1, -1).reshape(-1, weight.shape[1] // 4, 4)
        assert np.all((grouped == 0).sum(-1) >= 2), scope
        checked += 1
    assert checked == len(masks)
    # PyTorch eval runs the masked weights too: it matches the exported models (it ran the dense ones)
    x = example_input(PruneResNet, seed=7)
    assert np.abs(_ort(paths["fake_quant"], x) - expected.numpy()).max() <= 1e-3
    assert np.abs(_ort(paths["deploy"], x) - expected.numpy()).max() <= 0.05 * float(expected.abs().max())
    # restore: the masks come from the record and the pth, never from the weights
    restored = _restore(tmp_path, model, cfg, record)
    for name, mask in masks.items():
        assert torch.equal(selective_masks(restored)[name].mask, mask.mask)
    assert isinstance(restored.pw.weight_quant.selective, SelectiveMask)
    with torch.no_grad():
        assert torch.equal(restored(example_input(PruneResNet, seed=7)), expected)


@pytest.mark.parametrize("seed_cfg", ["compressed_filter_prune_int8.cfg", "compressed_m4n2_int8.cfg"])
def test_seed_cfgs_refuse_their_placeholders_and_run_once_they_name_real_layers(tmp_path, seed_cfg):
    cfg = tmp_path / seed_cfg
    shutil.copy(FIXTURES / seed_cfg, cfg)
    with pytest.raises(ConfigError, match=r':11:1: layer type "Optype" in skip_layer_types is not a supported'):
        amct.create_compressed_retrain_model(
            PruneResNet(), example_input(PruneResNet), str(cfg), str(tmp_path / "r.txt")
        )
    # AMCT raises for the placeholders too (docs/spec/engine.md §1.1); with the model's names the cfg runs
    text = (FIXTURES / seed_cfg).read_text().replace('"Optype"', '"ConvTranspose2d"')
    cfg.write_text(text.replace('"Opname"', '"fc"').replace('"quant_skip_layers_name_0"', '"fc"'))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        model = amct.create_compressed_retrain_model(
            PruneResNet(), example_input(PruneResNet), str(cfg), str(tmp_path / "r.txt")
        )
    assert isinstance(model.layer2.conv2, QuantRetrainLayer)
    assert model.amct_prune_report.pruned_groups or model.amct_prune_report.selective
    _train_then_eval(model, steps=0)
    paths = amct.save_compressed_retrain_model(
        model, str(tmp_path / "r.txt"), str(tmp_path / "seed"), example_input(PruneResNet)
    )
    assert all(Path(p).is_file() for p in paths.values())


def test_prune_only_cfg_through_the_compressed_api_writes_the_float_model_twice(tmp_path):
    model, _, record = _create(
        tmp_path, "prune_config { filter_pruner { balanced_l2_norm_filter_prune { prune_ratio: 0.5 } } }"
    )
    assert not any(isinstance(m, QuantRetrainLayer) for m in model.modules())
    paths = amct.save_compressed_retrain_model(
        model.eval(), str(record), str(tmp_path / "p"), example_input(PruneResNet)
    )
    assert Path(paths["deploy"]).read_bytes() == Path(paths["fake_quant"]).read_bytes()


def test_a_cfg_with_neither_prune_nor_quant_is_refused(tmp_path):
    cfg = _cfg(tmp_path, 'skip_layers: "fc"\n')
    with pytest.raises(ConfigError, match="neither quantization nor pruning"):
        amct.create_compressed_retrain_model(PruneResNet(), example_input(PruneResNet), cfg, str(tmp_path / "r"))


def test_two_prune_kinds_in_one_scope_are_refused(tmp_path):
    cfg = _cfg(
        tmp_path,
        """prune_config {
        filter_pruner { balanced_l2_norm_filter_prune { prune_ratio: 0.5 } }
        n_out_of_m_pruner { l1_selective_prune { } }
    }""",
    )
    with pytest.raises(ConfigError, match="n_out_of_m_pruner"):
        amct.create_compressed_retrain_model(PruneResNet(), example_input(PruneResNet), cfg, str(tmp_path / "r"))


def test_save_before_the_eval_forward_says_what_is_missing(tmp_path):
    model, _, record = _create(tmp_path, FILTER_INT8)
    with pytest.raises(RuntimeError, match="run one inference pass after training"):
        amct.save_compressed_retrain_model(model, str(record), str(tmp_path / "x"), example_input(PruneResNet))
