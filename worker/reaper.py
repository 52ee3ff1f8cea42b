"""The reaper: running jobs whose worker vanished (lease expired) go back to the queue or fail.

Redis only re-delivers a dead worker's message after the visibility timeout (hours, spec §2b);
the lease catches it within `lease_s`. Runs every minute from celery beat (`worker.tasks.reap`).
"""

from __future__ import annotations

from sqlalchemy import select

from service.db import jobstate
from service.db.models import Job
from service.db.session import session_factory
from service.dispatch import Dispatcher
from service.settings import Settings


def reap_once(settings: Settings, dispatcher: Dispatcher) -> dict:
    sessions = session_factory(settings.resolved_database_url)
    requeued, failed = [], []
    with sessions.begin() as session:
        for job_id in jobstate.expired_running_jobs(session):
            attempt, max_attempts, queue = session.execute(
                select(Job.attempt, Job.max_attempts, Job.queue).where(Job.id == job_id)).one()
            lease_over = Job.lease_expires_at < jobstate.utcnow()
            if attempt >= max_attempts:
                if jobstate.transition(session, job_id, jobstate.RUNNING, jobstate.FAILED, extra_where=lease_over,
                                       values={"error_type": "crashed",
                                               "error_detail": f"the worker was lost {attempt} times"}):
                    failed.append(job_id)
            elif jobstate.transition(session, job_id, jobstate.RUNNING, jobstate.QUEUED, extra_where=lease_over,
                                     values={"lease_owner": None, "lease_expires_at": None},
                                     event={"reason": "worker lost (lease expired)"}):
                requeued.append((job_id, queue))
    for job_id, queue in requeued:  # after the commit, as at submit
        dispatcher.enqueue(job_id, queue)
    return {"requeued": [j for j, _ in requeued], "failed": failed}
