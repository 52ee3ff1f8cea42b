"""Small helpers shared by the routes: the project row, lookups that 404 with the resource named."""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.db.models import Base
from service.problems import Problem
from service.schemas import control_character

T = TypeVar("T", bound=Base)


def get_or_404(session: Session, model: type[T], id_: str, project: str, what: str) -> T:
    row = session.get(model, id_)
    if row is None or getattr(row, "project_id", project) != project:
        raise not_found(what, id_)
    return row


def not_found(what: str, id_: str) -> Problem:
    """The 404 of a resource this project does not have (another project's ids answer the same)."""
    return Problem(404, f"no {what} with id {id_!r}", field=f"{what}_id", resource=what)


def find_by_sha(session: Session, model: Any, project: str, sha256: str) -> Any:
    return session.scalars(
        select(model).where(model.project_id == project, model.sha256 == sha256).order_by(model.created_at)
    ).first()


def multipart(required: list[str], fields: dict[str, dict], summary: str) -> dict[str, Any]:
    """`openapi_extra` for an upload route: the multipart form it reads itself (streamed, not via FastAPI)."""
    properties = {"file": {"type": "string", "format": "binary", "description": summary}, **fields}
    return {
        "requestBody": {
            "required": True,
            "content": {
                "multipart/form-data": {
                    "schema": {"type": "object", "required": ["file", *required], "properties": properties}
                }
            },
        }
    }


UPLOAD_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "a malformed multipart body"},
    413: {"description": "file over the size limit"},
    415: {"description": "not a multipart/form-data body"},
    422: {"description": "a form field is missing or invalid, or the file is not usable; `field` says"},
}
NAME_FIELD = {"name": {"type": "string", "maxLength": 200, "description": "defaults to the file name"}}


def refuse_control_characters(value: str, field: str) -> str:
    """The check schemas.CleanStr makes, for what a route reads itself (multipart fields, headers)."""
    if (char := control_character(value)) is not None:
        raise Problem(
            422, f"{field} contains a control character ({char}); ids, names and filenames may not", field=field
        )
    return value


def require_name(fields: dict[str, str], default: str | None) -> str:
    """The `name` form field, else the file's name; neither may carry a control character."""
    if default:
        refuse_control_characters(default, "file")  # the upload's filename
    name = refuse_control_characters((fields.get("name") or default or "").strip(), "name")
    if not name:
        raise Problem(422, "name is required", field="name")
    if len(name) > 200:
        raise Problem(422, "name is longer than 200 characters", field="name")
    return name
