"""The FastAPI application: `create_app(settings)` wires the database, the store and the queue."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI
from sqlalchemy import select

from service import problems
from service.db import migrate
from service.db.models import Project
from service.db.session import session_factory
from service.dispatch import Dispatcher
from service.routes import artifacts, configs, datasets, events, health, jobs, models
from service.settings import Settings
from service.storage import open_store


def ensure_project(sessions, project: str) -> None:
    with sessions() as session:
        if session.scalar(select(Project.id).where(Project.id == project)) is None:
            session.add(Project(id=project, name=project))
            session.commit()


def create_app(settings: Settings | None = None, run_migrations: bool = True) -> FastAPI:
    settings = settings or Settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    settings.tmp_dir.mkdir(parents=True, exist_ok=True)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if run_migrations:
            migrate.upgrade(settings.resolved_database_url)
        ensure_project(app.state.sessions, settings.project)
        yield

    app = FastAPI(title="AMCT compression service", version="0.1.0", lifespan=lifespan,
                  description="Upload a TorchScript model, a .cfg and a dataset; submit a compression job; "
                              "watch it; download the ONNX models and the report.")
    # Imported here: the worker package imports service.*, not the other way round at module load.
    from worker.celery_app import make_celery

    app.state.settings = settings
    app.state.sessions = session_factory(settings.resolved_database_url)
    app.state.store = open_store(settings.resolved_artifact_store, settings.s3_endpoint_url)
    app.state.dispatcher = Dispatcher(make_celery(settings))
    problems.install(app)
    for module in (health, models, configs, datasets, jobs, events, artifacts):
        app.include_router(module.router)
    return app
