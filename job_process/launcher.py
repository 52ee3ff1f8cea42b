"""Starting the job process and following it: the one way the worker and `amct compress` run a job.

`ChildProcess(workdir)` runs `python -m job_process.main DIR` in the sandbox (its own session, no
credentials: sandbox.py), its stderr going to DIR/child.log. A thread reads its stdout, so a caller
can wait for protocol messages with a timeout and do its own work in between (the worker heartbeats).
`request_cancel()` creates the cancel file, which the child checks every step (cooperative);
`kill()` takes the whole process group down. Torch-free: only the child imports torch.
"""

from __future__ import annotations

import queue
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

from job_process import sandbox
from job_process.protocol import CANCEL_FILE, ERROR_FILE, LOG_FILE, RESULT_FILE, parse_line, read_json_file

JOB_MODULE = "job_process.main"
LOG_TAIL_BYTES = 4000


class ChildProcess:
    """One run of the job process on the spec in `workdir`; a context manager that never leaves it running."""

    def __init__(self, workdir: Path, module: str = JOB_MODULE) -> None:
        self.workdir, self.module = workdir, module
        self.log_path = workdir / LOG_FILE
        self.stdout_closed = False  # the child closed its stdout: it exited, or is about to
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._proc: subprocess.Popen | None = None
        self._log = None

    # -- starting and stopping ---------------------------------------------------------------------
    def start(self) -> ChildProcess:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed by close()
        # Through the module attribute: tests stand in for the child with sandbox.popen.
        self._proc = sandbox.popen(self.module, [str(self.workdir)], cwd=self.workdir, stdout=subprocess.PIPE,
                                   stderr=self._log, text=True, bufsize=1)
        threading.Thread(target=self._pump, args=(self._proc.stdout,), daemon=True).start()
        return self

    def request_cancel(self) -> None:
        """Ask the child to stop at its next step or phase change; it then exits with CANCELLED_EXIT."""
        (self.workdir / CANCEL_FILE).touch()

    def kill(self) -> None:
        """SIGKILL the child and everything it started (its process group)."""
        if self._proc is not None:
            sandbox.kill_group(self._proc)

    def wait(self) -> int:
        return self._proc.wait()

    def close(self) -> None:
        """Kill the child if it still runs (an error, Ctrl-C, a lost lease), reap it, close the log."""
        if self._proc is not None and self._proc.poll() is None:
            self.kill()
            self._proc.wait()
        if self._log is not None:
            self._log.close()

    def __enter__(self) -> ChildProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- what it says --------------------------------------------------------------------------------
    def _pump(self, stream) -> None:
        for line in stream:
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
        """result.json: `metrics` and `artifacts`; None unless the job succeeded."""
        return read_json_file(self.workdir / RESULT_FILE)

    def error(self) -> dict | None:
        """error.json: the failure's `type` and `detail`, as the child classified it."""
        return read_json_file(self.workdir / ERROR_FILE)

    def log_tail(self) -> str:
        """The last non-empty line of child.log (a crash's last words), or ''."""
        try:
            data = self.log_path.read_bytes()[-LOG_TAIL_BYTES:]
        except OSError:
            return ""
        lines = [ln for ln in data.decode("utf-8", "replace").splitlines() if ln.strip()]
        return lines[-1] if lines else ""
