"""Prometheus metrics: HTTP latency measured in the API process, job numbers read from the database.

Every job number is computed from the database at scrape time, not counted in memory. Job state
changes happen in Celery workers on other machines (claim, finish, fail), in the reaper, and in
any of several API replicas (submit, cancel); a counter in one process would see only its own
share and restart from zero with it. The database is the one place every transition lands, so any
replica answers a scrape with the same, complete numbers, and a restart loses nothing. That covers
the job duration histogram too: it is built from `started_at` / `finished_at` of finished jobs, in
one aggregate query whose size does not grow with the number of jobs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from sqlalchemy import case, extract, func, select
from sqlalchemy.exc import SQLAlchemyError

from core.db import jobstate
from core.db.models import Job
from core.settings import DEVICES, Settings
from job_host.kinds import JOB_KINDS

log = logging.getLogger(__name__)
# Compression jobs take seconds (a small CNN) to hours (a transformer's distillation).
DURATION_BUCKETS = (5, 15, 30, 60, 120, 300, 600, 1800, 3600, 3 * 3600, 12 * 3600, 24 * 3600)
HTTP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


def _duration_s(dialect: str):
    """finished_at - started_at in seconds, in SQL: the two dialects spell it differently."""
    if dialect == "sqlite":  # stored as UTC text; julianday counts days
        return (func.julianday(Job.finished_at) - func.julianday(Job.started_at)) * 86400.0
    return extract("epoch", Job.finished_at - Job.started_at)


class JobCollector:
    """`amct_jobs{state,kind}`, `amct_queue_depth{queue}`, `amct_job_duration_seconds{kind,state}`."""

    def __init__(self, sessions, settings: Settings) -> None:
        self.sessions, self.settings = sessions, settings

    def describe(self) -> list[Metric]:
        return []  # names are fixed in collect(); describing would run the queries at registration

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("amct_database_up", "1 when the job numbers below could be read from the database")
        try:
            with self.sessions() as session:
                families = [self._jobs(session), self._queues(session), self._durations(session)]
        except SQLAlchemyError as e:
            log.warning("metrics: the database did not answer: %s", e)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families

    def _jobs(self, session) -> Metric:
        counts = {(s, k): 0 for s in jobstate.STATES for k in JOB_KINDS}  # zeros too: a missing series is no 0
        for status, kind, n in session.execute(
            select(Job.status, Job.kind, func.count()).group_by(Job.status, Job.kind)
        ):
            counts[(status, kind)] = n
        family = GaugeMetricFamily("amct_jobs", "jobs by state and kind, all projects", labels=["state", "kind"])
        for (status, kind), n in sorted(counts.items()):
            family.add_metric([status, kind], n)
        return family

    def _queues(self, session) -> Metric:
        """Queued jobs per device queue: the database's count, which a broker's own (unacked, redelivered,
        revoked messages) can disagree with."""
        depth = {self.settings.queue_for(d): 0 for d in DEVICES}
        rows = session.execute(select(Job.queue, func.count()).where(Job.status == jobstate.QUEUED).group_by(Job.queue))
        depth.update(dict(rows.all()))
        family = GaugeMetricFamily("amct_queue_depth", "jobs waiting for a worker, per queue", labels=["queue"])
        for queue, n in sorted(depth.items()):
            family.add_metric([queue], n)
        return family

    def _durations(self, session) -> Metric:
        seconds = _duration_s(session.bind.dialect.name)
        buckets = [func.sum(case((seconds <= b, 1), else_=0)) for b in DURATION_BUCKETS]
        query = (
            select(Job.kind, Job.status, func.count(), func.coalesce(func.sum(seconds), 0.0), *buckets)
            .where(Job.status.in_(jobstate.TERMINAL), Job.started_at.is_not(None), Job.finished_at.is_not(None))
            .group_by(Job.kind, Job.status)
        )
        family = HistogramMetricFamily(
            "amct_job_duration_seconds",
            "run time of finished jobs, from start to end (queued time excluded)",
            labels=["kind", "state"],
        )
        for kind, status, count, total, *cumulative in session.execute(query):
            edges = [(str(float(b)), int(c or 0)) for b, c in zip(DURATION_BUCKETS, cumulative, strict=True)]
            family.add_metric([kind, status], edges + [("+Inf", int(count))], sum_value=float(total))
        return family


def make_registry(sessions, settings: Settings) -> tuple[CollectorRegistry, Histogram]:
    """A registry per app (tests build many apps in one process), and its HTTP latency histogram."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    registry.register(JobCollector(sessions, settings))
    latency = Histogram(
        "amct_http_request_duration_seconds",
        "HTTP request latency until the response starts, by route template",
        ["method", "route", "status"],
        buckets=HTTP_BUCKETS,
        registry=registry,
    )
    return registry, latency


class HttpMetricsMiddleware:
    """Pure ASGI middleware (no BaseHTTPMiddleware: it would buffer the SSE and download streams).

    Latency runs to the start of the response: for an event stream or a large download the rest is
    the job's lifetime or the client's bandwidth, not the server's latency. The route label is the
    path template (`/v1/jobs/{job_id}`), so ids do not make one series each; unmatched paths share one.
    """

    def __init__(self, app, latency: Histogram) -> None:
        self.app, self.latency = app, latency

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        root = scope.get("root_path", "")
        done = False

        def observe(status: int) -> None:
            nonlocal done
            done = True
            self.latency.labels(scope["method"], _route(scope, root), str(status)).observe(time.perf_counter() - start)

        async def timed_send(message) -> None:
            if message["type"] == "http.response.start" and not done:
                observe(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            if not done:  # an exception before any response: the outer error handler answers 500
                observe(500)


def _route(scope, root: str) -> str:
    route = scope.get("route")
    if route is not None and getattr(route, "path", None):
        return route.path
    # A mount (the dashboard's static files) records itself in root_path, not in "route".
    mounted = scope.get("root_path", "")[len(root) :]
    return mounted or "unmatched"
