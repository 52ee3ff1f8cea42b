"""A claimed job's inputs, laid out in its folder for the job process: the files and spec.json.

The model, cfg and dataset blobs are fetched from the store; the spec says what to run with them
(job_process/main.py reads it). When an earlier attempt left a training checkpoint, it is fetched as
`resume.pt` and the job process resumes from it instead of starting over.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from sqlalchemy.orm import sessionmaker

from core.db.models import Config, Dataset, Job, Model
from core.settings import Settings
from core.storage import BlobStore
from job_host.protocol import RESUME_FILE
from job_host.spec import JobParams, JobSpec
from worker.records import last_checkpoint

log = logging.getLogger(__name__)


def stage_inputs(
    sessions: sessionmaker,
    store: BlobStore,
    settings: Settings,
    job: Job,
    workdir: Path,
    visible_as: Path | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """Fetch the inputs into `workdir` and write spec.json; its paths name the folder `visible_as` (the name the
    job process sees it under, worker/warm.py), `workdir` by default. `extra`: more spec fields (a node of a job
    across several nodes, worker/nodes.py)."""
    with sessions() as session:
        model = session.get(Model, job.model_id)
        config = session.get(Config, job.config_id)
        dataset = session.get(Dataset, job.dataset_id)
    files = {
        "model": (model.sha256, "model.pt"),
        "cfg": (config.sha256, "job.cfg"),
        "dataset": (dataset.sha256, f"dataset.{dataset.format}"),
    }
    for sha256, name in files.values():
        store.fetch(sha256, workdir / name)
    spec = JobSpec(
        kind=job.kind,
        device=job.device,
        params=JobParams.model_validate(job.params),
        input_shape=model.input_shape,
        input_dtype=model.input_dtype,
        inputs=model.signature,
        outputs=model.outputs,
        dataset_format=dataset.format,
        checkpoint_every_steps=settings.checkpoint_every_steps,
        memory_bytes=settings.job_memory_limit,
        model=str((visible_as or workdir) / files["model"][1]),
        cfg=str((visible_as or workdir) / files["cfg"][1]),
        dataset=str((visible_as or workdir) / files["dataset"][1]),
        **(extra or {}),
    )
    if checkpoint := last_checkpoint(sessions, job.id):
        # A previous attempt got this far: the job process resumes from here instead of from the start.
        store.fetch(checkpoint, workdir / RESUME_FILE)
        log.info("job %s: attempt %d resumes from checkpoint %s", job.id, job.attempt, checkpoint[:12])
    spec.write(workdir)
