"""QAT retrain API: config JSON, quantised model, record, save to ONNX, restore (docs/spec/engine.md §1.2, §5)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

import amct_engine as amct
from amct_engine.export.qdq.fusion_report import deploy_report
from amct_engine.quant.retrain_layer import QuantRetrainLayer
from amct_engine.record import RecordFile
from tests.models import BranchesNet, ConvBnReluNet

INPUT = torch.randn(4, 1, 28, 28, generator=torch.Generator().manual_seed(0))


def _train_steps(model: nn.Module, steps: int = 5) -> None:
    """A few real optimisation steps on a fixed regression target."""
    gen = torch.Generator().manual_seed(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model.train()
    for _ in range(steps):
        x = torch.randn(8, 1, 28, 28, generator=gen)
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def trained_qat_model(tmp_path):
    """A ConvBnReluNet through create_quant_retrain_*, 3 training steps, then its eval output on INPUT
    (the first eval forward also writes the record): ``(config, qmodel, record, expected)``."""
    torch.manual_seed(0)
    model = ConvBnReluNet()
    config, record = tmp_path / "c.json", tmp_path / "r.txt"
    amct.create_quant_retrain_config(str(config), model, INPUT)
    qmodel = amct.create_quant_retrain_model(str(config), model, str(record), INPUT)
    _train_steps(qmodel, 3)
    qmodel.eval()
    with torch.no_grad():
        expected = qmodel(INPUT).numpy()
    return config, qmodel, record, expected


@pytest.fixture
def qat(tmp_path):
    """A created QAT model of ConvBnReluNet, trained a little and run once in eval mode."""
    torch.manual_seed(0)
    model = ConvBnReluNet().eval()
    config = tmp_path / "retrain.json"
    record = tmp_path / "record.txt"
    amct.create_quant_retrain_config(str(config), model, INPUT)
    qmodel = amct.create_quant_retrain_model(str(config), model, str(record), INPUT)
    _train_steps(qmodel)
    qmodel.eval()
    with torch.no_grad():
        qmodel(INPUT)
    return model, qmodel, config, record, tmp_path


def _ort_run(path, x):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]


def test_default_config_json_lists_every_layer_with_linear_per_tensor(tmp_path):
    config = tmp_path / "c.json"
    amct.create_quant_retrain_config(str(config), ConvBnReluNet(), INPUT)
    data = json.loads(config.read_text())
    assert data["version"] == 1 and data["batch_num"] == 1
    assert [k for k in data if k not in ("version", "batch_num")] == ["conv1", "conv2", "fc"]
    assert data["conv1"]["retrain_weight_config"] == {"algo": "arq_retrain", "channel_wise": True, "dst_type": "INT8"}
    assert data["fc"]["retrain_weight_config"]["channel_wise"] is False
    assert data["conv2"]["retrain_data_config"] == {"algo": "ulq_quantize", "dst_type": "INT8"}


def test_cfg_overrides_and_skips_reach_the_json(tmp_path):
    cfg = tmp_path / "q.cfg"
    cfg.write_text(
        """batch_num: 3
