"""The REST API on SQLite and on a real PostgreSQL (no worker: submitted jobs stay queued)."""

from __future__ import annotations

import hashlib

import pytest
from sqlalchemy import select

from core.db.models import Artifact, Job
from service.problems import PROBLEM_JSON
from tests.service.support import QUANT_CFG, npz_bytes

PRUNE_CFG = b"""prune_config {
  filter_pruner { balanced_l2_norm_filter_prune { prune_ratio: 0.3 } }
}
"""


def job_body(uploaded, **overrides):
    body = {
        "kind": "quant_retrain",
        "model_id": uploaded["model_id"],
        "config_id": uploaded["config_id"],
        "dataset_id": uploaded["dataset_id"],
        "epochs": 1,
        "batch_size": 64,
        "lr": 5e-4,
    }
    return {**body, **overrides}


def assert_problem(response, status: int, field: str | None = None) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM_JSON)
    body = response.json()
    assert body["status"] == status and body["title"] and body["detail"]
    if field is not None:
        assert body["field"] == field, body
    return body


def test_healthz_and_readyz_check_database_broker_store_and_sandbox(api):
    assert api.client.get("/healthz").json() == {"status": "ok"}
    ready = api.client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {"database": "ok", "broker": "ok", "store": "ok", "sandbox": "ok"}


def test_model_upload_reports_hash_size_and_quantisable_layers(api, uploaded, assets):
    data = (assets / "cnn.pt").read_bytes()
    model = uploaded["model"]
    assert model["sha256"] == hashlib.sha256(data).hexdigest()
    assert model["size_bytes"] == len(data)
    assert model["status"] == "ready" and model["input_shape"] == [1, 1, 28, 28]
    assert [layer["name"] for layer in model["layers"]["quantizable"]] == ["conv1", "conv2", "fc"]
    assert model["layers"]["parameters"] == 20586
    assert api.client.get(f"/v1/models/{model['id']}").json()["sha256"] == model["sha256"]


def test_cfg_with_a_typo_is_422_with_line_and_column(api):
    bad = b"# QAT\nretrain_weight_quant_config {\n  arq_retrain { chanel_wise: true }\n}\n"
    body = assert_problem(api.upload_config(bad, filename="typo.cfg"), 422, "file")
    assert (body["line"], body["column"]) == (3, 17)
    assert "chanel_wise" in body["detail"] and "channel_wise" in body["detail"]


def test_cfg_upload_says_which_job_kinds_accept_it(api):
    summary = api.upload_config(PRUNE_CFG).json()["summary"]["job_kinds"]
    assert summary["prune_retrain"]["ok"] and summary["compressed_retrain"]["ok"]
    assert not summary["quant_retrain"]["ok"] and summary["quant_retrain"]["line"] == 1


def test_cfg_content_is_the_uploaded_text(api):
    config = api.upload_config(PRUNE_CFG).json()
    response = api.client.get(f"/v1/configs/{config['id']}/content")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    assert response.content == PRUNE_CFG and response.headers["etag"] == f'"{config["sha256"]}"'


def test_unknown_cfg_kind_is_422_naming_kind(api):
    assert_problem(api.upload_config(QUANT_CFG, kind="ptq"), 422, "kind")


def test_dataset_is_described(api):
    body = api.upload_dataset(
        npz_bytes(inputs=__import__("numpy").zeros((5, 1, 28, 28), "float32"), labels=__import__("numpy").arange(5))
    )
    assert body.status_code == 201, body.text
    description = body.json()["description"]
    assert description == {
        "samples": 5,
        "has_labels": True,
        "num_classes": 5,
        "arrays": {
            "inputs": {"shape": [5, 1, 28, 28], "dtype": "float32", "finite": True},
            "labels": {"shape": [5], "dtype": "int64", "min": 0, "max": 4},
        },
    }


def test_submit_returns_202_location_and_a_queued_job_on_the_device_queue(api, uploaded):
    response = api.submit(**job_body(uploaded))
    assert response.status_code == 202, response.text
    job = response.json()
    assert response.headers["location"] == f"/v1/jobs/{job['id']}"
    assert (job["status"], job["progress"], job["attempt"]) == ("queued", 0.0, 0)
    assert job["queue"] == api.settings.queue_for("cpu")
    assert job["params"] == {
        "epochs": 1,
        "batch_size": 64,
        "lr": 5e-4,
        "eval_fraction": 0.1,
        "seed": 0,
        "deploy_format": "onnx",
        "deploy_target": "auto",
        "objective": "cross_entropy",
        "distill_loss": "auto",
        "temperature": 4.0,
    }
    assert api.client.get(response.headers["location"]).json()["id"] == job["id"]


def test_submit_enqueues_the_job_id_on_the_broker(api, uploaded):
    if not api.settings.resolved_broker_url.startswith("filesystem://"):
        pytest.skip("inspects the filesystem queue")
    before = set((api.settings.broker_folder / "queue").iterdir())
    job_id = api.submit(**job_body(uploaded)).json()["id"]
    new = [p for p in (api.settings.broker_folder / "queue").iterdir() if p not in before]
    assert len(new) == 1 and api.settings.queue_for("cpu") in new[0].name
    assert job_id in new[0].read_text()


