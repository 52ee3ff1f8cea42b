"""RFC 9457 problem details for every error the API returns, naming the field at fault."""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from python_multipart.exceptions import ParseError
from starlette.exceptions import HTTPException as StarletteHTTPException

from job_host.spec import validation_message

PROBLEM_JSON = "application/problem+json"
_TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
log = logging.getLogger(__name__)


class Problem(Exception):
    """Raise from a route: becomes a problem+json response. Extra keyword fields are members."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        type_: str = "about:blank",
        title: str | None = None,
        field: str | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status, self.detail, self.type, self.headers = status, detail, type_, headers
        self.title = title or _TITLES.get(status, "Error")
        self.extra = {"field": field, **extra} if field else extra


def problem_response(
    status: int,
    title: str,
    detail: str,
    instance: str,
    type_: str = "about:blank",
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    body = {"type": type_, "title": title, "status": status, "detail": detail, "instance": instance, **extra}
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def _field(loc: tuple | list) -> str:
    # ("body", "epochs") → "epochs"; ("query", "limit") → "limit"; header names keep their spelling.
    sources = ("body", "query", "path", "header", "form")
    parts = [str(p) for p in (loc[1:] if loc and loc[0] in sources else loc)]
    return ".".join(parts) or str(loc[0] if loc else "")


class ProblemDoc(BaseModel):
    """How every error body looks (RFC 9457), for the OpenAPI document; routes add members."""

    model_config = ConfigDict(extra="allow", title="Problem")

    type: str = "about:blank"
    title: str
    status: int
    detail: str
    instance: str
    field: str | None = Field(None, description="the request field, header or file at fault")


def _document_problems(schema: dict) -> dict:
    """Every error response of every operation is problem+json: say so, and which errors can happen.

    FastAPI documents its own `{"detail": [...]}` 422 body, which this API never sends; the auth
    dependency (401/403) and an id in the path (404) add errors no route declares one by one.
    """
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components["Problem"] = ProblemDoc.model_json_schema(ref_template="#/components/schemas/{model}")
    problem = {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}
    for path, operations in schema.get("paths", {}).items():
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            errors = {int(s) for s in responses if s.isdigit() and int(s) >= 400}
            if operation.get("security"):
                errors |= {401, 403}
            if "{" in path:
                errors.add(404)
            if "requestBody" in operation:
                errors.add(400)  # a body that is not even JSON (or multipart) of any shape
            for status in sorted(errors):
                entry = responses.setdefault(str(status), {})
                if status == 422 or not entry.get("description"):
                    entry["description"] = _ERROR_DOCS.get(status, _TITLES.get(status, "Error"))
                entry["content"] = problem
                if status == 401:
                    entry.setdefault("headers", {})["WWW-Authenticate"] = {
                        "description": "Bearer",
                        "schema": {"type": "string"},
                    }
    for unused in ("HTTPValidationError", "ValidationError"):
        if f'"#/components/schemas/{unused}"' not in json.dumps(schema["paths"]):
            components.pop(unused, None)
    return schema


_ERROR_DOCS = {
    400: "the body could not be parsed",
    401: "no API key, or an unknown or revoked one",
    403: "the API key lacks the scope this needs",
    404: "no such resource in the caller's project",
    422: "a parameter or body field is invalid; `field` names it",
}


def document(app: FastAPI) -> None:
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = _document_problems(build())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend its schema


def _error(e: dict) -> dict:
    if e["type"] == "json_invalid":  # loc is ("body", <character offset>): the field is the body itself
        return {"field": "body", "message": f"{e['msg']} at character {e['loc'][-1]}", "type": e["type"]}
    return {"field": _field(e["loc"]), "message": validation_message(e), "type": e["type"]}


def install(app: FastAPI) -> None:
    document(app)

    @app.exception_handler(Problem)
    async def _problem(request: Request, exc: Problem):
        return problem_response(exc.status, exc.title, exc.detail, request.url.path, exc.type, exc.headers, **exc.extra)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        errors = [_error(e) for e in exc.errors()]
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        return problem_response(
            422,
            "Unprocessable Content",
            detail,
            request.url.path,
            field=errors[0]["field"] if errors else None,
            errors=errors,
        )

    @app.exception_handler(ParseError)
    async def _bad_multipart(request: Request, exc: ParseError):
        # The upload routes parse their multipart body as it streams in: a broken body surfaces here.
        return problem_response(
            400, "Bad Request", f"the multipart/form-data body is malformed: {exc}", request.url.path, field="body"
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        return problem_response(
            exc.status_code,
            _TITLES.get(exc.status_code, "Error"),
            str(exc.detail),
            request.url.path,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem_response(
            500, "Internal Server Error", "an unexpected error occurred; see the server log", request.url.path
        )
