"""Model uploads checked in the background (`Prefer: respond-async`, RFC 7240): the upload is answered as soon
as its file is stored, and the sandboxed check (service/routes/models.py `validate_in_child`) goes on after.

An upload's check is a sandboxed process that loads, runs and captures the model: seconds for a small CNN,
minutes for a transformer on a busy machine, more than many clients and proxies wait for an answer (issue 39).
Asked for, the answer is 202 with the model `validating`; the model becomes `ready` (its outputs and layers
recorded) or `invalid` (`status_detail`: the refusal a synchronous upload gets as its 422) when the check
ends. It holds its check slot until then, so the cap on checks at once still holds. A check cut short by the
API's stop leaves the model `validating`: the reaper marks it `invalid` after the check's time limit
(core/reaper.py), so a client polling it gets an answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import ExitStack

from fastapi import FastAPI, Request
from sqlalchemy import update
from starlette.concurrency import run_in_threadpool

from core.db.models import Model

log = logging.getLogger("amct.api")


def wants_async(request: Request) -> bool:
    """The request's `Prefer` header holds `respond-async`."""
    preferences = request.headers.get("prefer", "").split(",")
    return any(p.split(";", 1)[0].strip().lower() == "respond-async" for p in preferences)


def start(
    app: FastAPI, model_id: str, check: Callable[[], dict], columns: Callable[[dict], dict], held: ExitStack
) -> None:
    """Run `check` (the sandboxed check, returning its report) in the background and write `columns(report)` to the
    model `model_id`, which is `validating` until then; `held` (the check slot, the uploaded file) is released
    when the check ends."""
    tasks: set[asyncio.Task] = app.state.__dict__.setdefault("model_checks", set())
    task = asyncio.get_running_loop().create_task(_check(app, model_id, check, columns, held))
    tasks.add(task)  # referenced until done: the event loop keeps only a weak reference to a task
    task.add_done_callback(tasks.discard)


async def _check(
    app: FastAPI, model_id: str, check: Callable[[], dict], columns: Callable[[dict], dict], held: ExitStack
) -> None:
    try:
        values = columns(await run_in_threadpool(check))
    except Exception as e:  # the check could not run (e.g. the sandbox went away): the model is not usable
        log.exception("the check of model %s failed", model_id)
        values = {"status": "invalid", "status_detail": f"the model could not be checked ({type(e).__name__})"}
    finally:
        held.close()
    await run_in_threadpool(_record, app, model_id, values)


def _record(app: FastAPI, model_id: str, values: dict) -> None:
    with app.state.sessions.begin() as session:
        session.execute(update(Model).where(Model.id == model_id, Model.status == "validating").values(**values))
