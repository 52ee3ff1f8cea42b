"""The compression runner: claim a job, run the engine child, relay its progress, store its outputs.

Plain Python over the database and the store, so tests drive it without Celery. The worker
process itself never imports torch or loads the user's model: the child does (service/sandbox.py).

Recovery: the child's training checkpoints are uploaded as they come and kept as the job's one
`train_state` artifact; a later attempt (after a crash, a lost worker, a broker restart) hands the
child that file and it resumes from it. Cancel: the runner asks the child to stop (a file in the
job folder, see worker/child/checkpoints.py) and kills its process group only if it has not exited
after `cancel_grace_s`.
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

from sqlalchemy import delete, select, update

from service import sandbox
from service.db import jobstate
from service.db.models import Artifact, Config, Dataset, Job, Model, utcnow
from service.db.session import session_factory
from service.settings import Settings
from service.storage import BlobStore, open_store
from worker.child.protocol import (
    CANCEL_FILE,
    CANCELLED_EXIT,
    CHECKPOINT_DIR,
    ERROR_FILE,
    RESULT_FILE,
    RESUME_FILE,
    SPEC_FILE,
    parse_line,
)

log = logging.getLogger(__name__)
LOG_TAIL_BYTES = 4000
TRAIN_STATE = "train_state"  # the artifact kind of the job's last training checkpoint


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
                "dataset_format": dataset.format, "checkpoint_every_steps": self.settings.checkpoint_every_steps,
                **{k: str(workdir / name) for k, (_, name) in files.items()}}
        if checkpoint := self._last_checkpoint(job.id):
            # A previous attempt got this far: the child resumes from here instead of from the start.
            self.store.fetch(checkpoint, workdir / RESUME_FILE)
            log.info("job %s: attempt %d resumes from checkpoint %s", job.id, job.attempt, checkpoint[:12])
        (workdir / SPEC_FILE).write_text(json.dumps(spec))

    def _last_checkpoint(self, job_id: str) -> str | None:
        with self.sessions() as session:
            return session.scalars(select(Artifact.sha256).where(Artifact.job_id == job_id,
                                                                 Artifact.kind == TRAIN_STATE)
                                   .order_by(Artifact.created_at.desc())).first()

    # -- while the child runs ----------------------------------------------------------------------
    def _supervise(self, job_id: str, workdir: Path) -> str:
        stderr = open(workdir / "child.log", "wb")  # noqa: SIM115 - closed in the finally below
        proc = sandbox.popen("worker.child.compress", [str(workdir)], cwd=workdir, stdout=subprocess.PIPE,
                             stderr=stderr, text=True, bufsize=1)
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
        deadline = time.monotonic() + self.settings.job_time_limit_s
        eof, last_beat, cancel_at = False, 0.0, None
        try:
            while not eof:
                batch, eof = _drain(lines, timeout=min(0.5, self.settings.heartbeat_s))
                now = time.monotonic()
                if batch or eof or now - last_beat >= self.settings.heartbeat_s:
                    last_beat = now
                    owned, cancel = self._heartbeat(job_id, batch, workdir)
                    if not owned:
                        log.warning("job %s: lease lost; stopping the child", job_id)
                        sandbox.kill_group(proc)
                        return "lost"
                    if cancel and cancel_at is None:
                        cancel_at = now
                        (workdir / CANCEL_FILE).touch()  # the child checks it every step (cooperative)
                        log.info("job %s: cancel requested; asked the engine to stop", job_id)
                if cancel_at is not None and now - cancel_at > self.settings.cancel_grace_s:
                    sandbox.kill_group(proc)  # forced: the child did not stop within the grace period
                    self._finish(job_id, jobstate.CANCELLED, {"phase": None},
                                 {"reason": "cancel requested", "stopped_by": "kill",
                                  "grace_s": self.settings.cancel_grace_s})
                    return jobstate.CANCELLED
                if now > deadline:
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
            # A cancel that came too late to stop anything: cancel is not a rollback of finished work.
            return self._succeed(job_id, workdir)
        if cancel_at is not None:
            stopped_by = "engine" if returncode == CANCELLED_EXIT else f"exit code {returncode}"
            self._finish(job_id, jobstate.CANCELLED, {"phase": None},
                         {"reason": "cancel requested", "stopped_by": stopped_by})
            return jobstate.CANCELLED
        error = _read_json(workdir / ERROR_FILE) or {
            "type": "crashed", "detail": f"the engine process exited with code {returncode}: {_tail(workdir)}"}
        self._fail(job_id, error["type"], error["detail"], workdir)
        return jobstate.FAILED

    def _heartbeat(self, job_id: str, messages: list[dict], workdir: Path) -> tuple[bool, bool]:
        """Record the child's news and renew the lease, fenced on our ownership, in one transaction."""
        values = {"lease_expires_at": utcnow() + timedelta(seconds=self.settings.lease_s), "updated_at": utcnow()}
        for m in messages:
            if m.get("phase"):
                values["phase"] = m["phase"]
            if m.get("progress") is not None:
                values["progress"] = float(m["progress"])
        checkpoint = self._upload_checkpoints(workdir, messages)  # blobs before rows, as at the end
        with self.sessions.begin() as session:
            row = session.execute(
                update(Job).where(Job.id == job_id, Job.status == jobstate.RUNNING, Job.lease_owner == self.owner)
                .values(**values).returning(Job.cancel_requested_at)
            ).first()
            if row is None:
                return False, False
            if checkpoint is not None:  # the job keeps one: its newest
                session.execute(delete(Artifact).where(Artifact.job_id == job_id, Artifact.kind == TRAIN_STATE))
                session.add(_artifact_row(job_id, {"kind": TRAIN_STATE, "filename": f"{TRAIN_STATE}.pt",
                                                   "media_type": "application/octet-stream"}, checkpoint))
            for m in _coalesce(messages):
                kind = m.pop("type")
                jobstate.add_event(session, job_id, kind, m)
        return True, row[0] is not None

    def _upload_checkpoints(self, workdir: Path, messages: list[dict]):
        """Store the checkpoints the child announced; the blob of the newest one stored, or None."""
        newest = None
        for m in messages:
            if m.get("type") != "checkpoint":
                continue
            name = str(m.pop("file", ""))
            path = workdir / CHECKPOINT_DIR / name
            # The name comes from a process that runs the user's model: never a path out of ckpt/.
            if not name or Path(name).name != name or not path.is_file():
                m.update(type="log", level="warning", message=f"ignored a checkpoint line naming {name!r}")
                continue
            try:
                newest = self.store.put_file(path)
            except Exception as e:  # the next checkpoint may get through; a store hiccup must not fail the job
                log.warning("checkpoint %s not stored: %s", path, e)
                m.update(type="log", level="warning", message=f"checkpoint at step {m.get('step')} not stored: {e}")
                continue
            m.update(sha256=newest.sha256, size_bytes=newest.size_bytes)
            path.unlink(missing_ok=True)
        return newest

    # -- outcomes ----------------------------------------------------------------------------------
    def _succeed(self, job_id: str, workdir: Path) -> str:
        result = json.loads((workdir / RESULT_FILE).read_text())
        # Blobs first, rows after: a row never points at bytes that are not in the store yet.
        stored = [(a, self.store.put_file(_inside(workdir, a["path"]))) for a in result["artifacts"]]
        stored.append(self._log_blob(workdir))
        with self.sessions.begin() as session:
            # The finished job's outputs replace its resume point (the `checkpoint` artifact is the model).
            session.execute(delete(Artifact).where(Artifact.job_id == job_id, Artifact.kind == TRAIN_STATE))
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


def _inside(workdir: Path, path: str) -> Path:
    """A result path the child wrote, refused unless it lies in the job folder."""
    resolved = Path(path).resolve()
    if not resolved.is_relative_to(workdir.resolve()):
        raise ValueError(f"the engine listed an output outside its job folder: {path}")
    return resolved


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
