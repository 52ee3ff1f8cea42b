"""Lookup tables as int8 rows with per-row scales: the quantised PyTorch model rounds them and freezes them
(amct_engine/quant/lookup_tables.py), the deploy file stores those rows as int8 (export/qdq/embeddings.py):
no float table left, about 3/4 of its bytes saved, outputs those of the float graph holding the same
rounded table (float tolerance), at other sequence lengths too; QAT leaves the table on its grid; a table
tied to a float head is neither rounded nor stored as int8."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

import amct_engine as amct
import amct_engine.export.qdq.finalize as finalize
from amct_engine.export.qdq.embeddings import int8_embeddings
from amct_engine.export.qdq.fusion_report import deploy_report
from amct_engine.quant.lookup_tables import MIN_TABLE_BYTES, per_row_int8

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


def _rounded(table: torch.Tensor) -> torch.Tensor:
    codes, scales = per_row_int8(table)
    return codes.float() * scales


def test_a_lookup_table_is_rounded_in_pytorch_and_stored_as_int8_rows(tmp_path, monkeypatch):
    torch.manual_seed(0)
    model = Bag().eval()
    original = model.tokens.weight.detach().clone()
    deploy, calibrated = _ptq(model, tmp_path, "int8")
    # The PyTorch model computes with the rounded, frozen table; the user's model keeps its own.
    assert torch.equal(calibrated.tokens.weight, _rounded(original)) and not calibrated.tokens.weight.requires_grad
    assert torch.equal(model.tokens.weight, original)
    assert torch.equal(calibrated.positions.weight, model.positions.weight)  # 16 KB: below the threshold
    monkeypatch.setattr(finalize, "int8_embeddings", lambda graph: [])
    float_table, _ = _ptq(model, tmp_path, "float")

    written = onnx.load(deploy)
    assert original.numel() * 4 >= MIN_TABLE_BYTES
    by_rows = {t.name: (t.data_type, list(t.dims)) for t in written.graph.initializer if t.dims[:1] == [VOCAB]}
    assert by_rows == {  # no float table left: int8 codes and a [rows, 1] scale vector
        "tokens.weight.int8_rows": (TensorProto.INT8, [VOCAB, WIDTH]),
        "tokens.weight.row_scales": (TensorProto.FLOAT, [VOCAB, 1]),
    }
    report = deploy_report(deploy)
    assert report["int8_embeddings"] == ["tokens.weight"]
    assert deploy_report(float_table)["int8_embeddings"] == []
    saved = (tmp_path / "float_deploy_model.onnx").stat().st_size - (tmp_path / "int8_deploy_model.onnx").stat().st_size
    expected_saving = original.numel() * 3 - 4 * VOCAB  # int8 codes, one float scale a row
    assert abs(saved - expected_saving) < 2048, (saved, expected_saving)

    for batch, seq in ((2, 7), (3, 40)):  # sequence lengths other than the example's 16
        ids = _ids(batch, seq, seq)
        got = _run(deploy, ids)
        # The float file holds the same rounded table: identical up to float rounding.
        np.testing.assert_allclose(got, _run(float_table, ids), rtol=1e-5, atol=1e-6)
        with torch.no_grad():
            want = calibrated(ids).numpy()
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 0.02  # the int8 Linear's own error


def test_quantisation_aware_training_keeps_the_table_on_its_grid(tmp_path):
    torch.manual_seed(0)
    model, ids = Bag(), _ids(8, SEQ, 0)
    config, record = str(tmp_path / "c.json"), str(tmp_path / "r.txt")
    amct.create_quant_retrain_config(config, model, (ids,))
    qmodel = amct.create_quant_retrain_model(config, model, record, (ids,))
    rounded = qmodel.tokens.weight.detach().clone()
    assert torch.equal(rounded, _rounded(model.tokens.weight))
    optimizer = torch.optim.AdamW([p for p in qmodel.parameters() if p.requires_grad], lr=1e-2)
    for step in range(3):
        loss = qmodel(_ids(8, SEQ, step)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert torch.equal(qmodel.tokens.weight, rounded)  # frozen: the deploy file's rows are what it trained with
    assert not torch.equal(qmodel.fc.layer.weight, model.fc.weight)  # the rest trained
    qmodel.eval()
    with torch.no_grad():
        qmodel(ids)  # the record's factors after training
    paths = amct.save_quant_retrain_model(
        config, qmodel, record, str(tmp_path / "qat"), (ids,), ["ids"], ["out"], {"ids": {0: "n", 1: "t"}}
    )
    assert deploy_report(paths["deploy"])["int8_embeddings"] == ["tokens.weight"]
    ids = _ids(3, 11, 5)
    with torch.no_grad():
        want = qmodel(ids).numpy()
    got = _run(paths["deploy"], ids)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 0.02


def test_a_table_tied_to_a_float_head_stays_float(tmp_path):
    torch.manual_seed(0)
    model = TiedHead().eval()
    deploy, calibrated = _ptq(model, tmp_path, "tied")
    written = onnx.load(deploy)
    readers = [n.op_type for n in written.graph.node if "tokens.weight" in n.input]
    assert sorted(readers) == ["Gather", "Gemm"]  # the head (a tied weight stays float) reads the table too
    assert deploy_report(deploy)["int8_embeddings"] == []
    assert torch.equal(calibrated.tokens.weight, model.tokens.weight)  # not rounded either
    ids = _ids(2, 9, 1)
    with torch.no_grad():
        want = calibrated(ids).numpy()
    got = _run(deploy, ids)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 0.02


def test_only_rounded_tables_read_by_axis_0_lookups_with_computed_ids_are_rewritten():
    """The pass on a hand-made graph: an unnamed Gather on the ids input of a table on the int8 row grid is
    rewritten; a Gather on constant ids (a weight slice, folded at load anyway), on axis 1, or of a table
    the PyTorch model did not round keeps its table float."""
    rows = MIN_TABLE_BYTES // (4 * WIDTH) + 1
    tables = {
        name: _rounded(torch.randn(rows, WIDTH, generator=torch.Generator().manual_seed(i))).numpy()
        for i, name in enumerate(("looked_up", "sliced", "columns"))
    }
    tables["unrounded"] = np.random.default_rng(3).standard_normal((rows, WIDTH)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["looked_up", "ids"], ["a"]),
        helper.make_node("Gather", ["sliced", "fixed"], ["b"]),
        helper.make_node("Gather", ["columns", "ids"], ["c"], axis=1),
        helper.make_node("Gather", ["unrounded", "ids"], ["d"]),
    ]
    graph = helper.make_graph(
        nodes,
        "lookups",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["t"])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["t", WIDTH]) for name in "abd"]
        + [helper.make_tensor_value_info("c", TensorProto.FLOAT, [rows, "t"])],
        [numpy_helper.from_array(t, name) for name, t in tables.items()]
        + [numpy_helper.from_array(np.array([0, 3], np.int64), "fixed")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert int8_embeddings(model) == ["looked_up"]
    onnx.checker.check_model(model)
    ids = np.array([5, -2, WIDTH - 1], np.int64)  # negative ids index from the end, as in Gather
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    a, b, d, c = session.run(["a", "b", "d", "c"], {"ids": ids})
    np.testing.assert_allclose(a, tables["looked_up"][ids], rtol=1e-6, atol=0)
    np.testing.assert_array_equal(b, tables["sliced"][[0, 3]])
    np.testing.assert_array_equal(c, tables["columns"][:, ids])
    np.testing.assert_array_equal(d, tables["unrounded"][ids])
