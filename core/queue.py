"""The job queue: the Celery app, configured for hour-long jobs whose truth lives in the database
(docs/spec/service.md §2a), and the Dispatcher that hands a job to the queue of its device.

Both sides build their app here: the API (`make_celery(settings)`, which only sends) and the worker
(`make_celery(settings, include=["worker.tasks"])` in worker/main.py, which also runs the tasks), so
the API never imports the worker. `celery -A worker.main worker -Q amct.jobs.cpu` runs a worker; one
queue per device kind. With no BROKER_URL the transport is kombu's filesystem one under the data
folder, with whole messages taken in order (core/file_queue.py): no broker server at all (the embedded
mode of `python -m service`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from amqp.exceptions import ChannelError
from celery import Celery
from kombu import Queue

from core.file_queue import WRITING_FOLDER
from core.settings import DEVICES, Settings

log = logging.getLogger(__name__)
# The tasks by name: the API sends them without importing the module that defines them (worker/tasks.py).
RUN_JOB_TASK = "worker.tasks.run_job"
REAP_TASK = "worker.tasks.reap"
JOIN_TASK = "worker.tasks.join_job"  # a node of a job across several nodes (worker/nodes.py)
FILE_QUEUE_TRANSPORT = "core.file_queue:Transport"


def _transport_options(settings: Settings) -> dict:
    url = settings.resolved_broker_url
    if url.startswith("filesystem://"):
        folder = settings.broker_folder
        (folder / "queue").mkdir(parents=True, exist_ok=True)
        (folder / "processed").mkdir(parents=True, exist_ok=True)
        (folder / "control").mkdir(parents=True, exist_ok=True)
        (folder / WRITING_FOLDER).mkdir(parents=True, exist_ok=True)
        # The same folder in and out: producer and consumer are different processes on one machine.
        # control_folder too, or kombu writes its broadcast exchanges to ./control in the CWD.
        return {
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "processed_folder": str(folder / "processed"),
            "control_folder": str(folder / "control"),
            "store_processed": False,
            "polling_interval": settings.broker_poll_s,
        }
    # Redis re-delivers an unacked message after visibility_timeout: it must outlive any job.
    return {"visibility_timeout": settings.visibility_timeout_s}


def make_celery(settings: Settings | None = None, include: Sequence[str] = ()) -> Celery:
    """`include`: the task modules this process runs (the worker's); none for a process that only sends."""
    settings = settings or Settings()
    app = Celery("amct", broker=settings.resolved_broker_url, include=list(include))
    app.conf.update(
        broker_transport_options=_transport_options(settings),
        # kombu's filesystem transport with atomic, time-ordered message files (core/file_queue.py); an
        # explicit transport wins over the URL's scheme, so `filesystem://` stays the documented setting.
        broker_transport=FILE_QUEUE_TRANSPORT if settings.resolved_broker_url.startswith("filesystem://") else None,
        broker_connection_retry_on_startup=True,
        task_queues=[Queue(settings.queue_for(d)) for d in DEVICES],
        task_default_queue=settings.queue_for("cpu"),
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,  # the jobs table holds results, not a result backend
        task_acks_late=True,  # ack after the run: a lost worker's job is delivered again…
        task_reject_on_worker_lost=True,  # …and a killed child re-queues instead of acking
        worker_prefetch_multiplier=1,  # a long job must not hold the next one hostage
        # No worker_max_tasks_per_child=1 (docs/spec/service.md §2a, to free GPU memory and whatever a user model left
        # behind): this process never imports torch or loads a model, the engine child it starts per job
        # does. Recycling it would cost a fork and initialisation after every task, reaps included
        # (seconds under load, measured: recovery after a crash took 3 forks longer).
        # docs/spec/service.md §2a suggests True "so a broker blip does not leave two copies running". Here the claim
        # and the fenced lease already allow one copy only, and True would kill every running job at
        # each Redis restart or failover (its work since the last checkpoint lost, then a lease of
        # waiting for the reaper). False: the job runs on; its late ack after the reconnect is a
        # no-op, and a redelivered copy of its message is refused by the claim
        # (tests/service/test_recovery.py::test_a_redis_restart_loses_no_job).
        worker_cancel_long_running_tasks_on_connection_loss=False,
        # The runner stops a job at job_time_limit_s itself; Celery's limits are the backstop.
        task_soft_time_limit=settings.job_time_limit_s + 300,
        task_time_limit=settings.job_time_limit_s + 600,
        # `expires`: reap messages that waited behind a long job are dropped, not run back to back
        # (a few intervals, so that one late by less than that on a busy machine still runs).
        beat_schedule={
            "reap-lost-jobs": {
                "task": REAP_TASK,
                "schedule": settings.reap_interval_s,
                "options": {"queue": settings.queue_for("cpu"), "expires": 3 * settings.reap_interval_s},
            }
        },
        worker_send_task_events=False,
    )
    app.amct_settings = settings  # the tasks read the same settings the app was built from
    return app


class Dispatcher:
    def __init__(self, celery: Celery) -> None:
        self.celery = celery

    def enqueue(self, job_id: str, queue: str) -> bool:
        """Send after the job row is committed; False when the broker is unreachable.

        The row stays `queued` either way: the database, not the message, is the truth, and a
        re-send (or a second delivery) is harmless because the worker claims the row atomically.
        """
        try:
            self.celery.send_task(
                RUN_JOB_TASK,
                args=[job_id],
                queue=queue,
                task_id=job_id,
                retry=True,
                retry_policy={"max_retries": 3, "interval_start": 0.2},
            )
        except Exception:
            log.exception("could not enqueue job %s on %s", job_id, queue)
            return False
        return True

    def enqueue_join(self, job_id: str, attempt: int, node_rank: int, queue: str) -> bool:
        """Ask a worker of `queue` to run node `node_rank` of the job's attempt (worker/nodes.py)."""
        try:
            self.celery.send_task(
                JOIN_TASK,
                args=[job_id, attempt, node_rank],
                queue=queue,
                task_id=f"{job_id}:{attempt}:{node_rank}",
                retry=True,
                retry_policy={"max_retries": 3, "interval_start": 0.2},
            )
        except Exception:
            log.exception("could not enqueue node %d of job %s on %s", node_rank, job_id, queue)
            return False
        return True

    def pending_messages(self, queue: str) -> int | None:
        """Messages waiting in the broker queue (not those a worker holds), or None when it cannot tell."""
        try:
            with self.celery.connection_for_write() as conn:
                conn.ensure_connection(max_retries=1, timeout=2)
                return conn.default_channel.queue_declare(queue=queue, passive=True).message_count
        except ChannelError as e:
            if str(e.reply_code) == "404":  # Redis drops the key of an empty list: no queue is an empty queue
                return 0
            log.warning("could not read the depth of queue %s: %s", queue, e)
            return None
        except Exception:
            log.warning("could not read the depth of queue %s", queue, exc_info=True)
            return None

    def ping(self) -> None:
        """Raise when the broker cannot be reached (readiness)."""
        with self.celery.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
