"""llm_quant through the service (issue 41 item 3): a real Celery worker, PostgreSQL and Redis for the jobs; the
API on SQLite for what is refused at upload and submit.

The model: a tiny random-init LlamaForCausalLM (hidden 64, 2 layers) over a BPE tokenizer trained offline on
pydoc text (tests/llm_folder.py), as a zipped Hugging Face folder (config.json, model.safetensors,
tokenizer.json) and as a TorchScript trace carrying its tokenizer.json. Its text: other pydoc topics.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from tests.llm_folder import topics_text, write_folder, zip_folder
from tests.service.support import Api, make_settings, npz_bytes, open_api, wait_terminal, worker_stack
from tests.service.test_api import assert_problem

pytest.importorskip("transformers")

INT4_AWQ = {
    "batch_num": 2,
    "quant_cfg": {"weights": {"type": "int4", "symmetric": False, "strategy": "group", "group_size": 32}},
    "algorithm": {"awq": {"grids_num": 10}},
    "skip_layers": ["lm_head"],
}
INT8_RTN = {"quant_cfg": {"weights": {"type": "int8", "strategy": "channel"}}, "skip_layers": ["lm_head"]}
JOB = {"kind": "llm_quant", "seq_len": 64, "batch_size": 8, "eval_fraction": 0.2}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return write_folder(tmp_path_factory.mktemp("llm") / "tiny-llama")


@pytest.fixture(scope="module")
def text() -> bytes:
    return topics_text(40, 52).encode()  # ~30k tokens; the tokenizer was trained on topics 0-40


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    """The API on SQLite; nobody consumes its queue (the refusals come before any job runs)."""
    settings = make_settings(tmp_path_factory.mktemp("llm-api"))
    with open_api(settings) as client:
        yield Api(client, settings)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, pg_url, redis_url):
    with worker_stack(tmp_path_factory.mktemp("llm-jobs"), pg_url, redis_url) as stack:
        yield stack


def _upload_model(api: Api, data: bytes, filename: str = "tiny-llama.zip", **fields):
    return api.client.post("/v1/models", files={"file": (filename, data)}, data={"name": filename, **fields})


def _run(api: Api, model: dict, cfg: dict, text: bytes, filename: str) -> tuple[dict, dict]:
    config = api.upload_config(json.dumps(cfg).encode(), kind="llm", filename="llm.json")
    assert config.status_code == 201, config.text
    dataset = api.upload_dataset(text, filename=filename)
    assert dataset.status_code == 201, dataset.text
    submit = api.submit(model_id=model["id"], config_id=config.json()["id"], dataset_id=dataset.json()["id"], **JOB)
    assert submit.status_code == 202, submit.text
    job = wait_terminal(api, submit.json()["id"], timeout=600)  # ~40 s on an idle 2-core machine
    assert job["status"] == "succeeded", job["error"]
    artifacts = {a["kind"]: a for a in api.client.get(f"/v1/jobs/{job['id']}/artifacts").json()["items"]}
    return job, artifacts


def _check_numbers(api: Api, job: dict, artifacts: dict) -> dict:
    report = api.client.get(artifacts["report"]["content_url"]).json()["llm"]
    ppl = report["perplexity"]
    for side in ("fp32", "deploy"):  # onnxruntime computes what PyTorch computes
        assert ppl[side]["onnxruntime"] == pytest.approx(ppl[side]["pytorch"], rel=0.01), ppl
    # A random model over a 512-token vocabulary: perplexity near the vocabulary, barely moved by quantisation.
    assert 100 < ppl["fp32"]["pytorch"] < 2000 and abs(ppl["increase"]) < 0.05, ppl
    sizes = report["onnx_size_bytes"]
    assert sizes["deploy"] < sizes["fp32"] and sizes["deploy"] == artifacts["deploy"]["size_bytes"]
    assert sizes["fp32"] == artifacts["fp32_onnx"]["size_bytes"]
    prefill = report["prefill"]
    assert prefill["tokens"] == JOB["seq_len"] and prefill["deploy"]["tokens_per_s"] > 0
    assert prefill["speedup"] == pytest.approx(prefill["fp32"]["median_ms"] / prefill["deploy"]["median_ms"])
    tokens = report["tokens"]
    assert tokens["calibration_batches"] == report["config"]["batch_num"]
    # held-out rows are the text's tail: 20 % of its rows, none of them calibrated on
    rows = tokens["text_tokens"] // JOB["seq_len"]
    assert tokens["evaluation_rows"] == round(rows * 0.2) and tokens["calibration_rows"] == rows - round(rows * 0.2)
    assert job["metrics"]["perplexity_after"] == ppl["deploy"]["onnxruntime"]
    return report


@pytest.mark.slow  # a real worker (~60 s on an idle 2-core machine, most of it two ONNX exports)
def test_a_zipped_hf_folder_is_quantised_to_int4(stack, folder, text):
    api, _ = stack
    model = _upload_model(api, zip_folder(folder))
    assert model.status_code == 201, model.text
    row = model.json()
    assert (row["format"], row["status"], row["inputs"][0]["name"]) == ("hf_folder", "ready", "input_ids")
    assert row["layers"]["architecture"] == "LlamaForCausalLM" and len(row["layers"]["quantizable"]) == 14 + 1
    job, artifacts = _run(api, row, INT4_AWQ, text, "topics.txt")
    report = _check_numbers(api, job, artifacts)
    assert report["source"] == "hf_folder" and report["config"]["weights"] == "int4 asymmetric group 32"
    deploy = onnx.load_from_string(api.client.get(artifacts["deploy"]["content_url"]).content)
    assert sum(n.op_type == "MatMulNBits" for n in deploy.graph.node) == 14  # 7 Linears x 2 layers; lm_head float
    print(f"\nllm_quant int4 AWQ g32: ppl {report['perplexity']}, bytes {report['onnx_size_bytes']}")


@pytest.mark.slow  # a real worker (~60 s on an idle 2-core machine, most of it two ONNX exports)
def test_a_torchscript_trace_with_its_tokenizer(stack, folder, text, tmp_path):
    from transformers import LlamaForCausalLM

    api, _ = stack
    llama = LlamaForCausalLM.from_pretrained(folder).eval()

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.llama = llama

        def forward(self, input_ids):
            return self.llama(input_ids=input_ids, use_cache=False).logits

    ids = torch.randint(0, 500, (2, 16))
    trace = torch.jit.trace(Logits().eval(), (ids,), strict=False)
    path = tmp_path / "llama.pt"
    trace.save(str(path), _extra_files={"tokenizer.json": (folder / "tokenizer.json").read_bytes()})
    signature = [{"name": "input_ids", "shape": ["batch", "sequence"], "dtype": "int64"}]
    model = _upload_model(api, path.read_bytes(), "llama.pt", inputs=json.dumps(signature))
    assert model.status_code == 201, model.text
    assert model.json()["format"] == "torchscript"
    records = text.decode().split("\n\n")
    jsonl = "\n".join(json.dumps({"text": r}) for r in records if r.strip()).encode()
    job, artifacts = _run(api, model.json(), INT8_RTN, jsonl, "topics.jsonl")
    report = _check_numbers(api, job, artifacts)
    assert report["source"] == "torchscript"
    session = ort.InferenceSession(api.client.get(artifacts["deploy"]["content_url"]).content)
    assert session.run(None, {"input_ids": ids[:1, :7].numpy()})[0].shape == (1, 7, 512)


# -- refused at upload and submit, naming the file or the field ------------------------------------------------------
@pytest.mark.parametrize(
    ("extra", "config_update", "file"),
    [
        ({"pytorch_model.bin": b"\x80\x02}q\x00."}, None, "pytorch_model.bin"),
        ({"extra/optimizer.pt": b"PK"}, None, "extra/optimizer.pt"),
        (
            {"modeling_evil.py": b"import os"},
            {"auto_map": {"AutoModelForCausalLM": "modeling_evil.Evil"}},
            "config.json",
        ),
        ({}, {"model_type": "evil_llama"}, "config.json"),
        (
            {"tokenizer_config.json": json.dumps({"auto_map": {"AutoTokenizer": ["t.T", None]}}).encode()},
            None,
            "tokenizer_config.json",
        ),
    ],
    ids=["pickle-bin", "pickle-pt", "auto_map", "unknown-model-type", "tokenizer-auto_map"],
)
def test_a_folder_asking_for_code_or_holding_a_pickle_is_refused(api, folder, extra, config_update, file):
    answer = _upload_model(api, zip_folder(folder, extra, config_update))
    assert_problem(answer, 422, "file")
    assert answer.json()["file"] == file, answer.json()
    assert file in answer.json()["detail"]


@pytest.mark.parametrize(
    ("cfg", "field"),
    [
        (
            {"quant_cfg": {"weights": {"type": "int4", "strategy": "group", "group_size": 48}}},
            "quant_cfg.weights.group_size",
        ),
        ({"quant_cfg": {"weights": {"type": "int8"}}, "algorithm": ["rtn"]}, "algorithm"),
        ({"quant_cfg": {"weights": {"type": "int8"}}, "batch_num": 0}, "batch_num"),
        ({"quant_cfg": {"weights": {"type": "int8"}, "colour": 1}}, "quant_cfg.colour"),
    ],
)
def test_a_bad_config_field_is_named(api, cfg, field):
    answer = api.upload_config(json.dumps(cfg).encode(), kind="llm", filename="llm.json")
    assert_problem(answer, 422, "file")
    assert answer.json()["cfg_field"] == field and answer.json()["detail"].startswith(field + ":")


def test_config_that_is_not_json_gives_the_line(api):
    answer = api.upload_config(b'{\n  "quant_cfg": {\n    "weights": {"type": int4}}}', kind="llm", filename="llm.json")
    assert_problem(answer, 422, "file")
    assert answer.json()["line"] == 3


def test_submit_checks_the_pairing_of_kind_model_and_data(api, folder, text):
    model = _upload_model(api, zip_folder(folder)).json()
    llm_cfg = api.upload_config(json.dumps(INT8_RTN).encode(), kind="llm", filename="llm.json").json()
    text_data = api.upload_dataset(text, filename="t.txt").json()
    assert text_data["format"] == "text" and text_data["description"]["text"]["records"] == 1
    npz = api.upload_dataset(npz_bytes(inputs=np.zeros((4, 8), dtype=np.int64)))
    ids = {"model_id": model["id"], "config_id": llm_cfg["id"], "dataset_id": text_data["id"]}
    assert_problem(api.submit(**{**JOB, **ids, "dataset_id": npz.json()["id"]}), 422, "dataset_id")
    assert_problem(api.submit(**{**JOB, **ids, "min_output_cosine": 0.9}), 422, "min_output_cosine")
    retrain_cfg = api.upload_config(b"retrain_data_quant_config { ulq_quantize { dst_type: INT8 } }\n").json()
    answer = api.submit(
        kind="quant_retrain", model_id=model["id"], config_id=retrain_cfg["id"], dataset_id=npz.json()["id"]
    )
    assert_problem(answer, 422, "model_id")
    assert "Hugging Face folder" in answer.json()["detail"]


@pytest.mark.parametrize(
    ("data", "filename", "words"),
    [
        (b'{"text": "one"}\n{"title": "two"}\n', "d.jsonl", 'line 2 has no "text" string field'),
        (b'{"text": "one"}\nnot json\n', "d.jsonl", "line 2 is not valid JSON"),
        (b"\xff\xfe text", "d.txt", "not UTF-8"),
        (b"plain text", "d.csv", "a .txt or .jsonl file"),
    ],
)
def test_a_text_dataset_that_does_not_read_is_422_saying_where(api, data, filename, words):
    body = assert_problem(api.upload_dataset(data, filename=filename), 422, "file")
    assert words in body["detail"], body


def test_jsonl_records_are_counted(api):
    answer = api.upload_dataset(b'{"text": "one"}\n\n{"text": "two", "id": 2}\n', filename="d.jsonl")
    assert answer.status_code == 201, answer.text
    assert answer.json()["format"] == "jsonl"
    assert answer.json()["description"]["text"] == {"format": "jsonl", "records": 2, "characters": 6, "lines": 3}


def test_the_folder_is_found_at_the_top_or_in_one_folder_and_torchscript_is_not_one():
    from amct_engine.llm.hf_folder import folder_root, is_model_folder

    assert folder_root(["config.json", "model.safetensors", "tokenizer.json"]) == ""
    assert folder_root(["llm/", "llm/config.json", "llm/model.safetensors", "llm/sub/config.json"]) == "llm/"
    assert folder_root(["smol/SmolLM2.gguf"]) == "smol/" and is_model_folder(["smol/SmolLM2.gguf"])
    assert not is_model_folder(["archive/data.pkl", "archive/constants.pkl", "archive/config.json"])
