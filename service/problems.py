"""RFC 9457 problem details for every error the API returns, naming the field at fault."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

PROBLEM_JSON = "application/problem+json"
_TITLES = {400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 409: "Conflict",
           413: "Content Too Large", 415: "Unsupported Media Type", 422: "Unprocessable Content",
           500: "Internal Server Error", 503: "Service Unavailable"}
log = logging.getLogger(__name__)


class Problem(Exception):
    """Raise from a route: becomes a problem+json response. Extra keyword fields are members."""

    def __init__(self, status: int, detail: str, *, type_: str = "about:blank", title: str | None = None,
                 field: str | None = None, headers: dict[str, str] | None = None, **extra: Any) -> None:
        super().__init__(detail)
        self.status, self.detail, self.type, self.headers = status, detail, type_, headers
        self.title = title or _TITLES.get(status, "Error")
        self.extra = {"field": field, **extra} if field else extra


def problem_response(status: int, title: str, detail: str, instance: str, type_: str = "about:blank",
                     headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    body = {"type": type_, "title": title, "status": status, "detail": detail, "instance": instance, **extra}
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def _field(loc: tuple | list) -> str:
    # ("body", "epochs") → "epochs"; ("query", "limit") → "limit"; header names keep their spelling.
    sources = ("body", "query", "path", "header", "form")
    parts = [str(p) for p in (loc[1:] if loc and loc[0] in sources else loc)]
    return ".".join(parts) or str(loc[0] if loc else "")


def install(app: FastAPI) -> None:
    @app.exception_handler(Problem)
    async def _problem(request: Request, exc: Problem):
        return problem_response(exc.status, exc.title, exc.detail, request.url.path, exc.type,
                                exc.headers, **exc.extra)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        errors = [{"field": _field(e["loc"]), "message": e["msg"], "type": e["type"]} for e in exc.errors()]
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        return problem_response(422, "Unprocessable Content", detail, request.url.path,
                                field=errors[0]["field"] if errors else None, errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        return problem_response(exc.status_code, _TITLES.get(exc.status_code, "Error"), str(exc.detail),
                                request.url.path, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem_response(500, "Internal Server Error", "an unexpected error occurred; see the server log",
                                request.url.path)
