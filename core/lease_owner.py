"""Who holds a running job's lease, spelt so that a worker or reaper on the same machine can tell it died.

A lease is the only proof that a running job still has a worker, and it runs for `lease_s` (120 s) after the
last renewal: a pool process killed with SIGKILL (the OOM killer, an operator) held its job that long
before anyone took it over, though Celery re-delivers the message at once (`reject_on_worker_lost`). The
owner's name therefore carries its process id and the place that id means something: the machine's name and
its PID namespace. A process of the same place whose owner's pid no longer runs takes the lease over at once
(worker/runner.py on the re-delivered message, core/reaper.py on every reap). Elsewhere the lease runs out as
before: a pid means nothing across machines or containers.
"""

from __future__ import annotations

import os


def _here() -> str:
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:  # no /proc: never judge another process from here
        return ""
    return f"{os.uname().nodename}/{namespace}"


def lease_owner(node: str, task: str) -> str:
    """`<node>:<pid>:<task>:<machine>/<pid namespace>` for this process (the node first: the embedded server
    expires its dead worker's leases by that prefix, service/embedded_worker.py)."""
    return f"{node}:{os.getpid()}:{task[:8]}:{_here()}"


def gone_here(owner: str | None) -> bool:
    """True when `owner` ran in this machine's PID namespace and its process is gone (exited, or a zombie its
    parent has not reaped yet)."""
    parts = (owner or "").split(":")
    if len(parts) < 4 or not parts[1].isdigit() or not parts[-1] or parts[-1] != _here():
        return False
    return not _running(int(parts[1]))


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")  # a zombie or a dead task: it runs nothing
