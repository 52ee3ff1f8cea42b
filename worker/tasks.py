"""Celery tasks: a few lines each. They take only a job id; the runner does the work."""

from __future__ import annotations

import logging

from celery import shared_task

from core.lease_owner import lease_owner
from core.queue import JOIN_TASK, REAP_TASK, RUN_JOB_TASK, Dispatcher
from core.reaper import reap_once
from worker import warm
from worker.nodes import NodeRunner
from worker.runner import JobRunner

log = logging.getLogger(__name__)


@shared_task(bind=True, name=RUN_JOB_TASK, acks_late=True, reject_on_worker_lost=True)
def run_job(self, job_id: str) -> str:
    owner = lease_owner(self.request.hostname, self.request.id or "")
    return JobRunner(self.app.amct_settings, owner=owner, warm=warm.current()).run(job_id)


@shared_task(bind=True, name=REAP_TASK, acks_late=False)
def reap(self) -> dict:
    return reap_once(self.app.amct_settings, Dispatcher(self.app))


@shared_task(bind=True, name=JOIN_TASK, acks_late=False)
def join_job(self, job_id: str, attempt: int, node_rank: int) -> str:
    """A node other than 0 of a job across several nodes (worker/nodes.py). Not redelivered when this worker
    dies: the attempt's other nodes fail with it, and the next attempt asks for its nodes again."""
    owner = lease_owner(self.request.hostname, self.request.id or "")
    return NodeRunner(self.app.amct_settings, owner=owner).run(job_id, attempt, node_rank)
