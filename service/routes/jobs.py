"""/v1/jobs: submit (idempotent), list (keyset cursor), read, cancel, artifacts."""

from __future__ import annotations

import base64
import functools
import json
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response
from sqlalchemy import Connection, Row, Select, String, and_, bindparam, or_, select

from core import workers
from core.db import jobstate
from core.db.models import Artifact, Job
from service import job_submission as submission
from service.auth import Caller, Credentials, ReadCaller, WriteCaller, read_as_caller
from service.deps import DispatcherDep, SessionDep, SettingsDep
from service.etag import NOT_MODIFIED, conditional_json
from service.problems import Problem
from service.routes.common import get_or_404, not_found, refuse_control_characters
from service.schemas import (
    ArtifactList,
    ArtifactOut,
    CleanStr,
    JobCreate,
    JobKind,
    JobOut,
    JobPage,
    JobStatus,
    control_character,
)

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


def job_out(job: Job | Row) -> JobOut:
    base = f"/v1/jobs/{job.id}"
    return JobOut(
        id=job.id,
        kind=job.kind,
        status=job.status,
        phase=job.phase,
        progress=job.progress,
        model_id=job.model_id,
        config_id=job.config_id,
        dataset_id=job.dataset_id,
        params=job.params,
        device=job.device,
        queue=job.queue,
        attempt=job.attempt,
        metrics=job.metrics,
        error={"type": job.error_type, "detail": job.error_detail} if job.error_type else None,
        cancel_requested=job.cancel_requested_at is not None,
        cancel_outcome=cancel_outcome(job.status, job.cancel_requested_at is not None),
        created_at=job.created_at,
        started_at=job.started_at,
        attempt_started_at=job.attempt_started_at,
        finished_at=job.finished_at,
        links={"self": base, "events": f"{base}/events", "artifacts": f"{base}/artifacts", "cancel": f"{base}/cancel"},
    )


def cancel_outcome(status: str, requested: bool) -> str | None:
    if not requested:
        return None
    if status not in jobstate.TERMINAL:
        return "pending"
    return "cancelled" if status == jobstate.CANCELLED else "too_late"


def artifact_out(a: Artifact) -> ArtifactOut:
    return ArtifactOut(
        id=a.id,
        job_id=a.job_id,
        kind=a.kind,
        filename=a.filename,
        media_type=a.media_type,
        sha256=a.sha256,
        size_bytes=a.size_bytes,
        created_at=a.created_at,
        content_url=f"/v1/artifacts/{a.id}/content",
    )


