"""The fork server's side in the sandbox (`python -m job_process.main SLOT --fork-server FD`).

A fresh job process spends about 8 s of CPU before its first step on the 2-core development machine
(docs/scaling.md, "Fork server"): importing torch, the engine, torch.export, onnx and onnxruntime, and
their first use. A warm child (warm.py) moves that cost ahead of the job but still pays it once per job,
so it bounds jobs/min on a busy machine. The fork server pays it once: it warms up, then forks one child
per job, which starts with all of it in memory (copy-on-write) and exits after its job. Android's zygote
and Chromium's do the same.

One job at a time, never two children side by side, and nothing of a job survives it
(docs/security.md, "Fork server"):
- The server never runs user code and reads no job's files: it warms up on its own tiny model, then only
  forks, waits and cleans up. After warm-up it makes itself non-dumpable, so a job (same user, same
  namespaces) can neither read nor write its memory or file descriptors through /proc (ptrace is denied by
  the seccomp filter already).
- A job's child closes the control socket before anything else, and gets its own stdout pipe (sent to the
  worker over the socket, SCM_RIGHTS), so what it prints cannot pass for the server's messages.
- When the child exits, the server (a child subreaper: the job's orphans become its children) SIGKILLs
  every other process in the sandbox's PID namespace and reaps them, then empties /tmp and /dev/shm, the
  writable places the sandbox shares between its processes, before it says the job ended. The worker
  empties the slot folder before it stages the next job there.

Only in bubblewrap (the worker does not start one without it): outside a PID namespace of its own,
`kill(-1)` and emptying /tmp would reach the host's processes and files.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import signal
import socket
import stat
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from job_host import sandbox
from job_host.protocol import LOG_FILE, emit, receive, send

PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 4, 36  # <linux/prctl.h>
SHARED_WRITABLE = ("/tmp", "/dev/shm")  # the sandbox's tmpfs folders: every process in it sees them


def serve(ctl_fd: int, warm_up: Callable[[], None], run_job: Callable[[Path], int]) -> int:
    """Warm up, then run each job the worker names in a forked child, one at a time, until it hangs up."""
    if not _own_sandbox():
        print("the fork server runs only in bubblewrap's PID namespace", file=sys.stderr)
        return 2
    ctl = socket.socket(fileno=ctl_fd)
    send(ctl, {"type": "started"})
    started = time.monotonic()
    job_threads = _warm_up_single_threaded(warm_up)
    news = f"warm engine process: forked from a fork server that warmed up in {time.monotonic() - started:.1f} s"
    _prctl(PR_SET_DUMPABLE, 0)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    send(ctl, {"type": "ready"})
    for served in itertools.count():
        message, _ = receive(ctl)
        if message is None:
            return 0
        before = f"{served} job{'' if served == 1 else 's'} before this one"
        code = _run_one(ctl, Path(message["folder"]), run_job, job_threads, f"{news}; {before}")
        _clean_up()
        send(ctl, {"type": "exit", "code": code})


def _run_one(ctl: socket.socket, folder: Path, run_job: Callable[[Path], int], job_threads: int, news: str) -> int:
    """Fork the job's child, hand its stdout to the worker, wait for it; its exit status as Popen's."""
    read, write = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _become_job(ctl, read, write, folder, run_job, job_threads, news)  # never returns
    os.close(write)
    try:
        send(ctl, {"type": "forked", "pid": pid}, [read])
    finally:
        os.close(read)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _become_job(
    ctl: socket.socket, read: int, write: int, folder: Path, run_job: Callable[[Path], int], job_threads: int, news: str
) -> None:
    code = 1
    try:
        ctl.close()  # first: nothing the job runs may speak for the server
        os.close(read)
        os.dup2(write, 1)
        os.close(write)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        log = os.open(folder / LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(log, 2)
        os.close(log)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        from job_host.sandbox import die_with_parent

        die_with_parent(os.getppid())
        _prctl(PR_SET_DUMPABLE, 1)  # its own process, as a job started fresh would be
        _prctl(PR_SET_CHILD_SUBREAPER, 0)
        import torch

        torch.set_num_threads(job_threads)
        os.chdir(folder)
        emit("log", level="info", message=news)
        code = run_job(folder)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _warm_up_single_threaded(warm_up: Callable[[], None]) -> int:
    """Run the warm-up on one thread; returns the thread count a job gets back (torch's default here).

    Forking copies only the calling thread: OpenMP's worker threads, tqdm's monitor and the like would be
    missing in the child while their state says they exist, so none is started before the first fork.
    """
    import torch
    import tqdm

    job_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tqdm.tqdm.monitor_interval = 0  # no monitor thread
    warm_up()
    return job_threads


def _clean_up() -> None:
    """Nothing of the job outlives it: its processes are killed and reaped, the shared tmpfs folders emptied."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, signal.SIGKILL)  # every process of this PID namespace but this one and bwrap (its init)
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    for folder in SHARED_WRITABLE:
        with contextlib.suppress(OSError):
            device = os.lstat(folder).st_dev
            for entry in _entries(folder):
                _remove(entry.path, device)


def _remove(path: str, device: int) -> None:
    """Remove `path` and what is under it, but nothing on another file system: the slot folder is bind-mounted
    below /tmp when the host's scratch folder is under /tmp (bwrap makes the folders above it on the tmpfs),
    and emptying it from here would delete the job folder on the host. shutil.rmtree would cross that mount."""
    try:
        st = os.lstat(path)
    except OSError:
        return
    if st.st_dev != device:
        return
    if stat.S_ISDIR(st.st_mode):
        for entry in _entries(path):
            _remove(entry.path, device)
        with contextlib.suppress(OSError):
            os.rmdir(path)  # fails where a mount point stays below it
    else:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _entries(folder: str) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as it:
            return list(it)
    except OSError:
        return []


def _own_sandbox() -> bool:
    """Inside bubblewrap's PID namespace: its init (pid 1) is bwrap, and /tmp is the sandbox's own."""
    try:
        return Path("/proc/1/comm").read_text().strip() == "bwrap" and os.environ.get("TMPDIR") == "/tmp"
    except OSError:
        return False


def _prctl(option: int, value: int) -> None:
    if not sandbox.prctl(option, value):
        raise OSError(ctypes.get_errno(), f"prctl({option}, {value}) failed")
