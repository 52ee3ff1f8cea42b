"""Lookup tables of the deploy model as int8 rows with per-row scales (amct_engine/export/qdq/embeddings.py):
no float table left, about 3/4 of its bytes saved, outputs those of the same graph with the table rounded
per row (float tolerance), at other sequence lengths too; a table tied to a float head stays float."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

import amct_engine as amct
import amct_engine.export.qdq.finalize as finalize
from amct_engine.export.qdq.embeddings import MIN_TABLE_BYTES, int8_embeddings, per_row_int8
from amct_engine.export.qdq.fusion_report import deploy_report

VOCAB, WIDTH, SEQ = 5000, 64, 16  # 1.28 MB: above the pass's 1 MiB threshold; the 64-row position table is below


class Bag(nn.Module):
    """Token + position embeddings, a Linear, mean over the tokens: a sentence encoder in small."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, WIDTH)
        self.positions = nn.Embedding(64, WIDTH)
        self.fc = nn.Linear(WIDTH, 32)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.fc(self.tokens(ids) + self.positions(positions)).mean(1)


class TiedHead(nn.Module):
    """A language model's tied head: the Gemm reads the embedding table itself."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, WIDTH)
        self.fc = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)
        self.head.weight = self.tokens.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.fc(self.tokens(ids))).mean(1))


def _ids(batch: int, seq: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _ptq(model: nn.Module, tmp_path, name: str) -> tuple[str, nn.Module]:
    """The deploy file of `model` after PTQ (ids [n, t] dynamic), and the calibrated PyTorch model."""
    ids = _ids(4, SEQ, 0)
    config, fused, record = (str(tmp_path / f"{name}{suffix}") for suffix in (".json", ".onnx", ".txt"))
    amct.create_quant_config(config, model, (ids,))
    calibrated = amct.quantize_model(config, fused, record, model, (ids,), ["ids"], ["out"], {"ids": {0: "n", 1: "t"}})
    with torch.no_grad():
        calibrated(ids)
    return amct.save_model(fused, record, str(tmp_path / name), calibrated)["deploy"], calibrated


def _run(model: str | onnx.ModelProto, ids: torch.Tensor) -> np.ndarray:
    source = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, {"ids": ids.numpy()})[0]


def test_a_lookup_table_is_stored_as_int8_rows_and_computes_the_rounded_table(tmp_path, monkeypatch):
    torch.manual_seed(0)
    model = Bag().eval()
    deploy, calibrated = _ptq(model, tmp_path, "int8")
    monkeypatch.setattr(finalize, "int8_embeddings", lambda graph: [])
    float_table, _ = _ptq(model, tmp_path, "float")

    written = onnx.load(deploy)
    table = model.tokens.weight.detach().numpy()
    assert table.nbytes >= MIN_TABLE_BYTES
    by_rows = {t.name: (t.data_type, list(t.dims)) for t in written.graph.initializer if t.dims[:1] == [VOCAB]}
    assert by_rows == {  # no float table left: int8 codes and a [rows, 1] scale vector
        "tokens.weight.int8_rows": (TensorProto.INT8, [VOCAB, WIDTH]),
        "tokens.weight.row_scales": (TensorProto.FLOAT, [VOCAB, 1]),
    }
    report = deploy_report(deploy)
    assert report["int8_embeddings"] == ["tokens.weight"]  # the position table (16 KB) stays float
    assert deploy_report(float_table)["int8_embeddings"] == []
    saved = (tmp_path / "float_deploy_model.onnx").stat().st_size - (tmp_path / "int8_deploy_model.onnx").stat().st_size
    expected_saving = table.nbytes * 3 / 4 - 4 * VOCAB  # int8 codes, one float scale a row
    assert abs(saved - expected_saving) < 2048, (saved, expected_saving)

    # The float file with its table rounded the same way is the reference: identical up to float rounding.
    reference = onnx.load(float_table)
    codes, scales = per_row_int8(table)
    for tensor in reference.graph.initializer:
        if tensor.name == "tokens.weight":
            tensor.CopyFrom(numpy_helper.from_array(codes.astype(np.float32) * scales, "tokens.weight"))
    for batch, seq in ((2, 7), (3, 40)):  # sequence lengths other than the example's 16
        ids = _ids(batch, seq, seq)
        got = _run(deploy, ids)
        np.testing.assert_allclose(got, _run(reference, ids), rtol=1e-5, atol=1e-6)
        with torch.no_grad():
            want = calibrated(ids).numpy()
        # Against PyTorch: the int8 Linear's own error plus a rounding of at most scale/2 per table element.
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 0.02
        assert np.abs(got - _run(float_table, ids)).max() < 0.05 * np.abs(want).max()


def test_a_table_tied_to_a_float_head_stays_float(tmp_path):
    torch.manual_seed(0)
    model = TiedHead().eval()
    deploy, calibrated = _ptq(model, tmp_path, "tied")
    written = onnx.load(deploy)
    readers = [n.op_type for n in written.graph.node if "tokens.weight" in n.input]
    assert sorted(readers) == ["Gather", "Gemm"]  # the head (a tied weight stays float) reads the table too
    assert deploy_report(deploy)["int8_embeddings"] == []
    ids = _ids(2, 9, 1)
    with torch.no_grad():
        want = calibrated(ids).numpy()
    got = _run(deploy, ids)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 0.02


def test_only_axis_0_lookups_with_computed_ids_are_rewritten():
    """The pass on a hand-made graph: an unnamed Gather on the ids input is rewritten; a Gather on constant
    ids (a weight slice, folded at load anyway) or on axis 1 keeps its table float."""
    rows = MIN_TABLE_BYTES // (4 * WIDTH) + 1
    tables = {
        name: np.random.default_rng(i).standard_normal((rows, WIDTH)).astype(np.float32)
        for i, name in enumerate(("looked_up", "sliced", "columns"))
    }
    nodes = [
        helper.make_node("Gather", ["looked_up", "ids"], ["a"]),
        helper.make_node("Gather", ["sliced", "fixed"], ["b"]),
        helper.make_node("Gather", ["columns", "ids"], ["c"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "lookups",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["t"])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["t", WIDTH]) for name in "ab"]
        + [helper.make_tensor_value_info("c", TensorProto.FLOAT, [rows, "t"])],
        [numpy_helper.from_array(t, name) for name, t in tables.items()]
        + [numpy_helper.from_array(np.array([0, 3], np.int64), "fixed")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert int8_embeddings(model) == ["looked_up"]
    onnx.checker.check_model(model)
    ids = np.array([5, -2, WIDTH - 1], np.int64)  # negative ids index from the end, as in Gather
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    a, b, c = session.run(None, {"ids": ids})
    codes, scales = per_row_int8(tables["looked_up"])
    np.testing.assert_array_equal(a, codes[ids].astype(np.float32) * scales[ids])
    assert np.abs(a - tables["looked_up"][ids]).max() <= scales.max() / 2 + 1e-7
    np.testing.assert_array_equal(b, tables["sliced"][[0, 3]])
    np.testing.assert_array_equal(c, tables["columns"][:, ids])
