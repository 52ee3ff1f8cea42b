"""/v1/jobs: submit (idempotent), list (keyset cursor), read, cancel, artifacts."""

from __future__ import annotations

import base64
import functools
import hashlib
import json
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from sqlalchemy import Connection, Row, Select, and_, bindparam, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from job_process.kinds import JOB_KINDS
from job_process.objective_names import default_objective
from job_process.spec import JobParams
from service import workers
from service.auth import Caller, Credentials, ReadCaller, WriteCaller, read_as_caller
from service.datasets import DatasetError, check_against_model
from service.db import jobstate
from service.db.models import Artifact, Config, Dataset, Job, Model, Project
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
from service.settings import Settings

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
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        links={"self": base, "events": f"{base}/events", "artifacts": f"{base}/artifacts", "cancel": f"{base}/cancel"},
    )


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


def check_inputs(session: Session, body: JobCreate, project: str, settings: Settings) -> str | None:
    """Refuse at submit what could only fail later in the worker, naming the field; returns the objective
    a retrain kind trains with (None for the kinds that take none)."""
    check_world(body, settings)
    model = get_or_404(session, Model, body.model_id, project, "model")
    config = get_or_404(session, Config, body.config_id, project, "config")
    dataset = get_or_404(session, Dataset, body.dataset_id, project, "dataset")
    if model.status != "ready":
        raise Problem(
            422, f"model {model.id} is {model.status}: {model.status_detail or 'not usable'}", field="model_id"
        )
    kind = JOB_KINDS[body.kind]
    verdict = config.summary.get("job_kinds", {}).get(body.kind)
    if config.kind != kind.cfg_kind:
        raise Problem(
            422,
            f"config {config.id} is a {config.kind} cfg; a {body.kind} job needs a {kind.cfg_kind} cfg",
            field="config_id",
        )
    if verdict is None:  # the cfg was checked at upload, before this job kind was registered
        raise Problem(
            422,
            f"config {config.id} was uploaded before the job kind {body.kind} existed; "
            "upload it again to have it checked for that kind",
            field="config_id",
        )
    if not verdict["ok"]:
        raise Problem(
            422,
            f"config {config.id} does not suit {body.kind}: {verdict['detail']}",
            field="config_id",
            line=verdict.get("line"),
            column=verdict.get("column"),
        )
    if body.bn_recalibration_batches and not kind.prunes:
        raise Problem(
            422,
            f"bn_recalibration_batches recalibrates a pruned model's BatchNorms; a {body.kind} job "
            "does not prune (compressed_retrain and prune_retrain do)",
            field="bn_recalibration_batches",
        )
    objective = job_objective(body, dataset) if kind.needs_labels else None
    try:
        check_against_model(dataset.description, model.signature, model.outputs, objective or "")
    except DatasetError as e:
        raise Problem(
            422,
            f"dataset {dataset.id} does not suit model {model.id}: {e}",
            field="dataset_id",
            **({"array": e.array} if e.array else {}),
        ) from None
    if body.max_accuracy_drop is not None and not dataset.description["has_labels"]:
        raise Problem(
            422,
            "max_accuracy_drop compares top-1 on the dataset's labels, which it lacks; use min_output_cosine",
            field="max_accuracy_drop",
        )
    return objective


def check_world(body: JobCreate, settings: Settings) -> None:
    """A distributed job (docs/scaling.md, "Distributed jobs"): a kind that trains data-parallel; across several
    nodes only where the operator enabled it."""
    if body.world_size > 1 and not JOB_KINDS[body.kind].distributed:
        able = ", ".join(k.name for k in JOB_KINDS.values() if k.distributed)
        raise Problem(422, f"{body.kind} jobs run in one process; world_size > 1 suits {able}", field="world_size")
    if body.world_size % body.nodes:
        raise Problem(422, f"world_size {body.world_size} is not a multiple of nodes {body.nodes}", field="nodes")
    if body.nodes > 1 and not settings.multinode:
        raise Problem(
            422,
            "this server runs every job on one node (jobs across several nodes share the host "
            "network in their sandboxes: AMCT_MULTINODE, docs/security.md)",
            field="nodes",
        )


def job_objective(body: JobCreate, dataset: Dataset) -> str:
    return body.objective or default_objective(dataset.description["has_labels"])


