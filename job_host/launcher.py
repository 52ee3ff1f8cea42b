"""Starting the job process and following it: the one way the worker and `amct compress` run a job.

`ChildProcess(workdir)` runs `python -m job_process.main DIR` in the sandbox (bubblewrap, its own
session, no credentials: sandbox.py), its stderr going to DIR/child.log. DIR is the only folder it may
write; `read_only` names input files outside it that it may read (`amct compress`'s own files).
What it reports is read without following links and scrubbed (job_host/errors.py). A thread reads
its stdout, so a caller can wait for protocol messages with a timeout and do its own work in between
(the worker heartbeats).
`request_cancel()` creates the cancel file, which the child checks every step (cooperative);
`kill()` takes the whole process group down. Torch-free: only the child imports torch.

`ChildProcess.warm(folder)` starts the same child before its job exists, in an empty folder of its own
(job_process/warm.py); `hand_over(job_folder)` renames that folder to the job's on the host and
`begin()` tells the child its files are there. The child keeps seeing its folder under the name it was
started with (`sandbox_dir`: a bind mount follows the directory, not its name), so the spec is written
with that name and the paths the child reports are translated back (`result()`).
"""

from __future__ import annotations

import os
import queue
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from job_host import bubblewrap, protocol, sandbox
from job_host.errors import scrub
from job_host.protocol import (
    CANCEL_FILE,
    ERROR_FILE,
    LOG_FILE,
    READY_LINE,
    RESULT_FILE,
    START_LINE,
    STARTED_LINE,
    WARM_FLAG,
    parse_line,
)

JOB_MODULE = "job_process.main"
LOG_TAIL_BYTES = 4000
ERROR_TYPES = ("engine_error", "unsupported", "quality_gate", "memory_limit")  # the types job_process/main.py writes


