"""Submitting a job, the domain side of POST /v1/jobs: the checks on its rows (the model is ready, the cfg
suits the kind, the dataset suits the model: service/job_rules.py), the idempotent replay, the per-project
quota under a lock, and the job row with its first event. The route (service/routes/jobs.py) only maps
HTTP onto these."""

from __future__ import annotations

import hashlib
import json

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from core.db import jobstate
from core.db.models import Config, Dataset, Job, Model, Project
from core.settings import Settings
from job_host.spec import JobParams
from service.cfg_summary import check_cfg_suits
from service.job_rules import JobRuleError, check_data, check_model_format, check_settings
from service.problems import Problem
from service.routes.common import get_or_404
from service.schemas import JobCreate


def check_inputs(session: Session, body: JobCreate, project: str, settings: Settings) -> str | None:
    """Refuse at submit what could only fail later in the worker, naming the field; returns the objective
    a retrain kind trains with (None for the kinds that take none)."""
    params = job_params(body)
    model = get_or_404(session, Model, body.model_id, project, "model")
    config = get_or_404(session, Config, body.config_id, project, "config")
    dataset = get_or_404(session, Dataset, body.dataset_id, project, "dataset")
    try:
        check_settings(body.kind, params, settings.multinode)
        if model.status == "validating":
            raise JobRuleError(
                f"model {model.id} is still being checked; submit once GET /v1/models/{model.id} says ready", "model_id"
            )
        if model.status != "ready":
            raise JobRuleError(f"model {model.id} is {model.status}: {model.status_detail or 'not usable'}", "model_id")
        check_model_format(body.kind, model.format, f"model {model.id}")
        check_cfg_suits(config.summary, config.kind, body.kind, f"config {config.id}", "config_id")
        names = (f"dataset {dataset.id}", f"model {model.id}")
        return check_data(body.kind, params, dataset.description, model.signature, model.outputs, names)
    except JobRuleError as e:
        raise Problem(422, str(e), field=e.field, **e.extra) from None


def job_params(body: JobCreate) -> JobParams:
    return JobParams.model_validate(body.model_dump(include=set(JobParams.model_fields)))


def request_hash(body: JobCreate) -> str:
    data = body.model_dump(mode="json")
    for name, default in (("world_size", 1), ("nodes", 1), ("seq_len", 256)):
        if data[name] == default:  # fields added later: at their default, the hash a replay had before
            del data[name]
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def find_replay(session: Session, project: str, key: str, digest: str) -> Job | None:
    """The job an earlier request with this Idempotency-Key made; 422 when its body was another."""
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
    active = session.scalars(
        select(func.count())
        .select_from(Job)
        .where(Job.project_id == project, Job.status.in_((jobstate.QUEUED, jobstate.RUNNING)))
    ).one()
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


def create_job(
    session: Session, body: JobCreate, project: str, settings: Settings, key: str | None, digest: str, objective
) -> tuple[Job, bool]:
    """Add the job (queued, its first event) in one transaction; (the job, whether it is new). The same key
    racing in from a concurrent request answers with the winner's job."""
    job = Job(
        project_id=project,
        kind=body.kind,
        status=jobstate.QUEUED,
        model_id=body.model_id,
        config_id=body.config_id,
        dataset_id=body.dataset_id,
        # the settings as JobParams stores them, with the objective check_inputs resolved (None: the kind does not
        # train, and no objective settings are stored)
        params=job_params(body).model_copy(update={"objective": objective}).stored(),
        device=body.device,
        queue=settings.queue_for(body.device),
        max_attempts=settings.max_attempts,
        idempotency_key=key,
        request_hash=digest,
    )
    session.add(job)
    try:
        session.flush()
        jobstate.add_event(session, job.id, "state", {"status": jobstate.QUEUED, "edge": "submitted"})
        session.commit()
    except IntegrityError:
        session.rollback()
        winner = find_replay(session, project, key or "", digest)
        if winner is None:
            raise
        return winner, False
    return job, True
