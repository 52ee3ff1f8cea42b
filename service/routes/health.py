"""GET /healthz (the process answers) and /readyz (database, broker and store answer, and user models can
run in the sandbox: docs/security.md; which devices the live workers serve, and the queued jobs no live
worker can run).

The workers do not decide readiness: the API can take jobs while its workers restart, and taking it
out of a load balancer because a worker is down would refuse every request instead of some. So the
workers are reported (`workers`), and `warnings` names each device with queued jobs and no worker.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy import func, select, text
from starlette.concurrency import run_in_threadpool

from core import workers
from core.db import jobstate
from core.db.models import Job
from core.settings import DEVICES
from job_host import bubblewrap
from service.problems import problem_response

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict:
    return {"status": "ok"}


def _check(fn) -> str | None:
    try:
        fn()
    except Exception as e:  # readiness reports any failure, it never raises
        return f"{type(e).__name__}: {e}"[:300]
    return None


@router.get("/readyz", responses={503: {"description": "a dependency is down"}})
async def readyz(request: Request):
    state = request.app.state

    def database() -> None:
        with state.sessions() as session:
            session.execute(text("SELECT 1"))

    checks = {
        "database": database,
        "broker": state.dispatcher.ping,
        "store": state.store.check,
        "sandbox": bubblewrap.require,
    }
    results = {name: await run_in_threadpool(_check, fn) for name, fn in checks.items()}
    body = {name: ("ok" if err is None else err) for name, err in results.items()}
    if results["sandbox"] is None and bubblewrap.state().mode != "bubblewrap":
        body["sandbox"] = "unsafe-no-sandbox"  # ready, as the operator asked, but never silently
    failed = [name for name, err in results.items() if err is not None]
    if failed:
        return problem_response(
            503, "Service Unavailable", f"not ready: {', '.join(failed)} unavailable", request.url.path, checks=body
        )
    return JSONResponse({"status": "ready", "checks": body, **await run_in_threadpool(_workers, state)})


def _workers(state) -> dict:
    settings = state.settings
    with state.sessions() as session:
        queues = workers.live_queues(session, settings.worker_stale_s)
        waiting = dict(
            session.execute(
                select(Job.device, func.count())
                .where(Job.status == jobstate.QUEUED, Job.queue.in_([settings.queue_for(d) for d in DEVICES]))
                .group_by(Job.device)
            ).all()
        )
    served = workers.served_devices(queues, settings)
    warnings = [
        f"{n} queued {d} job(s) and no live worker serves {d}" for d, n in sorted(waiting.items()) if d not in served
    ]
    return {"workers": {"devices": served, "queued": waiting}, "warnings": warnings}
