"""The worker registry: which queues the live workers consume, so a job nobody can run is told so.

Each Celery worker writes its row (its node name and the queues it consumes) when it is ready and
renews it every `worker_heartbeat_s` (worker/lifecycle.py); a row not renewed for `worker_stale_s`
is a dead worker's. The database, not Redis: it is the one store every deployment has (the
embedded mode has no Redis), the API and the reaper already read it, and a heartbeat every ten
seconds per worker is nothing to it. Celery's own worker events and `inspect` broadcasts would work
on Redis only and answer within a timeout rather than from a table.

Queues are named `<queue_prefix>.<device>` (core/settings.py): the workers of one deployment share
a prefix, so a worker of another deployment on the same database is not counted as serving it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import cast

from sqlalchemy import CursorResult, delete, select
from sqlalchemy.orm import Session

from core.db.models import Worker, utcnow
from core.settings import DEVICES, Settings


def heartbeat(session: Session, name: str, queues: list[str]) -> None:
    """Write or renew the worker's row."""
    row = session.get(Worker, name)
    if row is None:
        session.add(Worker(name=name, queues=sorted(queues)))
    else:
        row.queues, row.last_seen_at = sorted(queues), utcnow()


def unregister(session: Session, name: str) -> None:
    session.execute(delete(Worker).where(Worker.name == name))


def forget_node(session: Session, name: str) -> int:
    """Remove the rows of the dead worker node `name@<host>` (each `name@<host>:<pid>`): how many there were,
    i.e. whether it ever came up (a worker registers once it is ready)."""
    result = session.execute(delete(Worker).where(Worker.name.startswith(f"{name}@", autoescape=True)))
    return cast(CursorResult, result).rowcount


def live_queues(session: Session, stale_s: float) -> set[str]:
    """Every queue a worker seen in the last `stale_s` seconds consumes."""
    since = utcnow() - timedelta(seconds=stale_s)
    rows = session.scalars(select(Worker.queues).where(Worker.last_seen_at >= since))
    return {q for queues in rows for q in queues}


def prefix_of(queue: str) -> str:
    return queue.rsplit(".", 1)[0]


def has_workers(queues: set[str], prefix: str) -> bool:
    """Whether any live worker belongs to the deployment of `prefix`."""
    return any(prefix_of(q) == prefix for q in queues)


def served_devices(queues: set[str], settings: Settings) -> list[str]:
    return [d for d in DEVICES if settings.queue_for(d) in queues]


def unserved(session: Session, device: str, settings: Settings) -> list[str] | None:
    """The devices served now when no live worker serves `device`; None when one does, or when none of
    this deployment has registered at all (it is starting or restarting: its jobs wait for it)."""
    queues = live_queues(session, settings.worker_stale_s)
    if settings.queue_for(device) in queues or not has_workers(queues, settings.queue_prefix):
        return None
    return served_devices(queues, settings)


def unserved_message(device: str, served: list[str]) -> str:
    return (
        f"no live worker serves device {device!r}; the devices served now: {', '.join(served) or 'none'}. "
        f"Start a worker for it (amct worker --devices {device}) or choose a served device"
    )
