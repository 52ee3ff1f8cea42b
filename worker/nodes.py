"""Jobs across several nodes: node 0 publishes where the ranks meet, the other nodes join (docs/scaling.md,
"Distributed jobs").

A job with `nodes` = N > 1 is claimed by one worker as any job (the lease, the attempts, the outcome are
node 0's). Its job process opens the ranks' c10d store and says its port in a `rendezvous` line
(job_process/distributed.py); this worker then writes node 0's row of `job_nodes` with its own address
and that port (the rendezvous goes through the database: every worker has it, the job processes have no
credentials), and sends N - 1 join messages on the job's queue. A worker that takes one claims that node
of the attempt (a row per node: a second delivery is a no-op), lays out the same inputs, and starts a job
process for its `world_size / N` ranks, pointed at node 0's store. Their ranks meet node 0's; from then on
they fail together: a node whose ranks die breaks the others' collectives, and a joined node kills its
ranks when the job's attempt is no longer running (finished, failed, requeued).

Such a job's sandboxes share the host's network (bwrap --share-net): an operator's opt-in (AMCT_MULTINODE),
docs/security.md, "Distributed jobs". Warm job processes are not used for them (started without network).
"""

from __future__ import annotations

import logging
import shutil
import socket
import tempfile
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from core.db import jobstate
from core.db.models import Job, JobNode
from core.db.session import session_factory
from core.queue import Dispatcher, make_celery
from core.settings import Settings
from core.storage import BlobStore, open_store
from job_host.launcher import ChildProcess
from job_host.protocol import job_folder_prefix
from job_host.spec import JobParams
from worker.inputs import stage_inputs

log = logging.getLogger(__name__)


def nodes_of(job: Job) -> int:
    return JobParams.model_validate(job.params or {}).nodes


def node_spec(settings: Settings, node_rank: int, rendezvous: dict | None = None) -> dict:
    """What a node's job process needs besides the job's spec: which node it is and where the ranks meet."""
    return {
        "node_rank": node_rank,
        "join_timeout_s": settings.node_join_timeout_s,
        **({"rendezvous": rendezvous} if rendezvous else {}),
    }


def node_address(settings: Settings) -> str:
    return settings.node_address or socket.gethostbyname(socket.gethostname())


class Leader:
    """Node 0's worker: on its job process's `rendezvous` line, publish it and ask for the other nodes."""

    def __init__(self, settings: Settings, sessions, job: Job, owner: str) -> None:
        self.settings, self.sessions, self.job, self.owner = settings, sessions, job, owner

    def __call__(self, message: dict) -> None:
        job = self.job
        with self.sessions.begin() as session:
            session.merge(
                JobNode(
                    job_id=job.id,
                    attempt=job.attempt,
                    node_rank=0,
                    owner=self.owner,
                    address=node_address(self.settings),
                    port=int(message["port"]),
                )
            )
        dispatcher = Dispatcher(make_celery(self.settings))
        for node in range(1, nodes_of(job)):
            dispatcher.enqueue_join(job.id, job.attempt, node, job.queue)
        log.info(
            "job %s: ranks meet at %s:%s; asked for %d more nodes",
            job.id,
            node_address(self.settings),
            message["port"],
            nodes_of(job) - 1,
        )


class NodeRunner:
    """A node other than 0: join the job's attempt, run this node's ranks, stop with the job."""

    def __init__(self, settings: Settings, owner: str, store: BlobStore | None = None) -> None:
        self.settings, self.owner = settings, owner
        self.store = store or open_store(settings.resolved_artifact_store, settings.s3_endpoint_url)
        self.sessions = session_factory(settings.resolved_database_url, settings.db_pool)

    def run(self, job_id: str, attempt: int, node_rank: int) -> str:
        joined = self._join(job_id, attempt, node_rank)
        if joined is None:
            log.info(
                "job %s: node %d of attempt %d not joined (taken, or the attempt is over)", job_id, node_rank, attempt
            )
            return "skipped"
        job, leader = joined
        log.info(
            "job %s: joined attempt %d as node %d (ranks meet at %s:%s)",
            job_id,
            attempt,
            node_rank,
            leader.address,
            leader.port,
        )
        self.settings.tmp_dir.mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix=job_folder_prefix(job_id), dir=self.settings.tmp_dir))
        try:
            stage_inputs(
                self.sessions,
                self.store,
                self.settings,
                job,
                workdir,
                extra=node_spec(self.settings, node_rank, {"host": leader.address, "port": leader.port}),
            )
            with ChildProcess(workdir, share_net=True) as child:
                while not child.stdout_closed:
                    child.messages(timeout=self.settings.heartbeat_s)  # its ranks do not speak the protocol
                    if not self._running(job_id, attempt):
                        log.warning("job %s: attempt %d is over; stopping node %d", job_id, attempt, node_rank)
                        child.kill()
                        return "lost"
                code = child.wait()
            # A failed node's last words (scrubbed): the job's outcome is node 0's, so they show only here.
            log.info(
                "job %s: node %d exited with %s%s", job_id, node_rank, code, f" ({child.log_tail()})" if code else ""
            )
            return "done" if code == 0 else "failed"
        except Exception:
            log.exception("job %s: node %d failed to start", job_id, node_rank)
            return "failed"
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _join(self, job_id: str, attempt: int, node_rank: int) -> tuple[Job, JobNode] | None:
        try:
            with self.sessions.begin() as session:
                job = session.get(Job, job_id)
                leader = session.get(JobNode, (job_id, attempt, 0))
                if job is None or job.status != jobstate.RUNNING or job.attempt != attempt or leader is None:
                    return None
                session.add(JobNode(job_id=job_id, attempt=attempt, node_rank=node_rank, owner=self.owner))
        except IntegrityError:  # another delivery of the same join took this node
            return None
        return job, leader

    def _running(self, job_id: str, attempt: int) -> bool:
        with self.sessions() as session:
            row = session.execute(select(Job.status, Job.attempt).where(Job.id == job_id)).first()
        return row is not None and row[0] == jobstate.RUNNING and row[1] == attempt
