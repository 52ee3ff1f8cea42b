"""Conditional reads: an ETag on job and job-list responses, and 304 Not Modified for `If-None-Match`.

Clients poll jobs (the CLI's watch, dashboards, MLOps platforms). The ETag is a hash of the response
body itself, not of a row version: a job's visible fields change through several writers (the worker's
heartbeat writes phase and progress, transitions write the rest, the reaper bumps `updated_at`), and a
hash of what is sent cannot miss any of them. A 304 saves the body on the wire and the client's parse;
the server still reads the rows (one indexed lookup), which is what keeps it correct (RFC 9110, section 13.1.2:
If-None-Match uses the weak comparison, so `W/"…"` matches too).
"""

from __future__ import annotations

import hashlib
from typing import Any

from fastapi import Request, Response
from pydantic import BaseModel

NOT_MODIFIED: dict[int | str, dict[str, Any]] = {
    304: {"description": "the representation has not changed since the `If-None-Match` ETag"}
}


def etag_of(body: bytes) -> str:
    return '"' + hashlib.blake2b(body, digest_size=16).hexdigest() + '"'


def matches(header: str | None, etag: str) -> bool:
    """Whether an If-None-Match header names `etag` (weak comparison; `*` matches any)."""
    if not header:
        return False
    for candidate in header.split(","):
        candidate = candidate.strip()
        if candidate == "*" or candidate.removeprefix("W/") == etag:
            return True
    return False


def conditional_json(request: Request, model: BaseModel) -> Response:
    """`model` as JSON with its ETag, or an empty 304 when the client already has this representation.

    Serialised once here (FastAPI would validate and serialise a returned model again: a cost on every poll).
    """
    body = model.model_dump_json().encode()
    etag = etag_of(body)
    headers = {"ETag": etag, "Cache-Control": "private, no-cache"}
    if matches(request.headers.get("if-none-match"), etag):
        return Response(status_code=304, headers=headers)
    return Response(body, media_type="application/json", headers=headers)
