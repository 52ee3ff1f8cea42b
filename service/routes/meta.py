"""GET /v1/meta: the job kinds, deploy formats, devices, objectives and job states this server accepts.

Read from the tables that define them (job_host/kinds.py, amct_engine/export/formats.py,
core/settings.py, job_host/objective_names.py, core/db/jobstate.py), so the dashboard's
choices are never a copy.
"""

from __future__ import annotations

from fastapi import APIRouter

from amct_engine.export.deploy_target import deploy_target_names
from amct_engine.export.formats import DEPLOY_FORMATS
from core.db.jobstate import STATES, TERMINAL
from core.settings import DEVICES
from job_host import bubblewrap
from job_host.kinds import DEFAULT_JOB_KIND, JOB_KINDS
from job_host.objective_names import DISTILL_LOSSES, OBJECTIVES
from service.auth import ReadCaller
from service.schemas import DeployFormatInfo, JobCreate, JobKindInfo, Meta, SandboxInfo

router = APIRouter(prefix="/v1/meta", tags=["meta"])


@router.get("", response_model=Meta)
def get_meta(caller: ReadCaller) -> Meta:
    return Meta(
        job_kinds=[
            JobKindInfo(
                name=k.name,
                cfg_kind=k.cfg_kind,
                trains=k.trains,
                needs_labels=k.needs_labels,
                description=k.description,
            )
            for k in JOB_KINDS.values()
        ],
        deploy_formats=[DeployFormatInfo(name=f.name, summary=f.summary) for f in DEPLOY_FORMATS.values()],
        deploy_targets=list(deploy_target_names()),
        devices=list(DEVICES),
        objectives=list(OBJECTIVES),
        distill_losses=list(DISTILL_LOSSES),
        job_states=list(STATES),
        terminal_states=[s for s in STATES if s in TERMINAL],
        defaults={
            "kind": DEFAULT_JOB_KIND,
            **{
                name: JobCreate.model_fields[name].default
                for name in ("device", "deploy_format", "deploy_target", "distill_loss", "temperature", "distill_alpha")
            },
        },
        sandbox=SandboxInfo(**bubblewrap.state().as_dict()),
    )
