"""amct.quantize / convert / export_onnx for LLMs (docs/spec/llm.md) on a tiny random-init Llama fed real text.

The model: LlamaForCausalLM, hidden 64, MLP 160 (so group 128 leaves a partial last group), 2 layers, a
byte vocabulary (256), with a few large norm weights so that some input channels carry outliers as in
trained LLMs. Text: Python's pydoc topics, as bytes; calibration and evaluation come from different topics.
"""

from __future__ import annotations

import copy
import pydoc_data.topics

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

import amct_engine as amct
from amct_engine.config.errors import ConfigError
from amct_engine.llm import onnx_export
from amct_engine.llm.awq import output_error
from amct_engine.llm.config import WeightSpec, parse_config
from amct_engine.llm.group_quant import rtn
from amct_engine.llm.onnx_export import accuracy_level_for_cpu
from amct_engine.llm.quant_linear import W8A8Linear, WeightOnlyLinear
from tests.llm_folder import tiny_llama

transformers = pytest.importorskip("transformers")

SEQ = 128
G32_ASYM = {"type": "int4", "symmetric": False, "strategy": "group", "group_size": 32}


def _cfg(weights, algorithm, inputs=None, skip=("lm_head",)):
    quant_cfg = {"weights": dict(weights)}
    if inputs:
        quant_cfg["inputs"] = inputs
    return {"batch_num": 1, "quant_cfg": quant_cfg, "algorithm": algorithm, "skip_layers": set(skip)}


def _text_ids(keys, rows: int) -> torch.Tensor:
    data = "\n".join(pydoc_data.topics.topics[k] for k in keys).encode()[: rows * SEQ]
    return torch.tensor(list(data), dtype=torch.long).reshape(rows, SEQ)