class ChildProcess:
    """One run of the job process on the spec in `workdir`; a context manager that never leaves it running."""

    def __init__(
        self,
        workdir: Path,
        module: str = JOB_MODULE,
        read_only: Iterable[Path] = (),
        warm: bool = False,
        share_net: bool = False,
    ) -> None:
        self.workdir, self.module, self.read_only, self.is_warm = workdir, module, list(read_only), warm
        self.share_net = share_net  # a node of a multi-node job (job_process/distributed.py)
        self.sandbox_dir = workdir  # the folder's path inside the sandbox: workdir's name when the child started
        self.log_path = workdir / LOG_FILE
        self.stdout_closed = False  # the child closed its stdout: it exited, or is about to
        self.sandboxed = threading.Event()  # a warm child runs inside its sandbox: its folder is mounted
        self.ready = threading.Event()  # a warm child finished its warm-up
        self.started_at = self.ready_at = 0.0  # time.monotonic() of the start and of the warm-up's end
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._proc: subprocess.Popen | None = None
        self._log: BinaryIO | None = None

    @classmethod
    def warm(cls, folder: Path, module: str = JOB_MODULE) -> ChildProcess:
        """Start the job process ahead of its job in `folder` (empty, its own): it warms up and waits."""
        return cls(folder, module, warm=True).start()

    # -- starting and stopping ---------------------------------------------------------------------
    def start(self) -> ChildProcess:
        log = self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed by close()
        args = [str(self.workdir), WARM_FLAG] if self.is_warm else [str(self.workdir)]
        # Only what applies: tests stand in for the child with sandbox.popen, passing these on to Popen.
        extra: dict[str, Any] = {"stdin": subprocess.PIPE} if self.is_warm else {}
        if self.share_net:
            extra["share_net"] = True
        try:
            self._proc = sandbox.popen(
                self.module,
                args,
                cwd=self.workdir,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                bufsize=1,
                read_only=self.read_only,
                **extra,
            )
        except BaseException:
            log.close()
            raise
        self.started_at = time.monotonic()
        threading.Thread(target=self._pump, args=(self._proc.stdout,), daemon=True).start()
        return self

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def hand_over(self, job_folder: Path) -> None:
        """Make the warm child's folder the job's: renamed on the host, the same folder inside the sandbox.

        `job_folder` must not exist. The child cannot tell: its bind mount follows the directory. Only once
        the child said it runs in its sandbox (`sandboxed`): before, bwrap may not have mounted the folder yet,
        and would find no folder under the old name.
        """
        os.rename(self.workdir, job_folder)
        self.workdir, self.log_path = job_folder, job_folder / LOG_FILE

    def begin(self) -> None:
        """The job's spec and files are in the folder: the warm child may run it. A child that died meanwhile
        shows up as its exit status (the supervisor records it)."""
        try:
            stdin = self._started().stdin
            assert stdin is not None  # a warm child is started with a pipe on its stdin
            stdin.write(START_LINE + "\n")
            stdin.close()
        except (BrokenPipeError, OSError):
            pass

    def request_cancel(self) -> None:
        """Ask the child to stop at its next step or phase change; it then exits with CANCELLED_EXIT."""
        (self.workdir / CANCEL_FILE).touch()

    def kill(self) -> None:
        """SIGKILL the child and everything it started (its process group)."""
        if self._proc is not None:
            sandbox.kill_group(self._proc)

    def wait(self) -> int:
        """The exit status; a signal's death is negative (-9) as without bwrap, which reports 128 + N."""
        return bubblewrap.exit_code(self._started().wait())

    def _started(self) -> subprocess.Popen:
        if self._proc is None:
            raise RuntimeError("the job process has not been started")
        return self._proc

    def close(self) -> None:
        """Kill the child if it still runs (an error, Ctrl-C, a lost lease), reap it, close the log."""
        if self._proc is not None and self._proc.poll() is None:
            self.kill()
            self._proc.wait()
        if self._proc is not None and self._proc.stdin is not None and not self._proc.stdin.closed:
            self._proc.stdin.close()
        if self._log is not None:
            self._log.close()

    def __enter__(self) -> ChildProcess:
        return self if self._proc is not None else self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- what it says --------------------------------------------------------------------------------
    def _pump(self, stream) -> None:
        for line in stream:
            if self.is_warm and not self.sandboxed.is_set() and line.strip() == STARTED_LINE:
                self.sandboxed.set()
                continue
            if self.is_warm and not self.ready.is_set() and line.strip() == READY_LINE:
                self.ready_at = time.monotonic()
                self.ready.set()
                continue
            self._lines.put(line)
        self._lines.put(None)

    def messages(self, timeout: float) -> list[dict]:
        """The protocol messages that arrived within `timeout` (the user model's prints are dropped).

        Returns at the first line after waiting, with every line already queued behind it; sets
        `stdout_closed` when the child closed its stdout.
        """
        batch: list[dict] = []
        if self.stdout_closed:
            return batch
        try:
            line = self._lines.get(timeout=timeout)
            while True:
                if line is None:
                    self.stdout_closed = True
                    return batch
                if (message := parse_line(line)) is not None:
                    batch.append(message)
                line = self._lines.get_nowait()
        except queue.Empty:
            return batch

    def __iter__(self) -> Iterator[dict]:
        """Every protocol message until the child closes its stdout."""
        while not self.stdout_closed:
            yield from self.messages(timeout=1.0)

    # -- how it ended --------------------------------------------------------------------------------
    def result(self) -> dict | None:
        """result.json: `metrics` and `artifacts`; None unless the job succeeded, or finished and missed its
        quality gate (error.json says so; its outputs are kept)."""
        result = protocol.read_json_file(self.workdir / RESULT_FILE)
        if result is not None and isinstance(result.get("artifacts"), list):
            for artifact in result["artifacts"]:
                if isinstance(artifact, dict) and isinstance(artifact.get("path"), str):
                    artifact["path"] = str(self.host_path(artifact["path"]))
        return result

    def host_path(self, path: str) -> Path:
        """A path the child named, as this side sees it: under `sandbox_dir` means under `workdir`. Anything
        else stays as it is, and the worker refuses it (worker/records.py: files inside the job folder only)."""
        inside = Path(path)
        if self.sandbox_dir != self.workdir and inside.is_relative_to(self.sandbox_dir):
            return self.workdir / inside.relative_to(self.sandbox_dir)
        return inside

    def error(self) -> dict | None:
        """error.json: the failure's `type` and `detail`, as the child classified it, scrubbed again here
        (a child the model took over may have written anything)."""
        error = protocol.read_json_file(self.workdir / ERROR_FILE)
        if error is None:
            return None
        kind = str(error.get("type", "engine_error"))
        return {"type": kind if kind in ERROR_TYPES else "engine_error", "detail": scrub(error.get("detail", ""))}

    def log_tail(self) -> str:
        """The last non-empty line of child.log (a crash's last words), scrubbed, or ''."""
        data = protocol.read_job_file(self.log_path, LOG_TAIL_BYTES, tail=True) or b""
        lines = [ln for ln in data.decode("utf-8", "replace").splitlines() if ln.strip()]
        return scrub(lines[-1], 200) if lines else ""
