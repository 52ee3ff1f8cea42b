"""/v1/keys (admin scope): the caller's project's API keys; /v1/me: who the caller is."""

from __future__ import annotations

from fastapi import APIRouter, Request
from sqlalchemy import select

from core.db.models import ApiKey
from service import auth
from service.auth import AdminCaller, ReadCaller
from service.deps import SessionDep
from service.problems import Problem
from service.schemas import CleanStr, KeyCreate, KeyCreated, KeyList, KeyOut, Me

router = APIRouter(tags=["keys"])


@router.get("/v1/me", response_model=Me)
def me(caller: ReadCaller) -> Me:
    """The project and scopes of the key this request carries."""
    return Me(project=caller.project, scopes=sorted(caller.scopes), key_id=caller.key_id)


@router.post("/v1/keys", status_code=201, response_model=KeyCreated)
def create_key(body: KeyCreate, request: Request, session: SessionDep, caller: AdminCaller) -> KeyCreated:
    """A new key in the caller's project. `secret` is in this response only: the server keeps its hash."""
    key_id, secret = auth.create_key(request.app.state.sessions, caller.project, body.scopes, body.name)
    key = session.get(ApiKey, key_id)
    return KeyCreated(**KeyOut.model_validate(key).model_dump(), secret=secret)


@router.get("/v1/keys", response_model=KeyList)
def list_keys(session: SessionDep, caller: AdminCaller) -> KeyList:
    """The project's keys, revoked ones included; never their secrets."""
    rows = session.scalars(
        select(ApiKey).where(ApiKey.project_id == caller.project).order_by(ApiKey.created_at, ApiKey.id)
    ).all()
    return KeyList(items=[KeyOut.model_validate(k) for k in rows])


@router.post("/v1/keys/{key_id}/revoke", response_model=KeyOut)
def revoke_key(key_id: CleanStr, request: Request, session: SessionDep, caller: AdminCaller) -> KeyOut:
    """Revoke (idempotent): requests with the key answer 401 from now on. A key may revoke itself."""
    if not auth.revoke_key(request.app.state.sessions, key_id, caller.project):
        raise Problem(404, f"no key with id {key_id!r}", field="key_id", resource="key")
    return KeyOut.model_validate(session.get(ApiKey, key_id))
