"""What the database says of a batch of benchmark jobs: their statuses, waiting for them to settle, cancelling
the queued ones, and the audit that none was lost or run twice (bench/service_load.py)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import httpx

from bench.service_stack import TERMINAL, log


def status_counts(database_url: str, job_ids: list[str]) -> Counter[str]:
    """Jobs of the batch per status, read from the database (progress polling stays off the API under test)."""
    from sqlalchemy import func, select

    from core.db.models import Job
    from core.db.session import session_factory

    with session_factory(database_url)() as session:
        rows = session.execute(select(Job.status, func.count()).where(Job.id.in_(job_ids)).group_by(Job.status))
        return Counter(dict(rows.all()))


def wait_settled(database_url: str, job_ids: list[str], timeout: float) -> bool:
    """Wait until every job of the batch is terminal; False when `timeout` ran out first."""
    deadline = time.monotonic() + timeout
    last_report = time.monotonic()
    while True:
        counts = status_counts(database_url, job_ids)
        if sum(counts[s] for s in TERMINAL) == len(job_ids):
            return True
        if time.monotonic() > deadline:
            return False
        if time.monotonic() - last_report > 60:
            log(f"  {dict(counts)}")
            last_report = time.monotonic()
        time.sleep(1.0)


def cancel_queued(client: httpx.Client, job_ids: list[str], database_url: str) -> int:
    """Cancel every job of the batch that is still queued (the window closed); returns how many."""
    from sqlalchemy import select

    from core.db.models import Job
    from core.db.session import session_factory

    with session_factory(database_url)() as session:
        queued = list(session.scalars(select(Job.id).where(Job.id.in_(job_ids), Job.status == "queued")))
    cancelled = 0
    for job_id in queued:
        response = client.post(f"/v1/jobs/{job_id}/cancel")
        cancelled += response.status_code == 202  # 409: it started or finished meanwhile
    return cancelled


def audit_database(database_url: str, job_ids: list[str]) -> dict[str, Any]:
    """Job rows and their events: which jobs exist, ended, ran (claimed), ran more than once, were re-sent."""
    from sqlalchemy import select

    from core.db.models import Job, JobEvent
    from core.db.session import session_factory

    wanted = set(job_ids)
    with session_factory(database_url)() as session:
        rows = {j.id: j for j in session.scalars(select(Job).where(Job.id.in_(job_ids)))}
        events = session.execute(
            select(JobEvent.job_id, JobEvent.type, JobEvent.payload).where(JobEvent.job_id.in_(job_ids))
        ).all()
    claims: Counter[str] = Counter()
    reclaims: Counter[str] = Counter()
    resent: Counter[str] = Counter()
    for job_id, type_, payload in events:
        if type_ == "state" and payload.get("edge") == "claimed":
            claims[job_id] += 1
        elif type_ == "state" and payload.get("edge") in ("reclaimed", "requeued"):
            reclaims[job_id] += 1
        elif type_ == "log" and str(payload.get("message", "")).startswith("re-sent to the queue"):
            resent[job_id] += 1
    ran = [j for j in rows.values() if j.started_at is not None]
    spans = [(j.started_at, j.finished_at) for j in ran if j.status == "succeeded" and j.finished_at]
    busy_s = (max(f for _, f in spans) - min(s for s, _ in spans)).total_seconds() if spans else 0.0
    return {
        "jobs_in_db": len(rows),
        "missing": len(wanted - rows.keys()),
        "not_terminal": sum(1 for j in rows.values() if j.status not in TERMINAL),
        "statuses": dict(Counter(j.status for j in rows.values())),
        "ran": len(ran),
        "ran_twice": sum(1 for j in wanted if claims[j] > 1 or reclaims[j] > 0) + sum(1 for j in ran if j.attempt != 1),
        "never_claimed_but_ran": sum(1 for j in ran if claims[j.id] == 0),
        "re_sent_messages": sum(resent.values()),
        "jobs_with_re_sent_message": len(resent),
        "succeeded_span_s": busy_s,
    }
