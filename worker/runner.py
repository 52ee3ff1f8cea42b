"""The compression runner: claim a job, run the engine child, relay its progress, store its outputs.

Plain Python over the database and the store, so tests drive it without Celery. The worker
process itself never imports torch or loads the user's model: the child does (service/sandbox.py).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

from sqlalchemy import update

from service import sandbox
from service.db import jobstate
from service.db.models import Artifact, Config, Dataset, Job, Model, utcnow
from service.db.session import session_factory
from service.settings import Settings
from service.storage import BlobStore, open_store
from worker.child.protocol import ERROR_FILE, RESULT_FILE, SPEC_FILE, parse_line

log = logging.getLogger(__name__)
LOG_TAIL_BYTES = 4000


class JobRunner:
    def __init__(self, settings: Settings, store: BlobStore | None = None, owner: str | None = None) -> None:
        self.settings = settings
        self.store = store or open_store(settings.resolved_artifact_store, settings.s3_endpoint_url)
        self.sessions = session_factory(settings.resolved_database_url)
        self.owner = owner or f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

    # -- the whole job -----------------------------------------------------------------------------
    def run(self, job_id: str) -> str:
        """Run the job if this delivery can claim it; returns the outcome (`skipped` for a no-op)."""
        with self.sessions.begin() as session:
            job = jobstate.claim_job(session, job_id, self.owner, self.settings.lease_s)
            if job is not None and job.attempt > job.max_attempts:
                jobstate.transition(session, job_id, jobstate.RUNNING, jobstate.FAILED, owner=self.owner,
                                    values={"error_type": "crashed",
                                            "error_detail": f"gave up after {job.max_attempts} attempts"})
                return jobstate.FAILED
        if job is None:
            log.info("job %s: delivery ignored (already claimed, cancelled or finished)", job_id)
            return "skipped"
        log.info("job %s: claimed by %s (attempt %d)", job_id, self.owner, job.attempt)
        workdir = Path(tempfile.mkdtemp(prefix=f"job-{job_id}-", dir=self._scratch()))
        try:
            self._prepare(job, workdir)
            return self._supervise(job_id, workdir)
        except Exception as e:
            log.exception("job %s: runner error", job_id)
            self._fail(job_id, "internal", f"{type(e).__name__}: {e}", workdir)
            return jobstate.FAILED
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _scratch(self) -> Path:
        self.settings.tmp_dir.mkdir(parents=True, exist_ok=True)
        return self.settings.tmp_dir

    # -- inputs ------------------------------------------------------------------------------------
    def _prepare(self, job: Job, workdir: Path) -> None:
        with self.sessions() as session:
            model = session.get(Model, job.model_id)
            config = session.get(Config, job.config_id)
            dataset = session.get(Dataset, job.dataset_id)
        files = {"model": (model.sha256, "model.pt"), "cfg": (config.sha256, "job.cfg"),
                 "dataset": (dataset.sha256, f"dataset.{dataset.format}")}
        for sha256, name in files.values():
            self.store.fetch(sha256, workdir / name)
        spec = {"kind": job.kind, "device": job.device, "params": job.params,
                "input_shape": model.input_shape, "input_dtype": model.input_dtype,
                "dataset_format": dataset.format, **{k: str(workdir / name) for k, (_, name) in files.items()}}
        (workdir / SPEC_FILE).write_text(json.dumps(spec))

    # -- while the child runs ----------------------------------------------------------------------
    def _supervise(self, job_id: str, workdir: Path) -> str:
        stderr = open(workdir / "child.log", "wb")  # noqa: SIM115 - closed in the finally below
        proc = sandbox.popen("worker.child.compress", [str(workdir)], cwd=workdir, stdout=subprocess.PIPE,
                             stderr=stderr, text=True, bufsize=1)
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
        deadline = time.monotonic() + self.settings.job_time_limit_s
        eof, last_beat = False, 0.0
        try:
            while not eof:
                batch, eof = _drain(lines, timeout=min(0.5, self.settings.heartbeat_s))
                if not batch and not eof and time.monotonic() - last_beat < self.settings.heartbeat_s:
                    continue
                last_beat = time.monotonic()
                owned, cancel = self._heartbeat(job_id, batch)
                if not owned:
                    log.warning("job %s: lease lost; stopping the child", job_id)
                    sandbox.kill_group(proc)
                    return "lost"
                if cancel:
                    sandbox.kill_group(proc)
                    self._finish(job_id, jobstate.CANCELLED, {"phase": None}, {"reason": "cancel requested"})
                    return jobstate.CANCELLED
                if time.monotonic() > deadline:
                    sandbox.kill_group(proc)
                    self._fail(job_id, "max_runtime_exceeded",
                               f"the job ran longer than {self.settings.job_time_limit_s} s", workdir)
                    return jobstate.FAILED
            returncode = proc.wait()
        finally:
            if proc.poll() is None:
                sandbox.kill_group(proc)
                proc.wait()
            stderr.close()
        if returncode == 0 and (workdir / RESULT_FILE).exists():
            return self._succeed(job_id, workdir)
        error = _read_json(workdir / ERROR_FILE) or {
            "type": "crashed", "detail": f"the engine process exited with code {returncode}: {_tail(workdir)}"}
        self._fail(job_id, error["type"], error["detail"], workdir)
        return jobstate.FAILED

    def _heartbeat(self, job_id: str, messages: list[dict]) -> tuple[bool, bool]:
        """Record the child's news and renew the lease, fenced on our ownership, in one transaction."""
        values = {"lease_expires_at": utcnow() + timedelta(seconds=self.settings.lease_s), "updated_at": utcnow()}
        for m in messages:
            if m.get("phase"):
                values["phase"] = m["phase"]
            if m.get("progress") is not None:
                values["progress"] = float(m["progress"])
        with self.sessions.begin() as session:
            row = session.execute(
                update(Job).where(Job.id == job_id, Job.status == jobstate.RUNNING, Job.lease_owner == self.owner)
                .values(**values).returning(Job.cancel_requested_at)
            ).first()
            if row is None:
                return False, False
            for m in _coalesce(messages):
                kind = m.pop("type")
                jobstate.add_event(session, job_id, kind, m)
        return True, row[0] is not None

    # -- outcomes ----------------------------------------------------------------------------------
    def _succeed(self, job_id: str, workdir: Path) -> str:
        result = json.loads((workdir / RESULT_FILE).read_text())
        # Blobs first, rows after: a row never points at bytes that are not in the store yet.
        stored = [(a, self.store.put_file(a["path"])) for a in result["artifacts"]]
        stored.append(self._log_blob(workdir))
        with self.sessions.begin() as session:
            session.add_all(_artifact_row(job_id, spec, blob) for spec, blob in stored)
            done = jobstate.transition(session, job_id, jobstate.RUNNING, jobstate.SUCCEEDED, owner=self.owner,
                                       values={"metrics": result["metrics"], "progress": 1.0, "phase": None},
                                       event={"metrics": result["metrics"]})
            if not done:
                session.rollback()
                return "lost"
        return jobstate.SUCCEEDED

    def _fail(self, job_id: str, error_type: str, detail: str, workdir: Path | None) -> None:
        artifacts = [self._log_blob(workdir)] if workdir is not None and (workdir / "child.log").exists() else []
        values = {"error_type": error_type, "error_detail": detail[:4000], "phase": None}
        self._finish(job_id, jobstate.FAILED, values, {"error": {"type": error_type, "detail": detail[:500]}},
                     artifacts)

    def _finish(self, job_id: str, to: str, values: dict, event: dict, artifacts=()) -> bool:
        with self.sessions.begin() as session:
            session.add_all(_artifact_row(job_id, spec, blob) for spec, blob in artifacts)
            done = jobstate.transition(session, job_id, jobstate.RUNNING, to, owner=self.owner, values=values,
                                       event=event)
            if not done:
                session.rollback()
            return done

    def _log_blob(self, workdir: Path):
        path = workdir / "child.log"
        return {"kind": "log", "path": str(path), "filename": "engine.log", "media_type": "text/plain"}, \
            self.store.put_file(path)


