"""The job state machine as data, and the only functions that change a job's status or its lease.

Every change is one conditional UPDATE (`WHERE status = :from`) plus its job_events row, in the
caller's transaction: the API, the worker and the reaper all go through here, so two of them
racing on the same job cannot both win (docs/spec/service.md §2d, §7c). The lifecycle rules live here too: how many
attempts a job gets (`attempts_exhausted`), and what becomes of a job that lost its worker
(`recover_lost_job`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, and_, func, select, update
from sqlalchemy.orm import Session

from core.db.models import Job, JobEvent, utcnow
from core.job_states import CANCELLED, FAILED, QUEUED, RUNNING, STATES, SUCCEEDED, TERMINAL  # noqa: F401 - re-exported
from core.lease_owner import gone_here

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
    result = cast(CursorResult, session.execute(update(Job).where(*conditions).values(**changes)))
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
    lease = {
        "lease_owner": owner,
        "lease_expires_at": now + timedelta(seconds=lease_s),
        "attempt": Job.attempt + 1,
        "phase": "preparing",
        "attempt_started_at": now,
        # A requeued job (its worker lost, its engine killed) keeps its first start: the time since is the
        # job's elapsed time, attempts included.
        "started_at": func.coalesce(Job.started_at, now),
    }
    not_cancelled = Job.cancel_requested_at.is_(None)
    for from_ in (QUEUED, RUNNING):
        where = not_cancelled if from_ == QUEUED else and_(not_cancelled, Job.lease_expires_at < now)
        if transition(session, job_id, from_, RUNNING, values=lease, extra_where=where, event={"worker": owner}):
            return session.get(Job, job_id, populate_existing=True)
    return None


def attempts_exhausted(attempt: int, max_attempts: int) -> bool:
    """Whether attempt number `attempt` (counted from 1) is one too many: max_attempts=N allows N attempts."""
    return attempt > max_attempts


def give_up_if_exhausted(session: Session, job: Job, owner: str) -> bool:
    """Fail the job `owner` just claimed when that attempt is past max_attempts; True when it did.

    The reaper fails a job that lost its worker on its last attempt; this catches the same job when a
    redelivered message reclaims it first (a lease that ran out with no reaper running).
    """
    if not attempts_exhausted(job.attempt, job.max_attempts):
        return False
    transition(
        session,
        job.id,
        RUNNING,
        FAILED,
        owner=owner,
        values={"error_type": "crashed", "error_detail": f"gave up after {job.max_attempts} attempts"},
    )
    return True


@dataclass(frozen=True)
class Lease:
    """A renewed lease, and what the job's row says its worker must know."""

    cancel_requested: bool


def renew_lease(
    session: Session,
    job_id: str,
    owner: str,
    lease_s: float,
    *,
    phase: str | None = None,
    progress: float | None = None,
) -> Lease | None:
    """The worker's heartbeat: extend the lease and record the job's phase and progress, fenced on `owner`.

    None when the job is no longer ours (reclaimed after our lease ran out, finished, reaped).
    """
    now = utcnow()
    values: dict[str, Any] = {"lease_expires_at": now + timedelta(seconds=lease_s), "updated_at": now}
    if phase:
        values["phase"] = phase
    if progress is not None:
        values["progress"] = float(progress)
    row = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == RUNNING, Job.lease_owner == owner)
        .values(**values)
        .returning(Job.cancel_requested_at)
    ).first()
    return None if row is None else Lease(cancel_requested=row[0] is not None)


