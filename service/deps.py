"""Route dependencies, declared with Annotated so a route's signature reads as its contract.

FastAPI runs a plain `def` dependency in its thread pool, one hand-over per dependency (and two for a
generator: its start and its end), each a cross-thread wake-up of the event loop. The ones here do no
I/O to start (a Session checks out a connection at its first statement), so they are `async def` and run
on the event loop; only a session's close, which may talk to the database, goes to a worker thread
(docs/scaling.md, "The API").
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

import anyio
from fastapi import Depends, Request
from sqlalchemy.orm import Session

from core.queue import Dispatcher
from core.settings import Settings
from core.storage import BlobStore


async def _settings(request: Request) -> Settings:
    return request.app.state.settings


async def _close(session: Session) -> None:
    # Returns its connection, a ROLLBACK when a transaction is open: that may free a row lock the thread
    # pool's threads all wait on, so it takes a thread outside the pool's limit, and a cancelled request
    # still closes it (as FastAPI's own exit of a generator dependency does).
    with anyio.CancelScope(shield=True):
        await anyio.to_thread.run_sync(session.close, limiter=anyio.CapacityLimiter(1))


# Each generator closes its session itself: one generator iterating another would leave the inner one's
# `finally` to the garbage collector when the route raises.
async def _session(request: Request) -> AsyncIterator[Session]:
    session = request.app.state.sessions()
    try:
        yield session
    finally:
        await _close(session)


async def _store(request: Request) -> BlobStore:
    return request.app.state.store


async def _dispatcher(request: Request) -> Dispatcher:
    return request.app.state.dispatcher


SettingsDep = Annotated[Settings, Depends(_settings)]
SessionDep = Annotated[Session, Depends(_session)]
StoreDep = Annotated[BlobStore, Depends(_store)]
DispatcherDep = Annotated[Dispatcher, Depends(_dispatcher)]
