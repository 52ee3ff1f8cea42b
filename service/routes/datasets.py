"""POST/GET /v1/datasets: `.npz` (or safetensors) of named arrays (one per model input, optional `labels`
or targets), streamed to disk and described in chunks at upload (service/datasets.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from core.db.models import Dataset
from service.auth import ReadCaller, WriteCaller
from service.checks import BUSY_RESPONSE, checks_slot
from service.datasets import DatasetError, describe_dataset
from service.deps import SessionDep, SettingsDep, StoreDep
from service.job_rules import array_of
from service.problems import Problem
from service.routes.common import NAME_FIELD, UPLOAD_ERRORS, get_or_404, multipart, require_name
from service.schemas import CleanStr, DatasetOut
from service.uploads import receive_upload

router = APIRouter(prefix="/v1/datasets", tags=["datasets"])


@router.post(
    "",
    status_code=201,
    response_model=DatasetOut,
    responses={**UPLOAD_ERRORS, **BUSY_RESPONSE},
    openapi_extra=multipart(
        [],
        NAME_FIELD,
        "an .npz or .safetensors of named arrays: one per model "
        "input (or `inputs`), optional `labels`, optional targets",
    ),
)
async def upload_dataset(
    request: Request, session: SessionDep, store: StoreDep, settings: SettingsDep, caller: WriteCaller
) -> Dataset:
    """Multipart: `file` (`.npz` or `.safetensors` of named arrays: one per model input, named after it
    (`inputs` for a one-input model), optional `labels`, optional targets; or, for llm_quant, text: a `.txt` file
    or `.jsonl` with a "text" field per line, told apart by the file's name), optional `name`."""
    with checks_slot(settings, "dataset"):
        upload = await receive_upload(request, "file", settings.max_dataset_bytes, settings.tmp_dir)
        try:
            name = require_name(upload.fields, upload.filename)
            try:
                fmt, description = await run_in_threadpool(
                    describe_dataset, str(upload.file), settings, upload.filename
                )
            except DatasetError as e:
                raise Problem(422, str(e), field="file", **array_of(e)) from None
            except ValueError as e:
                raise Problem(422, str(e), field="file") from None
            blob = await run_in_threadpool(store.put_file, upload.file, upload.sha256)
        finally:
            upload.discard()
    dataset = Dataset(
        project_id=caller.project,
        name=name,
        format=fmt,
        description=description,
        sha256=blob.sha256,
        size_bytes=blob.size_bytes,
        uri=blob.uri,
    )
    session.add(dataset)
    session.commit()
    return dataset


@router.get("/{dataset_id}", response_model=DatasetOut)
def get_dataset(dataset_id: CleanStr, session: SessionDep, caller: ReadCaller) -> Dataset:
    return get_or_404(session, Dataset, dataset_id, caller.project, "dataset")
