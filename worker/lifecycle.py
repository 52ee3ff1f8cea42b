"""What a worker process does when it starts and stops, hooked to Celery's signals (worker/main.py).

- The worker registry (core/workers.py): once it consumes, the worker writes its queues to the
  database and renews them every `worker_heartbeat_s` from a thread; at a clean shutdown it removes
  its row (a killed one's row goes stale after `worker_stale_s`).
- Orphans: the pool processes and the embedded beat (`-B`) ask the kernel to SIGKILL them when the
  worker's main process dies. Before, a kill -9 of the worker left its beat running, and a restarted
  worker then ran a second one (two reapers, two schedules). `amct serve` also starts its worker with
  DIE_WITH_PARENT_ENV set, so the worker itself ends with the server.
- Warm job processes: each pool process starts one when it starts, and kills it when it stops
  (worker/warm.py).
"""

from __future__ import annotations

import logging
import os
import threading

from celery import signals
from sqlalchemy import create_engine
from sqlalchemy.orm import sessionmaker
from sqlalchemy.pool import NullPool

from core import workers
from core.db.session import _normalise
from core.settings import DIE_WITH_PARENT_ENV  # the pid of the process the worker must not outlive
from job_host.sandbox import die_with_parent
from worker import warm

log = logging.getLogger(__name__)


def die_with_the_server() -> None:
    """Called as worker/main.py loads: a worker that `amct serve` started ends with it."""
    parent = os.environ.pop(DIE_WITH_PARENT_ENV, None)  # popped: the worker's own children must not check it
    if parent:
        die_with_parent(int(parent))


class Heartbeat:
    """A thread that keeps this worker's row in the registry fresh."""

    def __init__(self, app, name: str, queues: list[str]) -> None:
        settings = app.amct_settings
        self.name, self.queues, self.period = name, queues, settings.worker_heartbeat_s
        # Its own engine, without a pool: the pool processes fork from this one, and must not inherit
        # an open connection (two processes on one socket).
        self.sessions = sessionmaker(create_engine(_normalise(settings.resolved_database_url), poolclass=NullPool))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="amct-registry", daemon=True)

    def beat(self) -> None:
        with self.sessions.begin() as session:
            workers.heartbeat(session, self.name, self.queues)

    def _run(self) -> None:
        while not self.stop.wait(self.period):
            try:
                self.beat()
            except Exception:  # the database may be restarting; the next beat may get through
                log.warning("worker registry heartbeat failed", exc_info=True)

    def close(self) -> None:
        self.stop.set()
        try:
            with self.sessions.begin() as session:
                workers.unregister(session, self.name)
        except Exception:
            log.warning("could not remove worker %s from the registry", self.name, exc_info=True)


_heartbeat: Heartbeat | None = None


@signals.worker_ready.connect
def _register(sender, **_) -> None:
    global _heartbeat
    app = sender.app
    queues = list(app.amqp.queues.consume_from or {})
    _heartbeat = Heartbeat(app, f"{sender.hostname}:{os.getpid()}", queues)
    _heartbeat.beat()  # at once: a submit right after the worker is up sees it
    _heartbeat.thread.start()
    log.info("registered %s for queues %s", _heartbeat.name, ", ".join(queues))


@signals.worker_shutdown.connect
def _unregister(**_) -> None:
    if _heartbeat is not None:
        _heartbeat.close()


@signals.worker_process_init.connect
def _pool_process_dies_with_worker(**_) -> None:
    die_with_parent()


@signals.worker_process_init.connect
def _start_warm_job_process(sender=None, **_) -> None:
    """The pool process that runs the tasks starts its first warm job process now (worker/warm.py), from its
    main thread: bwrap's --die-with-parent follows the thread that started it."""
    from celery import current_app

    settings = current_app.amct_settings
    if settings.warm_start:
        warm.start_pool(settings.tmp_dir, settings.fork_server)


@signals.worker_process_shutdown.connect
def _stop_warm_job_process(**_) -> None:
    warm.stop_pool()


@signals.beat_embedded_init.connect
def _beat_dies_with_worker(**_) -> None:
    die_with_parent()