quant_skip_layers: "conv1"
retrain_weight_quant_config { ulq_retrain { channel_wise: true dst_type: INT8 } }
override_layer_configs {
  layer_name: "conv2"
  retrain_data_quant_config { ulq_quantize { clip_max_min { clip_max: 6.0 clip_min: -6.0 } fixed_min: true } }
  retrain_weight_quant_config { arq_retrain { channel_wise: false dst_type: INT4 } }
}
override_layer_types { layer_type: "Linear" retrain_data_quant_config { ulq_quantize { dst_type: INT16 } } }
"""
    )
    config = tmp_path / "c.json"
    amct.create_quant_retrain_config(str(config), ConvBnReluNet(), INPUT, str(cfg))
    data = json.loads(config.read_text())
    assert data["batch_num"] == 3
    assert data["conv1"] == {"retrain_enable": False}
    assert data["conv2"]["retrain_data_config"] == {
        "algo": "ulq_quantize",
        "clip_max": 6.0,
        "clip_min": -6.0,
        "fixed_min": True,
        "dst_type": "INT8",
    }
    assert data["conv2"]["retrain_weight_config"] == {"algo": "arq_retrain", "channel_wise": False, "dst_type": "INT4"}
    assert data["fc"]["retrain_data_config"]["dst_type"] == "INT16"
    assert data["fc"]["retrain_weight_config"] == {"algo": "ulq_retrain", "channel_wise": False, "dst_type": "INT8"}


def test_missing_cfg_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        amct.create_quant_retrain_config(str(tmp_path / "c.json"), ConvBnReluNet(), INPUT, str(tmp_path / "no.cfg"))


def test_create_returns_a_quantised_copy_with_bn_inside_the_wrapper(tmp_path):
    model = ConvBnReluNet()
    config, record = tmp_path / "c.json", tmp_path / "r.txt"
    amct.create_quant_retrain_config(str(config), model, INPUT)
    qmodel = amct.create_quant_retrain_model(str(config), model, str(record), INPUT)
    assert isinstance(model.conv1, nn.Conv2d) and isinstance(model.bn, nn.BatchNorm2d)  # original untouched
    assert isinstance(qmodel.conv1, QuantRetrainLayer) and isinstance(qmodel.fc, QuantRetrainLayer)
    assert isinstance(qmodel.bn, nn.Identity) and qmodel.conv1.bn is not None
    assert qmodel.fc.bn is None
    assert record.exists() and RecordFile(record).quant_layers() == {}
    # docs/spec/engine.md §4.1: fixed_min defaults to true when the input comes from a ReLU.
    assert qmodel.conv2.act_quant.fixed_min is True and qmodel.conv1.act_quant.fixed_min is False


def test_save_before_an_eval_forward_says_to_run_one(tmp_path):
    model = ConvBnReluNet()
    config, record = tmp_path / "c.json", tmp_path / "r.txt"
    amct.create_quant_retrain_config(str(config), model, INPUT)
    qmodel = amct.create_quant_retrain_model(str(config), model, str(record), INPUT)
    _train_steps(qmodel, 2)
    with pytest.raises(RuntimeError, match=r"model.eval\(\); model\(x\)"):
        amct.save_quant_retrain_model(str(config), qmodel, str(record), str(tmp_path / "m"), INPUT)


def test_record_holds_bn_folded_weight_scales(qat):
    _, qmodel, _, record, _ = qat
    entries = RecordFile(record).quant_layers()
    assert set(entries) == {"conv1", "conv2", "fc"}
    conv1 = qmodel.conv1
    bn = conv1.bn
    expected = conv1.weight_quant.wts_scales.detach().abs() * (bn.weight / torch.sqrt(bn.running_var + bn.eps)).abs()
    np.testing.assert_allclose(entries["conv1"].scale_w, expected.detach().numpy(), rtol=1e-6)
    assert len(entries["fc"].scale_w) == 1 and entries["fc"].offset_w == (0,)
    assert -128 <= entries["conv2"].offset_d <= 127 and entries["conv2"].scale_d > 0


def test_fake_quant_onnx_matches_pytorch_and_deploy_runs_integer_kernels(qat):
    _, qmodel, config, record, tmp_path = qat
    paths = amct.save_quant_retrain_model(str(config), qmodel, str(record), str(tmp_path / "out/net"), INPUT)
    assert paths["fake_quant"].endswith("out/net_fake_quant_model.onnx")
    x = torch.randn(16, 1, 28, 28, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = qmodel(x).numpy()
    # The exported graph has a fixed batch unless dynamic_axes is given; use the example batch.
    fake = _ort_run(paths["fake_quant"], x[:4])
    np.testing.assert_allclose(fake, expected[:4], atol=1e-4)
    deploy = _ort_run(paths["deploy"], x[:4])
    assert np.abs(deploy - expected[:4]).max() < 0.05 * np.abs(expected).max()

    deploy_model = onnx.load(paths["deploy"])
    op_types = {n.op_type for n in deploy_model.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Conv", "Gemm"} <= op_types
    assert "BatchNormalization" not in op_types
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimised.onnx")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    ort.InferenceSession(paths["deploy"], options, providers=["CPUExecutionProvider"])
    optimised_ops = [n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node]
    # conv1 and conv2 feed the next quantised layer through ReLU/flatten only, so their outputs are
    # requantised and onnxruntime fuses them into QLinearConv; fc's float logits come from QGemm. A one-channel
    # stem (conv1 on a VNNI CPU) runs float on its integer codes by design, and the report says so.
    stems = deploy_report(deploy_model)["conv_layout"]["float_stems"]
    assert optimised_ops.count("QLinearConv") == 2 - len(stems) and optimised_ops.count("QGemm") == 1
    assert sum(op in ("Conv", "FusedConv") for op in optimised_ops) == len(stems)
    assert not {"MatMulInteger", "ConvInteger"} & set(optimised_ops)


def test_dynamic_axes_let_the_exported_models_take_any_batch(qat):
    _, qmodel, config, record, tmp_path = qat
    paths = amct.save_quant_retrain_model(
        str(config),
        qmodel,
        str(record),
        str(tmp_path / "dyn"),
        INPUT,
        input_names=["x"],
        output_names=["logits"],
        dynamic_axes={"x": {0: "n"}, "logits": {0: "n"}},
    )
    x = torch.randn(9, 1, 28, 28)
    assert _ort_run(paths["deploy"], x).shape == (9, 10)
    with pytest.raises(RuntimeError, match="axes"):
        amct.save_quant_retrain_model(
            str(config), qmodel, str(record), str(tmp_path / "bad"), INPUT, dynamic_axes={"x": [-1]}
        )


def test_save_rejects_a_config_changed_since_create(qat):
    _, qmodel, config, record, tmp_path = qat
    data = json.loads(config.read_text())
    data["conv1"]["retrain_enable"] = False
    config.write_text(json.dumps(data))
    with pytest.raises(RuntimeError, match="differs"):
        amct.save_quant_retrain_model(str(config), qmodel, str(record), str(tmp_path / "m"), INPUT)


def test_restore_from_pth_gives_identical_outputs(qat):
    model, qmodel, config, record, tmp_path = qat
    pth = tmp_path / "ckpt.pth"
    torch.save({"state": qmodel.state_dict()}, pth)
    restored = amct.restore_quant_retrain_model(str(config), model, str(record), INPUT, str(pth), "state")
    restored.eval()
    x = torch.randn(6, 1, 28, 28)
    with torch.no_grad():
        assert torch.equal(restored(x), qmodel(x))


def test_torchscript_file_goes_through_the_same_flow(tmp_path):
    torch.manual_seed(0)
    scripted = torch.jit.script(ConvBnReluNet().eval())
    path = tmp_path / "net.pt"
    torch.jit.save(scripted, str(path))
    config, record = tmp_path / "c.json", tmp_path / "r.txt"
    amct.create_quant_retrain_config(str(config), str(path), INPUT)
    qmodel = amct.create_quant_retrain_model(str(config), str(path), str(record), INPUT)
    assert isinstance(qmodel.get_submodule("conv1"), QuantRetrainLayer)
    _train_steps(qmodel, 2)
    qmodel.eval()
    with torch.no_grad():
        expected = qmodel(INPUT).numpy()
    paths = amct.save_quant_retrain_model(str(config), qmodel, str(record), str(tmp_path / "ts"), INPUT)
    np.testing.assert_allclose(_ort_run(paths["fake_quant"], INPUT), expected, atol=1e-4)


def _signed_codes(codes: np.ndarray, zero_point: np.ndarray | None) -> np.ndarray:
    """Weight codes minus their zero point (uint8 codes + 128 are stored for the exact u8u8 kernels)."""
    if codes.dtype != np.uint8:
        return codes
    zero = zero_point.reshape(-1)  # one value, or one per output channel (axis 0)
    zero = zero.reshape((-1,) + (1,) * (codes.ndim - 1)) if zero.size > 1 else zero
    return (codes.astype(np.int16) - zero.astype(np.int16)).astype(np.int8)


def _integer_weight_codes(model: onnx.ModelProto) -> list[np.ndarray]:
    """INT8 weight codes of every layer of a deploy model, in graph order: the weight input of a
    ConvInteger/MatMulInteger, or the tensor a Conv's weight DequantizeLinear reads, less the zero point."""
    constants = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    producers = {out: n for n in model.graph.node for out in n.output}
    codes = []
    for node in model.graph.node:
        if node.op_type in ("ConvInteger", "MatMulInteger"):
            zero = constants.get(node.input[3]) if len(node.input) > 3 else None
            codes.append(_signed_codes(constants[node.input[1]], zero))
        elif node.op_type == "Conv":
            dequantize = producers[node.input[1]]
            zero = constants.get(dequantize.input[2]) if len(dequantize.input) > 2 else None
            weight = dequantize.input[0]
            if weight not in constants:  # INT4 codes stored as INT4 -> Cast(INT8) (export.int4_pack)
                weight = producers[weight].input[0]
            stored = constants[weight]
            stored = stored if stored.dtype in (np.int8, np.uint8) else stored.astype(np.int8)  # INT4
            codes.append(_signed_codes(stored, zero))
    assert all(c.dtype == np.int8 for c in codes)
    return codes


