"""The job quota under concurrent submits (issue 16): 200 submits at once against a quota of 20 accept
exactly 20, on SQLite and on a real PostgreSQL. Before, the count and the insert were not atomic: 21
got through. Each submit runs in its own thread of the app's thread pool, on its own connection.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import func, select

from core.db.models import Job
from tests.service.tenants import make_tenant, populate

QUOTA, SUBMITS = 20, 200


def test_parallel_submits_never_pass_the_quota(api, monkeypatch):
    tenant = populate(make_tenant(api.client.app, api.settings, f"race-{api.settings.queue_prefix[-6:]}"))
    monkeypatch.setattr(api.settings, "max_active_jobs", QUOTA)

    def submit(i: int) -> int:
        return tenant.api.submit(**tenant.job_body(seed=i)).status_code

    with ThreadPoolExecutor(max_workers=40) as pool:
        statuses = Counter(pool.map(submit, range(SUBMITS)))
    assert statuses == {202: QUOTA, 429: SUBMITS - QUOTA}, statuses
    with api.client.app.state.sessions() as session:
        active = session.scalar(
            select(func.count())
            .select_from(Job)
            .where(Job.project_id == tenant.project, Job.status.in_(("queued", "running")))
        )
    assert active == QUOTA
