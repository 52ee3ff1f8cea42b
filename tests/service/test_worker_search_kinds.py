"""The no-training job kinds (ptq, auto_mixed_precision) through a real `celery worker`, Redis and PostgreSQL.

Same stack as tests/service/test_worker.py: the API in process, the worker a separate process.
"""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest

from amct_engine.config.calibration_cfg import parse_calibration_cfg
from tests.service.support import Api, wait_terminal, worker_stack

pytestmark = pytest.mark.slow

PTQ_CFG = b"""# INT8 PTQ, HFMG activations, 2 calibration batches
batch_num: 2
common_config { hfmg_quantize { num_of_bins: 2048 } arq_quantize { channel_wise: true } }
"""
AMP_CFG = b"""# mixed precision under a 3-point top-1 budget (180 search samples: one image is 0.56 points)
batch_num: 2
search_config { max_top1_drop: 3.0 }
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory, pg_url, redis_url, assets):
    with worker_stack(tmp_path_factory.mktemp("search_stack"), pg_url, redis_url) as (api, worker):
        ids = {"model_id": api.upload_model(assets / "cnn.pt").json()["id"],
               "dataset_id": api.upload_dataset((assets / "fmnist.npz").read_bytes()).json()["id"]}
        yield api, worker, ids


def _run(api: Api, ids: dict, kind: str, cfg: bytes) -> tuple[dict, dict, list[dict]]:
    config = api.upload_config(cfg, kind="calibration")
    assert config.status_code == 201, config.text
    assert config.json()["summary"]["job_kinds"][kind] == {"ok": True}
    submit = api.submit(kind=kind, model_id=ids["model_id"], config_id=config.json()["id"],
                        dataset_id=ids["dataset_id"], batch_size=64, eval_fraction=0.25)
    assert submit.status_code == 202, submit.text
    job = wait_terminal(api, submit.json()["id"])
    assert job["status"] == "succeeded", job["error"]
    artifacts = {a["kind"]: a for a in api.client.get(f"/v1/jobs/{job['id']}/artifacts").json()["items"]}
    text = api.client.get(f"/v1/jobs/{job['id']}/events").text
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    return job, artifacts, events


def test_ptq_job_end_to_end(stack, assets):
    api, worker, ids = stack
    job, artifacts, events = _run(api, ids, "ptq", PTQ_CFG)
    assert set(artifacts) >= {"config", "record", "fused_onnx", "fake_quant", "deploy", "report"}
    steps = [(e["step"], e["total_steps"]) for e in events if e["type"] == "progress"]
    assert steps == [(1, 2), (2, 2)]  # one event per calibration batch
    report = api.client.get(artifacts["report"]["content_url"]).json()
    assert report["ptq"] == {"batch_num": 2, "calibration_samples": 128}
    assert report["accuracy"]["deploy"] >= report["accuracy"]["fp32"] - 0.01
    config = api.client.get(artifacts["config"]["content_url"]).json()
    assert config["conv1"]["activation_quant_params"] == {"act_algo": "hfmg_quantize", "num_bits": 8,
                                                         "num_of_bins": 2048}
    deploy = api.client.get(artifacts["deploy"]["content_url"]).content
    session = ort.InferenceSession(deploy, providers=["CPUExecutionProvider"])
    data = np.load(assets / "fmnist.npz")
    assert (session.run(None, {"input": data["inputs"][:300]})[0].argmax(1) == data["labels"][:300]).mean() > 0.7


def test_auto_mixed_precision_job_end_to_end(stack):
    api, worker, ids = stack
    job, artifacts, events = _run(api, ids, "auto_mixed_precision", AMP_CFG)
    report = api.client.get(artifacts["report"]["content_url"]).json()["mixed_precision"]
    assert report["budget"] == {"max_top1_drop": 3.0} and report["samples"] == 180
    assert report["deployed"]["top1_drop"] <= 3.0
    assert set(report["precisions"]) == {"conv1", "conv2", "fc"}
    tried = {s["layer"]: s["accepted"] for s in report["steps"] if s["to"] == "INT4"}
    assert set(tried) == {"conv1", "conv2", "fc"}
    assert {n for n, ok in tried.items() if ok} == {n for n, p in report["precisions"].items() if p == "INT4"}
    assert report["weight_bytes"] == 20432 - sum(w // 2 for n, w in (("conv1", 144), ("conv2", 4608), ("fc", 15680))
                                                 if report["precisions"][n] == "INT4")
    steps = [(e["step"], e["total_steps"]) for e in events if e["type"] == "progress"]
    assert steps[-1] == (3, 3)  # the three layers tried at INT4
    # The chosen cfg downloads as text, parses with our loader, and says what the report says.
    cfg = api.client.get(artifacts["mixed_precision_cfg"]["content_url"]).text
    assert cfg == report["cfg_text"]
    msg = parse_calibration_cfg(cfg).message
    int4 = {o.layer_name for o in msg.override_layer_configs if o.calibration_config.arq_quantize.quant_bits == 4}
    assert int4 == {n for n, p in report["precisions"].items() if p == "INT4"}