def _cfg_model(tmp_path, cfg_text):
    cfg = tmp_path / "q.cfg"
    cfg.write_text(cfg_text)
    model = ConvBnReluNet()
    config, record = tmp_path / "c.json", tmp_path / "r.txt"
    amct.create_quant_retrain_config(str(config), model, INPUT, str(cfg))
    qmodel = amct.create_quant_retrain_model(str(config), model, str(record), INPUT)
    _train_steps(qmodel, 3)
    qmodel.eval()
    with torch.no_grad():
        expected = qmodel(INPUT).numpy()
    return qmodel, config, record, expected


@pytest.mark.parametrize(
    "cfg_text, act_type, wts_type",
    [
        ("retrain_weight_quant_config { arq_retrain { dst_type: INT4 } }", "INT8", "INT4"),
        ("retrain_data_quant_config { ulq_quantize { dst_type: INT16 } }", "INT16", "INT8"),
        ("retrain_weight_quant_config { ulq_retrain { dst_type: INT4 } }", "INT8", "INT4"),
    ],
    ids=["A8W4-arq", "A16W8", "A8W4-ulq"],
)
def test_other_bit_widths_export_and_match(tmp_path, cfg_text, act_type, wts_type):
    qmodel, config, record, expected = _cfg_model(tmp_path, cfg_text)
    entry = RecordFile(record).quant_layers()["conv2"]
    assert (entry.act_type, entry.wts_type) == (act_type, wts_type)
    paths = amct.save_quant_retrain_model(str(config), qmodel, str(record), str(tmp_path / "m"), INPUT)
    np.testing.assert_allclose(_ort_run(paths["fake_quant"], INPUT), expected, atol=1e-4)
    if act_type == "INT8":  # integer kernels need 8-bit inputs; INT16 layers stay QDQ
        codes = _integer_weight_codes(onnx.load(paths["deploy"]))
        bound = 8 if wts_type == "INT4" else 128
        # conv1 has one input channel: INT4 needs an even Cin, so it stays INT8 (docs/spec/engine.md §2.2).
        assert int(codes[0].max()) - int(codes[0].min()) > 16
        assert all(w.min() >= -bound and w.max() < bound for w in codes[1:])
    np.testing.assert_allclose(_ort_run(paths["deploy"], INPUT), expected, atol=0.05 * np.abs(expected).max())


