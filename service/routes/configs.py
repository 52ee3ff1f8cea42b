"""POST/GET /v1/configs: AMCT `.cfg` files, parsed by the engine's loader at upload.

Parsing protobuf text runs no user code, so it happens here; a bad cfg is a 422 whose problem
carries the engine's `line`, `column` and `field`.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse
from starlette.concurrency import run_in_threadpool

from core.db.models import Config
from job_host.kinds import CFG_KINDS
from service.auth import ReadCaller, WriteCaller
from service.cfg_summary import summarise_cfg
from service.deps import SessionDep, SettingsDep, StoreDep
from service.problems import Problem
from service.routes.common import NAME_FIELD, UPLOAD_ERRORS, get_or_404, multipart, require_name
from service.schemas import CleanStr, ConfigOut
from service.uploads import receive_upload

router = APIRouter(prefix="/v1/configs", tags=["configs"])


@router.post(
    "",
    status_code=201,
    response_model=ConfigOut,
    responses={
        **UPLOAD_ERRORS,
        422: {
            "description": "the cfg does not parse (`line`, `column` and `cfg_field` say where), "
            "or a form field is invalid"
        },
    },
    openapi_extra=multipart(
        ["kind"],
        {**NAME_FIELD, "kind": {"type": "string", "enum": list(CFG_KINDS)}},
        "an AMCT .cfg (protobuf text format)",
    ),
)
async def upload_config(
    request: Request, session: SessionDep, store: StoreDep, settings: SettingsDep, caller: WriteCaller
) -> Config:
    """Multipart: `file` (`.cfg`, protobuf text format), `kind` (`retrain` | `distill`), optional `name`."""
    from amct_engine.config.errors import ConfigError

    upload = await receive_upload(request, "file", settings.max_config_bytes, settings.tmp_dir)
    try:
        kind = upload.fields.get("kind", "")
        if kind not in CFG_KINDS:
            raise Problem(422, f"kind must be {' or '.join(map(repr, CFG_KINDS))}", field="kind")
        name = require_name(upload.fields, upload.filename)
        data = upload.file.read_bytes()
        try:
            summary = await run_in_threadpool(summarise_cfg, data, kind, upload.filename or name)
        except ConfigError as e:
            raise Problem(
                422,
                str(e),
                type_="/problems/config-error",
                field="file",
                line=e.line,
                column=e.column,
                cfg_field=e.field,
                message=e.message,
            ) from None
        blob = await run_in_threadpool(store.put_file, upload.file, upload.sha256)
    finally:
        upload.discard()
    config = Config(
        project_id=caller.project,
        name=name,
        kind=kind,
        summary=summary,
        sha256=blob.sha256,
        size_bytes=blob.size_bytes,
        uri=blob.uri,
    )
    session.add(config)
    session.commit()
    return config


@router.get("/{config_id}", response_model=ConfigOut)
def get_config(config_id: CleanStr, session: SessionDep, caller: ReadCaller) -> Config:
    return get_or_404(session, Config, config_id, caller.project, "config")


@router.get(
    "/{config_id}/content",
    response_class=PlainTextResponse,
    responses={200: {"description": "the cfg exactly as uploaded", "content": {"text/plain": {}}}},
)
def config_content(config_id: CleanStr, session: SessionDep, store: StoreDep, caller: ReadCaller) -> PlainTextResponse:
    """The uploaded cfg text. Blobs are content-addressed and never change, so this is the text a job froze."""
    config = get_or_404(session, Config, config_id, caller.project, "config")
    text = b"".join(store.iter_bytes(config.sha256)).decode("utf-8", errors="replace")  # <= max_config_bytes
    return PlainTextResponse(text, headers={"ETag": f'"{config.sha256}"'})
