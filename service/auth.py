"""Projects, API keys and the caller: who is asking, for which project, with which scopes.

A key is `amct_<43 url-safe characters>` from `secrets` (256 random bits). It is shown once, at
creation; the database keeps only its SHA-256 and a short visible prefix for listings. A fast hash is
right here (unlike passwords): a 256-bit random secret cannot be guessed or brute-forced from its
hash, so a slow KDF would only slow every request down.

Scopes nest: `admin` ⊃ `write` ⊃ `read`. Routes take `ReadCaller`, `WriteCaller` or `AdminCaller`;
every query they run is filtered by `caller.project`, so another project's ids answer 404.
With `AMCT_AUTH=open` every request acts as `settings.project` with all scopes, from loopback
clients only: local development, logged as a warning at start.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import os
import re
import secrets
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated, TypeVar

import anyio
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Connection, and_, bindparam, or_, select, update

from core.db.models import ApiKey, Project, utcnow
from core.settings import Settings
from service.problems import Problem

log = logging.getLogger("amct.auth")

SCOPES = ("read", "write", "admin")
# What each granted scope lets a caller do.
_IMPLIES = {"read": {"read"}, "write": {"read", "write"}, "admin": {"read", "write", "admin"}}
KEY_PREFIX = "amct_"
VISIBLE_CHARS = 12  # "amct_" + 7 characters: enough to tell keys apart in a listing, useless to guess
PROJECT_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
# last_used_at is a hint for humans: refresh it at most this often, not on every request.
_TOUCH_EVERY = timedelta(seconds=60)
KEY_FILE = "api-key"
T = TypeVar("T")


@dataclass(frozen=True)
class Caller:
    project: str
    scopes: frozenset[str]
    key_id: str | None  # None in open mode


def expand_scopes(scopes: Iterable[str]) -> frozenset[str]:
    granted: set[str] = set()
    for scope in scopes:
        if scope not in _IMPLIES:
            raise ValueError(f"unknown scope {scope!r}; scopes are {', '.join(SCOPES)}")
        granted |= _IMPLIES[scope]
    return frozenset(granted)


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_secret() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


# -- projects and keys, usable without HTTP (admin CLI, bootstrap, tests) -------------------------------


def create_project(sessions, project_id: str, name: str | None = None) -> None:
    """ValueError when the id is malformed or taken."""
    if not PROJECT_ID.match(project_id):
        raise ValueError(f"project id {project_id!r} must be 1-64 of a-z 0-9 _ -, starting with a letter or digit")
    with sessions() as session:
        if session.get(Project, project_id) is not None:
            raise ValueError(f"project {project_id!r} already exists")
        session.add(Project(id=project_id, name=name or project_id))
        session.commit()


def create_key(sessions, project_id: str, scopes: Iterable[str], name: str | None = None) -> tuple[str, str]:
    """A new key for the project: (key id, secret). The secret is not stored and cannot be shown again."""
    scopes = sorted(set(scopes)) or ["read"]
    expand_scopes(scopes)  # ValueError on an unknown scope
    secret = new_secret()
    with sessions() as session:
        if session.get(Project, project_id) is None:
            raise ValueError(f"no project {project_id!r}")
        key = ApiKey(
            project_id=project_id,
            name=name or "",
            prefix=secret[:VISIBLE_CHARS],
            key_hash=hash_key(secret),
            scopes=scopes,
        )
        session.add(key)
        session.commit()
        return key.id, secret


def revoke_key(sessions, key_id: str, project_id: str | None = None) -> bool:
    """Revoke (idempotent); False when no such key (in that project, when one is given)."""
    with sessions() as session:
        key = session.get(ApiKey, key_id)
        if key is None or (project_id is not None and key.project_id != project_id):
            return False
        if key.revoked_at is None:
            key.revoked_at = utcnow()
            session.commit()
        return True


def list_keys(sessions, project_id: str) -> list[ApiKey]:
    with sessions() as session:
        return list(
            session.scalars(
                select(ApiKey).where(ApiKey.project_id == project_id).order_by(ApiKey.created_at, ApiKey.id)
            )
        )


# Built once: the same statement object each time skips building it and adapting its cached result columns.
_KEY_BY_HASH = select(ApiKey.id, ApiKey.project_id, ApiKey.scopes, ApiKey.revoked_at, ApiKey.last_used_at).where(
    ApiKey.key_hash == bindparam("key_hash")
)


def authenticate(connection: Connection, secret: str) -> Caller | None:
    """The caller a presented key stands for; None for an unknown or revoked key.

    A Core query on a Connection, not an ORM Session: it runs on every request, and loading an ApiKey
    entity cost more than the lookup itself (docs/scaling.md, "The API")."""
    if not secret.startswith(KEY_PREFIX):
        return None
    key = connection.execute(_KEY_BY_HASH, {"key_hash": hash_key(secret)}).first()
    if key is None or key.revoked_at is not None:
        return None
    now = utcnow()
    # A read-only request stays read-only: the row just read says whether the hint is due (once a minute), and
    # only then one conditional UPDATE, so concurrent requests do not pile up writes on the same row. Before,
    # every request ran the UPDATE and a commit (a write round trip per GET, docs/scaling.md).
    if key.last_used_at is None or key.last_used_at < now - _TOUCH_EVERY:
        connection.execute(
            update(ApiKey)
            .where(
                ApiKey.id == key.id, or_(ApiKey.last_used_at.is_(None), and_(ApiKey.last_used_at < now - _TOUCH_EVERY))
            )
            .values(last_used_at=now)
        )
        connection.commit()
    return Caller(project=key.project_id, scopes=expand_scopes(key.scopes), key_id=key.id)


# -- the local project of the embedded mode -------------------------------------------------------------


def bootstrap_local_key(settings: Settings, sessions) -> str | None:
    """First start of the embedded mode: an admin key for the local project, printed once and saved 0600.

    Returns the new secret, or None when the project already has a key (a restart).
    """
    with sessions() as session:
        if session.get(Project, settings.project) is None:
            session.add(Project(id=settings.project, name=settings.project))
            session.commit()
        if session.scalar(select(ApiKey.id).where(ApiKey.project_id == settings.project).limit(1)) is not None:
            return None
    _key_id, secret = create_key(sessions, settings.project, ["admin"], name="local admin (first start)")
    path = (settings.data_dir / KEY_FILE).resolve()
    # Created with mode 0600, so the secret is never readable by others, not even for a moment; a file
    # left from an older database keeps its own mode through O_CREAT, hence the fchmod before writing.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    rule = "=" * 78
    print(
        f"\n{rule}\n  AMCT service: first start. An admin API key for project {settings.project!r}:\n\n"
        f"      {secret}\n\n  It is shown only this once. A copy is in {path} (mode 0600) for the local CLI\n"
        f"  and dashboard. Send it as `Authorization: Bearer <key>`; make more keys with\n"
        f"  `amct admin create-key {settings.project} --scope read`.\n{rule}\n",
        file=sys.stderr,
        flush=True,
    )
    return secret


def warn_if_open(settings: Settings) -> None:
    if settings.auth == "open":
        log.warning(
            "AMCT_AUTH=open: NO AUTHENTICATION. Every request from this machine acts as project %r "
            "with admin rights; requests from other hosts are refused. For local development only.",
            settings.project,
        )


# -- FastAPI dependencies ----------------------------------------------------------------------------------

_bearer = HTTPBearer(auto_error=False, description="an API key: `Authorization: Bearer amct_...`")
_UNAUTHORIZED = {"WWW-Authenticate": "Bearer"}


def _is_loopback(host: str | None) -> bool:
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def caller_of(request: Request, credentials: HTTPAuthorizationCredentials | None, connection: Connection) -> Caller:
    """Who sends this request (Problem 401/403 when nobody may); `connection` looks the key up."""
    settings: Settings = request.app.state.settings
    if settings.auth == "open":
        if not _is_loopback(request.client.host if request.client else None):
            raise Problem(
                403,
                "this server runs without authentication (AMCT_AUTH=open) and serves only localhost",
                field="Authorization",
            )
        return Caller(project=settings.project, scopes=frozenset(SCOPES), key_id=None)
    if credentials is None:
        raise Problem(
            401, "send an API key as `Authorization: Bearer <key>`", field="Authorization", headers=_UNAUTHORIZED
        )
    caller = authenticate(connection, credentials.credentials)
    if caller is None:
        raise Problem(
            401,
            "the API key is unknown or revoked",
            field="Authorization",
            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )
    return caller


def _caller(request: Request, credentials: Credentials) -> Caller:
    with request.app.state.read_engine.connect() as connection:  # autocommit: the lookup needs no transaction
        return caller_of(request, credentials, connection)


def _check_scope(caller: Caller, scope: str) -> Caller:
    if scope not in caller.scopes:
        raise Problem(
            403,
            f"this API key lacks the {scope!r} scope (it has: {', '.join(sorted(caller.scopes))})",
            field="Authorization",
            required_scope=scope,
        )
    return caller


def _requires(scope: str):
    async def check(caller: Annotated[Caller, Depends(_caller)]) -> Caller:  # no I/O: on the event loop
        return _check_scope(caller, scope)

    check.__name__ = f"requires_{scope}"
    return check


async def read_as_caller(
    request: Request, credentials: HTTPAuthorizationCredentials | None, read: Callable[[Connection, Caller], T]
) -> T:
    """`read(connection, caller)` for a caller with the read scope, in one thread hand-off: the key lookup and
    the read share one autocommit connection.

    For the reads clients poll (one job, a page of jobs). As dependencies, the key check and the route each
    take a hand-off to FastAPI's thread pool and a connection of their own; here it is one of each
    (docs/scaling.md, "The API")."""

    def run() -> T:
        with request.app.state.read_engine.connect() as connection:
            return read(connection, _check_scope(caller_of(request, credentials, connection), "read"))

    return await anyio.to_thread.run_sync(run, limiter=request.app.state.read_limiter)


ReadCaller = Annotated[Caller, Depends(_requires("read"))]
WriteCaller = Annotated[Caller, Depends(_requires("write"))]
AdminCaller = Annotated[Caller, Depends(_requires("admin"))]