def test_eval_matches_training_after_a_learnt_weight_scale_steps_below_zero(tmp_path):
    """Regression: a ULQ scale that Adam pushed through zero zeroed its channel in training (scale
    clamped to epsilon) while the record held |s|, so eval (= deploy) computed another layer."""
    qmodel, *_ = _cfg_model(tmp_path, "retrain_weight_quant_config { ulq_retrain { channel_wise: true } }")
    layer = qmodel.conv2
    assert isinstance(layer, QuantRetrainLayer)
    with torch.no_grad():
        layer.weight_quant.wts_scales[0] *= -1
    layer.invalidate()
    x = torch.randn(4, 8, 28, 28, generator=torch.Generator().manual_seed(2)).relu()
    with torch.no_grad():
        reference = layer.training_forward(x)  # fake-quant weights, BN with its running statistics
        deployed = layer(x)  # record factors, integer codes, BN folded
    assert reference[:, 0].abs().max() > 0.1  # the channel is alive in training too
    torch.testing.assert_close(deployed, reference, atol=0.02 * float(reference.abs().max()), rtol=0)


def test_layers_reading_one_tensor_share_the_activation_quantiser(tmp_path):
    x = torch.randn(2, 3, 8, 8)
    config, record = tmp_path / "c.json", tmp_path / "r.txt"
    amct.create_quant_retrain_config(str(config), BranchesNet(), x)
    qmodel = amct.create_quant_retrain_model(str(config), BranchesNet(), str(record), x)
    assert qmodel.branch1.act_quant is qmodel.branch2.act_quant
    assert qmodel.stem.act_quant is not qmodel.branch1.act_quant
    # Shared parameters are counted once.
    names = [n for n, _ in qmodel.named_parameters() if "acts_clip_max" in n]
    assert len(names) == 2
