"""Cheap, cacheable reads: job and list GETs with an ETag and 304, a bounded number of queries, indexes the
list filters use, and the production API command with several processes (docs/scaling.md, "The API").

Latency under load is measured in bench/service_load.py, not here.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import httpx
import pytest
from sqlalchemy import event, text

from tests.service.support import ROOT, Api, api_with_ready_model, make_settings, settings_env


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def env(request, tmp_path_factory, assets):
    """The API on each database with a ready model (inserted: the upload check is tested elsewhere)."""
    url = request.getfixturevalue("pg_url") if request.param == "postgresql" else None
    settings = make_settings(tmp_path_factory.mktemp(f"reads-{request.param}"), database_url=url)
    with api_with_ready_model(settings, assets) as env:
        yield env


def _submit(api: Api, ids: dict) -> str:
    response = api.submit(kind="quant_retrain", epochs=1, **ids)
    assert response.status_code == 202, response.text
    return response.json()["id"]


def test_a_job_read_has_an_etag_and_an_unchanged_job_answers_304(env):
    api, ids = env
    job_id = _submit(api, ids)
    first = api.client.get(f"/v1/jobs/{job_id}")
    etag = first.headers["ETag"]
    assert first.status_code == 200 and etag.startswith('"') and first.json()["id"] == job_id
    for sent in (etag, f"W/{etag}", f'"other", {etag}', "*"):
        again = api.client.get(f"/v1/jobs/{job_id}", headers={"If-None-Match": sent})
        assert (again.status_code, again.content, again.headers["ETag"]) == (304, b"", etag), sent
    assert api.client.get(f"/v1/jobs/{job_id}", headers={"If-None-Match": '"stale"'}).status_code == 200
    api.client.post(f"/v1/jobs/{job_id}/cancel")  # the job changes: the old ETag no longer matches
    changed = api.client.get(f"/v1/jobs/{job_id}", headers={"If-None-Match": etag})
    assert changed.status_code == 200 and changed.json()["status"] == "cancelled"
    assert changed.headers["ETag"] != etag


def test_a_list_page_has_an_etag_that_changes_with_its_jobs(env):
    api, ids = env
    _submit(api, ids)
    _submit(api, ids)
    page = api.client.get("/v1/jobs", params={"limit": 5})
    etag = page.headers["ETag"]
    assert api.client.get("/v1/jobs", params={"limit": 5}, headers={"If-None-Match": etag}).status_code == 304
    other = api.client.get("/v1/jobs", params={"limit": 1}, headers={"If-None-Match": etag})
    assert other.status_code == 200  # another page is another representation
    _submit(api, ids)
    after = api.client.get("/v1/jobs", params={"limit": 5}, headers={"If-None-Match": etag})
    assert after.status_code == 200 and after.headers["ETag"] != etag


@contextmanager
def _statements(api: Api):
    engine = api.client.app.state.sessions.kw["bind"]
    seen: list[str] = []

    def record(conn, cursor, statement, *args):
        seen.append(statement.split(None, 1)[0].upper())

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def test_reads_take_a_fixed_number_of_queries_and_write_nothing(env):
    api, ids = env
    jobs = [_submit(api, ids) for _ in range(6)]
    api.client.get(f"/v1/jobs/{jobs[0]}")  # the key's last-used hint is due at most once a minute: done now
    with _statements(api) as seen:
        assert api.client.get(f"/v1/jobs/{jobs[0]}").status_code == 200
    assert seen == ["SELECT", "SELECT"]  # the key, the job: no N+1, no UPDATE or COMMIT of the key's row
    counts = {}
    for limit in (1, 6):
        with _statements(api) as seen:
            assert len(api.client.get("/v1/jobs", params={"limit": limit}).json()["items"]) == limit
        counts[limit] = list(seen)
    assert counts[1] == counts[6] == ["SELECT", "SELECT"]


def test_a_burst_of_polled_reads_holds_at_most_the_pools_size_of_connections(env):
    """80 job and list reads at once: they queue for the read path's threads instead of opening overflow
    connections (which the pool closes again as they come back: a PostgreSQL backend per read)."""
    api, ids = env
    if api.settings.resolved_database_url.startswith("sqlite"):
        pytest.skip("SQLite's pool is not the one sized by AMCT_DB_POOL_SIZE")
    job_id = _submit(api, ids)
    pool = api.client.app.state.read_engine.pool
    held = {"now": 0, "peak": 0}
    lock = threading.Lock()

    def out(*_):
        with lock:
            held["now"] += 1
            held["peak"] = max(held["peak"], held["now"])

    def back(*_):
        with lock:
            held["now"] -= 1

    async def burst() -> list[int]:
        transport = httpx.ASGITransport(app=api.client.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api", headers=api.client.headers) as c:
            answers = await asyncio.gather(*(c.get(f"/v1/jobs/{job_id}" if i % 2 else "/v1/jobs") for i in range(80)))
        return [a.status_code for a in answers]

    event.listen(pool, "checkout", out)
    event.listen(pool, "checkin", back)
    try:
        codes = asyncio.run(burst())
    finally:
        event.remove(pool, "checkout", out)
        event.remove(pool, "checkin", back)
    assert codes == [200] * 80
    assert 1 <= held["peak"] <= api.settings.db_pool_size, held


def test_the_list_filters_have_indexes(env):
    api, ids = env
    if api.settings.resolved_database_url.startswith("sqlite"):
        pytest.skip("the plans checked are PostgreSQL's")
    with api.client.app.state.sessions() as session:
        session.execute(text("SET LOCAL enable_seqscan = off"))  # a small table: make the planner show its index
        plans = {}
        for column, value in (("status", "queued"), ("kind", "quant_retrain")):
            rows = session.execute(
                text(
                    f"EXPLAIN SELECT id FROM jobs WHERE project_id = :p AND {column} = :v "
                    "ORDER BY created_at DESC, id DESC LIMIT 51"
                ),
                {"p": api.settings.project, "v": value},
            )
            plans[column] = "\n".join(r[0] for r in rows)
    assert "ix_jobs_list_status" in plans["status"], plans["status"]
    assert "ix_jobs_list_kind" in plans["kind"], plans["kind"]


def test_the_production_api_command_serves_from_several_processes(env, tmp_path):
    api, ids = env
    if api.settings.resolved_database_url.startswith("sqlite"):
        pytest.skip("several API processes are the PostgreSQL deployment's")
    port = _free_port()
    environment = dict(os.environ, **settings_env(api.settings), PYTHONPATH=str(ROOT))
    log = open(tmp_path / "api.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "service", "api", "--workers", "2", "--port", str(port)],
        cwd=ROOT,
        env=environment,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, (tmp_path / "api.log").read_text()[-2000:]
            time.sleep(0.2)
        children = [p for p in os.listdir("/proc") if p.isdigit() and _parent(p) == proc.pid]
        assert len(children) >= 2  # the supervisor's two API processes
        headers = {"Authorization": api.client.headers["Authorization"]}
        job_id = _submit(api, ids)
        got = [httpx.get(f"{url}/v1/jobs/{job_id}", headers=headers, timeout=10) for _ in range(8)]
        assert {r.status_code for r in got} == {200} and len({r.headers["ETag"] for r in got}) == 1
    finally:
        from job_host.sandbox import stop_group

        stop_group(proc, 20)
        log.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _parent(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None
