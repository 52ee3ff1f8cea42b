"""Request and response bodies (pydantic v2): the API's contract, as OpenAPI shows it at /docs."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

JobKind = Literal["distill", "compressed_retrain", "quant_retrain", "prune_retrain"]
Device = Literal["cpu", "cuda", "npu"]
JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]


class _Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class ModelOut(_Out):
    id: str
    name: str
    format: str
    sha256: str
    size_bytes: int
    input_shape: list[int]
    input_dtype: str
    status: Literal["validating", "ready", "invalid"]
    status_detail: str | None = None
    layers: dict[str, Any] | None = None
    created_at: datetime


class ConfigOut(_Out):
    id: str
    name: str
    kind: Literal["retrain", "distill"]
    sha256: str
    size_bytes: int
    summary: dict[str, Any] = Field(description="which job kinds accept this cfg, and why not")
    created_at: datetime


class DatasetOut(_Out):
    id: str
    name: str
    format: Literal["npz", "safetensors"]
    sha256: str
    size_bytes: int
    description: dict[str, Any]
    created_at: datetime


class JobCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: JobKind
    model_id: str
    config_id: str
    dataset_id: str
    epochs: int = Field(1, ge=1, le=1000)
    batch_size: int = Field(64, ge=1, le=65536)
    lr: float = Field(1e-3, gt=0, le=10)
    device: Device = "cpu"
    eval_fraction: float = Field(0.1, ge=0, lt=1, description="held-out share of the dataset for the report")
    seed: int = Field(0, ge=0, le=2**31 - 1)
    deploy_format: Literal["onnx", "ascend"] = Field(
        "onnx", description="deploy model layout: onnxruntime integer model, or AMCT's Ascend layout for ATC"
    )


class JobError(BaseModel):
    type: str
    detail: str | None = None


class JobOut(_Out):
    id: str
    kind: JobKind
    status: JobStatus
    phase: str | None
    progress: float
    model_id: str
    config_id: str
    dataset_id: str
    params: dict[str, Any]
    device: Device
    queue: str
    attempt: int
    metrics: dict[str, Any] | None
    error: JobError | None
    cancel_requested: bool
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    links: dict[str, str]


class JobPage(BaseModel):
    items: list[JobOut]
    next_cursor: str | None


class ArtifactOut(_Out):
    id: str
    job_id: str
    kind: str
    filename: str
    media_type: str
    sha256: str
    size_bytes: int
    created_at: datetime
    content_url: str


class ArtifactList(BaseModel):
    items: list[ArtifactOut]


Scope = Literal["read", "write", "admin"]


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    scopes: list[Scope] = Field(default=["read"], min_length=1, description="admin implies write implies read")
    name: str = Field("", max_length=200, description="what the key is for")


class KeyOut(_Out):
    id: str
    name: str
    prefix: str = Field(description="the secret's first characters, to tell keys apart")
    scopes: list[Scope]
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


class KeyCreated(KeyOut):
    secret: str = Field(description="the API key itself: shown in this response only, never again")


class KeyList(BaseModel):
    items: list[KeyOut]


class Me(BaseModel):
    project: str
    scopes: list[Scope]
    key_id: str | None = Field(description="null when the server runs without authentication")
