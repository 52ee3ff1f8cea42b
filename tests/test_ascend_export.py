"""Ascend deploy layout (docs/spec/engine.md §5): AscendQuant / AscendDequant, INT8 weights, INT32 bias, packed
params."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import helper, numpy_helper
from torch import nn

import amct_engine as amct
from amct_engine.export.ascend import (
    ASCEND_DOMAIN,
    ascend_to_standard_onnx,
    pack_dequant_param,
    unpack_dequant_param,
)
from amct_engine.export.quant_layer import compute_factors
from amct_engine.record import LayerQuantRecord, RecordFile
from tests.models import BranchesNet
from tests.test_quant_retrain import INPUT, trained_qat_model


@pytest.fixture
def ascend(tmp_path):
    config, qmodel, record, expected = trained_qat_model(tmp_path)
    paths = amct.save_quant_retrain_model(
        str(config), qmodel, str(record), str(tmp_path / "net"), INPUT, deploy_format="ascend"
    )
    return qmodel, RecordFile(record).quant_layers(), onnx.load(paths["deploy"]), paths, expected


def _nodes(model, op_type):
    return [n for n in model.graph.node if n.op_type == op_type]


def _initializer(model, name):
    return numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == name))


def _attr(node, name):
    return helper.get_attribute_value(next(a for a in node.attribute if a.name == name))


def test_pack_and_unpack_are_inverse_and_use_the_canonical_bits():
    words = pack_dequant_param(np.array([0.5, 1e-4], np.float32), np.array([0, 3]))
    assert words.dtype == np.uint64
    assert int(words[1]) >> 40 == 3 and (int(words[1]) >> 32) & 0xFF == 0
    deq, shift_n, offset_w = unpack_dequant_param(words)
    np.testing.assert_array_equal(deq, np.array([0.5, 1e-4], np.float32))
    np.testing.assert_array_equal(offset_w, [0, 3])
    np.testing.assert_array_equal(shift_n, [0, 0])


def test_layout_names_attributes_and_types(ascend):
    _, records, model, _, _ = ascend
    onnx.checker.check_model(model)
    assert any(op.domain == ASCEND_DOMAIN for op in model.opset_import)
    quants = {n.name: n for n in _nodes(model, "AscendQuant")}
    dequants = {n.name: n for n in _nodes(model, "AscendDequant")}
    assert set(quants) == {"conv1.quant", "conv2.quant", "fc.quant"}
    assert set(dequants) == {"conv1.dequant", "conv2.dequant", "fc.dequant"}
    for layer, entry in records.items():
        node = quants[f"{layer}.quant"]
        assert node.domain == ASCEND_DOMAIN
        assert _attr(node, "scale") == pytest.approx(1.0 / entry.scale_d, rel=1e-6)
        assert _attr(node, "offset") == entry.offset_d
        assert _attr(node, "dst_type") == b"INT8"
        assert {a.name for a in node.attribute} == {"scale", "offset", "dst_type"}
        assert {a.name for a in dequants[f"{layer}.dequant"].attribute} == {"dtype"}
    types = {i.name: i.data_type for i in model.graph.initializer}
    for layer in records:
        assert types[f"{layer}.weight"] == onnx.TensorProto.INT8
        assert types[f"{layer}.bias"] == onnx.TensorProto.INT32
        assert types[f"{layer}.dequant.param"] == onnx.TensorProto.UINT64
    assert not _nodes(model, "BatchNormalization")


def test_every_dequant_param_decodes_bit_by_bit_to_the_record(ascend):
    _, records, model, _, _ = ascend
    for layer, entry in records.items():
        words = _initializer(model, f"{layer}.dequant.param").astype(np.uint64)
        assert words.size == len(entry.scale_w)
        expected = (np.float32(entry.scale_d) * np.asarray(entry.scale_w, np.float32)).astype(np.float32)
        for word, value in zip(words.tolist(), expected, strict=True):
            assert word & 0xFFFFFFFF == int(np.float32(value).view(np.uint32))  # deq_scale float32 bits
            assert (word >> 32) & 0xFF == 0  # shift_N: searchN is gone (docs/spec/engine.md §4.7)
            assert (word >> 40) & 0xFF == 0  # offset_w: symmetric weights
            assert word >> 48 == 0


def test_int32_bias_matches_an_independent_computation(ascend):
    qmodel, records, model, _, _ = ascend
    for layer in ("conv1", "conv2", "fc"):
        wrapper = qmodel.get_submodule(layer)
        bias = wrapper.layer.bias.detach().double().numpy()
        if wrapper.bn is not None:  # fold the BN by hand (docs/spec/engine.md §4.6)
            bn = wrapper.bn
            k = (bn.weight / torch.sqrt(bn.running_var + bn.eps)).detach().double().numpy()
            bias = (bias - bn.running_mean.double().numpy()) * k + bn.bias.detach().double().numpy()
        entry = records[layer]
        expected = np.round(bias / (np.asarray(entry.scale_w, np.float64) * entry.scale_d))
        np.testing.assert_array_equal(_initializer(model, f"{layer}.bias"), expected.astype(np.int32))


def test_reference_runs_the_ascend_model_like_the_fake_quant_one(ascend):
    _, _, model, paths, expected = ascend
    reference = ascend_to_standard_onnx(model)
    session = ort.InferenceSession(reference.SerializeToString(), providers=["CPUExecutionProvider"])
    out = session.run(None, {session.get_inputs()[0].name: INPUT.numpy()})[0]
    fake = ort.InferenceSession(paths["fake_quant"], providers=["CPUExecutionProvider"])
    fake_out = fake.run(None, {fake.get_inputs()[0].name: INPUT.numpy()})[0]
    # Integer-domain arithmetic everywhere: the three agree to the last bit, not just closely.
    np.testing.assert_allclose(out, fake_out, rtol=0, atol=1e-6)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-6)


def test_identical_quant_nodes_on_one_tensor_are_merged(tmp_path):
    x = torch.randn(2, 3, 8, 8)
    config, record = tmp_path / "c.json", tmp_path / "r.txt"
    amct.create_quant_retrain_config(str(config), BranchesNet(), x)
    qmodel = amct.create_quant_retrain_model(str(config), BranchesNet(), str(record), x).eval()
    with torch.no_grad():
        qmodel(x)
    paths = amct.save_quant_retrain_model(
        str(config), qmodel, str(record), str(tmp_path / "b"), x, deploy_format="ascend"
    )
    quants = _nodes(onnx.load(paths["deploy"]), "AscendQuant")
    assert len(quants) == 2  # stem, and one shared by both branches


class LastTokenHead(nn.Module):
    """A Linear, then a gather at an int32 position from an int32 arange, as transformers' sequence classifiers
    pick their last token: integer constants of the model's own beside the quantised layer's int32 bias."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[1], dtype=torch.int32)
        last = (positions * (x[0, :, 0] > -100).int()).argmax(-1)
        return self.fc(x)[:, last]


