"""Every conv of a mobile CNN runs in int8 whatever its activation (issue 37, docs/spec/engine.md §5, "Int8
around activations"): SiLU and sigmoid gates as QLinearSigmoid + QLinearMul, ReLU6 as a clamp ORT drops or a clip on
the codes, hardswish as a clip on the codes and QLinearMul, PReLU as Max(x, a * x), the squeeze-excite
hardsigmoid in float between int8 layers, a detector's split, concat and
nearest upsampling between int8 layers. Small versions of bench/mobile_nets.py's layouts, random weights
with trained-looking BatchNorm; the deploy outputs stay within the steps the added quantisers introduce."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

import amct_engine as amct
from amct_engine.export.qdq.fusion_report import deploy_report, optimized_ops
from bench.mobile_nets import C2f, ConvBnAct, InvertedResidual, Sppf, SqueezeExcite
from tests.deploy_targets import record_exact_target


class TinyMobile(nn.Module):
    """Stem, two inverted residual blocks (one with squeeze-excite), pool, classifier: one activation family."""

    def __init__(self, act, gate) -> None:
        super().__init__()
        se = lambda c: SqueezeExcite(c, 8, nn.ReLU, gate)  # noqa: E731
        self.features = nn.Sequential(
            ConvBnAct(3, 16, 3, 2, act=act),
            InvertedResidual(16, 48, 16, 3, 1, act),
            InvertedResidual(16, 64, 24, 5, 2, act, se),
            ConvBnAct(24, 64, 1, act=act),
        )
        self.classifier = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))


class TinyONet(nn.Module):
    """MTCNN's ONet pattern: conv -> PReLU -> max-pool, a dense PReLU layer, two heads."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3), nn.PReLU(16), nn.MaxPool2d(3, 2, ceil_mode=True),
            nn.Conv2d(16, 32, 3), nn.PReLU(32), nn.MaxPool2d(2, 2, ceil_mode=True),
        )  # fmt: skip
        self.dense = nn.Sequential(nn.Linear(32 * 5 * 5, 64), nn.PReLU(64))
        self.score, self.box = nn.Linear(64, 2), nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.dense(torch.flatten(self.features(x), 1))
        return torch.softmax(self.score(y), dim=1), self.box(y)