@pytest.fixture(scope="module")
def texts():
    keys = sorted(pydoc_data.topics.topics)
    return _text_ids(keys[: len(keys) // 2], 16), _text_ids(keys[len(keys) // 2 :], 4)


@pytest.fixture(scope="module")
def _tiny_llama():
    return tiny_llama(256)  # the service tests' model (tests/llm_folder.py), over a 256-token vocabulary


@pytest.fixture
def llama(_tiny_llama):
    return copy.deepcopy(_tiny_llama)


def _calibrated(model, cfg, calib):
    amct.quantize(model, cfg)
    with torch.no_grad():
        model(input_ids=calib)
    return amct.convert(model, progress=False)


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


# ------------------------------------------------------------------ config
@pytest.mark.parametrize(
    ("cfg", "field"),
    [
        ({"quant_cfg": {"weights": {"type": "int3"}}}, "quant_cfg.weights.type"),
        ({"quant_cfg": {"weights": {**G32_ASYM, "group_size": 48}}}, "quant_cfg.weights.group_size"),
        (
            {"quant_cfg": {"weights": {"type": "int4", "strategy": "channel", "group_size": 32}}},
            "quant_cfg.weights.group_size",
        ),
        ({"quant_cfg": {"weights": {"type": "int4", "strategy": "row"}}}, "quant_cfg.weights.strategy"),
        ({"quant_cfg": {"weights": {"type": "int4", "symmetric": "yes"}}}, "quant_cfg.weights.symmetric"),
        ({"quant_cfg": {"weights": {"type": "int4", "colour": 1}}}, "quant_cfg.weights.colour"),
        ({"quant_cfg": {}}, "quant_cfg.weights"),
        ({}, "quant_cfg"),
        ({"batch_num": 0, "quant_cfg": {"weights": {"type": "int8"}}}, "batch_num"),
        ({"quant_cfg": {"weights": {"type": "int8"}}, "algorithm": {"gptq", "awq"}}, "algorithm"),
        ({"quant_cfg": {"weights": {"type": "int8"}}, "algorithm": {"rtn"}}, "algorithm"),
        (
            {"quant_cfg": {"weights": {"type": "int8"}}, "algorithm": {"awq": {"grids_num": 0}}},
            "algorithm.awq.grids_num",
        ),
        (
            {"quant_cfg": {"weights": {"type": "int8"}}, "algorithm": {"smoothquant": {"smooth_strength": 2}}},
            "algorithm.smoothquant.smooth_strength",
        ),
        ({"quant_cfg": {"weights": {"type": "int8"}}, "algorithm": {"smoothquant"}}, "quant_cfg.inputs"),
        ({"quant_cfg": {"weights": {"type": "int4"}, "inputs": {"type": "int8"}}}, "quant_cfg.weights.type"),
        (
            {"quant_cfg": {"weights": {"type": "int8"}, "inputs": {"type": "int8", "strategy": "channel"}}},
            "quant_cfg.inputs.strategy",
        ),
        ({"quant_cfg": {"weights": {"type": "int8"}}, "skip_layers": "lm_head"}, "skip_layers"),
        ({"quant_cfg": {"weights": {"type": "int4", "zero_point": "float"}}}, "quant_cfg.weights.zero_point"),
        ({"quant_cfg": {"weights": dict(G32_ASYM, zero_point="half")}}, "quant_cfg.weights.zero_point"),
    ],
)
def test_config_errors_name_the_field(cfg, field):
    with pytest.raises(ConfigError) as info:
        parse_config(cfg)
    assert info.value.field == field
    assert str(info.value).startswith(field + ":")


def test_builtin_configs_parse_with_amct_meaning():
    gptq = parse_config(amct.INT4_GPTQ_WEIGHT_QUANT_CFG)
    assert (gptq.algorithm, gptq.weights.bits, gptq.weights.strategy, gptq.skip_layers) == (
        "gptq",
        4,
        "channel",
        frozenset({"lm_head"}),
    )
    awq = parse_config(amct.INT4_AWQ_WEIGHT_QUANT_CFG)
    assert (awq.algorithm, awq.params["grids_num"]) == ("awq", 20)
    sq = parse_config(amct.INT8_SMOOTHQUANT_CFG)
    assert (sq.inputs.strategy, sq.params["smooth_strength"]) == ("tensor", 0.5)
    assert parse_config(amct.INT8_MINMAX_WEIGHT_QUANT_CFG).weights.bits == 8


# ------------------------------------------------------------------ RTN maths
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize(("strategy", "group"), [("group", 32), ("group", 64), ("group", 128), ("channel", None)])
def test_rtn_error_within_half_a_step(bits, symmetric, strategy, group):
    torch.manual_seed(1)
    weight = torch.randn(24, 160) * torch.linspace(0.1, 2.0, 160)
    codes = rtn(weight, WeightSpec(bits, symmetric, strategy, group))
    size = group or 160
    assert codes.scales.shape == (24, -(-160 // size))  # 160 = 128 + a partial group of 32
    assert int(codes.codes.max()) <= 2**bits - 1
    step = codes.scales.repeat_interleave(size, dim=1)[:, :160]
    assert torch.all((codes.dequantize() - weight).abs() <= step / 2 + 1e-6)
    if symmetric:
        assert torch.all(codes.zero_points == 2 ** (bits - 1))
    for g in range(codes.scales.shape[1]):  # each group's own range sets its step
        block = weight[:, g * size : (g + 1) * size]
        lo, hi = block.amin(1).clamp(max=0), block.amax(1).clamp(min=0)
        want = torch.maximum(-lo, hi) / (2 ** (bits - 1) - 1) if symmetric else (hi - lo) / (2**bits - 1)
        torch.testing.assert_close(codes.scales[:, g], want)


def test_asymmetric_zero_point_keeps_zero_exact():
    weight = torch.tensor([[0.0, 0.3, 1.2, 2.0] * 8, [-1.0, 0.0, 0.5, 0.25] * 8])
    codes = rtn(weight, WeightSpec(4, False, "group", 32))
    deq = codes.dequantize()
    assert torch.all(deq[weight == 0] == 0)
    assert codes.zero_points[0, 0] == 0 and codes.zero_points[1, 0] == round(1.0 / (1.5 / 15))


def q4_1_weight(rows: int = 16, cols: int = 96) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight already on GGUF Q4_1's grid, as SmolLM2's file holds them: per 32 weights ``d * q + m``, q in
    0..15 (both ends used), ``m`` a float minimum that is not a multiple of ``d``; and its steps ``d``."""
    torch.manual_seed(3)
    q = torch.randint(0, 16, (rows, cols // 32, 32))
    q[..., 0], q[..., 1] = 0, 15
    d = torch.rand(rows, cols // 32, 1) * 0.02 + 0.005
    m = -d * (torch.rand(rows, cols // 32, 1) * 12 + 1.5)  # the grid's 0 falls between two codes
    return (d * q + m).reshape(rows, cols), d.reshape(rows, -1)


@pytest.mark.parametrize("algorithm", ["minmax", "gptq", "awq"])
def test_float_zero_points_find_a_q4_1_grid_again(algorithm):
    """Integer zero points cannot represent a grid whose 0 lies between codes (errors up to half a step); float
    zero points (ORT HQQ's form) give the weights back, through each algorithm (AWQ keeps alpha 0 and ratio 1,
    GPTQ has no error to spread)."""
    from amct_engine.llm.awq import awq_quantize
    from amct_engine.llm.gptq import gptq_quantize

    weight, step = q4_1_weight()
    x = torch.randn(256, weight.shape[1]) * torch.linspace(0.2, 3, weight.shape[1])
    h = x.T @ x / len(x)

    def restored(spec):
        if algorithm == "gptq":
            return gptq_quantize(weight, h, spec).dequantize()
        if algorithm == "awq":
            codes, multiplier = awq_quantize(weight, h, x.abs().mean(0), spec)
            return codes.dequantize() * multiplier
        return rtn(weight, spec).dequantize()

    floats = restored(WeightSpec(4, False, "group", 32, float_zero_point=True))
    integers = restored(WeightSpec(4, False, "group", 32))
    step = step.repeat_interleave(32, dim=1)
    assert torch.all((floats - weight).abs() <= 1e-4 * step)
    assert (integers - weight).abs().div(step).max() > 0.2


# ------------------------------------------------------------------ algorithms
def _layer_inputs(model, names, ids):
    seen = {}

    def keep(name):
        def hook(module, args):
            seen[name] = args[0].reshape(-1, args[0].shape[-1])

        return hook

    hooks = [model.get_submodule(n).register_forward_pre_hook(keep(n)) for n in names]
    with torch.no_grad():
        model(input_ids=ids)
    for h in hooks:
        h.remove()
    return seen


LAYERS = ["model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj", "model.layers.1.mlp.gate_proj"]


@pytest.mark.parametrize("weights", [G32_ASYM, {"type": "int4", "symmetric": True, "strategy": "channel"}])
def test_gptq_and_awq_beat_rtn_on_layer_output_error(llama, texts, weights):
    calib = texts[0]
    inputs = _layer_inputs(llama, LAYERS, calib)
    float_weights = {n: llama.get_submodule(n).weight.detach().clone() for n in LAYERS}
    errors = {}
    for algorithm in ("minmax", "gptq", "awq"):
        model = _calibrated(copy.deepcopy(llama), _cfg(weights, {algorithm}), calib)
        for name in LAYERS:
            module = model.get_submodule(name)
            x = inputs[name]
            error = (module(x) - x @ float_weights[name].T).pow(2).mean().item()
            errors.setdefault(name, {})[algorithm] = error
    for name, e in errors.items():
        assert e["gptq"] < 0.9 * e["minmax"], (name, e)
        assert e["awq"] < 0.95 * e["minmax"], (name, e)


def test_awq_search_keeps_rtn_on_its_grid():
    torch.manual_seed(2)
    weight, x = torch.randn(32, 64), torch.randn(512, 64) * torch.linspace(0.05, 4, 64)
    h = x.T @ x / len(x)
    spec = WeightSpec(4, False, "group", 32)
    from amct_engine.llm.awq import awq_quantize

    codes, multiplier = awq_quantize(weight, h, x.abs().mean(0), spec)
    awq_err = output_error(codes.dequantize() * multiplier - weight, h)
    assert awq_err <= output_error(rtn(weight, spec).dequantize() - weight, h)


@pytest.mark.parametrize("strategy", ["tensor", "token"])
def test_smoothquant_w8a8_close_to_fp32(llama, texts, strategy):
    calib, held_out = texts
    reference = _logits(llama, held_out)
    cfg = copy.deepcopy(amct.INT8_SMOOTHQUANT_CFG)
    cfg["quant_cfg"]["inputs"]["strategy"] = strategy
    model = _calibrated(llama, cfg, calib)
    assert isinstance(model.model.layers[0].mlp.up_proj, W8A8Linear)
    rel = (_logits(model, held_out) - reference).norm() / reference.norm()
    assert rel < 0.03, rel
    plain = parse_config(cfg)
    assert plain.algorithm == "smoothquant"


def test_smoothing_lowers_w8a8_error_on_outlier_channels(llama, texts):
    calib, held_out = texts
    reference = _logits(llama, held_out)
    errs = {}
    for alg in ("minmax", "smoothquant"):
        cfg = _cfg({"type": "int8", "strategy": "channel"}, {alg}, {"type": "int8", "strategy": "tensor"})
        out = _logits(_calibrated(copy.deepcopy(llama), cfg, calib), held_out)
        errs[alg] = ((out - reference).norm() / reference.norm()).item()
    assert errs["smoothquant"] < errs["minmax"], errs


# ------------------------------------------------------------------ API behaviour
class KeepLinear(nn.Linear):
    pass


def test_quantize_and_convert_in_place_with_skip_layers(llama, texts):
    calib, held_out = texts
    head = KeepLinear(64, 256, bias=False)
    head.weight = llama.lm_head.weight
    llama.lm_head = head
    original_config = copy.deepcopy(amct.INT8_MINMAX_WEIGHT_QUANT_CFG)
    cfg = _cfg({"type": "int8", "strategy": "channel"}, {"minmax"}, skip=("KeepLinear", "layers.1.mlp"))
    reference = _logits(llama, held_out)
    assert amct.quantize(llama, cfg) is llama
    assert type(llama.model.layers[0].self_attn.q_proj).__name__ == "CalibrationLinear"
    assert type(llama.model.layers[1].mlp.up_proj) is nn.Linear and type(llama.lm_head) is KeepLinear
    assert amct.convert(llama, progress=False) is llama
    assert isinstance(llama.model.layers[0].mlp.down_proj, WeightOnlyLinear)
    assert isinstance(llama.model.layers[1].self_attn.o_proj, WeightOnlyLinear)
    assert type(llama.model.layers[1].mlp.down_proj) is nn.Linear
    rel = (_logits(llama, held_out) - reference).norm() / reference.norm()
    assert rel < 0.01  # int8 per-channel weights
    assert original_config == amct.INT8_MINMAX_WEIGHT_QUANT_CFG


def test_convert_needs_the_calibration_forward(llama):
    amct.quantize(llama, amct.INT4_GPTQ_WEIGHT_QUANT_CFG)
    with pytest.raises(RuntimeError, match="calibration forward"):
        amct.convert(llama, progress=False)


def test_quantize_with_nothing_left_to_quantise(llama):
    with pytest.raises(ValueError, match="no nn.Linear"):
        amct.quantize(llama, _cfg({"type": "int8"}, {"minmax"}, skip=("Linear",)))


# ------------------------------------------------------------------ ONNX
def _ort_logits(path, ids):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"input_ids": ids.numpy()})[0]


@pytest.mark.parametrize(
    ("cfg", "op", "atol"),
    [
        (_cfg(G32_ASYM, {"awq"}), "MatMulNBits", 1e-4),
        (_cfg({"type": "int4", "symmetric": True, "strategy": "channel"}, {"gptq"}), "MatMulNBits", 1e-4),
        (_cfg(dict(G32_ASYM, zero_point="float"), {"gptq"}), "MatMulNBits", 1e-4),
        # MatMulInteger, the route export_onnx takes on x86 without VNNI (onnx_nodes.w8a8_static_nodes)
        (copy.deepcopy(amct.INT8_SMOOTHQUANT_CFG), "MatMulInteger", 1e-4),
    ],
    ids=["awq-int4-g32-asym", "gptq-int4-channel-sym", "gptq-int4-g32-float-zero-points", "smoothquant-w8a8"],
)
def test_export_onnx_runs_in_ort_as_convert_computes(llama, texts, tmp_path, cfg, op, atol):
    calib, held_out = texts
    model = _calibrated(llama, cfg, calib)
    path = amct.export_onnx(model, tmp_path / "model.onnx", calib[:1, :16], accuracy_level=0, w8a8_qdq=False)
    graph = onnx.load(str(path)).graph
    ops = [n.op_type for n in graph.node]
    assert ops.count(op) >= 12  # 7 Linears a layer, 2 layers, lm_head skipped (14)
    ids = held_out[:2, :100]  # another batch and length than the export's example
    np.testing.assert_allclose(_ort_logits(path, ids), _logits(model, ids).numpy(), atol=atol, rtol=1e-4)
    assert all(m.weight is not None for m in [model.lm_head])  # the model is unchanged by the export
    assert isinstance(model.model.layers[0].self_attn.q_proj, (WeightOnlyLinear, W8A8Linear))


@pytest.mark.parametrize(
    ("machine", "flags", "level"),
    [
        ("x86_64", {"avx2", "fma"}, 0),  # no VNNI: float activations prefill faster (onnx_export.py)
        ("x86_64", {"avx2", "avx512f", "avx512_vnni"}, 4),
        ("x86_64", {"avx2", "avx512f", "avx512_vnni", "amx_int8"}, 0),  # Xeon with AMX: its SGEMM is faster
        ("x86_64", {"avx2", "avx_vnni"}, 4),
        ("aarch64", {"asimddp"}, 4),
    ],
)
def test_accuracy_level_chosen_by_cpu(machine, flags, level):
    assert accuracy_level_for_cpu(machine, flags) == level


def test_export_writes_the_accuracy_level(llama, texts, tmp_path, monkeypatch):
    """None (the default) writes the level chosen for the exporting CPU on every MatMulNBits; 0-4 only."""
    calib, _ = texts
    model = _calibrated(llama, _cfg(G32_ASYM, {"minmax"}), calib[:4])
    with pytest.raises(ValueError, match="accuracy_level"):  # checked before the (slow) trace
        amct.export_onnx(model, tmp_path / "bad.onnx", calib[:1, :16], accuracy_level=5)
    monkeypatch.setattr(onnx_export, "detect_deploy_target", lambda machine=None, flags=None: "x86_vnni")
    path = amct.export_onnx(model, tmp_path / "auto.onnx", calib[:1, :16])
    nodes = [n for n in onnx.load(str(path)).graph.node if n.op_type == "MatMulNBits"]
    assert len(nodes) == 14  # 7 Linears a layer, 2 layers
    assert {a.i for n in nodes for a in n.attribute if a.name == "accuracy_level"} == {4}
