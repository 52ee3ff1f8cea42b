"""Service settings from the environment (pydantic-settings).

With nothing set, everything lives under one data folder on this machine: SQLite, a
filesystem message queue and a local artifact store (the embedded mode of `amct serve`).
`DATABASE_URL`, `BROKER_URL` and `ARTIFACT_STORE` switch to PostgreSQL, Redis and S3.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEVICES = ("cpu", "cuda", "npu")
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
    project: str = "default"

    max_model_bytes: int = 512 * MiB
    max_config_bytes: int = 1 * MiB
    max_dataset_bytes: int = 2048 * MiB
    # A TorchScript file and an .npz are zip archives: bound what they may unpack to.
    max_unpacked_bytes: int = 8192 * MiB
    max_zip_entries: int = 10_000

    validate_timeout_s: float = 300.0
    validate_memory_bytes: int = 8192 * MiB
    # The worker renews its lease while the engine runs; a job whose lease ran out lost its worker.
    lease_s: float = 120.0
    heartbeat_s: float = 5.0
    max_attempts: int = 3
    job_time_limit_s: int = 24 * 3600
    # Redis re-delivers unacked messages after this; it must outlive the longest job (spec §2a).
    visibility_timeout_s: int = 26 * 3600
    broker_poll_s: float = 0.1
    sse_poll_s: float = 0.25

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
    def broker_folder(self) -> Path:
        return (self.data_dir / "broker").resolve()

    @property
    def tmp_dir(self) -> Path:
        return (self.data_dir / "tmp").resolve()

    def queue_for(self, device: str) -> str:
        return f"{self.queue_prefix}.{device}"


def get_settings() -> Settings:
    return Settings()
