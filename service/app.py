"""The FastAPI application: `create_app(settings)` wires the database, the store and the queue."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from contextlib import asynccontextmanager

import anyio
import uvicorn
from fastapi import FastAPI
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from core.db import migrate
from core.db.models import Project
from core.db.session import read_engine, session_factory
from core.queue import Dispatcher, make_celery
from core.reaper import reap_once
from core.settings import Settings
from core.storage import open_store
from job_host import bubblewrap
from service import auth, metrics, problems
from service.routes import artifacts, configs, datasets, docs, events, health, jobs, keys, meta, models, ui
from service.routes import metrics as metrics_route

log = logging.getLogger("amct.api")


async def reap_forever(settings: Settings, dispatcher: Dispatcher) -> None:
    """Run the reaper (core/reaper.py) in a thread at once, then every reap_interval_s; an error is logged, not
    fatal. At once: a restarted server's jobs whose worker processes died with it are queued again at its start
    (core/lease_owner.py), not after a reap interval."""
    while True:
        try:
            result = await asyncio.to_thread(reap_once, settings, dispatcher)
            if any(result.values()):
                log.info("reaper: %s", result)
        except Exception:
            log.exception("reaper run failed; trying again in %s s", settings.reap_interval_s)
        await asyncio.sleep(settings.reap_interval_s)


def ensure_project(sessions, project: str) -> None:
    """Create the deployment's project row once. Idempotent under concurrency: every API process runs this at
    start-up, and on a fresh database two of them may both see no row; the loser's insert fails on the primary
    key, which means the row is there (docs/service.md, "Servers")."""
    with sessions() as session:
        if session.scalar(select(Project.id).where(Project.id == project)) is not None:
            return
        session.add(Project(id=project, name=project))
        try:
            session.commit()
        except IntegrityError:
            session.rollback()
            if session.scalar(select(Project.id).where(Project.id == project)) is None:
                raise  # not the race: some other constraint failed


def create_app(settings: Settings | None = None, run_migrations: bool = True) -> FastAPI:
    settings = settings or Settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    settings.tmp_dir.mkdir(parents=True, exist_ok=True)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if run_migrations:
            migrate.upgrade(settings.resolved_database_url)
        ensure_project(app.state.sessions, settings.project)
        auth.warn_if_open(settings)
        bubblewrap.log_state("api")  # uploads are checked in the sandbox: say loudly when there is none
        if settings.auth == "keys" and settings.database_url is None:
            # The embedded mode: the first start makes the local admin key (printed once, saved 0600).
            auth.bootstrap_local_key(settings, app.state.sessions)
        reaper = asyncio.create_task(reap_forever(settings, app.state.dispatcher)) if settings.reap_in_api else None
        yield
        if reaper is not None:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper

    app = FastAPI(
        title="AMCT compression service",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        description="Upload a TorchScript model, a .cfg and a dataset; submit a compression job; "
        "watch it; download the ONNX models and the report.",
    )
    app.state.settings = settings
    app.state.sessions = session_factory(settings.resolved_database_url, settings.db_pool)
    app.state.read_engine = read_engine(settings.resolved_database_url, settings.db_pool)
    # The polled reads (auth.read_as_caller) take at most this many threads, each holding one pooled connection:
    # a burst waits on the event loop, instead of opening overflow connections that the pool closes again
    # (a PostgreSQL backend started and stopped per read) and of more threads contending for the GIL.
    app.state.read_limiter = anyio.CapacityLimiter(settings.db_pool.size)
    app.state.store = open_store(settings.resolved_artifact_store, settings.s3_endpoint_url)
    app.state.dispatcher = Dispatcher(make_celery(settings))
    app.state.metrics, latency = metrics.make_registry(app.state.sessions, settings)
    app.add_middleware(metrics.HttpMetricsMiddleware, latency=latency)
    problems.install(app)
    for module in (health, meta, models, configs, datasets, jobs, events, artifacts, keys, metrics_route):
        app.include_router(module.router)
    app.include_router(docs.router)  # /docs and /redoc with their assets from this server (offline)
    ui.mount(app)  # the dashboard at /ui, and / redirects there
    return app


class ApiServer(uvicorn.Server):
    """uvicorn's Server, which hangs up the open job event streams when it begins to shut down.

    uvicorn waits for every response to end, and an event stream ends only with its job: Ctrl-C of `amct
    serve` with a dashboard open waited that long. Closed as a client that hangs up (no traceback), the
    stream reads as dropped, which clients resume with Last-Event-ID (service/client.py, ui/api.js); a
    clean end would tell them the job is over.
    """

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for connection in list(self.server_state.connections):
            if events.is_event_stream(getattr(connection, "scope", None)):
                connection.transport.close()
        await super().shutdown(sockets)


def app_from_env() -> FastAPI:
    """The app of each API process in production: `uvicorn service.app:app_from_env --factory --workers N`
    (docker-compose.yml, docs/scaling.md). Settings from the environment; each process runs the migrations
    at start-up, one at a time (an advisory lock on PostgreSQL, migrations/env.py)."""
    return create_app(Settings())