class TinyDetector(nn.Module):
    """A YOLO neck in small: C2f (split, concat), a strided conv, SPPF (chained max-pools), nearest upsampling,
    two output heads."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = ConvBnAct(3, 16, 3, 2, act=nn.SiLU)
        self.c3, self.down = C2f(16, 16, 1), ConvBnAct(16, 32, 3, 2, act=nn.SiLU)
        self.c4 = nn.Sequential(C2f(32, 32, 1), Sppf(32))
        self.neck = C2f(48, 16, 1)
        self.heads = nn.ModuleList(nn.Conv2d(c, 8, 1) for c in (16, 32))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p3 = self.c3(self.stem(x))
        p4 = self.c4(self.down(p3))
        n3 = self.neck(torch.cat([nn.functional.interpolate(p4, scale_factor=2.0, mode="nearest"), p3], dim=1))
        return self.heads[0](n3), self.heads[1](p4)


NETS = {
    "silu-sigmoid-gate": (lambda: TinyMobile(nn.SiLU, nn.Sigmoid), (3, 32, 32)),
    "hardswish-hardsigmoid-gate": (lambda: TinyMobile(nn.Hardswish, nn.Hardsigmoid), (3, 32, 32)),
    "relu6": (lambda: TinyMobile(nn.ReLU6, nn.Hardsigmoid), (3, 32, 32)),
    "prelu": (TinyONet, (3, 24, 24)),
    "detector": (TinyDetector, (3, 32, 32)),
}


def _save(net: nn.Module, x: torch.Tensor, tmp_path, **options):
    torch.manual_seed(0)
    for bn in (m for m in net.modules() if isinstance(m, nn.BatchNorm2d)):  # trained-looking BN
        bn.running_mean.uniform_(-0.2, 0.2)
        bn.running_var.uniform_(0.5, 1.5)
        bn.weight.data.uniform_(0.5, 1.5)
    for prelu in (m for m in net.modules() if isinstance(m, nn.PReLU)):  # a slope per channel, as trained
        prelu.weight.data.uniform_(0.05, 0.45)
    net.eval()
    config, record = tmp_path / "c.json", tmp_path / "r.txt"
    amct.create_quant_retrain_config(str(config), net, x[:2])
    qmodel = amct.create_quant_retrain_model(str(config), net, str(record), x[:2]).eval()
    with torch.no_grad():
        qmodel(x)  # calibration: the record
    with torch.no_grad():
        outputs = net(x[:1])
    names = [f"y{i}" for i in range(len(outputs) if isinstance(outputs, tuple) else 1)]
    axes = {name: {0: "n"} for name in ["x", *names]}
    paths = amct.save_quant_retrain_model(
        str(config),
        qmodel,
        str(record),
        str(tmp_path / "net"),
        x,
        input_names=["x"],
        output_names=names,
        dynamic_axes=axes,
        **options,
    )
    return qmodel, paths


def _outputs(path: str, x: torch.Tensor) -> list[np.ndarray]:
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})


@pytest.mark.parametrize("name", list(NETS))
def test_every_conv_runs_as_an_int8_kernel_whatever_the_activation(name, tmp_path):
    ctor, shape = NETS[name]
    x = torch.randn(16, *shape, generator=torch.Generator().manual_seed(1))
    net = ctor()
    qmodel, paths = _save(net, x, tmp_path)
    report = deploy_report(paths["deploy"])
    # Only a layer whose output is the model's output stays float, and the report says so.
    assert all("model output" in why for why in report["not_fused"].values()), report["not_fused"]
    heads = {"detector": 2}.get(name, 0)
    assert len(report["not_fused"]) == heads
    ops = [n.op_type for n in optimized_ops(onnx.load(paths["deploy"])).graph.node]
    assert ops.count("Conv") + ops.count("FusedConv") == heads, ops
    if name in ("silu-sigmoid-gate", "detector"):  # x * sigmoid(x) and the gates, in int8
        assert "QLinearSigmoid" in ops and "QLinearMul" in ops and "QuickGelu" not in ops
    if name == "prelu":  # PReLU as Max(x, a * x) between int8 layers, not ORT's slow PRelu kernel
        assert ops.count("QLinearConv") == 2 and ops.count("QGemm") == 3
        assert "PRelu" not in ops and ops.count("Max") == 3 and len(report["activations"]["prelu"]) == 3
    if name == "hardswish-hardsigmoid-gate":  # the gate on the codes, the product in int8: no float hardswish
        hardswishes = sum(isinstance(m, nn.Hardswish) for m in net.modules())
        assert "HardSwish" not in ops and ops.count("Clip") == hardswishes
        assert len(report["activations"]["hardswish_on_codes"]) == hardswishes
        assert ops.count("QLinearMul") == hardswishes + 1  # and the squeeze-excite gate

    # At the example's batch and at another one (the files declare it dynamic).
    for batch in (x, torch.randn(3, *shape, generator=torch.Generator().manual_seed(2))):
        _check_outputs(qmodel, paths, batch)


def test_a_detectors_split_max_pools_and_upsampling_run_on_the_codes(tmp_path):
    """C2f's Split, SPPF's max-pools and the nearest Resize move uint8 codes, not floats between a DequantizeLinear
    and a QuantizeLinear (docs/spec/engine.md §5, "Int8 around activations"): an output no layer quantises takes
    its input's parameters, and a half read by a conv with its own quantiser is requantised as a table."""
    x = torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    _, paths = _save(TinyDetector(), x, tmp_path)
    model = onnx.load(paths["deploy"])
    producer = {out: n for n in model.graph.node for out in n.output}
    readers = {name: [n for n in model.graph.node if name in n.input] for n in model.graph.node for name in n.output}
    moved = [n for n in model.graph.node if n.op_type in ("Split", "MaxPool", "Resize")]
    assert sorted(n.op_type for n in moved) == ["MaxPool"] * 3 + ["Resize"] + ["Split"] * 3
    for node in moved:
        source = producer[node.input[0]]
        if source.op_type == "QuantizeLinear":  # on the codes already
            continue
        # else ORT drops the pair: DequantizeLinear -> op -> QuantizeLinear with the same parameters
        (quantizer,) = readers[node.output[0]]
        assert source.op_type == "DequantizeLinear" and quantizer.op_type == "QuantizeLinear"
        assert source.input[1:] == quantizer.input[1:]
    optimized = optimized_ops(model)
    ops = [n.op_type for n in optimized.graph.node]
    assert "QLinearLeakyRelu" in ops  # the requantisations of the halves the blocks' convs read
    assert ops.count("QuantizeLinear") == 1 and ops.count("Split") == 3  # the image's quantiser only
    initializers = {t.name for t in optimized.graph.initializer}
    dequantized = [
        n for n in optimized.graph.node if n.op_type == "DequantizeLinear" and n.input[0] not in initializers
    ]
    assert len(dequantized) == 2  # the heads' float inputs (their outputs are the model's), nothing else


