"""Jobs through a real `celery worker` process, real Redis and a real PostgreSQL.

The API runs in process (TestClient); the worker is a separate process that shares only the
database, the broker and the artifact store with it, as in production.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from amct_engine.export.ascend import ascend_to_standard_onnx
from tests.service.support import (
    QUANT_CFG,
    ROOT,
    Api,
    wait_terminal,
    wait_until,
    worker_stack,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(tmp_path_factory, pg_url, redis_url, assets):
    """API + worker on PostgreSQL and Redis (a fresh queue prefix), with the assets uploaded."""
    with worker_stack(tmp_path_factory.mktemp("stack"), pg_url, redis_url) as (api, worker):
        ids = {
            "model_id": api.upload_model(assets / "cnn.pt").json()["id"],
            "config_id": api.upload_config(QUANT_CFG).json()["id"],
            "dataset_id": api.upload_dataset((assets / "fmnist.npz").read_bytes()).json()["id"],
            "small_id": api.upload_dataset((assets / "small.npz").read_bytes()).json()["id"],
        }
        yield api, worker, ids


def _job(api: Api, job_id: str) -> dict:
    return api.client.get(f"/v1/jobs/{job_id}").json()


def _events(api: Api, job_id: str) -> list[dict]:
    text = api.client.get(f"/v1/jobs/{job_id}/events").text
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def test_quant_retrain_job_end_to_end(stack, assets):
    """Fashion-MNIST CNN -> INT8 QAT on a worker; the deploy ONNX runs and keeps the accuracy."""
    api, worker, ids = stack
    submit = api.submit(
        kind="quant_retrain",
        model_id=ids["model_id"],
        config_id=ids["config_id"],
        dataset_id=ids["dataset_id"],
        epochs=1,
        batch_size=64,
        lr=5e-4,
        eval_fraction=0.25,
    )
    assert submit.status_code == 202, submit.text
    job = wait_terminal(api, submit.json()["id"])
    assert job["status"] == "succeeded", job["error"]
    assert job["attempt"] == 1 and job["progress"] == 1.0

    events = _events(api, job["id"])
    assert [e["status"] for e in events if e["type"] == "state"] == ["queued", "running", "succeeded"]
    phases = [e["phase"] for e in events if e["type"] == "phase"]
    assert phases[:3] == ["preparing", "baseline", "creating"] and "training" in phases and "verifying" in phases
    progress = [e["progress"] for e in events if e["type"] == "progress"]
    assert progress == sorted(progress) and progress[-1] == pytest.approx(0.8)
    assert all(e["loss"] > 0 for e in events if e["type"] == "progress")
    # The worker's pool process forked the job's child from its fork server (worker/fork_server.py).
    assert any(
        e["type"] == "log" and e["message"].startswith("warm engine process: forked from a fork server") for e in events
    )
    worker.wait_for("fork server ready", timeout=120)

    artifacts = {a["kind"]: a for a in api.client.get(f"/v1/jobs/{job['id']}/artifacts").json()["items"]}
    assert set(artifacts) >= {"config", "record", "checkpoint", "fake_quant", "deploy", "fp32_onnx", "report", "log"}
    report = api.client.get(artifacts["report"]["content_url"]).json()
    assert report["eval"] == {"split": "held_out", "samples": 300}
    # The base model reached ~0.8 after one epoch on 3,000 images; INT8 QAT must not lose it.
    assert report["accuracy"]["fp32"] > 0.7
    assert report["accuracy"]["deploy"] >= report["accuracy"]["fp32"] - 0.03
    assert report["onnx_size_bytes"]["deploy"] < 0.5 * report["onnx_size_bytes"]["fp32"]
    assert report["parameters"]["original"] == 20586
    assert job["metrics"]["accuracy_after"] == report["accuracy"]["deploy"]

    deploy = api.client.get(artifacts["deploy"]["content_url"]).content
    assert len(deploy) == artifacts["deploy"]["size_bytes"]
    session = ort.InferenceSession(deploy, providers=["CPUExecutionProvider"])
    data = np.load(assets / "fmnist.npz")
    logits = session.run(None, {"input": data["inputs"][:200]})[0]
    assert logits.shape == (200, 10)
    assert (logits.argmax(1) == data["labels"][:200]).mean() > 0.7


def test_a_message_delivered_twice_runs_once(stack):
    api, worker, ids = stack
    submit = api.submit(
        kind="quant_retrain",
        model_id=ids["model_id"],
        config_id=ids["config_id"],
        dataset_id=ids["small_id"],
        epochs=1,
        batch_size=64,
        lr=5e-4,
    )
    job_id = submit.json()["id"]
    # The broker hands the same task out again (a visibility-timeout redelivery, docs/spec/service.md §2b).
    api.client.app.state.dispatcher.enqueue(job_id, api.settings.queue_for("cpu"))
    job = wait_terminal(api, job_id)
    assert job["status"] == "succeeded" and job["attempt"] == 1
    worker.wait_for(f"job {job_id}: delivery ignored", timeout=60)
    states = [e["status"] for e in _events(api, job_id) if e["type"] == "state"]
    assert states == ["queued", "running", "succeeded"]
    assert worker.text().count(f"job {job_id}: claimed") == 1


def test_cancel_stops_a_running_job(stack):
    api, worker, ids = stack
    submit = api.submit(
        kind="quant_retrain",
        model_id=ids["model_id"],
        config_id=ids["config_id"],
        dataset_id=ids["dataset_id"],
        epochs=20,
        batch_size=16,
        lr=5e-4,
    )
    job_id = submit.json()["id"]
    wait_until(lambda: _job(api, job_id)["phase"] == "training", 120, interval=0.2, what="training started")
    assert api.client.post(f"/v1/jobs/{job_id}/cancel").status_code == 202
    job = wait_terminal(api, job_id, timeout=30)
    assert job["status"] == "cancelled" and job["cancel_requested"]
    assert 0.1 <= job["progress"] < 0.8


COMPRESSED_CFG = b"""# 30 % filter pruning (BCP) + INT8 QAT
prune_config { filter_pruner { balanced_l2_norm_filter_prune { prune_ratio: 0.3 ascend_optimized: false } } }
retrain_weight_quant_config { arq_retrain { channel_wise: true dst_type: INT8 } }
retrain_data_quant_config { ulq_quantize { dst_type: INT8 } }
"""


@pytest.mark.parametrize(
    "kind, cfg_kind, cfg, deploy_format",
    [
        ("distill", "distill", (ROOT / "tests/fixtures/cfg/distill_minimal.cfg").read_bytes(), "onnx"),
        ("compressed_retrain", "retrain", COMPRESSED_CFG, "ascend"),
    ],
    ids=["distill", "compressed_retrain-ascend"],
)
def test_distill_and_compressed_jobs_end_to_end(stack, kind, cfg_kind, cfg, deploy_format):
    api, worker, ids = stack
    config = api.upload_config(cfg, kind=cfg_kind)
    assert config.status_code == 201, config.text
    submit = api.submit(
        kind=kind,
        model_id=ids["model_id"],
        config_id=config.json()["id"],
        dataset_id=ids["dataset_id"],
        epochs=1,
        batch_size=64,
        lr=5e-4,
        eval_fraction=0.25,
        deploy_format=deploy_format,
    )
    assert submit.status_code == 202, submit.text
    job = wait_terminal(api, submit.json()["id"])
    assert job["status"] == "succeeded", job["error"]
    artifacts = {a["kind"]: a for a in api.client.get(f"/v1/jobs/{job['id']}/artifacts").json()["items"]}
    report = api.client.get(artifacts["report"]["content_url"]).json()
    assert report["accuracy"]["fp32"] > 0.7
    assert report["accuracy"]["deploy"] >= report["accuracy"]["fp32"] - 0.05
    assert report["onnx_size_bytes"]["deploy"] < 0.5 * report["onnx_size_bytes"]["fp32"]
    if kind == "compressed_retrain":  # 30 % of conv1/conv2 filters gone, and the fc inputs with them
        assert report["parameters"]["deploy"]["total"] < 0.75 * report["parameters"]["fp32"]["total"]
    else:
        assert "config" in artifacts  # the distill JSON config
    assert report["formats"]["deploy"] == deploy_format
    deploy = onnx.load_from_string(api.client.get(artifacts["deploy"]["content_url"]).content)
    if deploy_format == "ascend":  # AscendQuant/AscendDequant: run through the reference rewrite
        deploy = ascend_to_standard_onnx(deploy)
    session = ort.InferenceSession(deploy.SerializeToString(), providers=["CPUExecutionProvider"])
    assert session.run(None, {"input": np.zeros((3, 1, 28, 28), np.float32)})[0].shape == (3, 10)
