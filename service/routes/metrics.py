"""GET /metrics: Prometheus text format. Open like /healthz: it names no user data, only counts."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

router = APIRouter(tags=["health"])


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus exposition"}},
)
async def metrics(request: Request) -> Response:
    # The job collector queries the database: off the event loop.
    body = await run_in_threadpool(generate_latest, request.app.state.metrics)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
