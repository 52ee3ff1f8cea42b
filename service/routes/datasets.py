"""POST/GET /v1/datasets: `.npz` (or safetensors) with `inputs` and optional `labels`, described at upload."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from service.auth import ReadCaller, WriteCaller
from service.datasets import describe_dataset
from service.db.models import Dataset
from service.deps import SessionDep, SettingsDep, StoreDep
from service.problems import Problem
from service.routes.common import NAME_FIELD, UPLOAD_ERRORS, get_or_404, multipart, require_name
from service.schemas import CleanStr, DatasetOut
from service.uploads import receive_upload

router = APIRouter(prefix="/v1/datasets", tags=["datasets"])


@router.post("", status_code=201, response_model=DatasetOut, responses=UPLOAD_ERRORS,
             openapi_extra=multipart([], NAME_FIELD, "an .npz or .safetensors with `inputs`, optional `labels`"))
async def upload_dataset(request: Request, session: SessionDep, store: StoreDep, settings: SettingsDep,
                         caller: WriteCaller) -> Dataset:
    """Multipart: `file` (`.npz` or `.safetensors` with `inputs`, optional `labels`), optional `name`."""
    upload = await receive_upload(request, "file", settings.max_dataset_bytes, settings.tmp_dir)
    try:
        name = require_name(upload.fields, upload.filename)
        try:
            fmt, description = await run_in_threadpool(describe_dataset, str(upload.path), settings)
        except ValueError as e:
            raise Problem(422, str(e), field="file") from None
        blob = await run_in_threadpool(store.put_file, upload.path, upload.sha256)
    finally:
        upload.discard()
    dataset = Dataset(project_id=caller.project, name=name, format=fmt, description=description,
                      sha256=blob.sha256, size_bytes=blob.size_bytes, uri=blob.uri)
    session.add(dataset)
    session.commit()
    return dataset


@router.get("/{dataset_id}", response_model=DatasetOut)
def get_dataset(dataset_id: CleanStr, session: SessionDep, caller: ReadCaller) -> Dataset:
    return get_or_404(session, Dataset, dataset_id, caller.project, "dataset")
