"""Request and response bodies (pydantic v2): the API's contract, as OpenAPI shows it at /docs.

The values of `kind` and `deploy_format` come from their tables (job_host/kinds.py JOB_KINDS,
amct_engine/export/formats.py DEPLOY_FORMATS), read when a request is validated and when an app
renders its OpenAPI document: a kind or format registered later is accepted and listed by the next
app built. Devices and job states are fixed tuples (core/settings.py, core/db/jobstate.py). A
job's settings are job_host/spec.py's `JobParams`, which `JobCreate` extends.
"""

from __future__ import annotations

import unicodedata
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

from core.db.jobstate import STATES
from core.settings import DEFAULT_DEVICE, DEVICES
from job_host.kinds import CFG_KINDS, JOB_KINDS
from job_host.spec import DistillLoss, JobParams, Objective, OneOf


def control_character(value: str) -> str | None:
    """The first control character or lone surrogate in `value` (as U+XXXX), or None.

    Ids, names and filenames are refused with one of them before they reach the database: PostgreSQL
    cannot store a NUL in text at all (the driver raises, a 500), a lone surrogate is not UTF-8, and
    the others (newlines, escapes) forge log lines and headers.
    """
    for char in value:
        if unicodedata.category(char) in ("Cc", "Cs"):
            return f"U+{ord(char):04X}"
    return None


def _no_control_characters(value: str) -> str:
    if (char := control_character(value)) is not None:
        raise PydanticCustomError(
            "control_character",
            "contains a control character ({char}); ids, names and filenames may not",
            {"char": char},
        )
    return value


# A string with no control characters: every id (path or body) and name a request carries.
CleanStr = Annotated[str, AfterValidator(_no_control_characters)]
JobKind = Annotated[str, OneOf(JOB_KINDS.names)]
# (tuples of the names: a Literal over them, as pydantic reads it; mypy cannot see a tuple's values)
Device = Literal[DEVICES]  # type: ignore[valid-type]
JobStatus = Literal[STATES]  # type: ignore[valid-type]
CfgKind = Literal[CFG_KINDS]  # type: ignore[valid-type]


class _Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class ModelOut(_Out):
    id: str
    name: str
    format: str
    sha256: str
    size_bytes: int
    input_shape: list[int] = Field(description="the first input's example shape (the upload check ran on it)")
    input_dtype: str
    inputs: list[dict[str, Any]] = Field(
        validation_alias="signature",
        description="the signature: [{name, shape, dtype}], a dimension an integer or an axis name (dynamic)",
    )
    outputs: dict[str, Any] | None = Field(
        None,
        description="the output structure the upload check recorded: {type: tensor, shape, dtype} | "
        "{type: tuple, items: [...]} | {type: dict, items: {key: ...}}",
    )
    status: Literal["validating", "ready", "invalid"]
    status_detail: str | None = None
    layers: dict[str, Any] | None = None
    created_at: datetime


class ConfigOut(_Out):
    id: str
    name: str
    kind: CfgKind
    sha256: str
    size_bytes: int
    summary: dict[str, Any] = Field(description="which job kinds accept this cfg, and why not")
    created_at: datetime


class DatasetOut(_Out):
    id: str
    name: str
    format: Literal["npz", "safetensors", "text", "jsonl"] = Field(
        description='arrays (npz, safetensors) for the model kinds; text (.txt) or jsonl (a "text" field per '
        "line) for llm_quant"
    )
    sha256: str
    size_bytes: int
    description: dict[str, Any]
    created_at: datetime


class JobCreate(JobParams):
    """POST /v1/jobs: what to run on which files, and the job's settings (job_host/spec.py JobParams, where
    their bounds, defaults and descriptions live)."""

    kind: JobKind
    model_id: CleanStr
    config_id: CleanStr
    dataset_id: CleanStr
    device: Device = DEFAULT_DEVICE


class JobError(BaseModel):
    type: str
    detail: str | None = None


class JobOut(_Out):
    id: str
    kind: Annotated[str, OneOf(JOB_KINDS.names, check=False)]
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
    cancel_outcome: Literal["pending", "cancelled", "too_late"] | None = Field(
        description="what a cancel request came to: pending while the job runs (it stops at its next training "
        "step or stage), cancelled, or too_late when the job ended otherwise first (a job that succeeded keeps "
        "its result); null without a cancel request"
    )
    created_at: datetime
    started_at: datetime | None = Field(description="when the job's first attempt began")
    attempt_started_at: datetime | None = Field(description="when its current (or last) attempt began")
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
    name: CleanStr = Field("", max_length=200, description="what the key is for")


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


class JobKindInfo(BaseModel):
    name: str
    cfg_kind: CfgKind = Field(description="the cfg a job of this kind takes (POST /v1/configs `kind`)")
    trains: bool = Field(
        description="trains with an `objective`: cross_entropy on the dataset's `labels`, or distill_outputs "
        "(the FP32 model's outputs) on a dataset without them"
    )
    needs_labels: bool = Field(description="refused on a dataset without `labels` (false for every built-in kind)")
    description: str


class DeployFormatInfo(BaseModel):
    name: str
    summary: str


class SandboxInfo(BaseModel):
    mode: Literal["bubblewrap", "unsafe-no-sandbox", "unavailable"] = Field(
        description="how user models run: in bubblewrap, without isolation (the operator's opt-out), or refused"
    )
    detail: str
    seccomp: bool


class Meta(BaseModel):
    """What this server accepts, read from its tables: the dashboard and clients build their choices from it."""

    job_kinds: list[JobKindInfo]
    deploy_formats: list[DeployFormatInfo]
    deploy_targets: list[str] = Field(description="the `deploy_target` values, `auto` first")
    devices: list[Device]
    objectives: list[Objective] = Field(description="the `objective` values of a retraining job (JobCreate)")
    distill_losses: list[DistillLoss] = Field(description="the `distill_loss` values of distill_outputs, `auto` first")
    job_states: list[JobStatus]
    terminal_states: list[JobStatus]
    defaults: dict[str, str | float] = Field(
        description="what a form offers first: `kind`, `device`, `deploy_format`, `deploy_target`, `distill_loss`, "
        "`temperature` and `distill_alpha` (distill_outputs' KD + CE mix: 1, distillation alone)"
    )
    sandbox: SandboxInfo = Field(description="the isolation user models run in (docs/security.md)")