def test_a_requantisation_as_a_table_gives_the_codes_of_dequantize_then_quantize():
    """QLinearLeakyRelu with alpha 1 (what `DQ -> LeakyRelu(1) -> Q` fuses into) against the two nodes, every
    code, parameters that shrink, grow and shift the range."""
    from onnx import TensorProto, helper, numpy_helper

    codes = np.arange(256, dtype=np.uint8).reshape(1, 256)
    for (s1, z1), (s2, z2) in [((0.02, 120), (0.015, 100)), ((0.001, 3), (0.0037, 250)), ((0.5, 0), (0.5, 1))]:
        params = [
            numpy_helper.from_array(np.array(v, dtype=t), n)
            for v, t, n in ((s1, np.float32, "s1"), (z1, np.uint8, "z1"), (s2, np.float32, "s2"), (z2, np.uint8, "z2"))
        ]
        results = []
        for middle in ([], [helper.make_node("LeakyRelu", ["f"], ["f2"], alpha=1.0)]):
            nodes = [
                helper.make_node("DequantizeLinear", ["x", "s1", "z1"], ["f"]),
                *middle,
                helper.make_node("QuantizeLinear", ["f2" if middle else "f", "s2", "z2"], ["y"]),
            ]
            graph = helper.make_graph(
                nodes,
                "requantize",
                [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 256])],
                [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 256])],
                params,
            )
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
            if middle:
                assert [n.op_type for n in optimized_ops(model).graph.node] == ["QLinearLeakyRelu"]
            session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            results.append(session.run(None, {"x": codes})[0])
        np.testing.assert_array_equal(results[0], results[1])


def _check_outputs(qmodel: nn.Module, paths: dict, x: torch.Tensor) -> None:
    with torch.no_grad():
        expected = qmodel(x)
    expected = [t.numpy() for t in (expected if isinstance(expected, tuple) else (expected,))]
    fake, deploy = _outputs(paths["fake_quant"], x), _outputs(paths["deploy"], x)
    for want, got_fake, got in zip(expected, fake, deploy, strict=True):
        # onnxruntime's float activations (x * sigmoid(x)) and torch's differ in the last bit, which moves a value
        # sitting on a rounding boundary of the next quantiser by one step: rare, and one step at most.
        off = ~np.isclose(got_fake, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
        assert off.mean() <= 0.01 and np.abs(got_fake - want).max() <= 0.01 * np.abs(want).max()
        # The added quantisers (each activation's input, the gates, the adds) round once each.
        assert np.abs(got - want).max() <= 0.08 * np.abs(want).max(), np.abs(got - want).max()
        assert np.corrcoef(got.ravel(), want.ravel())[0, 1] > 0.995


def test_relu6_convs_fuse_whether_ort_drops_the_clamp_or_the_codes_are_clipped(tmp_path):
    """A ReLU6 between two convs: where the next quantiser's range lies within [0, 6] ORT drops the clamp;
    elsewhere the codes are clipped at q(0) and q(6), which is the clamp exactly (quantisation is monotone).
    Either way the conv before it runs as QLinearConv and no float Clip is left."""
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU6(), nn.Conv2d(8, 8, 3), nn.ReLU6(), nn.Conv2d(8, 4, 3)).eval()
    with torch.no_grad():
        net[0].weight.mul_(20)  # pre-activations far past 6
    x = torch.randn(8, 3, 12, 12, generator=torch.Generator().manual_seed(0))
    # The record's weight codes (this CPU's exact target): the deploy model within one output step of the eval model.
    qmodel, paths = _save(net, x, tmp_path, deploy_target=record_exact_target())
    deploy = onnx.load(paths["deploy"])
    values = {t.name: onnx.numpy_helper.to_array(t) for t in deploy.graph.initializer}
    producer = {out: n for n in deploy.graph.node for out in n.output}
    optimized = optimized_ops(deploy).graph.node
    for clip in (n for n in deploy.graph.node if n.op_type == "Clip"):
        quantize = producer[clip.input[0]]
        if quantize.op_type != "QuantizeLinear":  # a float clamp: one ORT drops (its quantiser lies inside)
            assert clip.name not in {n.name for n in optimized}
            continue
        scale, zero = (values[name] for name in quantize.input[1:3])  # else a clip on the codes
        codes = [values[name] for name in clip.input[1:]]
        assert [c.dtype for c in codes] == [zero.dtype] * 2 and int(codes[0]) == int(zero)
        assert int(codes[1]) == min(round(6.0 / float(scale)) + int(zero), np.iinfo(zero.dtype).max)
    ops = [n.op_type for n in optimized]
    assert ops.count("QLinearConv") == 2  # the last conv's output is the model's: float
    for batch in (x, torch.randn(3, 3, 12, 12, generator=torch.Generator().manual_seed(1))):
        with torch.no_grad():
            expected = qmodel(batch).numpy()
        got = _outputs(paths["deploy"], batch)[0]
        assert np.abs(got - expected).max() <= 0.01 * np.abs(expected).max()