def test_same_idempotency_key_returns_the_same_job(api, uploaded):
    headers = {"Idempotency-Key": "retry-me-1"}
    first = api.submit(headers=headers, **job_body(uploaded))
    again = api.submit(headers=headers, **job_body(uploaded))
    assert first.status_code == again.status_code == 202
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["idempotent-replayed"] == "true"


def test_idempotency_key_with_another_body_is_422(api, uploaded):
    headers = {"Idempotency-Key": "retry-me-2"}
    assert api.submit(headers=headers, **job_body(uploaded)).status_code == 202
    assert_problem(api.submit(headers=headers, **job_body(uploaded, epochs=2)), 422, "Idempotency-Key")


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"epochs": 0}, "epochs"),
        ({"lr": -1}, "lr"),
        ({"device": "tpu"}, "device"),
        ({"eval_fraction": 1.0}, "eval_fraction"),
        ({"colour": "red"}, "colour"),
        ({"deploy_format": "tensorrt"}, "deploy_format"),
        ({"deploy_target": "tpu"}, "deploy_target"),
    ],
)
def test_bad_job_parameters_are_422_naming_the_field(api, uploaded, overrides, field):
    assert_problem(api.submit(**job_body(uploaded, **overrides)), 422, field)


def test_unknown_model_is_404_naming_model_id(api, uploaded):
    assert_problem(api.submit(**job_body(uploaded, model_id="nope")), 404, "model_id")


def test_cfg_that_does_not_suit_the_kind_is_422_naming_config_id(api, uploaded):
    prune = api.upload_config(PRUNE_CFG).json()["id"]
    body = assert_problem(api.submit(**job_body(uploaded, config_id=prune)), 422, "config_id")
    assert "pruning" in body["detail"] and body["line"] == 1
    assert_problem(api.submit(**job_body(uploaded, kind="distill")), 422, "config_id")


def test_dataset_whose_samples_do_not_fit_the_model_is_422(api, uploaded):
    import numpy as np

    wrong = api.upload_dataset(npz_bytes(inputs=np.zeros((4, 3, 32, 32), "float32"), labels=np.zeros(4, "int64")))
    body = assert_problem(api.submit(**job_body(uploaded, dataset_id=wrong.json()["id"])), 422, "dataset_id")
    assert "[3, 32, 32]" in body["detail"] and "[1, 28, 28]" in body["detail"]


def test_cross_entropy_needs_labels_and_distill_outputs_is_the_default_without(api, uploaded, assets):
    unlabelled = api.upload_dataset((assets / "unlabelled.npz").read_bytes()).json()["id"]
    body = assert_problem(
        api.submit(**job_body(uploaded, dataset_id=unlabelled, objective="cross_entropy")), 422, "dataset_id"
    )
    assert body["array"] == "labels" and "distill_outputs" in body["detail"]
    job = api.submit(**job_body(uploaded, dataset_id=unlabelled))
    assert job.status_code == 202 and job.json()["params"]["objective"] == "distill_outputs"


def test_meta_says_which_kinds_train_and_that_none_needs_labels(api, uploaded, assets):
    kinds = {k["name"]: k for k in api.client.get("/v1/meta").json()["job_kinds"]}
    assert {name for name, k in kinds.items() if k["trains"]} >= {
        "quant_retrain",
        "compressed_retrain",
        "prune_retrain",
    }
    assert not kinds["ptq"]["trains"] and not any(k["needs_labels"] for k in kinds.values())
    unlabelled = api.upload_dataset((assets / "unlabelled.npz").read_bytes()).json()["id"]
    assert api.submit(**job_body(uploaded, dataset_id=unlabelled)).status_code == 202  # label-free, as it says


def test_a_kind_that_needs_labels_is_refused_without_them(api, uploaded, assets):
    from dataclasses import replace

    from job_host.kinds import JOB_KINDS, register_job_kind

    original = JOB_KINDS["quant_retrain"]
    register_job_kind(replace(original, needs_labels=True), replace=True)
    try:
        unlabelled = api.upload_dataset((assets / "unlabelled.npz").read_bytes()).json()["id"]
        body = assert_problem(api.submit(**job_body(uploaded, kind="quant_retrain", dataset_id=unlabelled)), 422)
        assert body["field"] == "dataset_id" and "labels" in body["detail"]
    finally:
        register_job_kind(original, replace=True)


def test_list_pages_newest_first_with_a_cursor(api, uploaded):
    ids = [api.submit(**job_body(uploaded, seed=i)).json()["id"] for i in range(5)]
    seen, cursor = [], None
    while len(seen) < 5:
        page = api.client.get("/v1/jobs", params={"limit": 2, **({"cursor": cursor} if cursor else {})}).json()
        assert len(page["items"]) == 2 and page["next_cursor"]
        seen += [j["id"] for j in page["items"]]
        cursor = page["next_cursor"]
    assert seen[:5] == ids[::-1]