def request_hash(body: JobCreate) -> str:
    data = body.model_dump(mode="json")
    for name in ("world_size", "nodes"):  # fields added later: at their default, the hash a replay had before
        if data[name] == 1:
            del data[name]
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _replay(session: Session, project: str, key: str, digest: str) -> Job | None:
    job = session.scalars(select(Job).where(Job.project_id == project, Job.idempotency_key == key)).first()
    if job is not None and job.request_hash != digest:
        raise Problem(422, "this Idempotency-Key was used with a different request body", field="Idempotency-Key")
    return job


def lock_project(session: Session, project: str) -> None:
    """Serialise the submits of one project until this transaction ends, so the quota's count and the
    insert that follows are one step: without it 200 parallel submits against a quota of 20 let 26 in.

    PostgreSQL: a row lock on the project (SELECT … FOR UPDATE). SQLite has no row locks and ignores
    FOR UPDATE; a no-op UPDATE of the row takes its database write lock instead (the driver opens the
    transaction at the first write, so the count below reads after every earlier submit committed).
    """
    if session.get_bind().dialect.name == "sqlite":
        session.execute(update(Project).where(Project.id == project).values(id=Project.id))
    else:
        session.execute(select(Project.id).where(Project.id == project).with_for_update())


def check_quota(session: Session, project: str, settings: Settings) -> None:
    """At most `max_active_jobs` queued + running jobs per project; the caller holds lock_project."""
    active = session.scalar(
        select(func.count())
        .select_from(Job)
        .where(Job.project_id == project, Job.status.in_((jobstate.QUEUED, jobstate.RUNNING)))
    )
    if active >= settings.max_active_jobs:
        raise Problem(
            429,
            f"project {project!r} has {active} queued or running jobs; the limit is "
            f"{settings.max_active_jobs}. Submit again when one has finished.",
            title="Too Many Requests",
            type_="/problems/quota-exceeded",
            field="max_active_jobs",
            limit=settings.max_active_jobs,
            active=active,
            headers={"Retry-After": str(settings.quota_retry_after_s)},
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
    digest = request_hash(body)
    # A replay answers with the job it already made, whatever the quota says now.
    if idempotency_key and (job := _replay(session, caller.project, idempotency_key, digest)):
        response.headers["Location"] = f"/v1/jobs/{job.id}"
        response.headers["Idempotent-Replayed"] = "true"
        return job_out(job)
    objective = check_inputs(session, body, caller.project, settings)
    if (served := workers.unserved(session, body.device, settings)) is not None:
        raise Problem(
            409,
            workers.unserved_message(body.device, served),
            type_="/problems/device-not-served",
            field="device",
            served_devices=served,
        )
    lock_project(session, caller.project)
    check_quota(session, caller.project, settings)
    # the job's settings as JobParams stores them, with the objective check_inputs resolved (None: the kind
    # does not train, and no objective settings are stored)
    params = (
        JobParams.model_validate(body.model_dump(include=set(JobParams.model_fields)))
        .model_copy(update={"objective": objective})
        .stored()
    )
    job = Job(
        project_id=caller.project,
        kind=body.kind,
        status=jobstate.QUEUED,
        model_id=body.model_id,
        config_id=body.config_id,
        dataset_id=body.dataset_id,
        params=params,
        device=body.device,
        queue=settings.queue_for(body.device),
        max_attempts=settings.max_attempts,
        idempotency_key=idempotency_key,
        request_hash=digest,
    )
    session.add(job)
    try:
        session.flush()
        jobstate.add_event(session, job.id, "state", {"status": jobstate.QUEUED, "edge": "submitted"})
        session.commit()
    except IntegrityError:
        # The same key raced in from a concurrent request: answer with the winner.
        session.rollback()
        job = _replay(session, caller.project, idempotency_key or "", digest)
        if job is None:
            raise
        response.headers["Idempotent-Replayed"] = "true"
    else:
        dispatcher.enqueue(job.id, job.queue)
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
        created, after_id = bindparam("created", type_=Job.created_at.type), bindparam("after_id")
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
        params = {"project": caller.project, "status": status, "kind": kind, "limit": limit + 1}
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
    """Queued jobs are cancelled at once; a running job's worker stops it within a heartbeat."""
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
