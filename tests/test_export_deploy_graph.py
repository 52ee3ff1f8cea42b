"""The "onnx" deploy model is a graph onnxruntime runs in int8 end to end (issue 22).

After ORT's own optimiser (`optimized_model_filepath`) no ConvInteger/MatMulInteger is left and no
float op sits between two quantised layers, on a residual CNN (residual adds, a downsample conv,
global pooling) and on CREPE's conv -> ReLU -> BatchNorm -> MaxPool stack; the deploy outputs equal
the PyTorch eval model's within the quantisation steps the added quantisers introduce.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

import amct_engine as amct
from amct_engine.export.deploy_target import detect_deploy_target
from amct_engine.export.qdq.fusion_report import FUSED_OPS, deploy_report, optimized_ops
from examples.fashion_mnist import fashion_mnist_available, load_fashion_mnist
from examples.models import SmallFashionCnn
from tests.deploy_targets import record_exact_target
from tests.models import TinyResNet

INTEGER_OR_GLUE = {
    "DequantizeLinear",
    "QuantizeLinear",
    "Transpose",
    "Flatten",
    "Reshape",
    "MaxPool",
    "NhwcMaxPool",
    "Clip",
}


class ReluBnPoolNet(nn.Module):
    """CREPE's layer: zero pad -> conv -> ReLU -> BatchNorm -> MaxPool, twice, then a Linear; input [N, 1, 64, 1]."""

    def __init__(self) -> None:
        super().__init__()
        layers = []
        for cin, cout in ((1, 8), (8, 16)):
            layers += [
                nn.ZeroPad2d((0, 0, 4, 3)),
                nn.Conv2d(cin, cout, (8, 1)),
                nn.ReLU(),
                nn.BatchNorm2d(cout),
                nn.MaxPool2d((2, 1)),
            ]
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(16 * 16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.features(x), 1))


def _quantised(model: nn.Module, x: torch.Tensor, tmp_path):
    torch.manual_seed(0)
    for bn in (m for m in model.modules() if isinstance(m, nn.BatchNorm2d)):  # trained-looking BN
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.data.uniform_(0.5, 1.5)
    model.eval()
    config, record = tmp_path / "c.json", tmp_path / "r.txt"
    amct.create_quant_retrain_config(str(config), model, x)
    qmodel = amct.create_quant_retrain_model(str(config), model, str(record), x).eval()
    with torch.no_grad():
        qmodel(x)  # calibration: the record
    paths = amct.save_quant_retrain_model(str(config), qmodel, str(record), str(tmp_path / "net"), x)
    return qmodel, paths


def _ort(path: str, x: torch.Tensor) -> np.ndarray:
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]


def _float_ops_between_quantised_layers(model: onnx.ModelProto) -> list[str]:
    """Ops of the optimised graph that are neither int8 kernels nor layout/quantiser glue, except
    the graph's first QuantizeLinear and the float ops after the last int8 kernel (the logits)."""
    ops = [n.op_type for n in model.graph.node]
    last = max(i for i, op in enumerate(ops) if op in FUSED_OPS)
    return [op for op in ops[:last] if op not in FUSED_OPS | INTEGER_OR_GLUE]


