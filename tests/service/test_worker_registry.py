"""The worker registry (core/workers.py): a job for a device no live worker serves is told so.

Workers write their queues to the `workers` table with a heartbeat (worker/lifecycle.py). A submit for
a device none of this deployment's live workers serves is a 409 naming the devices that are served;
one queued while the registry was empty fails after `unserved_wait_s`; /readyz lists the served
devices and warns of queued jobs nobody can run. Real Celery workers on PostgreSQL + Redis.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from sqlalchemy import select

from core import workers
from core.db.models import Worker as WorkerRow
from core.db.models import utcnow
from service.problems import PROBLEM_JSON
from tests.service.support import Worker, make_settings, open_api, wait_until
from tests.service.tenants import make_tenant, populate


def _row(session, name: str, queues: list[str], age_s: float = 0.0) -> None:
    session.add(WorkerRow(name=name, queues=queues, last_seen_at=utcnow() - timedelta(seconds=age_s)))


def test_live_queues_ignore_stale_workers_and_other_deployments(tmp_path):
    settings = make_settings(tmp_path, queue_prefix="dep")
    with open_api(settings) as client:
        sessions = client.app.state.sessions
        with sessions.begin() as session:
            assert workers.unserved(session, "cuda", settings) is None  # nobody registered: jobs wait
            _row(session, "other@h:1", ["elsewhere.cuda"])
            _row(session, "dead@h:2", ["dep.cuda"], age_s=settings.worker_stale_s + 5)
        with sessions.begin() as session:
            assert workers.unserved(session, "cuda", settings) is None  # no live worker of this deployment
            _row(session, "cpu@h:3", ["dep.cpu"])
        with sessions.begin() as session:
            assert workers.unserved(session, "cuda", settings) == ["cpu"]
            assert workers.unserved(session, "cpu", settings) is None
            workers.heartbeat(session, "dead@h:2", ["dep.cuda", "dep.cpu"])  # it came back
        with sessions.begin() as session:
            assert workers.unserved(session, "cuda", settings) is None
            workers.unregister(session, "dead@h:2")
        with sessions.begin() as session:
            assert workers.unserved(session, "npu", settings) == ["cpu"]


def test_forget_node_removes_only_that_start_of_the_worker_and_says_whether_it_came_up(tmp_path):
    settings = make_settings(tmp_path)
    with open_api(settings) as client:
        sessions = client.app.state.sessions
        with sessions.begin() as session:
            _row(session, "embedded-ab12@h:1", ["q.cpu"])
            _row(session, "embedded-ab12@h:2", ["q.cpu"])
            _row(session, "embedded-ab123@h:3", ["q.cpu"])  # another start whose name extends it
        with sessions.begin() as session:
            assert workers.forget_node(session, "embedded_ab12") == 0  # `_` is no LIKE wildcard here
            assert workers.forget_node(session, "embedded-cd34") == 0  # never registered: a crash loop
            assert workers.forget_node(session, "embedded-ab12") == 2  # it had come up
        with sessions.begin() as session:
            assert list(session.scalars(select(WorkerRow.name))) == ["embedded-ab123@h:3"]


def test_a_worker_that_dies_before_it_comes_up_is_restarted_with_a_growing_back_off(tmp_path):
    """It never registers: 1, 2, 4 … s between starts, not a restart loop (nor an immediate one)."""
    import sys

    from service.embedded_worker import EmbeddedWorker

    settings = make_settings(tmp_path)
    with open_api(settings):  # the database exists and is migrated
        worker = EmbeddedWorker(settings, [sys.executable, "-c", "raise SystemExit(3)"], {}).start()
        try:
            time.sleep(5.0)  # starts at ~0, ~1, ~3 s (then ~7 s): about three in five seconds
            assert 2 <= worker.restarts <= 4, worker.restarts
        finally:
            worker.stop(grace_s=5)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, pg_url, redis_url):
    settings = make_settings(
        tmp_path_factory.mktemp("registry"),
        database_url=pg_url,
        broker_url=redis_url,
        reap_interval_s=1.0,
        unserved_wait_s=2.0,
        worker_heartbeat_s=1.0,
        worker_stale_s=5.0,
    )
    with open_api(settings) as client:
        yield populate(make_tenant(client.app, settings, f"registry-{settings.queue_prefix[-6:]}"))


@pytest.mark.slow
def test_a_job_for_a_device_no_live_worker_serves_is_told_so(stack, tmp_path):
    tenant = stack
    api, settings = tenant.api, tenant.api.settings
    early = api.submit(**tenant.job_body(device="cuda"))  # no worker registered yet: it waits
    assert early.status_code == 202, early.text
    worker = Worker(settings, tmp_path / "worker.log", devices=("cpu",))
    try:
        wait_until(
            lambda: "cpu" in api.client.get("/readyz").json()["workers"]["devices"],
            30,
            interval=0.2,
            what="the worker registered",
        )
        asked = time.monotonic()
        refused = api.submit(**tenant.job_body(device="cuda"))
        assert refused.status_code == 409 and refused.headers["content-type"].startswith(PROBLEM_JSON)
        body = refused.json()
        assert body["field"] == "device" and body["served_devices"] == ["cpu"], body
        assert "no live worker serves device 'cuda'" in body["detail"]
        assert time.monotonic() - asked < 5

        # The one accepted before the worker came: failed by the reaper once the wait is over.
        job = wait_until(
            lambda: (j := api.client.get(f"/v1/jobs/{early.json()['id']}").json())["status"] == "failed" and j,
            60,
            interval=0.2,
            what="the unserved job failed",
        )
        assert job["error"]["type"] == "no_worker" and "'cuda'" in job["error"]["detail"], job
        ready = api.client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["workers"]["devices"] == ["cpu"]

        accepted = api.submit(**tenant.job_body(device="cpu", epochs=1))
        assert accepted.status_code == 202, accepted.text
        api.client.post(f"/v1/jobs/{accepted.json()['id']}/cancel")
    finally:
        worker.stop()
    with api.client.app.state.sessions() as session:  # a clean stop takes the worker off the registry
        assert [r for r in session.scalars(select(WorkerRow)) if settings.queue_for("cpu") in r.queues] == []


def test_readyz_warns_of_queued_jobs_no_worker_serves(tmp_path):
    settings = make_settings(tmp_path)
    with open_api(settings) as client:
        tenant = populate(make_tenant(client.app, settings, "readyz"))
        job = tenant.api.submit(**tenant.job_body(device="npu")).json()["id"]
        ready = client.get("/readyz")
        assert ready.status_code == 200  # the API still takes jobs: the workers may be restarting
        assert ready.json()["workers"] == {"devices": [], "queued": {"npu": 1}}
        assert ready.json()["warnings"] == ["1 queued npu job(s) and no live worker serves npu"]
        tenant.api.client.post(f"/v1/jobs/{job}/cancel")
