"""A cap on the uploads the API checks at once: models (each check is a child of up to
`validate_memory_bytes` and `validate_timeout_s`) and datasets (each streams a whole file).

Beyond the cap an upload is refused at once with 429 and Retry-After, before its body is read: a
burst of uploads cannot take the API's memory, CPU or child processes (issue 16 item 5).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from core.settings import Settings
from service.problems import Problem

_LOCK = threading.Lock()
_SLOTS: dict[tuple[str, int], threading.BoundedSemaphore] = {}

BUSY_RESPONSE: dict[int | str, dict[str, Any]] = {
    429: {
        "description": "the server is checking as many uploads as it allows at once",
        "headers": {
            "Retry-After": {"description": "seconds to wait before uploading again", "schema": {"type": "integer"}}
        },
    }
}


def _limit(settings: Settings, what: str) -> int:
    return settings.max_concurrent_model_checks if what == "model" else settings.max_concurrent_dataset_checks


def _semaphore(what: str, limit: int) -> threading.BoundedSemaphore:
    with _LOCK:
        return _SLOTS.setdefault((what, limit), threading.BoundedSemaphore(limit))


@contextmanager
def checks_slot(settings: Settings, what: str) -> Iterator[None]:
    """Hold one of the `what` ("model" | "dataset") check slots, or raise 429 when none is free."""
    limit = _limit(settings, what)
    slots = _semaphore(what, limit)
    if not slots.acquire(blocking=False):
        raise Problem(
            429,
            f"{limit} {what} uploads are being checked already, the most this server checks at once; "
            "upload again shortly",
            type_="/problems/busy",
            field="file",
            limit=limit,
            headers={"Retry-After": str(settings.check_retry_after_s)},
        )
    try:
        yield
    finally:
        slots.release()