def test_a_model_captured_by_torch_export_saves_with_dynamic_axes_and_no_names(tmp_path):
    """The detector is captured through torch.export (fx cannot trace its split); its files get the input's
    parameter name and output_0, output_1, and the batch stays dynamic."""
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    config, record = tmp_path / "c.json", tmp_path / "r.txt"
    net = TinyDetector().eval()
    amct.create_quant_retrain_config(str(config), net, x[:2])
    qmodel = amct.create_quant_retrain_model(str(config), net, str(record), x[:2]).eval()
    with torch.no_grad():
        qmodel(x)
    paths = amct.save_quant_retrain_model(
        str(config), qmodel, str(record), str(tmp_path / "net"), x, dynamic_axes={"x": {0: "n"}}
    )
    for path in paths.values():
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        assert [i.name for i in session.get_inputs()] == ["x"]
        assert [o.name for o in session.get_outputs()] == ["output_0", "output_1"]
        assert [o.shape[0] for o in session.run(None, {"x": x[:3].numpy()})] == [3, 3]


@pytest.mark.parametrize(
    "name, producer, minimum",
    [("hardswish-hardsigmoid-gate", "Mul", -0.375), ("silu-sigmoid-gate", "Mul", -0.2785)],
)
def test_bounded_below_activations_are_quantised_from_their_minimum_not_below(name, producer, minimum, tmp_path):
    """The calibration widens an example's range by a margin (other inputs reach further), but hardswish never
    goes below -0.375 nor SiLU below -0.2785: those codes would be wasted, so the range starts at the minimum."""
    ctor, shape = NETS[name]
    x = torch.randn(16, *shape, generator=torch.Generator().manual_seed(1)) * 3  # inputs that reach the minimum
    _, paths = _save(ctor(), x, tmp_path)
    deploy = onnx.load(paths["deploy"])
    values = {t.name: onnx.numpy_helper.to_array(t) for t in deploy.graph.initializer}
    producers = {out: n for n in deploy.graph.node for out in n.output}

    def codes_of(name: str) -> str:  # a dequantised tensor's codes: two DequantizeLinear of one tensor match
        node = producers.get(name)
        return node.input[0] if node is not None and node.op_type == "DequantizeLinear" else name

    def gate_input(name: str) -> str | None:  # the codes a gate reads: SiLU's Sigmoid, hardswish's Clip on codes
        node = producers.get(name)
        node = producers.get(node.input[0]) if node is not None and node.op_type == "DequantizeLinear" else None
        if node is not None and node.op_type == "QuantizeLinear":
            node = producers.get(node.input[0])
        return codes_of(node.input[0]) if node is not None and node.op_type in ("Sigmoid", "Clip") else None

    def is_activation(source) -> bool:  # x * gate(x), not a squeeze-excite gate's x * sigmoid(fc(x))
        if source is None or source.op_type != producer or len(source.input) != 2:
            return False
        a, b = source.input
        return gate_input(b) == codes_of(a) or gate_input(a) == codes_of(b)

    lows = []
    for node in deploy.graph.node:
        if node.op_type == "QuantizeLinear" and is_activation(producers.get(node.input[0])):
            scale, zero = (float(values[n]) for n in node.input[1:3])
            lows.append(-scale * zero)
    assert lows and all(minimum - 0.01 <= low <= 0 for low in lows), lows
    assert min(lows) < minimum / 2  # the inputs did reach down there
