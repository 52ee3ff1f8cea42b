"""Warm job processes: each worker process keeps one sandboxed job process started ahead of its job.

A cold job spends seconds in its child before the first training step (torch's and the engine's
imports, the first graph capture: job_process/warm.py). So a worker starts the next child as soon as
it takes one: the child warms up in an empty folder of its own, `<scratch>/warm-<worker pid>-<token>`,
and waits. When a job is claimed, the runner takes it (`take`), the folder is renamed to the job's
(`job-<job id>-<token>`, the name the reaper and the next attempt look for), the inputs are staged
into it, and the child is told to begin; a replacement is started at once (`fill`).

Isolation is the cold child's: the same bubblewrap command line, seccomp filter, rlimits and
environment (job_host/sandbox.py), one job per child, and a folder that held nothing until its
job was handed over (docs/security.md, "Warm job processes"). A warm child dies with its worker
process (bwrap's --die-with-parent: the pool process's main thread starts it, and lives as long as
the process); a killed worker leaves an empty warm folder, removed by the next pool on that machine
(`remove_stale`).

Only the Celery worker uses it (worker/lifecycle.py starts one pool per pool process, when
`AMCT_WARM_START` is on); `amct compress` and the upload check start cold children. By default the pool
is a fork server instead (worker/fork_server.py: one warm-up for many jobs); `AMCT_FORK_SERVER=0` keeps
one warm child per job.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import threading
import time
from pathlib import Path

from job_host import bubblewrap
from job_host.launcher import JOB_MODULE, ChildProcess
from job_host.protocol import job_folder_prefix
from worker.fork_server import ForkServerPool

log = logging.getLogger(__name__)
PREFIX = "warm-"
SANDBOX_START_S = 30.0  # how long a job waits for a just-started warm child to be inside its sandbox


class WarmPool:
    """One warm child for the process that owns this pool; start and take it from one long-lived thread."""

    def __init__(self, scratch: Path, module: str = JOB_MODULE) -> None:
        self.scratch, self.module = scratch, module  # `module`: tests start a stand-in
        self._child: ChildProcess | None = None
        self._token = ""

    def fill(self) -> None:
        """Start a warm child unless one is waiting. A sandbox that cannot start is logged; jobs then start
        cold, and fail as a cold one would (SandboxUnavailable)."""
        if self._child is not None:
            return
        self.scratch.mkdir(parents=True, exist_ok=True)
        self._token = secrets.token_hex(4)
        folder = self.scratch / f"{PREFIX}{os.getpid()}-{self._token}"
        folder.mkdir(mode=0o700)
        try:
            self._child = ChildProcess.warm(folder, self.module)
        except (
            bubblewrap.SandboxUnavailable
        ) as e:  # said once at the worker's start (bubblewrap.log_state): no traceback
            log.warning("no warm job process: %s", e)
            shutil.rmtree(folder, ignore_errors=True)
            return
        except Exception:
            log.exception("could not start a warm job process; jobs start cold")
            shutil.rmtree(folder, ignore_errors=True)
            return
        threading.Thread(target=_log_ready, args=(self._child,), daemon=True).start()

    def take(self, job_id: str) -> ChildProcess | None:
        """The waiting child, its folder renamed to the job's; None when there is none or it died (start cold)."""
        child, self._child = self._child, None
        if child is None:
            return None
        # Its folder is renamed only once the child runs in its sandbox (bwrap has mounted it): usually long
        # before a job comes, else within a fraction of a second of its start.
        deadline = time.monotonic() + SANDBOX_START_S
        while not child.sandboxed.wait(timeout=0.05) and child.alive() and time.monotonic() < deadline:
            pass
        if not child.sandboxed.is_set() or not child.alive():
            log.warning(
                "the warm job process %s; starting this job cold",
                f"had exited ({child.wait()})" if not child.alive() else "did not start in its sandbox",
            )
            _discard(child)
            return None
        child.hand_over(self.scratch / f"{job_folder_prefix(job_id)}{self._token}")
        return child

    def close(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            _discard(child)


def _discard(child: ChildProcess) -> None:
    child.close()
    shutil.rmtree(child.workdir, ignore_errors=True)


def _log_ready(child: ChildProcess) -> None:
    if child.ready.wait(timeout=600):
        log.info("warm job process ready in %.1f s (%s)", child.ready_at - child.started_at, child.workdir.name)


def remove_stale(scratch: Path) -> int:
    """Remove the warm folders of worker processes that are gone (SIGKILLed: no clean-up ran)."""
    removed = 0
    for folder in scratch.glob(f"{PREFIX}*-*") if scratch.is_dir() else []:
        pid = folder.name[len(PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            if folder.is_dir():
                shutil.rmtree(folder, ignore_errors=True)
            else:  # a fork server's job marker (worker/fork_server.py)
                folder.unlink(missing_ok=True)
            removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_pool: WarmPool | ForkServerPool | None = None


def start_pool(scratch: Path, fork_server: bool = True) -> WarmPool | ForkServerPool:
    """This process's pool, filled (called once per Celery pool process, worker/lifecycle.py): a fork server
    (worker/fork_server.py) when asked for and the sandbox is bubblewrap, else one warm child per job."""
    global _pool
    remove_stale(scratch)
    if fork_server and bubblewrap.state().mode != "bubblewrap":
        log.warning("no fork server without bubblewrap (%s): one warm job process per job", bubblewrap.state().detail)
        fork_server = False
    _pool = ForkServerPool(scratch) if fork_server else WarmPool(scratch)
    _pool.fill()
    return _pool


def current() -> WarmPool | ForkServerPool | None:
    return _pool


def stop_pool() -> None:
    global _pool
    with contextlib.suppress(Exception):
        if _pool is not None:
            _pool.close()
    _pool = None
