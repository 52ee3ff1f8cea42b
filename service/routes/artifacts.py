"""GET /v1/artifacts/{id}[/content]: artifact metadata and bytes, streamed from the store."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import StreamingResponse
from starlette.concurrency import iterate_in_threadpool

from core.db.models import Artifact, Job
from service.auth import ReadCaller
from service.deps import SessionDep, StoreDep
from service.problems import Problem
from service.routes.jobs import artifact_out
from service.schemas import ArtifactOut, CleanStr

router = APIRouter(prefix="/v1/artifacts", tags=["artifacts"])


def _artifact(session, artifact_id: str, project: str) -> Artifact:
    artifact = session.get(Artifact, artifact_id)
    job = session.get(Job, artifact.job_id) if artifact else None
    if artifact is None or job is None or job.project_id != project:
        raise Problem(404, f"no artifact with id {artifact_id!r}", field="artifact_id", resource="artifact")
    return artifact


@router.get("/{artifact_id}", response_model=ArtifactOut)
def get_artifact(artifact_id: CleanStr, session: SessionDep, caller: ReadCaller) -> ArtifactOut:
    return artifact_out(_artifact(session, artifact_id, caller.project))


@router.get(
    "/{artifact_id}/content",
    response_class=StreamingResponse,
    responses={
        200: {"description": "the bytes, with the artifact's own media_type (ONNX, JSON, ...)", "content": {"*/*": {}}}
    },
)
def artifact_content(
    artifact_id: CleanStr, session: SessionDep, caller: ReadCaller, store: StoreDep
) -> StreamingResponse:
    artifact = _artifact(session, artifact_id, caller.project)
    headers = {
        "Content-Length": str(artifact.size_bytes),
        "ETag": f'"{artifact.sha256}"',
        "Content-Disposition": f'attachment; filename="{artifact.filename}"',
    }
    return StreamingResponse(
        iterate_in_threadpool(store.iter_bytes(artifact.sha256)), media_type=artifact.media_type, headers=headers
    )
