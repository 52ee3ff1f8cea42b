"""Following a running job process: relay its news, keep the lease, cancel it, stop it at the time limit.

Every heartbeat (at least every `heartbeat_s`, and whenever the process says something) renews the
lease and records the news in one transaction (worker/records.py). A lost lease means another worker
owns the job now: the process is killed and nothing more is written. A cancel request is passed on as
the cancel file, and the process group is killed only if it has not stopped after `cancel_grace_s`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from core.db import jobstate
from core.settings import Settings
from job_host.launcher import ChildProcess
from job_host.protocol import CANCELLED_EXIT, signal_name
from worker.records import JobRecords

log = logging.getLogger(__name__)
LOST = "lost"  # the outcome when the job is no longer ours: someone else records it


def supervise(
    child: ChildProcess, records: JobRecords, settings: Settings, on_rendezvous: Callable[[dict], None] | None = None
) -> str:
    """Run `child` (started) to its end and record how the job ended; returns that outcome.

    `on_rendezvous`: called with a `rendezvous` line (node 0 of a job across several nodes, worker/nodes.py)."""
    job_id = records.job_id
    deadline = time.monotonic() + settings.job_time_limit_s
    disk_limit = settings.job_disk_limit
    last_beat, cancel_at = 0.0, None
    while not child.stdout_closed:
        batch = child.messages(timeout=min(0.5, settings.heartbeat_s))
        now = time.monotonic()
        for message in batch:
            if message["type"] == "rendezvous" and on_rendezvous is not None:
                on_rendezvous(message)
        if batch or child.stdout_closed or now - last_beat >= settings.heartbeat_s:
            last_beat = now
            lease = records.heartbeat(child.workdir, batch)
            if lease is None:
                log.warning("job %s: lease lost; stopping the child", job_id)
                child.kill()
                return LOST
            if disk_limit and (used := folder_bytes(child.workdir)) > disk_limit:
                child.kill()
                records.fail("disk_limit", _over_disk(used, disk_limit), child.workdir)
                return jobstate.FAILED
            if lease.cancel_requested and cancel_at is None:
                cancel_at = now
                child.request_cancel()
                log.info("job %s: cancel requested; asked the engine to stop", job_id)
        if cancel_at is not None and now - cancel_at > settings.cancel_grace_s:
            child.kill()  # forced: the child did not stop within the grace period
            records.cancelled(stopped_by="kill", grace_s=settings.cancel_grace_s)
            return jobstate.CANCELLED
        if now > deadline:
            child.kill()
            records.fail(
                "max_runtime_exceeded", f"the job ran longer than {settings.job_time_limit_s} s", child.workdir
            )
            return jobstate.FAILED
    return _record_exit(child, records, child.wait(), cancelling=cancel_at is not None)


def _record_exit(child: ChildProcess, records: JobRecords, returncode: int, cancelling: bool) -> str:
    if returncode == 0 and (result := child.result()) is not None:
        # A cancel that came too late to stop anything: cancel is not a rollback of finished work.
        return records.succeed(child.workdir, result)
    if cancelling:
        records.cancelled(stopped_by="engine" if returncode == CANCELLED_EXIT else f"exit code {returncode}")
        return jobstate.CANCELLED
    error = child.error()
    if error is None and (name := killed_by(returncode)) is not None:
        # Killed from outside (the OOM killer, an operator's kill -9, a segfault) rather than failing on
        # its inputs: another attempt may well finish, from the checkpoint this one left.
        log.warning("job %s: the engine process was killed by %s; retrying", records.job_id, name)
        return records.crashed(f"the engine process was killed by {name}")
    error = error or {
        "type": "crashed",
        "detail": f"the engine process exited with code {returncode}: {child.log_tail()}",
    }
    # A job that finished but missed its quality gate left its outputs in result.json: kept, not discarded.
    records.fail(
        error["type"],
        error["detail"],
        child.workdir,
        outputs=child.result() if error["type"] == "quality_gate" else None,
    )
    return jobstate.FAILED


def folder_bytes(folder: Path) -> int:
    """The disk space the files under `folder` take (allocated blocks: a sparse file counts what it holds)."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):  # written or removed meanwhile
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


def _over_disk(used: int, limit: int) -> str:
    return (
        f"the job's folder (its inputs, checkpoints and exports) grew to {used / 2**20:,.1f} MiB, past its limit of "
        f"{limit / 2**20:,.1f} MiB (the server's AMCT_JOB_DISK_BYTES)"
    )


def killed_by(returncode: int) -> str | None:
    """The signal's name when the process died of one: Popen's -N, or a wrapper's 128 + N; else None."""
    number = -returncode if returncode < 0 else returncode - 128 if 128 < returncode < 160 else None
    return None if number is None else signal_name(number)
