"""Boolean attention masks with a finite fill and no NaN guard after the softmax (amct_engine/export/attention_masks.py,
docs/spec/engine.md §5.3): the deploy file computes what it did for every row with a visible key, at several
lengths and paddings, and the rewrite leaves a graph alone where another -inf could reach the softmax."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper
from torch import nn

import amct_engine as amct
import amct_engine.export.qdq.finalize as finalize
from amct_engine.export.attention_masks import finite_attention_masks
from amct_engine.export.qdq.fusion_report import deploy_report


class MaskedAttention(nn.Module):
    """One attention block over token features with a padding mask, as transformers' SDPA path calls it."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.out = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x).unflatten(-1, (3, 2, 8)).permute(2, 0, 3, 1, 4)  # (3, n, heads, tokens, 8)
        q, k, v = qkv[0], qkv[1], qkv[2]
        keep = mask[:, None, None, :].bool()
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        return self.out(y.transpose(1, 2).flatten(2))


def _deploy(tmp_path, name: str) -> str:
    torch.manual_seed(0)
    model = MaskedAttention().eval()
    x, mask = torch.randn(4, 10, 16), torch.ones(4, 10, dtype=torch.int64)
    mask[1, 6:] = 0
    config, record, fused = (str(tmp_path / f"{name}{s}") for s in (".json", ".txt", ".onnx"))
    amct.create_quant_config(config, model, (x, mask))
    io = {"input_names": ["x", "mask"], "output_names": ["y"]}
    axes = {"x": {0: "n", 1: "seq"}, "mask": {0: "n", 1: "seq"}, "y": {0: "n", 1: "seq"}}
    calibration = amct.quantize_model(config, fused, record, model, (x, mask), **io, dynamic_axes=axes)
    with torch.no_grad():
        calibration(x, mask)
    return amct.save_model(fused, record, str(tmp_path / name))["deploy"]


def _run(path: str, x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x, "mask": mask})[0]


def test_the_deploy_file_has_no_nan_guard_and_computes_the_same(tmp_path, monkeypatch):
    ours = _deploy(tmp_path, "finite")
    graph = onnx.load(ours).graph
    assert not [n for n in graph.node if n.op_type == "IsNaN"]
    assert len(deploy_report(ours)["finite_attention_masks"]) == 1
    monkeypatch.setattr(finalize, "finite_attention_masks", lambda model: [])
    guarded = _deploy(tmp_path, "guarded")
    assert [n.op_type for n in onnx.load(guarded).graph.node].count("IsNaN") == 1
    rng = np.random.default_rng(2)
    for length in (3, 10, 23):  # other lengths than the export's, with padding at several places
        x = rng.standard_normal((3, length, 16)).astype(np.float32)
        mask = np.ones((3, length), np.int64)
        mask[0, length // 2 :] = 0
        mask[2, 1:] = 0
        np.testing.assert_array_equal(_run(ours, x, mask), _run(guarded, x, mask))


def _attention_graph(extra_mask: bool) -> onnx.ModelProto:
    """softmax(q·kᵀ + Where(keep, 0, -inf) [+ another float mask]) · v with torch's NaN guard."""
    scores_in = "scores"
    nodes = [
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node("Where", ["keep", "zero", "minus_inf"], ["fill"]),
    ]
    if extra_mask:
        nodes.append(helper.make_node("Add", ["scores", "bias"], ["biased"]))
        scores_in = "biased"
    nodes += [
        helper.make_node("Add", [scores_in, "fill"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["p"], axis=-1, name="softmax"),
        helper.make_node("IsNaN", ["p"], ["nan"]),
        helper.make_node("Where", ["nan", "zero", "p"], ["p0"]),
        helper.make_node("MatMul", ["p0", "v"], ["y"]),
    ]
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info(n, f, [4, 4]) for n in ("q", "kt", "v", "bias")[: 4 if extra_mask else 3]]
    inputs.append(helper.make_tensor_value_info("keep", TensorProto.BOOL, [1, 4]))
    inits = [numpy_helper.from_array(np.array([0.0], np.float32), "zero")]
    inits.append(numpy_helper.from_array(np.array([-np.inf], np.float32), "minus_inf"))
    graph = helper.make_graph(nodes, "attention", inputs, [helper.make_tensor_value_info("y", f, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(keep: list[bool], extra: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((4, 4)).astype(np.float32) for n in ("q", "kt", "v")}
    feeds["keep"] = np.array([keep])
    if extra:
        feeds["bias"] = np.zeros((4, 4), np.float32)
    return feeds


def _outputs(model: onnx.ModelProto, feeds) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def test_rows_with_a_visible_key_unchanged_and_a_row_without_one_averages_the_values():
    model = _attention_graph(extra_mask=False)
    before = {keep: _outputs(model, _feeds(list(keep), False)) for keep in [(True, True, False, False), (False,) * 4]}
    rewritten = onnx.ModelProto.FromString(model.SerializeToString())
    assert finite_attention_masks(rewritten) == ["softmax"]
    assert {n.op_type for n in rewritten.graph.node} == {"MatMul", "Where", "Add", "Softmax"}
    assert "minus_inf" not in {i.name for i in rewritten.graph.initializer}  # the -inf fill is gone
    partial = _feeds([True, True, False, False], False)
    np.testing.assert_allclose(_outputs(rewritten, partial), before[(True, True, False, False)], rtol=0, atol=1e-6)
    none = _feeds([False] * 4, False)
    np.testing.assert_array_equal(before[(False,) * 4], 0.0)  # torch's rows of zeros ...
    mean = np.broadcast_to(none["v"].mean(axis=0), (4, 4))
    np.testing.assert_allclose(_outputs(rewritten, none), mean, rtol=1e-5)  # ... now the values' average


def test_another_mask_in_the_sum_keeps_the_guard():
    model = _attention_graph(extra_mask=True)
    assert finite_attention_masks(model) == []
    assert [n.op_type for n in model.graph.node].count("IsNaN") == 1
    assert any(i.name == "minus_inf" for i in model.graph.initializer)