@router.post(
    "",
    status_code=202,
    response_model=JobOut,
    responses={
        404: {"description": "model, config or dataset not found"},
        409: {"description": "no live worker serves the job's device; `served_devices` lists those that are served"},
        422: {"description": "invalid parameters, or an Idempotency-Key reused with another body"},
        429: {
            "description": "the project's queued + running jobs are at the quota",
            "headers": {
                "Retry-After": {"description": "seconds to wait before submitting again", "schema": {"type": "integer"}}
            },
        },
    },
)
def submit_job(
    body: JobCreate,
    response: Response,
    session: SessionDep,
    settings: SettingsDep,
    dispatcher: DispatcherDep,
    caller: WriteCaller,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> JobOut:
    if idempotency_key is not None:
        refuse_control_characters(idempotency_key, "Idempotency-Key")
    digest = submission.request_hash(body)
    # A replay answers with the job it already made, whatever the quota says now.
    if idempotency_key and (job := submission.find_replay(session, caller.project, idempotency_key, digest)):
        response.headers["Location"] = f"/v1/jobs/{job.id}"
        response.headers["Idempotent-Replayed"] = "true"
        return job_out(job)
    objective = submission.check_inputs(session, body, caller.project, settings)
    if (served := workers.unserved(session, body.device, settings)) is not None:
        raise Problem(
            409,
            workers.unserved_message(body.device, served),
            type_="/problems/device-not-served",
            field="device",
            served_devices=served,
        )
    submission.lock_project(session, caller.project)
    submission.check_quota(session, caller.project, settings)
    job, new = submission.create_job(session, body, caller.project, settings, idempotency_key, digest, objective)
    if new:
        dispatcher.enqueue(job.id, job.queue)
    else:
        response.headers["Idempotent-Replayed"] = "true"
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return job_out(job)


def encode_cursor(job: Job | Row) -> str:
    raw = json.dumps([job.created_at.isoformat(), job.id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


# Every job was created inside this range: a cursor outside it is not one this API returned, and its
# timestamp may not even fit the database's (year 9999 with a negative offset is year 10000 in UTC).
CURSOR_RANGE = (datetime(1970, 1, 1, tzinfo=UTC), datetime(3000, 1, 1, tzinfo=UTC))


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        created, id_ = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        stamp = datetime.fromisoformat(created)
        stamp = (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).astimezone(UTC)
        if not (CURSOR_RANGE[0] <= stamp < CURSOR_RANGE[1] and isinstance(id_, str) and control_character(id_) is None):
            raise ValueError(created)
        return stamp, id_
    except (ValueError, TypeError, OverflowError):
        raise Problem(422, "cursor is not one this API returned", field="cursor") from None


# What JobOut shows of a job: the polled reads select these columns on a Connection, not Job entities on a
# Session (loading ORM entities cost more than the query; docs/scaling.md, "The API"). job_out reads a Row
# of them as it reads a Job.
JOB_OUT_COLUMNS = tuple(
    getattr(Job, name)
    for name in (
        "id",
        "kind",
        "status",
        "phase",
        "progress",
        "model_id",
        "config_id",
        "dataset_id",
        "params",
        "device",
        "queue",
        "attempt",
        "metrics",
        "error_type",
        "error_detail",
        "cancel_requested_at",
        "created_at",
        "started_at",
        "attempt_started_at",
        "finished_at",
    )
)
# Built once: the same statement object each time skips building it and adapting its cached result columns.
_JOB_BY_ID = select(*JOB_OUT_COLUMNS).where(Job.id == bindparam("id"), Job.project_id == bindparam("project"))


@functools.cache
def _list_statement(by_status: bool, by_kind: bool, after: bool) -> Select:
    """A page of a project's jobs, newest first, for one combination of the filters a request uses; one statement
    object per combination (as _JOB_BY_ID), the values are bound."""
    query = select(*JOB_OUT_COLUMNS).where(Job.project_id == bindparam("project"))
    if by_status:
        query = query.where(Job.status.in_(bindparam("status", expanding=True)))
    if by_kind:
        query = query.where(Job.kind.in_(bindparam("kind", expanding=True)))
    if after:
        # Keyset on (created_at, id): stable while jobs are added or change state under the reader.
        created, after_id = bindparam("created", type_=Job.created_at.type), bindparam("after_id", type_=String())
        query = query.where(or_(Job.created_at < created, and_(Job.created_at == created, Job.id < after_id)))
    return query.order_by(Job.created_at.desc(), Job.id.desc()).limit(bindparam("limit"))


@router.get("", response_model=JobPage, responses=NOT_MODIFIED)
async def list_jobs(
    request: Request,
    credentials: Credentials,
    status: Annotated[list[JobStatus] | None, Query()] = None,
    kind: Annotated[list[JobKind] | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: str | None = None,
) -> Response:
    """Newest first. Filters repeat (`?status=queued&status=running`); `next_cursor` pages on. The response
    has an ETag; send it back as `If-None-Match` and an unchanged page is a 304 without a body."""

    def read(connection: Connection, caller: Caller) -> JobPage:
        params: dict[str, Any] = {"project": caller.project, "status": status, "kind": kind, "limit": limit + 1}
        if cursor:
            params["created"], params["after_id"] = decode_cursor(cursor)
        rows = connection.execute(_list_statement(bool(status), bool(kind), bool(cursor)), params).all()
        page = rows[:limit]
        return JobPage(
            items=[job_out(j) for j in page], next_cursor=encode_cursor(page[-1]) if len(rows) > limit else None
        )

    return conditional_json(request, await read_as_caller(request, credentials, read))


@router.get("/{job_id}", response_model=JobOut, responses=NOT_MODIFIED)
async def get_job(request: Request, job_id: CleanStr, credentials: Credentials) -> Response:
    """One row read by its key (nothing else is loaded); with an ETag, and 304 for a matching `If-None-Match`."""

    def read(connection: Connection, caller: Caller) -> JobOut:
        row = connection.execute(_JOB_BY_ID, {"id": job_id, "project": caller.project}).first()
        if row is None:
            raise not_found("job", job_id)
        return job_out(row)

    return conditional_json(request, await read_as_caller(request, credentials, read))


@router.post(
    "/{job_id}/cancel",
    status_code=202,
    response_model=JobOut,
    responses={409: {"description": "the job already finished"}},
)
def cancel_job(job_id: CleanStr, session: SessionDep, caller: WriteCaller) -> JobOut:
    """Queued jobs are cancelled at once; a running job's worker stops it within a heartbeat, at its next training
    step or stage. A job that finishes its work first succeeds all the same: `cancel_outcome` then says
    `too_late`."""
    job = get_or_404(session, Job, job_id, caller.project, "job")
    if job.status in jobstate.TERMINAL:
        raise Problem(409, f"job {job_id} already {job.status}", field="job_id", status_now=job.status)
    jobstate.request_cancel(session, job_id)
    session.commit()
    session.refresh(job)
    return job_out(job)


@router.get("/{job_id}/artifacts", response_model=ArtifactList)
def list_artifacts(job_id: CleanStr, session: SessionDep, caller: ReadCaller) -> ArtifactList:
    get_or_404(session, Job, job_id, caller.project, "job")
    rows = session.scalars(select(Artifact).where(Artifact.job_id == job_id).order_by(Artifact.kind)).all()
    return ArtifactList(items=[artifact_out(a) for a in rows])
