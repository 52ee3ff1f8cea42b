"""What the worker writes about a job while and after it runs: heartbeats, artifacts, its outcome.

Blobs go to the store before the rows that point at them, so a row never names bytes that are not
stored yet. Every status change and lease write goes through core/db/jobstate.py, fenced on the
lease owner: a worker that lost its job (reclaimed after its lease ran out) writes nothing more.

The job process's training checkpoints are uploaded as they come and kept as the job's one
`train_state` artifact; a later attempt resumes from it (worker/inputs.py).
"""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy import delete, select
from sqlalchemy.orm import sessionmaker

from core.db import jobstate
from core.db.models import Artifact
from core.storage import BlobStore
from job_host.protocol import CHECKPOINT_DIR, LOG_FILE

log = logging.getLogger(__name__)
TRAIN_STATE = "train_state"  # the artifact kind of the job's last training checkpoint


def last_checkpoint(sessions: sessionmaker, job_id: str) -> str | None:
    """The sha256 of the job's newest training checkpoint, or None."""
    with sessions() as session:
        return session.scalars(
            select(Artifact.sha256)
            .where(Artifact.job_id == job_id, Artifact.kind == TRAIN_STATE)
            .order_by(Artifact.created_at.desc())
        ).first()


class JobRecords:
    """The database and store writes for one attempt of one job, as the lease holder `owner`."""

    def __init__(self, sessions: sessionmaker, store: BlobStore, job_id: str, owner: str, lease_s: float) -> None:
        self.sessions, self.store, self.job_id, self.owner, self.lease_s = sessions, store, job_id, owner, lease_s

    # -- while the job process runs ------------------------------------------------------------------
    def heartbeat(self, workdir: Path, messages: list[dict]) -> jobstate.Lease | None:
        """Record the job process's news and renew the lease, in one transaction; None when the job is not ours."""
        phase = next((m["phase"] for m in reversed(messages) if m.get("phase")), None)
        progress = next((m["progress"] for m in reversed(messages) if m.get("progress") is not None), None)
        checkpoint = self._upload_checkpoints(workdir, messages)
        with self.sessions.begin() as session:
            lease = jobstate.renew_lease(session, self.job_id, self.owner, self.lease_s, phase=phase, progress=progress)
            if lease is None:
                return None
            if checkpoint is not None:  # the job keeps one: its newest
                session.execute(delete(Artifact).where(Artifact.job_id == self.job_id, Artifact.kind == TRAIN_STATE))
                session.add(
                    self._row(
                        {
                            "kind": TRAIN_STATE,
                            "filename": f"{TRAIN_STATE}.pt",
                            "media_type": "application/octet-stream",
                        },
                        checkpoint,
                    )
                )
            for m in _coalesce(messages):
                kind = m.pop("type")
                jobstate.add_event(session, self.job_id, kind, m)
        return lease

    def _upload_checkpoints(self, workdir: Path, messages: list[dict]):
        """Store the checkpoints the job process announced; the blob of the newest one stored, or None."""
        newest = None
        for m in messages:
            if m.get("type") != "checkpoint":
                continue
            name = str(m.pop("file", ""))
            path = workdir / CHECKPOINT_DIR / name
            # The name comes from a process that runs the user's model: never a path out of ckpt/, nor a link.
            if not name or Path(name).name != name or not _regular_inside(workdir, path):
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

    # -- outcomes ------------------------------------------------------------------------------------
    def succeed(self, workdir: Path, result: dict) -> str:
        """Store the outputs result.json lists and the log; `succeeded`, or `lost` when the job is no longer ours."""
        stored = [(a, self.store.put_file(_inside(workdir, a["path"]))) for a in result["artifacts"]]
        stored.append(self._log_blob(workdir))
        with self.sessions.begin() as session:
            # The finished job's outputs replace its resume point (the `checkpoint` artifact is the model).
            session.execute(delete(Artifact).where(Artifact.job_id == self.job_id, Artifact.kind == TRAIN_STATE))
            session.add_all(self._row(spec, blob) for spec, blob in stored)
            done = jobstate.transition(
                session,
                self.job_id,
                jobstate.RUNNING,
                jobstate.SUCCEEDED,
                owner=self.owner,
                values={"metrics": result["metrics"], "progress": 1.0, "phase": None},
                event={"metrics": result["metrics"]},
            )
            if not done:
                session.rollback()
                return "lost"
        return jobstate.SUCCEEDED

    def fail(self, error_type: str, detail: str, workdir: Path | None, outputs: dict | None = None) -> None:
        """Fail the job with the error a user reads; the job process's log goes with it when there is one.

        `outputs` (`artifacts`, `metrics`): what a job that finished but missed its quality gate made,
        stored for inspection as a success's would be."""
        artifacts = [self._log_blob(workdir)] if workdir is not None and (workdir / LOG_FILE).exists() else []
        values = {"error_type": error_type, "error_detail": detail[:4000], "phase": None}
        if outputs and workdir is not None:
            artifacts += [(a, self.store.put_file(_inside(workdir, a["path"]))) for a in outputs.get("artifacts", [])]
            values["metrics"] = outputs.get("metrics")
        self.finish(jobstate.FAILED, values, {"error": {"type": error_type, "detail": detail[:500]}}, artifacts)

    def crashed(self, detail: str) -> str:
        """The engine process died of a signal: queued for another attempt (or failed after the last);
        returns the state, or `lost` when the job is no longer ours."""
        with self.sessions.begin() as session:
            return jobstate.requeue_crashed(session, self.job_id, self.owner, detail) or "lost"

    def cancelled(self, **event) -> None:
        self.finish(jobstate.CANCELLED, {"phase": None}, {"reason": "cancel requested", **event})

    def finish(self, to: str, values: dict, event: dict, artifacts=()) -> bool:
        with self.sessions.begin() as session:
            session.add_all(self._row(spec, blob) for spec, blob in artifacts)
            done = jobstate.transition(
                session, self.job_id, jobstate.RUNNING, to, owner=self.owner, values=values, event=event
            )
            if not done:
                session.rollback()
            return done

    def _log_blob(self, workdir: Path):
        path = _inside(workdir, str(workdir / LOG_FILE))
        spec = {"kind": "log", "path": str(path), "filename": "engine.log", "media_type": "text/plain"}
        return spec, self.store.put_file(path)

    def _row(self, spec: dict, blob) -> Artifact:
        return Artifact(
            job_id=self.job_id,
            kind=spec["kind"],
            media_type=spec["media_type"],
            filename=spec.get("filename") or Path(spec["path"]).name,
            sha256=blob.sha256,
            size_bytes=blob.size_bytes,
            uri=blob.uri,
        )


def _inside(workdir: Path, path: str) -> Path:
    """A result path the job process wrote, refused unless it is a file in the job folder (links resolved:
    the child may plant one pointing at a host file the worker can read)."""
    if not _regular_inside(workdir, Path(path)):
        raise ValueError(f"the engine listed an output that is not a file in its job folder: {Path(path).name}")
    return Path(path).resolve()


def _regular_inside(workdir: Path, path: Path) -> bool:
    return not path.is_symlink() and path.resolve().is_relative_to(workdir.resolve()) and path.is_file()


def _coalesce(messages: list[dict]) -> list[dict]:
    """Keep every phase/log/metric line but only the newest progress line of a batch."""
    last_progress = max((i for i, m in enumerate(messages) if m["type"] == "progress"), default=-1)
    return [m for i, m in enumerate(messages) if m["type"] != "progress" or i == last_progress]
