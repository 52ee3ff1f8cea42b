"""The job state machine as data, and the only functions that change a job's status.

Every change is one conditional UPDATE (`WHERE status = :from`) plus its job_events row, in the
caller's transaction: the API, the worker and the reaper all go through here, so two of them
racing on the same job cannot both win (spec §2d, §7c).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, select, update
from sqlalchemy.orm import Session

from service.db.models import Job, JobEvent, utcnow

QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED = "queued", "running", "succeeded", "failed", "cancelled"
STATES = (QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED)
TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})

# (from, to) -> the name of the edge, recorded in the event. Nothing else is allowed.
TRANSITIONS: dict[tuple[str, str], str] = {
    (QUEUED, RUNNING): "claimed",
    (RUNNING, RUNNING): "reclaimed",  # the previous worker's lease ran out: a new attempt
    (RUNNING, QUEUED): "requeued",  # lost its worker; waits for a redelivery
    (RUNNING, SUCCEEDED): "succeeded",
    (RUNNING, FAILED): "failed",
    (RUNNING, CANCELLED): "cancelled",
    (QUEUED, CANCELLED): "cancelled",
    (QUEUED, FAILED): "failed",  # e.g. attempts exhausted before it could run again
}


class IllegalTransition(ValueError):
    pass


def add_event(session: Session, job_id: str, type_: str, payload: dict[str, Any]) -> int:
    """Append one event; its seq comes from the job row, whose UPDATE serialises concurrent writers."""
    seq = session.execute(
        update(Job).where(Job.id == job_id).values(event_seq=Job.event_seq + 1).returning(Job.event_seq)
    ).scalar_one()
    session.add(JobEvent(job_id=job_id, seq=seq, type=type_, payload=payload))
    session.flush()
    return seq


def transition(
    session: Session,
    job_id: str,
    from_: str,
    to: str,
    *,
    owner: str | None = None,
    values: dict[str, Any] | None = None,
    extra_where: Any = None,
    event: dict[str, Any] | None = None,
) -> bool:
    """Move the job from `from_` to `to` if it is still in `from_`; False when someone else moved it.

    `owner` fences worker writes: only the lease holder may finish a running job.
    """
    edge = TRANSITIONS.get((from_, to))
    if edge is None:
        raise IllegalTransition(f"a job cannot go from {from_} to {to}")
    now = utcnow()
    conditions = [Job.id == job_id, Job.status == from_]
    if owner is not None:
        conditions.append(Job.lease_owner == owner)
    if extra_where is not None:
        conditions.append(extra_where)
    changes: dict[str, Any] = {"status": to, "updated_at": now, **(values or {})}
    if to in TERMINAL:
        changes.setdefault("finished_at", now)
        changes.setdefault("lease_owner", None)
        changes.setdefault("lease_expires_at", None)
    result = session.execute(update(Job).where(*conditions).values(**changes))
    if result.rowcount != 1:
        return False
    add_event(session, job_id, "state", {"status": to, "from": from_, "edge": edge, **(event or {})})
    return True


def claim_job(session: Session, job_id: str, owner: str, lease_s: float) -> Job | None:
    """Atomically take the job for `owner`: from queued, or from running whose lease expired.

    None means another live worker holds it, it was cancelled, or it is finished: a second
    delivery of the same message is then a no-op.
    """
    now = utcnow()
    lease = {"lease_owner": owner, "lease_expires_at": now + timedelta(seconds=lease_s),
             "attempt": Job.attempt + 1, "phase": "preparing"}
    not_cancelled = Job.cancel_requested_at.is_(None)
    for from_ in (QUEUED, RUNNING):
        where = not_cancelled if from_ == QUEUED else and_(not_cancelled, Job.lease_expires_at < now)
        values = dict(lease, started_at=now) if from_ == QUEUED else lease
        if transition(session, job_id, from_, RUNNING, values=values, extra_where=where,
                      event={"worker": owner}):
            return session.get(Job, job_id, populate_existing=True)
    return None


def renew_lease(session: Session, job_id: str, owner: str, lease_s: float) -> bool:
    """Extend the lease; False when the job is no longer ours (cancelled, reclaimed, finished)."""
    result = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == RUNNING, Job.lease_owner == owner)
        .values(lease_expires_at=utcnow() + timedelta(seconds=lease_s))
    )
    return result.rowcount == 1


def request_cancel(session: Session, job_id: str) -> str:
    """Cancel a queued job at once; flag a running one for its worker. Returns the status after."""
    job = session.get(Job, job_id, populate_existing=True)
    if job is None:
        raise LookupError(job_id)
    if job.status == QUEUED and transition(session, job_id, QUEUED, CANCELLED,
                                           values={"cancel_requested_at": utcnow()},
                                           event={"reason": "cancel requested"}):
        return CANCELLED
    if job.status == RUNNING:
        result = session.execute(
            update(Job).where(Job.id == job_id, Job.status == RUNNING, Job.cancel_requested_at.is_(None))
            .values(cancel_requested_at=utcnow(), updated_at=utcnow())
        )
        if result.rowcount == 1:
            add_event(session, job_id, "log", {"message": "cancel requested"})
    session.refresh(job)
    return job.status


def expired_running_jobs(session: Session, now: datetime | None = None) -> list[str]:
    """Running jobs whose worker stopped renewing its lease (for the reaper)."""
    now = now or utcnow()
    rows = session.execute(select(Job.id).where(Job.status == RUNNING, Job.lease_expires_at < now))
    return [r[0] for r in rows]


def cancelling(session: Session, job_id: str) -> bool:
    flag = session.execute(select(Job.cancel_requested_at).where(Job.id == job_id)).scalar_one_or_none()
    return flag is not None


__all__ = [
    "CANCELLED", "FAILED", "QUEUED", "RUNNING", "STATES", "SUCCEEDED", "TERMINAL", "TRANSITIONS",
    "IllegalTransition", "add_event", "cancelling", "claim_job", "expired_running_jobs",
    "renew_lease", "request_cancel", "transition",
]
