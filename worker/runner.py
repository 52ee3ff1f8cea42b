"""The job runner: claim a job, lay out its inputs, run the job process under supervision, clean up.

Plain Python over the database and the store, so tests drive it without Celery. The worker process
itself never imports torch or loads the user's model: the job process does (job_process/main.py,
started through job_host/launcher.py in the sandbox).

The pieces: worker/inputs.py (the job folder and its spec), worker/supervisor.py (heartbeats,
cancel, the time limit), worker/records.py (what gets written: events, artifacts, the outcome),
worker/warm.py (the job process started ahead of its job, when the worker keeps one).
Recovery: a later attempt (after a crash, a lost worker, a broker restart) finds the last training
checkpoint of the earlier one and resumes from it.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import uuid
from pathlib import Path

from core.db import jobstate
from core.db.session import session_factory
from core.lease_owner import lease_owner
from core.reaper import job_folders
from core.settings import Settings
from core.storage import BlobStore, open_store
from job_host import bubblewrap, sandbox
from job_host.launcher import ChildProcess
from job_host.protocol import job_folder_prefix
from worker.fork_server import ForkServerPool
from worker.inputs import stage_inputs
from worker.nodes import Leader, node_spec, nodes_of
from worker.records import JobRecords
from worker.supervisor import supervise
from worker.warm import WarmPool

log = logging.getLogger(__name__)


class JobRunner:
    """`warm`: the worker process's pool of job processes started ahead (worker/warm.py); None starts each
    job's child when the job is claimed."""

    def __init__(
        self,
        settings: Settings,
        store: BlobStore | None = None,
        owner: str | None = None,
        warm: WarmPool | ForkServerPool | None = None,
    ) -> None:
        self.settings, self.warm = settings, warm
        self.store = store or open_store(settings.resolved_artifact_store, settings.s3_endpoint_url)
        self.sessions = session_factory(settings.resolved_database_url, settings.db_pool)
        self.owner = owner or lease_owner(os.uname().nodename, uuid.uuid4().hex)
        bubblewrap.log_state("worker")  # jobs fail with SandboxUnavailable without one (no opt-out)
        sandbox.child_nice()  # a bad AMCT_CHILD_NICE stops the worker here, not each job at its start

    def run(self, job_id: str) -> str:
        """Run the job if this delivery can claim it; returns the outcome (`skipped` for a no-op).

        An attempt whose engine process was killed puts the job back in the queue (worker/supervisor.py);
        this worker then claims it again at once, so the next attempt resumes from its checkpoint here.
        """
        while (outcome := self._attempt(job_id)) == jobstate.QUEUED:
            log.info("job %s: its engine process was killed; starting the next attempt", job_id)
        return outcome

    def _attempt(self, job_id: str) -> str:
        with self.sessions.begin() as session:
            # A re-delivered message whose job's worker process was killed here: take the job over now.
            jobstate.expire_if_owner_gone(session, [job_id])
            job = jobstate.claim_job(session, job_id, self.owner, self.settings.lease_s)
            if job is not None and jobstate.give_up_if_exhausted(session, job, self.owner):
                return jobstate.FAILED
        if job is None:
            log.info("job %s: delivery ignored (already claimed, cancelled or finished)", job_id)
            return "skipped"
        log.info("job %s: claimed by %s (attempt %d)", job_id, self.owner, job.attempt)
        records = JobRecords(self.sessions, self.store, job_id, self.owner, self.settings.lease_s)
        # We hold the lease now: any other folder of this job here is a dead attempt's (its checkpoints
        # went to the store as they were announced, and this attempt fetches the last one from there).
        for folder in job_folders(self._scratch(), job_id):
            shutil.rmtree(folder, ignore_errors=True)
        several = nodes_of(job) > 1  # node 0 of a job across several nodes (worker/nodes.py): cold, with network
        child = self.warm.take(job_id) if self.warm is not None and not several else None
        if child is None:
            child = ChildProcess(
                Path(tempfile.mkdtemp(prefix=job_folder_prefix(job_id), dir=self._scratch())), share_net=several
            )
        workdir = child.workdir
        try:
            # A warm child sees its folder under the name it started with: the spec's paths use that name.
            stage_inputs(
                self.sessions,
                self.store,
                self.settings,
                job,
                workdir,
                visible_as=child.sandbox_dir,
                extra=node_spec(self.settings, 0) if several else None,
            )
            with child:
                if child.is_warm:
                    child.begin()
                    if self.warm is not None:
                        self.warm.fill()  # the next job's child warms up while this one runs
                leader = Leader(self.settings, self.sessions, job, self.owner) if several else None
                return supervise(child, records, self.settings, on_rendezvous=leader)
        except Exception as e:
            log.exception("job %s: runner error", job_id)
            records.fail("internal", f"{type(e).__name__}: {e}", workdir)
            return jobstate.FAILED
        finally:
            child.close()
            shutil.rmtree(workdir, ignore_errors=True)

    def _scratch(self) -> Path:
        self.settings.tmp_dir.mkdir(parents=True, exist_ok=True)
        return self.settings.tmp_dir
