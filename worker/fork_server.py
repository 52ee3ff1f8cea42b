"""The fork server's host side: one warmed-up sandboxed process per worker process that forks each job's child.

A warm child (worker/warm.py) still pays a fresh process's start-up once per job, about 8 s of CPU on the
2-core development machine, which bounds jobs/min as soon as the cores are busy. The fork server
(job_process/zygote.py) pays it once per `JOBS_PER_SERVER` jobs: each job's child is forked from it,
with torch and the engine already imported and used, and exits after its job (docs/scaling.md,
"Fork server"; isolation in docs/security.md, "Fork server").

The server runs in the sandbox a cold child gets, with a slot folder of its own,
`<scratch>/warm-<worker pid>-<token>`, as its one writable folder. A job's folder is made inside the
slot (`job-<random>`: the server never learns a job id) after the slot was emptied, and removed by the
runner after the job; one job at a time. The server talks to this side over a socketpair
(SOCK_SEQPACKET, JSON messages); each job's stdout is a pipe of its own, passed over it.

`ForkedJob` is the runner's handle on one job's child, a `ChildProcess` (job_host/launcher.py) as the
supervisor knows it: the same protocol messages, result, error and log; killing it kills the whole server
(the next job starts cold while a new server warms up).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from job_host import bubblewrap, sandbox
from job_host.launcher import JOB_MODULE, ChildProcess
from job_host.protocol import FORK_SERVER_FLAG, receive, send

log = logging.getLogger(__name__)
PREFIX = "warm-"  # as worker/warm.py's folders: remove_stale finds both
SERVER_LOG = "server.log"
# A server is replaced after this many jobs: what a job can leave that the clean-up does not reach (System V
# IPC objects, which no job looks for) and the server's own heap growth stay bounded.
JOBS_PER_SERVER = 100
EXIT_WAIT_S = 60.0  # after a job's stdout closed, how long its exit status may take (the server cleans up)


class ForkServer:
    """The server process in its sandbox and this side's end of its control socket."""

    def __init__(self, slot: Path, module: str = JOB_MODULE) -> None:
        self.slot, self.module, self.jobs = slot, module, 0
        self.ctl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with open(slot / SERVER_LOG, "ab") as server_log:
                self.proc = sandbox.popen(
                    module,
                    [str(slot), FORK_SERVER_FLAG, str(theirs.fileno())],
                    cwd=slot,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=server_log,
                    keep_fds=[theirs.fileno()],
                )
        except BaseException:
            self.ctl.close()
            raise
        finally:
            theirs.close()
        self.started_at, self.ready_at = time.monotonic(), 0.0
        self.ready = threading.Event()
        # Reads the start-up messages and logs when the warm-up is done; a job's messages are read after it.
        self._start_up = threading.Thread(target=self._await_ready, daemon=True)
        self._start_up.start()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def start_job(self, folder: Path) -> None:
        self.jobs += 1
        send(self.ctl, {"folder": str(folder)})

    def _await_ready(self) -> None:
        while True:
            message, fds = self._receive()
            for fd in fds:
                os.close(fd)
            if message is None:
                return  # gone before its warm-up ended: its first job sees it as the job's exit status
            if message.get("type") == "ready":
                self.ready_at = time.monotonic()
                log.info("fork server ready in %.1f s (%s)", self.ready_at - self.started_at, self.slot.name)
                self.ready.set()
                return

    def next_message(self, want: str) -> tuple[dict | None, list[int]]:
        """The job's next message, which must be of type `want`; None when the server is gone (or said
        something else: then it is killed, as a server out of step cannot be trusted)."""
        self._start_up.join()
        message, fds = self._receive()
        if message is None or message.get("type") == want:
            return message, fds
        for fd in fds:
            os.close(fd)
        log.error("fork server %s sent %r while a %r was due; killing it", self.slot.name, message.get("type"), want)
        self.kill()
        return None, []

    def _receive(self) -> tuple[dict | None, list[int]]:
        try:
            return receive(self.ctl)
        except (OSError, ValueError):
            return None, []

    def exit_code(self) -> int:
        """How the server ended, as Popen says it (it was killed, or died: -9 when it has not been reaped yet)."""
        try:
            return bubblewrap.exit_code(self.proc.wait(timeout=10))
        except subprocess.TimeoutExpired:
            self.kill()
            return -9

    def kill(self) -> None:
        sandbox.kill_group(self.proc)

    def close(self) -> None:
        """Hang up (the server exits when it reads the end of the socket), then make sure it is gone."""
        with contextlib.suppress(OSError):
            self.ctl.shutdown(socket.SHUT_RDWR)  # also wakes this side's reader, if one still waits
        self.ctl.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait()

    def dispose(self) -> None:
        """Close it and remove its slot: the end of a server, after its last job or when it is replaced."""
        self.close()
        shutil.rmtree(self.slot, ignore_errors=True)


