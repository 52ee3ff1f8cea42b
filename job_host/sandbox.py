"""Run untrusted work (user TorchScript) in a child process: isolated, no credentials, bounded resources.

`torch.jit.load` has no safe mode (docs/spec/service.md §4a), so neither the API nor the worker process ever loads
a user model itself. Every child starts inside bubblewrap (bubblewrap.py: namespaces, a read-only system,
its own folder as the only writable one, no network, seccomp) and sets its own rlimits first thing
(limit_self). docs/security.md has the threat model. Torch-free: the API starts its model validation
here, the worker and `amct compress` their job process (through launcher.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from job_host import bubblewrap
from job_host.kinds import MODULES_ENV

ROOT = bubblewrap.ROOT
# Only these reach the child: no DATABASE_URL, BROKER_URL, AWS_* or tokens.
_PASS_ENV = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "TMPDIR",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "ASCEND_RT_VISIBLE_DEVICES",
    "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE",
    "AMCT_FASHION_MNIST_DIR",
    "GLOO_SOCKET_IFNAME",
    "NCCL_SOCKET_IFNAME",  # the interface the ranks of a multi-node job meet on
    MODULES_ENV,
)  # so the job process loads the same extra job kinds as its parent


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in _PASS_ENV}
    env["PYTHONPATH"] = str(ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


MEMORY_ENV = "AMCT_CHILD_MEMORY_BYTES"
CPU_ENV = "AMCT_CHILD_CPU_SECONDS"
PARENT_ENV = "AMCT_CHILD_PARENT_PID"
# The CPU priority every child runs at, below the API, the workers and their heartbeats (docs/scaling.md,
# "Sharing cores"): a user model that trains on every core slows the reads and leases, not the reverse.
NICE_ENV = "AMCT_CHILD_NICE"
DEFAULT_NICE = 10
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# Defaults every child gets: no file larger than an ONNX export of the largest model we accept can be,
# and a thread/process count no PyTorch job needs (a fork bomb stops there; root is exempt by the kernel).
MAX_FILE_BYTES = 32 * 1024**3
MAX_PROCESSES = 4096
log = logging.getLogger(__name__)


def limit_self() -> None:
    """Called first thing by every child entry point, before it touches user input.

    (The limits are applied by the child itself: preexec_fn is unsafe in the threaded API process.)
    """
    memory = int(os.environ.get(MEMORY_ENV, "0"))
    if memory:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    cpu = int(os.environ.get(CPU_ENV, "0"))
    if cpu:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))  # SIGXCPU, then SIGKILL 5 s later
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if nice := int(os.environ.get(NICE_ENV, "0")):
        lower_own_session(os.nice(nice))
    resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_FILE_BYTES, MAX_FILE_BYTES))
    _lower(resource.RLIMIT_NPROC, MAX_PROCESSES)
    if parent := os.environ.get(PARENT_ENV):
        die_with_parent(int(parent))


AUTOGROUP = Path("/proc/self/autogroup")


def lower_own_session(nice: int) -> None:
    """Give this process's session the nice value it gave itself, where the kernel schedules sessions as groups.

    With autogroup on (CONFIG_SCHED_AUTOGROUP, the default of most desktop and cloud kernels), the CPU is
    shared first between sessions and only then by nice value inside each; a child in a session of its own
    (start_new_session) would get as much CPU as the whole API, its own nice value notwithstanding. The
    group's nice value is the one that counts (docs/scaling.md, "Sharing cores"). An unprivileged process
    may change it at most once per 100 ms machine-wide (EAGAIN): a few tries. Without autogroup (no such
    file, or a process in a cgroup of its own) there is nothing to do.
    """
    for _ in range(5):
        try:
            AUTOGROUP.write_text(str(nice))
            return
        except BlockingIOError:
            time.sleep(0.1)
        except OSError:
            return


def _lower(limit: int, value: int) -> None:
    soft, hard = resource.getrlimit(limit)
    if hard == resource.RLIM_INFINITY or hard > value:
        resource.setrlimit(limit, (value, value))


def prctl(option: int, value: int) -> bool:
    """Linux prctl(2) with one argument; False when the kernel refused (`ctypes.get_errno()` says why)."""
    return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0


def die_with_parent(expected_parent: int | None = None) -> None:
    """Linux: the kernel SIGKILLs this process when the one that started it dies; exit now if
    `expected_parent` is already gone (it died before the prctl: nobody would ever stop us).

    The job child runs in its own session (so a cancel can kill its whole group), which also means a
    SIGKILLed or OOM-killed worker would leave it running: an orphan that keeps training, holding a
    GPU the job's next attempt needs. (The spawning thread waits for the child, so it outlives it.)
    Celery's pool and beat use it too (worker/lifecycle.py). No "parent is pid 1" test: in a container
    the worker itself may be pid 1.
    """
    if not sys.platform.startswith("linux"):
        return
    if not prctl(PR_SET_PDEATHSIG, signal.SIGKILL):
        return
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(1)


def child_nice() -> int:
    """AMCT_CHILD_NICE from this process's environment (default 10; 0 keeps the parent's priority)."""
    raw = os.environ.get(NICE_ENV, str(DEFAULT_NICE))
    try:
        nice = int(raw)
    except ValueError:
        nice = -1
    if not 0 <= nice <= 19:
        raise ValueError(f"{NICE_ENV} must be an integer from 0 to 19 (added to the parent's nice value), got {raw!r}")
    return nice


def python_command(module: str, args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", module, *args]


def popen(
    module: str,
    args: Sequence[str],
    cwd: str | os.PathLike,
    memory_bytes: int | None = None,
    env: dict[str, str] | None = None,
    read_only: Iterable[str | os.PathLike] = (),
    cpu_seconds: int | None = None,
    share_net: bool = False,
    keep_fds: Sequence[int] = (),
    **kwargs,
) -> subprocess.Popen:
    """Start `python -m module args` in the sandbox with `cwd` as its folder, the only one it may write.

    `read_only`: files outside that folder it may read (a local `amct compress`'s inputs). `keep_fds`:
    descriptors the child inherits under the same numbers (the fork server's control socket). Raises
    bubblewrap.SandboxUnavailable when there is no sandbox and no opt-out.
    """
    workdir = Path(cwd).resolve()
    state = bubblewrap.require()
    extra = dict(env or {})
    extra[NICE_ENV] = str(child_nice())
    if memory_bytes:
        extra[MEMORY_ENV] = str(memory_bytes)
    if cpu_seconds:
        extra[CPU_ENV] = str(int(cpu_seconds))
    if state.mode != "bubblewrap":
        log.warning("SECURITY: %s runs a user model WITHOUT a sandbox (%s)", module, state.detail)
        extra[PARENT_ENV] = str(os.getpid())  # bwrap's --die-with-parent does this otherwise
        return subprocess.Popen(
            python_command(module, args),
            cwd=workdir,
            env=child_env(extra),
            start_new_session=True,
            pass_fds=list(keep_fds),
            **kwargs,
        )
    extra.update(HOME=bubblewrap.SANDBOX_HOME, TMPDIR=bubblewrap.SANDBOX_HOME)
    assert state.bwrap is not None  # a usable state not opted out has found bwrap
    command = bubblewrap.wrap(
        python_command(module, args),
        workdir,
        [Path(p).resolve() for p in read_only],
        bwrap=state.bwrap,
        packages=[module],
        share_net=share_net,
    )
    try:
        # A new session: its own process group, so a cancel or time-out kills it and all it started.
        return subprocess.Popen(
            command.argv,
            cwd=workdir,
            env=child_env(extra),
            start_new_session=True,
            pass_fds=[*command.pass_fds, *keep_fds],
            **kwargs,
        )
    finally:
        command.close_fds()


def run(
    module: str,
    args: Sequence[str],
    cwd: str | os.PathLike,
    timeout_s: float,
    memory_bytes: int | None = None,
    cpu_seconds: int | None = None,
    read_only: Iterable[str | os.PathLike] = (),
) -> subprocess.CompletedProcess:
    """Run to completion; raises subprocess.TimeoutExpired after killing the whole group."""
    proc = popen(
        module,
        args,
        cwd,
        memory_bytes,
        cpu_seconds=cpu_seconds,
        read_only=read_only,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, bubblewrap.exit_code(proc.returncode), out, err)


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
