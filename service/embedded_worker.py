"""The Celery worker `amct serve` runs beside its API: watched, restarted when it dies, never orphaned.

Before, a kill -9 of that worker left its job `queued` for good (nothing consumed the queue any more)
and its beat child running (a restarted server then ran two). Now a thread of the server starts the
worker in a session of its own and waits for it. When it dies unexpectedly:

1. what is left of its process group (pool processes, the embedded beat) is SIGKILLed; they also
   die with it by themselves (worker/lifecycle.py, PR_SET_PDEATHSIG), this is the second wall;
2. the leases of the jobs it ran are expired at once: its node name is unique to this start, so
   no live worker holds them, and waiting `lease_s` for the reaper would only delay the resume;
3. the reaper runs: those jobs go back to the queue (their next attempt resumes from the checkpoint);
4. a new worker starts and consumes them, at once unless the dead one never came up (never wrote its
   row in the worker registry, core/workers.py): only that is a crash loop, and it backs off.

The worker also ends with the server (the server's pid is in DIE_WITH_PARENT_ENV; the thread that
starts it lives as long as it does, which PR_SET_PDEATHSIG needs).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import uuid
from pathlib import Path

from core import workers
from core.db import jobstate
from core.db.session import session_factory
from core.queue import Dispatcher, make_celery
from core.reaper import reap_once
from core.settings import DIE_WITH_PARENT_ENV, Settings
from job_host.sandbox import kill_group

log = logging.getLogger("amct.serve")
MAX_BACKOFF_S = 60.0  # the longest wait between restarts of a worker that dies before it comes up


class EmbeddedWorker:
    def __init__(self, settings: Settings, command: list[str], env: dict[str, str]) -> None:
        self.settings, self.command, self.env = settings, command, env
        self.node = ""
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self._stopping = threading.Event()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="amct-embedded-worker", daemon=True)

    def start(self) -> EmbeddedWorker:
        self._thread.start()
        self._started.wait(30)
        return self

    def _spawn(self) -> subprocess.Popen:
        self.node = f"embedded-{uuid.uuid4().hex[:8]}@%h"
        env = dict(self.env, **{DIE_WITH_PARENT_ENV: str(os.getpid())})
        self.proc = proc = subprocess.Popen([*self.command, "-n", self.node], env=env, start_new_session=True)
        log.info("embedded worker %s started (pid %d)", self.node, proc.pid)
        return proc

    def _watch(self) -> None:
        backoff = 0.0
        while not self._stopping.is_set():
            proc = self._spawn()
            self._started.set()
            code = proc.wait()
            if self._stopping.is_set():
                return
            log.error("embedded worker %s exited with code %s; cleaning up and restarting it", self.node, code)
            kill_group(proc)  # its pool and beat, if any survived it
            came_up = self._release_jobs()
            self.restarts += 1
            # A worker killed while it served (kill -9, OOM) is replaced at once; one that dies before it
            # comes up (a bad broker URL, an import error) would do so again: wait 1, 2, 4 … 60 s.
            backoff = 0.0 if came_up else min(MAX_BACKOFF_S, max(1.0, backoff * 2))
            if self._stopping.wait(backoff):
                return

    def _release_jobs(self) -> bool:
        """Expire the dead worker's leases and reap, so its jobs are queued again now, not after lease_s;
        remove its registry rows. Whether it had come up (registered); False when that cannot be read (a
        database that is down is what a worker dying at start-up most likely met: back off)."""
        hostname = self.node.split("@", 1)[0]
        try:
            with session_factory(self.settings.resolved_database_url).begin() as session:
                came_up = workers.forget_node(session, hostname) > 0
                expired = jobstate.expire_leases(session, owner_prefix=f"{hostname}@")
            if expired:
                result = reap_once(self.settings, Dispatcher(make_celery(self.settings)))
                log.info("the dead worker's jobs %s: %s", expired, result)
        except Exception:  # the reaper in the API catches them after lease_s anyway
            log.exception("could not release the dead worker's jobs")
            return False
        return came_up

    def stop(self, grace_s: float = 30.0) -> None:
        """Celery's cold shutdown: SIGQUIT to the worker's main process alone, which then stops its pool
        itself. A SIGTERM to the whole group killed the pool processes behind its back, and billiard logged
        each as an ERROR ("ForkPoolWorker-N exited with signal 15"); a warm shutdown (SIGTERM) would wait
        for a running job to end. Its job is stopped and queued again (acks_late), as before."""
        self._stopping.set()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            # Before Celery handles SIGQUIT (still starting), its default action would dump core: SIGTERM then.
            sig = signal.SIGQUIT if _handles(proc.pid, signal.SIGQUIT) else signal.SIGTERM
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, sig)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self._thread.join(grace_s)

    def kill(self) -> None:
        """SIGKILL the worker and all its group now."""
        self._stopping.set()
        if self.proc is not None:
            kill_group(self.proc)


def _handles(pid: int, sig: int) -> bool:
    """Whether process `pid` has a handler for `sig` (SigCgt of /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next((line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), "0")
    return bool(int(caught, 16) >> (sig - 1) & 1)
