"""GET /v1/jobs/{id}/events: server-sent events from job_events, resumable with Last-Event-ID.

Each SSE `id` is the event's per-job `seq`, so a client that reconnects with `Last-Event-ID: n`
gets exactly the events after n. The stream ends once the job is terminal and drained.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from core.db import jobstate
from core.db.models import Job, JobEvent
from service.auth import ReadCaller
from service.deps import SettingsDep
from service.problems import Problem
from service.routes.common import get_or_404
from service.schemas import CleanStr

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
KEEPALIVE_S = 15.0
BATCH = 500
# job_events.seq is an INTEGER column: an id past it matches nothing and overflows the driver
# (SQLite raises on the bind; the stream would end in a broken chunked body after its 200).
MAX_SEQ = 2**31 - 1


STREAM_PATH = re.compile(re.escape(router.prefix) + r"/[^/]+/events")


def is_event_stream(scope: dict | None) -> bool:
    """Whether an ASGI scope asks for this route (service/app.py's ApiServer hangs them up at shutdown)."""
    return (
        scope is not None and scope.get("type") == "http" and STREAM_PATH.fullmatch(scope.get("path", "")) is not None
    )


def format_event(event: JobEvent) -> str:
    data = json.dumps({"seq": event.seq, "ts": event.ts.isoformat(), "type": event.type, **event.payload})
    return f"id: {event.seq}\nevent: {event.type}\ndata: {data}\n\n"


def _read(sessions, job_id: str, after: int) -> tuple[list[JobEvent], str]:
    with sessions() as session:
        events = session.scalars(
            select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.seq > after).order_by(JobEvent.seq).limit(BATCH)
        ).all()
        status = session.scalar(select(Job.status).where(Job.id == job_id))
    return list(events), status


async def stream_events(request: Request, job_id: str, after: int, poll_s: float) -> AsyncIterator[str]:
    sessions = request.app.state.sessions
    last_sent = time.monotonic()
    yield "retry: 2000\n\n"
    while True:
        events, status = await run_in_threadpool(_read, sessions, job_id, after)
        for event in events:
            after = event.seq
            yield format_event(event)
        if events:
            last_sent = time.monotonic()
        if status in jobstate.TERMINAL and len(events) < BATCH:
            return
        if await request.is_disconnected():
            return
        if time.monotonic() - last_sent > KEEPALIVE_S:
            last_sent = time.monotonic()
            yield ": keep-alive\n\n"
        if not events:
            await asyncio.sleep(poll_s)


def _last_event_id(header: str) -> int:
    """The seq a reconnecting client last saw; checked before the stream starts, so a bad one is a 422."""
    text = header.strip()
    # The length first: int() of a 5,000-digit string raises (Python's int_max_str_digits).
    if not (text.isascii() and text.isdigit() and len(text) <= len(str(MAX_SEQ)) and int(text) <= MAX_SEQ):
        raise Problem(
            422, f"Last-Event-ID must be an event seq this stream sent (0 to {MAX_SEQ})", field="Last-Event-ID"
        )
    return int(text)


@router.get(
    "/{job_id}/events",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "the job's events"}},
)
def job_events(
    job_id: CleanStr,
    request: Request,
    settings: SettingsDep,
    caller: ReadCaller,
    last_event_id: Annotated[str | None, Header()] = None,
    after: Annotated[int | None, Query(ge=0, le=MAX_SEQ, description="like Last-Event-ID, without the header")] = None,
) -> StreamingResponse:
    with request.app.state.sessions() as session:
        get_or_404(session, Job, job_id, caller.project, "job")
    start = after or 0
    if last_event_id is not None:
        start = _last_event_id(last_event_id)
    return StreamingResponse(
        stream_events(request, job_id, start, settings.sse_poll_s),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
