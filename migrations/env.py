"""Alembic environment: one chain for SQLite and PostgreSQL (portable types, batch mode for SQLite)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import text

from core.db.models import Base
from core.db.session import make_engine
from core.settings import Settings

# An advisory lock key: API replicas starting together run the migrations one at a time.
_PG_LOCK = 7_216_115_001


def _url() -> str:
    return context.config.attributes.get("url") or Settings().resolved_database_url


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=Base.metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = make_engine(_url())
    with engine.connect() as connection:
        is_pg = connection.dialect.name == "postgresql"
        if is_pg:
            connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _PG_LOCK})
            connection.commit()
        try:
            context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
            with context.begin_transaction():
                context.run_migrations()
        finally:
            if is_pg:
                connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_LOCK})
                connection.commit()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