class ForkedJob(ChildProcess):
    """One job's child of a fork server, followed as a ChildProcess: `begin()` forks it."""

    def __init__(self, server: ForkServer, folder: Path, last: bool) -> None:
        super().__init__(folder, server.module, warm=True)
        self.server, self.last = server, last  # `last`: the server is closed after this job
        self.sandboxed.set()  # the slot is mounted since the server started
        self._code: int | None = None
        self._follower: threading.Thread | None = None

    def start(self) -> ForkedJob:
        return self  # the server runs already; begin() forks the child

    def begin(self) -> None:
        self.started_at = time.monotonic()
        with contextlib.suppress(OSError):  # a server that died shows up as the job's exit status
            self.server.start_job(self.workdir)
        self._follower = threading.Thread(target=self._follow, daemon=True)
        self._follower.start()

    def _follow(self) -> None:
        """The child's stdout lines into the queue, then its exit status, then the end of the stream."""
        forked, fds = self.server.next_message("forked")
        if forked is not None and fds:
            with open(fds[0], encoding="utf-8", errors="replace") as stream:
                for line in stream:
                    self._lines.put(line)
            ended, _ = self.server.next_message("exit")
            self._code = int(ended["code"]) if ended is not None else self.server.exit_code()
        else:
            self._code = self.server.exit_code()
        self._lines.put(None)

    def alive(self) -> bool:
        return self._follower is not None and self._follower.is_alive()

    def kill(self) -> None:
        """SIGKILL the job, with the server it was forked from (the pool starts another)."""
        self.server.kill()

    def wait(self) -> int:
        if self._follower is None:
            raise RuntimeError("the job was never started")
        self._follower.join(EXIT_WAIT_S)
        if self._follower.is_alive():  # the server did not say how the job ended: it is not to be trusted
            self.server.kill()
            self._follower.join()
        return self._code if self._code is not None else -9

    def close(self) -> None:
        if self.alive():
            self.server.kill()
        if self._follower is not None:
            self._follower.join()
        job_marker(self.server.slot).unlink(missing_ok=True)
        if self.last:
            self.server.dispose()


class ForkServerPool:
    """The worker process's fork server; the same calls as worker/warm.py's WarmPool."""

    def __init__(self, scratch: Path, module: str = JOB_MODULE, jobs_per_server: int = JOBS_PER_SERVER) -> None:
        self.scratch, self.module, self.jobs_per_server = scratch, module, jobs_per_server
        self._server: ForkServer | None = None

    def fill(self) -> None:
        """Start a server unless one runs. One that cannot start is logged; jobs then start cold."""
        if self._server is not None and self._server.alive():
            return
        self._discard()
        self.scratch.mkdir(parents=True, exist_ok=True)
        slot = self.scratch / f"{PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        slot.mkdir(mode=0o700)
        try:
            self._server = ForkServer(slot, self.module)
        except (
            bubblewrap.SandboxUnavailable
        ) as e:  # said once at the worker's start (bubblewrap.log_state): no traceback
            log.warning("no fork server: %s", e)
            shutil.rmtree(slot, ignore_errors=True)
        except Exception:
            log.exception("could not start a fork server; jobs start cold")
            shutil.rmtree(slot, ignore_errors=True)

    def take(self, job_id: str) -> ForkedJob | None:
        """A job folder in the server's slot, and the handle that forks the job's child there; None: start cold."""
        server = self._server
        if server is None or not server.alive():
            # It died (a killed job takes its server along) or could not start: this job starts cold, and a new
            # server warms up beside it for the next. A server that cannot warm up does not fail jobs.
            self.fill()
            return None
        _empty(server.slot)
        folder = Path(tempfile.mkdtemp(prefix="job-", dir=server.slot))
        # Which job the server runs, for people and tools on the host (`ps` shows only the slot): beside the
        # slot, never in it.
        job_marker(server.slot).write_text(job_id)
        last = server.jobs + 1 >= self.jobs_per_server
        if last:
            self._server = None  # fill(), called as the job begins, starts the next server
        log.info("job %s: forked from the fork server in %s", job_id, server.slot.name)
        return ForkedJob(server, folder, last)

    def close(self) -> None:
        self._discard()

    def _discard(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.dispose()


def job_marker(slot: Path) -> Path:
    """`<scratch>/warm-<pid>-<token>.job`: the id of the job the slot's server runs now."""
    return slot.with_name(slot.name + ".job")


def _empty(slot: Path) -> None:
    """Everything an earlier job left in the slot goes before the next job's folder is made (not the log)."""
    for entry in slot.iterdir():
        if entry.name == SERVER_LOG:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
