"""Run untrusted work (user TorchScript) in a child process: no credentials, bounded memory and time.

`torch.jit.load` has no safe mode (docs/spec/service.md §4a), so neither the API nor the worker process ever loads
a user model itself. This is the process boundary of docs/spec/service.md §4b; stronger isolation (nsjail, a
container per job) wraps the same command line. Torch-free: the API starts its model validation
here, the worker and `amct compress` their job process (through launcher.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from job_process.kinds import MODULES_ENV

ROOT = Path(__file__).resolve().parents[1]
# Only these reach the child: no DATABASE_URL, BROKER_URL, AWS_* or tokens.
_PASS_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
             "CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
             "AMCT_FASHION_MNIST_DIR",
             MODULES_ENV)  # so the job process loads the same extra job kinds as its parent


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in _PASS_ENV}
    env["PYTHONPATH"] = str(ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


MEMORY_ENV = "AMCT_CHILD_MEMORY_BYTES"
PARENT_ENV = "AMCT_CHILD_PARENT_PID"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def limit_self() -> None:
    """Called first thing by every child entry point, before it touches user input.

    (The limits are applied by the child itself: preexec_fn is unsafe in the threaded API process.)
    """
    memory = int(os.environ.get(MEMORY_ENV, "0"))
    if memory:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _die_with_parent()


def _die_with_parent() -> None:
    """Linux: the kernel SIGKILLs this child when the process that started it dies.

    The child runs in its own session (so a cancel can kill its whole group), which also means a
    SIGKILLed or OOM-killed worker would leave it running: an orphan that keeps training, holding a
    GPU the job's next attempt needs. (The spawning thread waits for the child, so it outlives it.)
    """
    parent = os.environ.get(PARENT_ENV)
    if not parent or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return
    if os.getppid() != int(parent):  # the parent died before the line above: nobody waits for us
        os._exit(1)


def python_command(module: str, args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", module, *args]


def popen(module: str, args: Sequence[str], cwd: str | os.PathLike, memory_bytes: int | None = None,
          env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
    extra = dict(env or {}, **{PARENT_ENV: str(os.getpid())})
    if memory_bytes:
        extra[MEMORY_ENV] = str(memory_bytes)
    # A new session: its own process group, so a cancel or time-out kills it and all it started.
    return subprocess.Popen(python_command(module, args), cwd=cwd, env=child_env(extra),
                            start_new_session=True, **kwargs)


def run(module: str, args: Sequence[str], cwd: str | os.PathLike, timeout_s: float,
        memory_bytes: int | None = None) -> subprocess.CompletedProcess:
    """Run to completion; raises subprocess.TimeoutExpired after killing the whole group."""
    proc = popen(module, args, cwd, memory_bytes, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def stop_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM the process group (a server, a worker and their children), SIGKILL it after grace_s."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        proc.wait()
