"""Start-up of several API processes on a fresh database (docs/service.md, "Servers").

`ensure_project` runs in every API process at start-up: on a fresh database all of them may find no project
row and insert it. The losers must carry on, on SQLite and on PostgreSQL. And a start-up that fails must end
`amct api` with a non-zero status, so that a container's restart policy starts it again.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import event, func, select

from core.db import migrate
from core.db.models import Project
from core.db.session import session_factory
from service.app import ensure_project

RACERS = 4


def _race(url: str, project: str) -> int:
    """RACERS threads call ensure_project(project) at once, each after every one of them has looked for the row
    and found none (a barrier after the SELECT): the interleaving that broke 2 starts in 16. How many rows."""
    sessions = session_factory(url)
    barrier = threading.Barrier(RACERS, timeout=10)
    looked = threading.local()

    def after_select(_conn, _cursor, statement, *_args) -> None:
        # Only each thread's first look at projects: the re-read after a lost insert must not wait.
        if (
            statement.lstrip().upper().startswith("SELECT")
            and "projects" in statement
            and not getattr(looked, "done", False)
        ):
            looked.done = True
            barrier.wait()

    engine = sessions.kw["bind"]
    event.listen(engine, "after_cursor_execute", after_select)
    try:
        with ThreadPoolExecutor(RACERS) as pool:
            for future in [pool.submit(ensure_project, sessions, project) for _ in range(RACERS)]:
                future.result()  # re-raises a racer's error
    finally:
        event.remove(engine, "after_cursor_execute", after_select)
    with sessions() as session:
        return session.scalar(select(func.count()).select_from(Project).where(Project.id == project))


def test_concurrent_ensure_project_on_sqlite(tmp_path):
    url = f"sqlite:///{tmp_path / 'amct.db'}"
    migrate.upgrade(url)
    assert _race(url, "race-sqlite") == 1
    assert _race(url, "race-sqlite") == 1  # and again when the row is there


def test_concurrent_ensure_project_on_postgresql(pg_url):
    migrate.upgrade(pg_url)
    assert _race(pg_url, "race-pg") == 1
    assert _race(pg_url, "race-pg") == 1


def test_a_failed_start_up_exits_non_zero(tmp_path):
    """Migrations against a database that cannot be opened fail every API process's start-up: `amct api`
    (two processes, uvicorn's supervisor) stops with uvicorn's start-up failure status 3, not 0."""
    env = {
        "DATABASE_URL": f"sqlite:///{tmp_path / 'missing-folder' / 'amct.db'}",
        "AMCT_DATA_DIR": str(tmp_path / "data"),
        "PATH": "/usr/bin:/bin",
    }
    done = subprocess.run(
        [sys.executable, "-m", "service", "api", "--workers", "2", "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3, done.stderr[-2000:]
    assert "failed to start" in done.stderr


@pytest.fixture(autouse=True)
def _fresh_engines():
    """Each test's URL gets its own engine (engine_for caches per process)."""
    from core.db.session import engine_for

    engine_for.cache_clear()
    yield
    engine_for.cache_clear()
