"""Service settings from the environment (pydantic-settings).

With nothing set, everything lives under one data folder on this machine: SQLite, a
filesystem message queue and a local artifact store (the embedded mode of `amct serve`).
`DATABASE_URL`, `BROKER_URL` and `ARTIFACT_STORE` switch to PostgreSQL, Redis and S3.
"""

from __future__ import annotations

import os
import shutil
from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from core.db.session import PoolSize

DEVICES = ("cpu", "cuda", "npu")
# The environment variable with the pid of the process a worker must not outlive (`amct serve`'s embedded
# worker, service/embedded_worker.py; read by worker/lifecycle.py).
DIE_WITH_PARENT_ENV = "AMCT_WORKER_DIE_WITH_PARENT"
DEFAULT_DEVICE = "cpu"
MiB = 1024 * 1024


def _env(name: str) -> AliasChoices:
    # The three wiring variables keep their conventional names; AMCT_-prefixed spellings work too.
    return AliasChoices(name, f"AMCT_{name}")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AMCT_", populate_by_name=True, extra="ignore")

    data_dir: Path = Field(default=Path("var"), description="root of every embedded default")
    database_url: str | None = Field(default=None, validation_alias=_env("DATABASE_URL"))
    broker_url: str | None = Field(default=None, validation_alias=_env("BROKER_URL"))
    artifact_store: str | None = Field(default=None, validation_alias=_env("ARTIFACT_STORE"))
    s3_endpoint_url: str | None = Field(default=None, validation_alias=_env("S3_ENDPOINT_URL"))

    # Queue names are `<queue_prefix>.<device>`: tests give each run its own prefix.
    queue_prefix: str = "amct.jobs"
    # The local project: the embedded mode's first start makes its admin key; `open` auth acts as it.
    project: str = "default"
    # `keys`: every /v1 request needs `Authorization: Bearer <key>`. `open`: no authentication, loopback
    # clients only, every request acts as `project` with all scopes (local development; warned at start).
    auth: Literal["keys", "open"] = "keys"
    # Quota: queued + running jobs per project; one more is refused with 429 and Retry-After.
    max_active_jobs: int = Field(default=20, ge=1)
    quota_retry_after_s: int = Field(default=30, ge=1)

    max_model_bytes: int = 512 * MiB
    max_config_bytes: int = 1 * MiB
    max_dataset_bytes: int = 2048 * MiB
    # A TorchScript file and an .npz are zip archives: bound what they may unpack to.
    max_unpacked_bytes: int = 8192 * MiB
    max_zip_entries: int = 10_000

    validate_timeout_s: float = 300.0
    validate_memory_bytes: int = 8192 * MiB
    # Uploads checked at once (service/checks.py); one more gets 429 with Retry-After.
    max_concurrent_model_checks: int = Field(default=2, ge=1)
    max_concurrent_dataset_checks: int = Field(default=2, ge=1)
    check_retry_after_s: int = Field(default=5, ge=1)
    # The worker renews its lease while the engine runs; a job whose lease ran out lost its worker.
    lease_s: float = 120.0
    heartbeat_s: float = 5.0
    max_attempts: int = 3
    job_time_limit_s: int = 24 * 3600
    # Per job (docs/service.md, "Limits"): the address space of a CPU job's engine process, and the bytes its
    # folder may hold (its staged inputs, checkpoints and exports). None: sized from the machine when the
    # worker starts (job_memory_limit, job_disk_limit); 0: no limit.
    job_memory_bytes: int | None = Field(default=None, ge=0)
    job_disk_bytes: int | None = Field(default=None, ge=0)
    # Redis re-delivers unacked messages after this; it must outlive the longest job (docs/spec/service.md §2a).
    visibility_timeout_s: int = 26 * 3600
    # Recovery (docs/service.md): training checkpoints at every epoch end and every N steps (0: epochs
    # only); a cancelled job's engine gets cancel_grace_s to stop by itself before it is killed; the
    # reaper runs every reap_interval_s and re-sends a queued job nobody claimed for requeue_after_s
    # (its message may have been lost with a broker restart; a duplicate is a no-op).
    checkpoint_every_steps: int = Field(default=500, ge=0)
    cancel_grace_s: float = 30.0
    reap_interval_s: float = 30.0
    requeue_after_s: float = 600.0
    # The API process reaps too: a worker's beat-scheduled reap waits behind the job that worker runs
    # (one process per device), the API never does. Reaps are idempotent, so several may run.
    reap_in_api: bool = True
    # The worker registry (core/workers.py): each worker renews its row every worker_heartbeat_s; one
    # silent for worker_stale_s is gone. A queued job for a device no live worker of this deployment
    # serves fails after unserved_wait_s (a submit is refused at once when the registry already says so).
    worker_heartbeat_s: float = Field(default=10.0, gt=0)
    worker_stale_s: float = Field(default=30.0, gt=0)
    unserved_wait_s: float = Field(default=20.0, ge=0)
    # Each worker process keeps one sandboxed job process started ahead of its job, torch and the engine
    # imported (worker/warm.py); off: every job's child starts when the job is claimed.
    warm_start: bool = True
    # ... as a fork server (worker/fork_server.py): warmed up once, it forks each job's child (one job at a
    # time); off: one warm process per job, each warming up on its own.
    fork_server: bool = True
    # Jobs across several nodes (docs/scaling.md, "Distributed jobs"): off unless the operator accepts that
    # such a job's sandboxes share the host's network. `node_address`: where this worker's node 0 is reached
    # by the others (default: the address of this host's name); how long the ranks wait for the other nodes.
    multinode: bool = False
    node_address: str | None = None
    node_join_timeout_s: float = Field(default=600.0, gt=0)
    # The API (docs/scaling.md, "The API"): uvicorn worker processes of `amct serve`, and each process's
    # PostgreSQL pool. processes x (pool + overflow) + the workers' connections must stay under the
    # server's max_connections (100 by default).
    api_workers: int = Field(default=1, ge=1)
    db_pool_size: int = Field(default=10, ge=1)
    db_max_overflow: int = Field(default=10, ge=0)
    db_pool_timeout_s: float = Field(default=10.0, gt=0)
    broker_poll_s: float = 0.1
    sse_poll_s: float = 0.25

    @model_validator(mode="after")
    def _recovery_timings_hold_together(self) -> Settings:
        # Past the visibility timeout Redis hands a running job's message out again: it must outlive
        # Celery's hard limit (job_time_limit_s + 600). A lease shorter than two heartbeats expires
        # under a live worker.
        if self.visibility_timeout_s <= self.job_time_limit_s + 600:
            raise ValueError(
                f"visibility_timeout_s ({self.visibility_timeout_s}) must exceed job_time_limit_s + 600 "
                f"({self.job_time_limit_s + 600}), or Redis re-delivers jobs that are still running"
            )
        if self.lease_s < 2 * self.heartbeat_s:
            raise ValueError(f"lease_s ({self.lease_s}) must be at least 2 x heartbeat_s ({self.heartbeat_s})")
        return self

    @cached_property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.data_dir / 'amct.db').resolve()}"

    @cached_property
    def resolved_broker_url(self) -> str:
        return self.broker_url or "filesystem://"

    @cached_property
    def resolved_artifact_store(self) -> str:
        return self.artifact_store or f"file://{(self.data_dir / 'artifacts').resolve()}"

    @property
    def db_pool(self) -> PoolSize:
        return PoolSize(self.db_pool_size, self.db_max_overflow, self.db_pool_timeout_s)

    @property
    def broker_folder(self) -> Path:
        return (self.data_dir / "broker").resolve()

    @property
    def tmp_dir(self) -> Path:
        return (self.data_dir / "tmp").resolve()

    @property
    def job_memory_limit(self) -> int | None:
        """job_memory_bytes, or three quarters of the machine's memory: one job cannot take it all."""
        if self.job_memory_bytes is not None:
            return self.job_memory_bytes or None
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") * 3 // 4

    @property
    def job_disk_limit(self) -> int | None:
        """job_disk_bytes, or a quarter of the job folders' file system: one job cannot fill it."""
        if self.job_disk_bytes is not None:
            return self.job_disk_bytes or None
        folder = self.tmp_dir
        while not folder.exists():  # the folder is made with the first job
            folder = folder.parent
        return shutil.disk_usage(folder).total // 4

    def queue_for(self, device: str) -> str:
        return f"{self.queue_prefix}.{device}"


def get_settings() -> Settings:
    return Settings()
