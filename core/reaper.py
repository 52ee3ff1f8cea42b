"""The reaper: jobs that lost their worker or their message get going again.

Redis only re-delivers a dead worker's message after the visibility timeout (hours, docs/spec/service.md §2b);
the lease catches it within `lease_s`: a running job whose lease expired goes back to the queue
(its next attempt resumes from the last checkpoint), or fails after `max_attempts`, or becomes
`cancelled` when a cancel was pending. A queued job nobody claimed for `requeue_after_s` is sent
again: its message may never have reached the broker (the API could not enqueue) or may have been
lost with it (a Redis restart without persistence). A duplicate message is harmless: the claim
lets one delivery run the job and turns the others into no-ops. Runs every `reap_interval_s` from
celery beat (`worker.tasks.reap`) and in the API process (service/app.py). What becomes of a lost job
is jobstate's rule (`recover_lost_job`); this module finds the jobs and talks to the queue.
"""

from __future__ import annotations

import shutil
from datetime import timedelta
from pathlib import Path

from sqlalchemy import func, select, update

from core import workers
from core.db import jobstate
from core.db.models import Job, Model
from core.db.session import session_factory
from core.queue import Dispatcher
from core.settings import DEVICES, Settings
from job_host.protocol import job_folder_prefix, job_of_folder


def reap_once(settings: Settings, dispatcher: Dispatcher) -> dict:
    sessions = session_factory(settings.resolved_database_url, settings.db_pool)
    requeued, failed, cancelled = [], [], []
    with sessions.begin() as session:
        jobstate.expire_if_owner_gone(session)  # a worker process of this machine that died: no need to wait
        for job_id in jobstate.expired_running_jobs(session):
            outcome = jobstate.recover_lost_job(session, job_id)
            if outcome == jobstate.QUEUED:
                requeued.append((job_id, session.scalars(select(Job.queue).where(Job.id == job_id)).one()))
            elif outcome == jobstate.FAILED:
                failed.append(job_id)
            elif outcome == jobstate.CANCELLED:
                cancelled.append(job_id)
        unserved = _fail_unserved(session, settings)
        interrupted = _interrupted_checks(session, settings)
        resent = _stale_queued(session, settings.requeue_after_s, dispatcher)
        removed = _remove_dead_folders(session, settings.tmp_dir)
    for job_id, queue in requeued + resent:  # after the commit, as at submit
        dispatcher.enqueue(job_id, queue)
    return {
        "requeued": [j for j, _ in requeued],
        "failed": failed,
        "cancelled": cancelled,
        "resent": [j for j, _ in resent],
        "unserved": unserved,
        "folders_removed": removed,
        "checks_interrupted": interrupted,
    }


def _interrupted_checks(session, settings: Settings) -> list[str]:
    """Models still `validating` well past the check's time limit: the API that checked them in the background
    stopped (service/model_checks.py). They become `invalid`, so a client waiting on one gets an answer."""
    before = jobstate.utcnow() - timedelta(seconds=2 * settings.validate_timeout_s + 60)
    rows = session.execute(
        update(Model)
        .where(Model.status == "validating", Model.created_at < before)
        .values(status="invalid", status_detail="its check was interrupted (the server stopped); upload it again")
        .returning(Model.id)
    ).all()
    return [r[0] for r in rows]


def _fail_unserved(session, settings: Settings) -> list[str]:
    """Fail the queued jobs no live worker can run: their device's queue has no consumer while workers of
    the same deployment (queue prefix) are alive, and has had none for `unserved_wait_s`.

    The submit refuses such a job already (service/routes/jobs.py); this catches one submitted while
    the registry was empty (the workers were starting) or whose workers went away since. With no live
    worker at all the jobs wait: the deployment is restarting, and failing all of them would be worse.
    """
    queues = workers.live_queues(session, settings.worker_stale_s)
    if not queues:
        return []
    before = jobstate.utcnow() - timedelta(seconds=settings.unserved_wait_s)
    waiting = session.execute(
        select(Job.id, Job.queue, Job.device).where(
            Job.status == jobstate.QUEUED, Job.updated_at < before, Job.queue.not_in(queues)
        )
    ).all()
    failed = []
    for job_id, queue, device in waiting:
        prefix = workers.prefix_of(queue)
        if not workers.has_workers(queues, prefix):
            continue
        served = [d for d in DEVICES if f"{prefix}.{d}" in queues]
        detail = workers.unserved_message(device, served) + f" (waited {settings.unserved_wait_s:g} s)"
        if jobstate.transition(
            session,
            job_id,
            jobstate.QUEUED,
            jobstate.FAILED,
            values={"error_type": "no_worker", "error_detail": detail},
        ):
            failed.append(job_id)
    return failed


def job_folders(scratch: Path, job_id: str | None = None) -> list[Path]:
    """The attempt folders under `scratch`, of one job or of all."""
    pattern = job_folder_prefix(job_id or "*") + "*"
    return [p for p in scratch.glob(pattern) if p.is_dir()] if scratch.is_dir() else []


def _remove_dead_folders(session, scratch: Path) -> int:
    """Remove the folders of attempts whose worker died (a SIGKILL skips the runner's clean-up).

    Only a running job has a live attempt: a folder of a job that is queued (requeued after a crash),
    finished, or gone belongs to a dead one. Its checkpoints are in the store already (uploaded as
    they were announced), so nothing the next attempt needs is lost. ~6 MB each for a small CNN.
    """
    folders = {p: job_of_folder(p.name) for p in job_folders(scratch)}
    if not folders:
        return 0
    running = set(
        session.scalars(select(Job.id).where(Job.id.in_(set(folders.values())), Job.status == jobstate.RUNNING))
    )
    dead = [p for p, job_id in folders.items() if job_id not in running]
    for folder in dead:
        shutil.rmtree(folder, ignore_errors=True)
    return len(dead)


def _stale_queued(session, after_s: float, dispatcher: Dispatcher) -> list[tuple[str, str]]:
    """Queued jobs untouched for `after_s` whose message is missing from the broker.

    A long queue is not a lost message: re-sending every waiting job each period would pile up
    duplicates behind a busy worker. So per queue, only as many jobs as the broker lacks messages
    for (queued rows minus messages waiting) are re-sent, oldest first; all of them when the broker
    cannot tell its depth. Their updated_at is bumped, so each is re-sent at most once per period.
    """
    now = jobstate.utcnow()
    stale = session.execute(
        select(Job.id, Job.queue)
        .where(Job.status == jobstate.QUEUED, Job.updated_at < now - timedelta(seconds=after_s))
        .order_by(Job.created_at)
    ).all()
    chosen: list[tuple[str, str]] = []
    for queue in sorted({q for _, q in stale}):
        waiting = dispatcher.pending_messages(queue)
        candidates = [(j, q) for j, q in stale if q == queue]
        if waiting is not None:
            queued = session.scalar(select(func.count()).where(Job.status == jobstate.QUEUED, Job.queue == queue))
            candidates = candidates[: max(0, queued - waiting)]
        chosen += candidates
    if chosen:
        session.execute(
            update(Job).where(Job.id.in_([j for j, _ in chosen]), Job.status == jobstate.QUEUED).values(updated_at=now)
        )
    for job_id, _ in chosen:
        jobstate.add_event(
            session,
            job_id,
            "log",
            {
                "message": f"re-sent to the queue: not claimed for {after_s:g} s and its message "
                "is missing from the broker"
            },
        )
    return chosen
