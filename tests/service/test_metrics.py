"""GET /metrics: job numbers read from the database (SQLite and PostgreSQL), HTTP latency per route."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select, update

from core.db import jobstate
from core.db.models import Job
from job_host.kinds import JOB_KINDS
from tests.service.support import QUANT_CFG, Api, make_settings, open_api


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def metrics_api(request, tmp_path_factory, assets):
    """An API with its own project (the PostgreSQL database is shared with other modules) and uploads."""
    url = request.getfixturevalue("pg_url") if request.param == "postgresql" else None
    settings = make_settings(
        tmp_path_factory.mktemp(f"metrics-{request.param}"), database_url=url, project=f"metrics-{uuid.uuid4().hex[:8]}"
    )
    with open_api(settings) as client:
        api = Api(client, settings)
        ids = {
            "model_id": api.upload_model(assets / "cnn.pt").json()["id"],
            "config_id": api.upload_config(QUANT_CFG).json()["id"],
            "dataset_id": api.upload_dataset((assets / "small.npz").read_bytes()).json()["id"],
        }
        yield api, ids


def scrape(api: Api) -> dict:
    """{(name, labels as a sorted tuple): value} of one scrape, made without an API key."""
    response = TestClient(api.client.app).get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def jobs_gauge(samples: dict) -> dict:
    return {
        dict(labels)["state"] + "/" + dict(labels)["kind"]: value
        for (name, labels), value in samples.items()
        if name == "amct_jobs"
    }


def db_counts(api: Api) -> dict:
    with api.client.app.state.sessions() as session:
        rows = session.execute(select(Job.status, Job.kind, func.count()).group_by(Job.status, Job.kind))
        return {f"{status}/{kind}": n for status, kind, n in rows}


def test_job_gauges_match_the_database(metrics_api):
    api, ids = metrics_api
    before = jobs_gauge(scrape(api))
    submitted = [api.submit(kind="compressed_retrain", **ids).json()["id"] for _ in range(3)]
    api.client.post(f"/v1/jobs/{submitted[0]}/cancel")
    after = jobs_gauge(scrape(api))

    assert after["queued/compressed_retrain"] - before["queued/compressed_retrain"] == 2
    assert after["cancelled/compressed_retrain"] - before["cancelled/compressed_retrain"] == 1
    # Every state x kind is exposed, zeros included, and each equals the database's count.
    counts = db_counts(api)
    assert len(after) == len(jobstate.STATES) * len(JOB_KINDS)  # every state x every kind of the table
    assert all(value == counts.get(series, 0) for series, value in after.items()), (after, counts)

    depth = {
        dict(labels)["queue"]: value for (name, labels), value in scrape(api).items() if name == "amct_queue_depth"
    }
    with api.client.app.state.sessions() as session:
        queued = session.scalar(
            select(func.count()).where(Job.status == jobstate.QUEUED, Job.queue == api.settings.queue_for("cpu"))
        )
    assert depth[api.settings.queue_for("cpu")] == queued >= 2 and depth[api.settings.queue_for("cuda")] == 0


def test_duration_histogram_is_built_from_finished_jobs(metrics_api):
    api, ids = metrics_api
    job_id = api.submit(kind="compressed_retrain", **ids).json()["id"]
    # A worker's part, through the same state machine: claim the job, then finish it 42.5 s later.
    with api.client.app.state.sessions.begin() as session:
        job = jobstate.claim_job(session, job_id, "test-worker", lease_s=60)
        session.execute(update(Job).where(Job.id == job_id).values(started_at=job.started_at - timedelta(seconds=42.5)))
        assert jobstate.transition(session, job_id, jobstate.RUNNING, jobstate.SUCCEEDED, owner="test-worker")
    with api.client.app.state.sessions() as session:
        finished = [
            (j.finished_at - j.started_at).total_seconds()
            for j in session.scalars(
                select(Job).where(Job.status == jobstate.SUCCEEDED, Job.kind == "compressed_retrain")
            )
        ]

    samples = scrape(api)
    labels = (("kind", "compressed_retrain"), ("state", "succeeded"))
    assert samples[("amct_job_duration_seconds_count", labels)] == len(finished)
    assert samples[("amct_job_duration_seconds_sum", labels)] == pytest.approx(sum(finished), abs=0.01)
    bucket = lambda le: samples[("amct_job_duration_seconds_bucket", tuple(sorted(labels + (("le", le),))))]  # noqa: E731
    assert bucket("30.0") == sum(d <= 30 for d in finished) and bucket("60.0") == sum(d <= 60 for d in finished)
    assert bucket("60.0") - bucket("30.0") >= 1  # the 42.5 s job
    assert bucket("+Inf") == len(finished)


def test_http_latency_is_counted_per_route_template(metrics_api):
    api, _ = metrics_api
    key = (
        "amct_http_request_duration_seconds_count",
        (("method", "GET"), ("route", "/v1/jobs/{job_id}"), ("status", "404")),
    )
    before = scrape(api).get(key, 0)
    for _ in range(3):
        assert api.client.get(f"/v1/jobs/{uuid.uuid4()}").status_code == 404
    samples = scrape(api)
    assert samples[key] - before == 3  # one series for every job id, not one per id
    assert samples[("amct_database_up", ())] == 1
    routes = {dict(labels).get("route") for (name, labels) in samples if name.startswith("amct_http_request")}
    assert not any(r and r.count("-") >= 4 for r in routes), routes  # no raw uuids as labels
