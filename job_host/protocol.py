"""What the job process tells whoever started it (the worker, `amct compress`): JSON lines on stdout,
and files in the job folder.

`progress`, `phase`, `metric` and `log` lines stream while it runs; at the end it writes
`result.json` (`metrics`, `artifacts` [{kind, path, media_type}]) or `error.json` (`type`, `detail`).

Recovery and cancel (docs/service.md, "Crashes, resume and cancel"):
- `checkpoint` {file, epoch, step[, group]}: a training checkpoint was written to `ckpt/<file>`; the
  worker uploads it and records it against the job. `epoch`/`step` count what is finished.
- `resumed` {epoch, step[, group]}: this attempt started from `resume.pt` (the job's last checkpoint)
  instead of from the start.
- `rendezvous` {port, nodes, world_size}: node 0 of a job across several nodes opened the ranks' store on
  that port (job_process/distributed.py); its worker publishes it for the other nodes (worker/nodes.py).
- The worker asks the child to stop by creating the file `cancel` in the job folder; the child
  checks it every training step and at every phase change, and exits with CANCELLED_EXIT.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import sys
from pathlib import Path
from typing import Any

RESULT_FILE = "result.json"
ERROR_FILE = "error.json"
SPEC_FILE = "spec.json"
CANCEL_FILE = "cancel"
CHECKPOINT_DIR = "ckpt"
RESUME_FILE = "resume.pt"
LOG_FILE = "child.log"  # the job process's stderr (tracebacks, the user model's prints)
CANCELLED_EXIT = 3  # the child stopped itself on a cancel request (not a crash)
TYPES = ("progress", "phase", "metric", "log", "checkpoint", "resumed", "rendezvous")


def signal_name(number: int) -> str:
    """A signal's name (SIGKILL), as the worker's records and the ranks' launcher say how a process died."""
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal has no name of its own
        return f"signal {number}"


_JOB_FOLDER = "job-"


def job_folder_prefix(job_id: str) -> str:
    """The start of an attempt's folder name, `job-<job id>-<random>`: the reaper and the next attempt find an
    attempt's folder by it (`job_folder_prefix("*")` matches every job's)."""
    return f"{_JOB_FOLDER}{job_id}-"


def job_of_folder(name: str) -> str:
    """The job id in an attempt folder's name."""
    return name[len(_JOB_FOLDER) :].rsplit("-", 1)[0]


# Warm start (job_process/warm.py): the flag that starts a job process before its job exists, the lines on its
# stdout that say it runs inside its sandbox (bwrap has mounted its folder: from then on the worker may rename
# it) and that its warm-up is done (read by job_host/launcher.py, never relayed), and the one line on its stdin
# that says the job's spec and files are in the folder.
WARM_FLAG = "--warm"
STARTED_LINE = '{"type": "warm_started"}'
READY_LINE = '{"type": "warm_ready"}'
START_LINE = "start"
# The fork server (job_process/zygote.py, worker/fork_server.py): its flag, and its messages on the control
# socket, JSON with file descriptors attached (SCM_RIGHTS).
FORK_SERVER_FLAG = "--fork-server"
MESSAGE_BYTES = 4096


def send(ctl: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(ctl, [data], fds)
    else:
        ctl.send(data)


def receive(ctl: socket.socket) -> tuple[dict | None, list[int]]:
    """The next message and the descriptors sent with it; (None, []) when the other side closed."""
    data, fds, _, _ = socket.recv_fds(ctl, MESSAGE_BYTES, 4)
    return (json.loads(data) if data else None), fds


def emit(type_: str, **payload: Any) -> None:
    sys.stdout.write(json.dumps({"type": type_, **payload}) + "\n")
    sys.stdout.flush()


def parse_line(line: str) -> dict | None:
    """A protocol line, or None for anything else the user's model printed."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        message = json.loads(line)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("type") not in TYPES:
        return None
    return message


MAX_JSON_BYTES = 1 << 20


def read_json_file(path: Path) -> dict | None:
    """`result.json` or `error.json` as the child left it; None when it is missing or unreadable.

    The child runs the user's model: the file may be a link it planted to a host file only the caller can
    read (the api-key). So never follow a link, and never read more than MAX_JSON_BYTES.
    """
    data = read_job_file(path, MAX_JSON_BYTES)
    try:
        value = json.loads(data) if data is not None else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def read_job_file(path: Path, limit: int, tail: bool = False) -> bytes | None:
    """Up to `limit` bytes (the last ones with `tail`) of a regular file the child wrote, never through a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        if tail and info.st_size > limit:
            f.seek(info.st_size - limit)
        return f.read(limit)