def test_the_models_own_integer_constants_keep_their_type(tmp_path):
    """Only the quantised layers' INT8 weights and INT32 biases turn float in the reference rewrite (a Range over
    int32 bounds once became a Range over float ones, and onnxruntime refused the Llama classifier's file)."""
    x = torch.randn(2, 5, 8)
    config, record = tmp_path / "c.json", tmp_path / "r.txt"
    amct.create_quant_config(str(config), LastTokenHead(), x)
    calibration = amct.quantize_model(str(config), str(tmp_path / "f.onnx"), str(record), LastTokenHead(), x)
    with torch.no_grad():
        calibration(x)
    paths = amct.save_model(str(tmp_path / "f.onnx"), str(record), str(tmp_path / "h"), deploy_format="ascend")
    reference = ascend_to_standard_onnx(onnx.load(paths["deploy"]))
    session = ort.InferenceSession(reference.SerializeToString(), providers=["CPUExecutionProvider"])
    out = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    fake = ort.InferenceSession(paths["fake_quant"], providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(out, fake.run(None, {fake.get_inputs()[0].name: x.numpy()})[0], rtol=0, atol=1e-6)


def test_bias_overflow_names_the_layer():
    layer = nn.Conv2d(1, 2, 1)
    with torch.no_grad():
        layer.bias.fill_(1e6)
    record = LayerQuantRecord(scale_d=1e-6, offset_d=0, scale_w=(1e-6, 1e-6), offset_w=(0, 0))
    with pytest.raises(RuntimeError, match="layer head.conv: quantised bias overflows int32"):
        compute_factors("head.conv", layer, record)


def test_unknown_deploy_format_is_rejected(ascend, tmp_path):
    qmodel, _, _, _, _ = ascend
    with pytest.raises(ValueError, match="deploy_format"):
        amct.save_quant_retrain_model(
            str(tmp_path / "c.json"),
            qmodel,
            str(tmp_path / "r.txt"),
            str(tmp_path / "x"),
            INPUT,
            deploy_format="tensorrt",
        )