def test_list_filters_by_status_and_kind(api, uploaded):
    job_id = api.submit(**job_body(uploaded)).json()["id"]
    api.client.post(f"/v1/jobs/{job_id}/cancel")
    cancelled = api.client.get("/v1/jobs", params={"status": "cancelled", "limit": 200}).json()["items"]
    assert job_id in [j["id"] for j in cancelled] and {j["status"] for j in cancelled} == {"cancelled"}
    assert api.client.get("/v1/jobs", params={"kind": "distill"}).json()["items"] == []
    assert_problem(api.client.get("/v1/jobs", params={"status": "paused"}), 422, "status.0")
    assert_problem(api.client.get("/v1/jobs", params={"cursor": "garbage"}), 422, "cursor")


def test_cancel_a_queued_job_then_409(api, uploaded):
    job_id = api.submit(**job_body(uploaded)).json()["id"]
    response = api.client.post(f"/v1/jobs/{job_id}/cancel")
    assert response.status_code == 202 and response.json()["status"] == "cancelled"
    assert response.json()["finished_at"] is not None and response.json()["cancel_outcome"] == "cancelled"
    assert_problem(api.client.post(f"/v1/jobs/{job_id}/cancel"), 409, "job_id")


def test_a_cancel_that_comes_too_late_says_so(api, uploaded):
    from core.db import jobstate
    from core.db.session import session_factory

    job_id = api.submit(**job_body(uploaded)).json()["id"]
    assert api.client.get(f"/v1/jobs/{job_id}").json()["cancel_outcome"] is None
    sessions = session_factory(api.settings.resolved_database_url)
    with sessions.begin() as s:
        jobstate.claim_job(s, job_id, "worker-a", lease_s=60)
    response = api.client.post(f"/v1/jobs/{job_id}/cancel")
    assert response.status_code == 202 and response.json()["cancel_outcome"] == "pending"
    with sessions.begin() as s:  # the job finished its work before its worker saw the request
        assert jobstate.transition(s, job_id, jobstate.RUNNING, jobstate.SUCCEEDED)
    job = api.client.get(f"/v1/jobs/{job_id}").json()
    assert (job["status"], job["cancel_requested"], job["cancel_outcome"]) == ("succeeded", True, "too_late")


def _sse(text: str) -> list[dict]:
    events = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line and not line.startswith(":"))
        if "id" in fields:
            events.append(fields)
    return events


def test_events_stream_and_resume_after_last_event_id(api, uploaded):
    import json

    job_id = api.submit(**job_body(uploaded)).json()["id"]
    api.client.post(f"/v1/jobs/{job_id}/cancel")
    response = api.client.get(f"/v1/jobs/{job_id}/events")
    assert response.headers["content-type"].startswith("text/event-stream")
    events = _sse(response.text)
    assert [(e["id"], e["event"], json.loads(e["data"])["status"]) for e in events] == [
        ("1", "state", "queued"),
        ("2", "state", "cancelled"),
    ]
    resumed = _sse(api.client.get(f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": "1"}).text)
    assert [e["id"] for e in resumed] == ["2"]
    assert_problem(api.client.get(f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": "x"}), 422, "Last-Event-ID")


def test_artifacts_are_listed_and_streamed_from_the_store(api, uploaded, tmp_path):
    job_id = api.submit(**job_body(uploaded)).json()["id"]
    payload = b'{"accuracy": 0.9}'
    (tmp_path / "report.json").write_bytes(payload)
    blob = api.client.app.state.store.put_file(tmp_path / "report.json")
    with api.client.app.state.sessions() as session:
        session.add(
            Artifact(
                job_id=job_id,
                kind="report",
                filename="report.json",
                media_type="application/json",
                sha256=blob.sha256,
                size_bytes=blob.size_bytes,
                uri=blob.uri,
            )
        )
        session.commit()
    items = api.client.get(f"/v1/jobs/{job_id}/artifacts").json()["items"]
    assert [(a["kind"], a["size_bytes"], a["sha256"]) for a in items] == [
        ("report", len(payload), hashlib.sha256(payload).hexdigest())
    ]
    content = api.client.get(items[0]["content_url"])
    assert content.content == payload and content.headers["etag"] == f'"{blob.sha256}"'
    assert_problem(api.client.get("/v1/artifacts/nope/content"), 404, "artifact_id")


def test_unknown_paths_and_methods_are_problems(api):
    assert_problem(api.client.get("/v1/nothing"), 404)
    assert_problem(api.client.delete("/v1/jobs"), 405)


def test_jobs_rows_keep_the_request_hash_for_idempotency(api, uploaded):
    job_id = api.submit(headers={"Idempotency-Key": "k3"}, **job_body(uploaded)).json()["id"]
    with api.client.app.state.sessions() as session:
        job = session.scalars(select(Job).where(Job.id == job_id)).one()
    assert job.idempotency_key == "k3" and len(job.request_hash) == 64