def _artifact_row(job_id: str, spec: dict, blob) -> Artifact:
    return Artifact(job_id=job_id, kind=spec["kind"], filename=spec.get("filename") or Path(spec["path"]).name,
                    media_type=spec["media_type"], sha256=blob.sha256, size_bytes=blob.size_bytes, uri=blob.uri)


def _pump(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def _drain(lines: queue.Queue, timeout: float) -> tuple[list[dict], bool]:
    """Protocol messages that arrived within `timeout`, and whether the child closed its stdout."""
    batch: list[dict] = []
    try:
        item = lines.get(timeout=timeout)
        while True:
            if item is None:
                return batch, True
            if (message := parse_line(item)) is not None:
                batch.append(message)
            item = lines.get_nowait()
    except queue.Empty:
        return batch, False


def _coalesce(messages: list[dict]) -> list[dict]:
    """Keep every phase/log/metric line but only the newest progress line of a batch."""
    last_progress = max((i for i, m in enumerate(messages) if m["type"] == "progress"), default=-1)
    return [m for i, m in enumerate(messages) if m["type"] != "progress" or i == last_progress]


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _tail(workdir: Path) -> str:
    try:
        data = (workdir / "child.log").read_bytes()[-LOG_TAIL_BYTES:]
    except OSError:
        return ""
    lines = [ln for ln in data.decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[-1] if lines else ""
