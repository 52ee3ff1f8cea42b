"""The tables (SQLAlchemy 2). Portable types only, so one Alembic chain serves SQLite and PostgreSQL.

Bytes never live here: every file is a blob in the content-addressed store, named by its sha256.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, DateTime, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id() -> str:
    return str(uuid.uuid4())


class UTCDateTime(TypeDecorator):
    """Timezone-aware UTC in Python whatever the backend; SQLite stores naive UTC text."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is not None and value.tzinfo is not None:
            value = value.astimezone(UTC)
            if dialect.name == "sqlite":
                value = value.replace(tzinfo=None)
        return value

    def process_result_value(self, value, dialect):
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UTCDateTime, dict[str, Any]: JSON}


class Project(Base):
    __tablename__ = "projects"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiKey(Base):
    """An API key: only its SHA-256 is kept (the secret is shown once); `prefix` tells keys apart in lists."""

    __tablename__ = "api_keys"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"), index=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[list[str]] = mapped_column(JSON)  # read | write | admin
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(default=None)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)


class BlobMixin:
    """The uploaded or produced file: where it is and what it is."""

    sha256: Mapped[str] = mapped_column(String(64), index=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    uri: Mapped[str] = mapped_column(Text)


class Model(BlobMixin, Base):
    __tablename__ = "models"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    format: Mapped[str] = mapped_column(String(32), default="torchscript")  # torchscript | hf_folder
    input_shape: Mapped[list[int]] = mapped_column(JSON)  # [1, 1, 28, 28]
    input_dtype: Mapped[str] = mapped_column(String(16), default="float32")
    # The signature (job_host/signature.py): [{name, shape, dtype}] and the output structure the
    # upload check recorded. None on rows from before migration 0003: `input_shape` is the signature then.
    inputs: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, default=None)
    outputs: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    status: Mapped[str] = mapped_column(String(16))  # validating | ready | invalid
    status_detail: Mapped[str | None] = mapped_column(Text, default=None)
    layers: Mapped[dict[str, Any] | None] = mapped_column(default=None)  # {"quantizable": [...], ...}
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    @property
    def signature(self) -> list[dict[str, Any]]:
        from job_host.signature import from_input_shape

        return self.inputs or from_input_shape(self.input_shape, self.input_dtype)


class Config(BlobMixin, Base):
    __tablename__ = "configs"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(16))  # retrain | distill | calibration | llm (job_host/kinds.py)
    # Which engine APIs accept the cfg (`quant`, `prune`, `compressed`), with the reason when not.
    summary: Mapped[dict[str, Any]] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Dataset(BlobMixin, Base):
    __tablename__ = "datasets"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    format: Mapped[str] = mapped_column(String(16))  # npz | safetensors | text | jsonl
    description: Mapped[dict[str, Any]] = mapped_column()  # arrays: shape, dtype; samples; has_labels
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("project_id", "idempotency_key", name="uq_jobs_idempotency"),
        Index("ix_jobs_list", "project_id", "created_at", "id"),
        # GET /v1/jobs?status=… / ?kind=…, and the quota's count of a project's active jobs (migration 0005).
        Index("ix_jobs_list_status", "project_id", "status", "created_at", "id"),
        Index("ix_jobs_list_kind", "project_id", "kind", "created_at", "id"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16), index=True)
    phase: Mapped[str | None] = mapped_column(String(32), default=None)
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    model_id: Mapped[str] = mapped_column(ForeignKey("models.id"))
    config_id: Mapped[str] = mapped_column(ForeignKey("configs.id"))
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id"))
    params: Mapped[dict[str, Any]] = mapped_column()  # epochs, batch_size, lr, eval_fraction, seed
    device: Mapped[str] = mapped_column(String(8))
    queue: Mapped[str] = mapped_column(String(200))
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    lease_owner: Mapped[str | None] = mapped_column(String(200), default=None)
    lease_expires_at: Mapped[datetime | None] = mapped_column(default=None)
    cancel_requested_at: Mapped[datetime | None] = mapped_column(default=None)
    metrics: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    error_type: Mapped[str | None] = mapped_column(String(64), default=None)
    error_detail: Mapped[str | None] = mapped_column(Text, default=None)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), default=None)
    request_hash: Mapped[str | None] = mapped_column(String(64), default=None)
    # The last job_events.seq handed out; bumped in the same UPDATE that takes the row lock.
    event_seq: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)  # the first attempt's start
    attempt_started_at: Mapped[datetime | None] = mapped_column(default=None)  # the current attempt's
    finished_at: Mapped[datetime | None] = mapped_column(default=None)


class JobEvent(Base):
    __tablename__ = "job_events"
    __table_args__ = (UniqueConstraint("job_id", "seq", name="uq_job_events_seq"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    seq: Mapped[int] = mapped_column(Integer)
    ts: Mapped[datetime] = mapped_column(default=utcnow)
    type: Mapped[str] = mapped_column(String(16))  # state | phase | progress | metric | log
    payload: Mapped[dict[str, Any]] = mapped_column()


class Artifact(BlobMixin, Base):
    __tablename__ = "artifacts"
    # A job's artifacts by kind: their listing, and the last checkpoint a new attempt resumes from.
    __table_args__ = (Index("ix_artifacts_job_kind", "job_id", "kind"),)
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(32))  # config | record | checkpoint | fake_quant | deploy | ...
    filename: Mapped[str] = mapped_column(String(255))
    media_type: Mapped[str] = mapped_column(String(100))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class JobNode(Base):
    """One node of an attempt of a job across several nodes (worker/nodes.py): which worker runs its ranks.
    Node 0's row, written by the worker that claimed the job, holds the rendezvous the others connect to."""

    __tablename__ = "job_nodes"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner: Mapped[str] = mapped_column(String(200))
    address: Mapped[str | None] = mapped_column(String(200), default=None)
    port: Mapped[int | None] = mapped_column(Integer, default=None)
    joined_at: Mapped[datetime] = mapped_column(default=utcnow)


class Worker(Base):
    """A Celery worker and the queues it consumes, kept fresh by its heartbeat (core/workers.py)."""

    __tablename__ = "workers"
    name: Mapped[str] = mapped_column(String(200), primary_key=True)  # <celery node name>:<pid>
    queues: Mapped[list[str]] = mapped_column(JSON)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
