"""Route dependencies, declared with Annotated so a route's signature reads as its contract."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from service.queue import Dispatcher
from service.settings import Settings
from service.storage import BlobStore


def _settings(request: Request) -> Settings:
    return request.app.state.settings


def _session(request: Request) -> Iterator[Session]:
    with request.app.state.sessions() as session:
        yield session


def _read_session(request: Request) -> Iterator[Session]:
    with request.app.state.read_sessions() as session:
        yield session


def _store(request: Request) -> BlobStore:
    return request.app.state.store


def _dispatcher(request: Request) -> Dispatcher:
    return request.app.state.dispatcher


SettingsDep = Annotated[Settings, Depends(_settings)]
SessionDep = Annotated[Session, Depends(_session)]
# Reads only: every statement commits on its own (db/session.py read_session_factory).
ReadSessionDep = Annotated[Session, Depends(_read_session)]
StoreDep = Annotated[BlobStore, Depends(_store)]
DispatcherDep = Annotated[Dispatcher, Depends(_dispatcher)]