@pytest.mark.parametrize(
    "net, shape", [(TinyResNet, (8, 3, 16, 16)), (ReluBnPoolNet, (8, 1, 64, 1))], ids=["residual", "relu-bn-pool"]
)
def test_ort_runs_the_deploy_graph_in_int8_kernels_end_to_end(net, shape, tmp_path):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    qmodel, paths = _quantised(net(), x, tmp_path)
    optimised = optimized_ops(onnx.load(paths["deploy"]))
    ops = [n.op_type for n in optimised.graph.node]
    assert not {"ConvInteger", "MatMulInteger", "Conv", "FusedConv", "Pad"} & set(ops), ops  # pads folded
    assert _float_ops_between_quantised_layers(optimised) == []
    report = deploy_report(paths["deploy"])
    assert report["not_fused"] == {} and report["deploy_target"] == detect_deploy_target()
    assert set(report["layers"].values()) <= {"QLinearConv", "QGemm"}
    if net is TinyResNet:
        assert ops.count("QLinearAdd") == 3 and ops.count("QLinearGlobalAveragePool") == 1
        assert ops.count("Transpose") <= 2  # NHWC from the first conv to the pool
    else:  # (8 x 1) kernels run as (1 x 8): tests/test_deploy_conv_layout.py
        assert report["conv_layout"]["wide_kernels"] == ["features.1/Conv", "features.6/Conv"]

    with torch.no_grad():
        expected = qmodel(x).numpy()
    deploy, fake = _ort(paths["deploy"], x), _ort(paths["fake_quant"], x)
    np.testing.assert_array_equal(fake, expected)  # the fake-quant model computes the eval model exactly
    # The added quantisers (residual add inputs, the BN between ReLU and pool) round once each.
    assert np.abs(deploy - expected).max() <= 0.02 * np.abs(expected).max()
    assert (deploy.argmax(1) == expected.argmax(1)).mean() >= 0.875


def test_deploy_graph_is_named_after_its_layers_and_passes_the_full_check(tmp_path):
    x = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    _, paths = _quantised(TinyResNet(), x, tmp_path)
    model = onnx.load(paths["deploy"])
    onnx.checker.check_model(model, full_check=True)
    assert model.producer_name == "amct_engine"
    assert {o.domain: o.version for o in model.opset_import}[""] >= 17
    initializers = {t.name for t in model.graph.initializer}
    assert {
        "layer1.0.conv1.weight",
        "layer1.0.conv1.weight_scale",
        "layer1.0.conv1.input_scale",
        "layer2.0.downsample.0.weight",
        "fc.weight",
        "fc.bias",
    } <= initializers
    nodes = {n.name: n.op_type for n in model.graph.node}
    assert nodes["layer1.0.conv1/Conv"] == "Conv" and nodes["fc/Gemm"] == "Gemm"
    fused = {n.name.split("/")[0]: n.op_type for n in optimized_ops(model).graph.node if n.op_type == "QLinearConv"}
    assert fused["layer1.0.conv1"] == "QLinearConv"  # ORT keeps the layer's name on the fused node


def test_a8w4_deploy_file_stores_int4_weights_and_runs_the_int8_kernels_exactly(tmp_path):
    from tests.test_quant_retrain import INPUT, _cfg_model

    cfg = "retrain_weight_quant_config { arq_retrain { dst_type: INT4 } }"
    qmodel, config, record, expected = _cfg_model(tmp_path, cfg)
    # conv1 (one input channel) keeps INT8 codes: the record's, on this CPU's exact kernels.
    paths = amct.save_quant_retrain_model(
        str(config), qmodel, str(record), str(tmp_path / "a8w4"), INPUT, deploy_target=record_exact_target()
    )
    float_path = str(tmp_path / "fp32.onnx")
    from amct_engine.export.save import export_onnx
    from tests.models import ConvBnReluNet

    export_onnx(ConvBnReluNet().eval(), float_path, (INPUT,))
    ratio = Path(paths["deploy"]).stat().st_size / Path(float_path).stat().st_size
    # 0.125 is the INT4 floor; this 33k-parameter model pays ~4 KB of graph (ResNet-18: bench/deploy_speed.py).
    assert ratio <= 0.16, ratio
    model = onnx.load(paths["deploy"])
    int4 = {t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.INT4}
    assert {"conv2.weight_int4", "fc.weight_int4"} <= int4  # conv1 has 1 input channel: INT8 (docs/spec/engine.md §2.2)
    assert deploy_report(model)["int4_weights"] == ["conv2.weight", "fc.weight"]
    ops = [n.op_type for n in optimized_ops(model).graph.node]  # ORT folds the Cast: the INT8 kernels run
    stems = deploy_report(model)["conv_layout"]["float_stems"]  # conv1 on a VNNI CPU: float on its codes
    assert ops.count("QLinearConv") == 2 - len(stems) and ops.count("QGemm") == 1
    assert not {"ConvInteger", "MatMulInteger"} & set(ops)
    np.testing.assert_array_equal(_ort(paths["deploy"], INPUT), expected)


