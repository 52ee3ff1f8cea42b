"""Hand a job to the queue of its device. The message carries only the job id (spec §2d)."""

from __future__ import annotations

import logging

from amqp.exceptions import ChannelError
from celery import Celery

log = logging.getLogger(__name__)
TASK_NAME = "worker.tasks.run_job"


class Dispatcher:
    def __init__(self, celery: Celery) -> None:
        self.celery = celery

    def enqueue(self, job_id: str, queue: str) -> bool:
        """Send after the job row is committed; False when the broker is unreachable.

        The row stays `queued` either way: the database, not the message, is the truth, and a
        re-send (or a second delivery) is harmless because the worker claims the row atomically.
        """
        try:
            self.celery.send_task(TASK_NAME, args=[job_id], queue=queue, task_id=job_id,
                                  retry=True, retry_policy={"max_retries": 3, "interval_start": 0.2})
        except Exception:
            log.exception("could not enqueue job %s on %s", job_id, queue)
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
