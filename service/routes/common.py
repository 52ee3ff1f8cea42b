"""Small helpers shared by the routes: the project row, lookups that 404 with the resource named."""

from __future__ import annotations

from typing import TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db.models import Base
from service.problems import Problem

T = TypeVar("T", bound=Base)


def get_or_404(session: Session, model: type[T], id_: str, project: str, what: str) -> T:
    row = session.get(model, id_)
    if row is None or getattr(row, "project_id", project) != project:
        raise Problem(404, f"no {what} with id {id_!r}", field=f"{what}_id", resource=what)
    return row


def find_by_sha(session: Session, model: type[T], project: str, sha256: str) -> T | None:
    return session.scalars(select(model).where(model.project_id == project, model.sha256 == sha256)
                           .order_by(model.created_at)).first()


def require_name(fields: dict[str, str], default: str | None) -> str:
    name = (fields.get("name") or default or "").strip()
    if not name:
        raise Problem(422, "name is required", field="name")
    if len(name) > 200:
        raise Problem(422, "name is longer than 200 characters", field="name")
    return name