@pytest.mark.skipif(not fashion_mnist_available(), reason="apt-get install dataset-fashion-mnist")
def test_the_benchmarks_20k_cnn_in_a8w4_is_under_a_sixth_of_fp32_and_exact(tmp_path):
    """bench/qat.py's A8W4 row: the 20,586-parameter Fashion CNN, whose graph, scales and report weigh as
    much as a fifth of its INT4 weights. The ReLU output quantised for the Linear is read through the
    Flatten as codes (one quantiser, not two), and ORT's output is the eval model's."""
    from amct_engine.export.save import export_onnx

    images, _ = load_fashion_mnist("test", limit=136)
    torch.manual_seed(0)
    model = SmallFashionCnn().eval()
    float_path = str(tmp_path / "fp32.onnx")
    export_onnx(model, float_path, (images[:8],))
    cfg = tmp_path / "q.cfg"
    cfg.write_text("retrain_weight_quant_config { ulq_retrain { channel_wise: true dst_type: INT4 } }\n")
    config, record = tmp_path / "c.json", tmp_path / "r.txt"
    amct.create_quant_retrain_config(str(config), model, images[:8], str(cfg))
    qmodel = amct.create_quant_retrain_model(str(config), model, str(record), images[:8])
    qmodel.train()
    qmodel(images[8:])  # one training forward: the activation ranges
    qmodel.eval()
    with torch.no_grad():
        expected = qmodel(images[:8]).numpy()
    paths = amct.save_quant_retrain_model(
        str(config), qmodel, str(record), str(tmp_path / "a8w4"), images[:8], deploy_target=record_exact_target()
    )
    # A sixth, as named: 0.159 for x86_vnni; 0.163 for x86_avx2_u8u8 (an AVX2-only CPU), whose uint8 conv1 weights
    # add a per-channel zero point and a Cast (export.deploy_target).
    assert Path(paths["deploy"]).stat().st_size / Path(float_path).stat().st_size <= 1 / 6
    graph = onnx.load(paths["deploy"]).graph
    producer = {out: n.op_type for n in graph.node for out in n.output}
    assert [producer[n.input[0]] for n in graph.node if n.op_type == "Flatten"] == ["QuantizeLinear"]
    layers = deploy_report(paths["deploy"])["layers"]  # conv1: a float stem on x86_vnni/amx, else QLinearConv
    assert layers["conv2"] == "QLinearConv" and layers["fc"] == "QGemm"
    # The input, conv2's, the Linear's; and conv1's output where conv1 runs quantised (x86_avx2_u8u8).
    quantised_stem = layers["conv1"] == "QLinearConv"
    assert sum(n.op_type == "QuantizeLinear" for n in graph.node) == 3 + quantised_stem
    np.testing.assert_array_equal(_ort(paths["deploy"], images[:8]), expected)


def test_the_report_names_every_layer_that_did_not_fuse_and_why(tmp_path):
    from tests.test_quant_retrain import INPUT, _cfg_model

    cfg = "retrain_data_quant_config { ulq_quantize { dst_type: INT16 } }"
    qmodel, config, record, expected = _cfg_model(tmp_path, cfg)
    paths = amct.save_quant_retrain_model(str(config), qmodel, str(record), str(tmp_path / "a16"), INPUT)
    report = deploy_report(paths["deploy"])
    assert set(report["not_fused"]) == {"conv1", "conv2", "fc"}  # INT16 inputs: no int8 kernel, never silent
    assert all("INT16" in why for why in report["not_fused"].values())
    np.testing.assert_allclose(_ort(paths["deploy"], INPUT), expected, atol=1e-4)