def request_cancel(session: Session, job_id: str) -> str:
    """Cancel a queued job at once; flag a running one for its worker. Returns the status after."""
    job = session.get(Job, job_id, populate_existing=True)
    if job is None:
        raise LookupError(job_id)
    if job.status == QUEUED and transition(
        session,
        job_id,
        QUEUED,
        CANCELLED,
        values={"cancel_requested_at": utcnow()},
        event={"reason": "cancel requested"},
    ):
        return CANCELLED
    if job.status == RUNNING:
        result = cast(
            CursorResult,
            session.execute(
                update(Job)
                .where(Job.id == job_id, Job.status == RUNNING, Job.cancel_requested_at.is_(None))
                .values(cancel_requested_at=utcnow(), updated_at=utcnow())
            ),
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


def expire_leases(session: Session, owner_prefix: str) -> list[str]:
    """End now the leases of the running jobs whose owner starts with `owner_prefix`: a worker known to
    be dead (service/embedded_worker.py). The reaper then treats them as any lost job."""
    rows = session.execute(
        update(Job)
        .where(Job.status == RUNNING, Job.lease_owner.startswith(owner_prefix, autoescape=True))
        .values(lease_expires_at=utcnow() - timedelta(seconds=1))
        .returning(Job.id)
    ).all()
    return [r[0] for r in rows]


def expire_if_owner_gone(session: Session, job_ids: list[str] | None = None) -> list[str]:
    """End now the leases of the running jobs (of `job_ids`, or all) whose owner's process is gone on this
    machine (core/lease_owner.py): they are lost jobs already, not in `lease_s`. Returns their ids."""
    query = select(Job.id, Job.lease_owner).where(Job.status == RUNNING, Job.lease_expires_at >= utcnow())
    if job_ids is not None:
        query = query.where(Job.id.in_(job_ids))
    expired = []
    for job_id, owner in session.execute(query).all():
        if not gone_here(owner):
            continue
        ended = session.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == RUNNING, Job.lease_owner == owner)
            .values(lease_expires_at=utcnow() - timedelta(seconds=1))
        )
        if cast(CursorResult, ended).rowcount:
            add_event(session, job_id, "log", {"message": "its worker process is gone: its lease ends now"})
            expired.append(job_id)
    return expired


def recover_lost_job(session: Session, job_id: str) -> str | None:
    """A running job whose lease expired (its worker is gone): the state it moves to, None if it moved on.

    A pending cancel wins (back in the queue the claim would refuse it: queued forever); a job that
    used its last attempt fails; any other goes back to the queue for its next attempt, which resumes
    from its last checkpoint. The caller re-sends a requeued job's message after committing.
    """
    attempt, max_attempts, cancel = session.execute(
        select(Job.attempt, Job.max_attempts, Job.cancel_requested_at).where(Job.id == job_id)
    ).one()
    lease_over = Job.lease_expires_at < utcnow()  # still expired: its worker did not come back meanwhile
    values: dict[str, Any]
    if cancel is not None:
        to, values = CANCELLED, {"phase": None}
        event = {"reason": "cancel requested", "stopped_by": "worker lost"}
    elif attempts_exhausted(attempt + 1, max_attempts):  # the next attempt would be one too many
        to, values = FAILED, {"error_type": "crashed", "error_detail": f"the worker was lost {attempt} times"}
        event = None
    else:
        to, values = QUEUED, {"lease_owner": None, "lease_expires_at": None}
        event = {"reason": "worker lost (lease expired)"}
    if transition(session, job_id, RUNNING, to, extra_where=lease_over, values=values, event=event):
        return to
    return None


def requeue_crashed(session: Session, job_id: str, owner: str, detail: str) -> str | None:
    """The job's engine process was killed (SIGKILL, the OOM killer, a segfault) under its live worker
    `owner`: the state it moves to, None if the job is no longer ours.

    The same rule as a lost worker: another attempt, which resumes from the last checkpoint, unless
    this was the last one (then the job fails with `detail`). The caller claims it again.
    """
    attempt, max_attempts = session.execute(select(Job.attempt, Job.max_attempts).where(Job.id == job_id)).one()
    if attempts_exhausted(attempt + 1, max_attempts):
        to, values, event = FAILED, {"error_type": "crashed", "error_detail": detail[:4000], "phase": None}, None
    else:
        to, values = QUEUED, {"lease_owner": None, "lease_expires_at": None, "phase": None}
        event = {"reason": f"{detail[:300]}; the next attempt resumes from the last checkpoint"}
    if transition(session, job_id, RUNNING, to, owner=owner, values=values, event=event):
        return to
    return None


def cancelling(session: Session, job_id: str) -> bool:
    flag = session.execute(select(Job.cancel_requested_at).where(Job.id == job_id)).scalar_one_or_none()
    return flag is not None


__all__ = [
    "CANCELLED",
    "FAILED",
    "QUEUED",
    "RUNNING",
    "STATES",
    "SUCCEEDED",
    "TERMINAL",
    "TRANSITIONS",
    "IllegalTransition",
    "Lease",
    "add_event",
    "attempts_exhausted",
    "cancelling",
    "claim_job",
    "expire_leases",
    "expired_running_jobs",
    "give_up_if_exhausted",
    "recover_lost_job",
    "renew_lease",
    "request_cancel",
    "requeue_crashed",
    "transition",
]
