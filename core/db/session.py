"""Engines and sessions. SQLite gets WAL and a busy timeout: the API and the worker write concurrently."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _normalise(url: str) -> str:
    # One driver for PostgreSQL everywhere: psycopg 3 (psycopg2 is not installed).
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


@dataclass(frozen=True)
class PoolSize:
    """A PostgreSQL connection pool per process: `size` kept open, `overflow` more under a burst, and how long
    a request waits for one before it fails (sized in docs/scaling.md, "The API")."""

    size: int = 10
    overflow: int = 10
    timeout_s: float = 10.0


def make_engine(url: str, pool: PoolSize = PoolSize()) -> Engine:
    url = _normalise(url)
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(
        url, pool_pre_ping=True, pool_size=pool.size, max_overflow=pool.overflow, pool_timeout=pool.timeout_s
    )


@lru_cache(maxsize=8)
def engine_for(url: str, pool: PoolSize = PoolSize()) -> Engine:
    """One engine (and pool) per URL and pool size per process."""
    return make_engine(url, pool)


def session_factory(url: str, pool: PoolSize = PoolSize()) -> sessionmaker[Session]:
    return sessionmaker(engine_for(url, pool), expire_on_commit=False)


def read_engine(url: str, pool: PoolSize = PoolSize()) -> Engine:
    """For reads that need no transaction around them (the API key lookup, one job, a page of jobs): each
    statement commits on its own, so there is no BEGIN before the first and no ROLLBACK at close, two
    of a GET's database round trips on PostgreSQL (docs/scaling.md, "The API"). The same pool as
    `session_factory`'s; a connection goes back to it with its isolation level restored."""
    return engine_for(url, pool).execution_options(isolation_level="AUTOCOMMIT")


@contextmanager
def session_scope(url: str) -> Iterator[Session]:
    """A session that commits on success and rolls back on error."""
    with session_factory(url)() as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise
