"""The job state machine, claims, leases and the reaper, on SQLite and on PostgreSQL."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import func, select, update

from core.db import jobstate, migrate
from core.db.models import Base, Config, Dataset, Job, JobEvent, Model, Project, utcnow
from core.db.session import engine_for, session_factory
from tests.service.support import make_settings


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def db_url(request, tmp_path_factory):
    if request.param == "postgresql":
        url = request.getfixturevalue("pg_url")
    else:
        url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'amct.db'}"
    migrate.upgrade(url)
    return url


@pytest.fixture
def sessions(db_url):
    return session_factory(db_url)


@pytest.fixture
def job_id(sessions):
    with sessions.begin() as s:
        if s.get(Project, "default") is None:
            s.add(Project(id="default", name="default"))
            s.flush()
        blob = {"sha256": "0" * 64, "size_bytes": 1, "uri": "file:///x", "project_id": "default"}
        model = Model(name="m", input_shape=[1, 1, 28, 28], status="ready", **blob)
        config = Config(name="c", kind="retrain", summary={}, **blob)
        dataset = Dataset(name="d", format="npz", description={}, **blob)
        s.add_all([model, config, dataset])
        s.flush()
        job = Job(
            project_id="default",
            kind="quant_retrain",
            status="queued",
            model_id=model.id,
            config_id=config.id,
            dataset_id=dataset.id,
            params={},
            device="cpu",
            queue="q",
        )
        s.add(job)
        s.flush()
        jobstate.add_event(s, job.id, "state", {"status": "queued"})
        return job.id


def _states(sessions, job_id) -> list[tuple[int, str]]:
    with sessions() as s:
        rows = s.scalars(select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.seq))
        return [(e.seq, e.payload.get("status", e.type)) for e in rows]


def test_migrations_match_the_models_and_go_down_and_up(db_url):
    with engine_for(db_url).connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    if db_url.startswith("sqlite"):  # PostgreSQL's database is shared with other modules' tests
        migrate.downgrade(db_url, "base")
        migrate.upgrade(db_url)


def test_only_listed_transitions_are_allowed(sessions, job_id):
    with sessions.begin() as s, pytest.raises(jobstate.IllegalTransition, match="succeeded to running"):
        jobstate.transition(s, job_id, jobstate.SUCCEEDED, jobstate.RUNNING)
    # An allowed edge from a state the job is not in changes nothing.
    with sessions.begin() as s:
        assert not jobstate.transition(s, job_id, jobstate.RUNNING, jobstate.SUCCEEDED)
    assert _states(sessions, job_id) == [(1, "queued")]


def test_a_transition_and_its_event_commit_or_roll_back_together(sessions, job_id):
    with sessions() as s:
        assert jobstate.transition(s, job_id, jobstate.QUEUED, jobstate.CANCELLED)
        s.rollback()
    with sessions() as s:
        assert s.get(Job, job_id).status == "queued"
    assert _states(sessions, job_id) == [(1, "queued")]


def test_claim_is_atomic_and_a_second_claim_is_a_no_op(sessions, job_id):
    with sessions.begin() as s:
        first = jobstate.claim_job(s, job_id, "worker-a", lease_s=60)
    with sessions.begin() as s:
        second = jobstate.claim_job(s, job_id, "worker-b", lease_s=60)
    assert first.status == "running" and first.lease_owner == "worker-a" and first.attempt == 1
    assert second is None
    assert _states(sessions, job_id) == [(1, "queued"), (2, "running")]


def test_only_the_lease_holder_can_finish_the_job(sessions, job_id):
    with sessions.begin() as s:
        jobstate.claim_job(s, job_id, "worker-a", lease_s=60)
    with sessions.begin() as s:
        assert not jobstate.transition(s, job_id, "running", "succeeded", owner="worker-b")
        assert jobstate.transition(s, job_id, "running", "succeeded", owner="worker-a")
    with sessions() as s:
        job = s.get(Job, job_id)
    assert job.status == "succeeded" and job.finished_at is not None and job.lease_owner is None


def test_an_expired_lease_can_be_reclaimed_as_a_new_attempt(sessions, job_id):
    with sessions.begin() as s:
        jobstate.claim_job(s, job_id, "worker-a", lease_s=60)
        s.execute(update(Job).where(Job.id == job_id).values(lease_expires_at=utcnow() - timedelta(seconds=1)))
    with sessions.begin() as s:
        job = jobstate.claim_job(s, job_id, "worker-b", lease_s=60)
    assert job.lease_owner == "worker-b" and job.attempt == 2
    with sessions.begin() as s:  # the old worker is fenced out
        assert not jobstate.renew_lease(s, job_id, "worker-a", 60)
        assert jobstate.renew_lease(s, job_id, "worker-b", 60)


def _lose_the_worker(sessions, job_id) -> None:
    with sessions.begin() as s:
        s.execute(update(Job).where(Job.id == job_id).values(lease_expires_at=utcnow() - timedelta(seconds=1)))


def test_a_job_with_max_attempts_n_runs_n_attempts_when_the_reaper_requeues_it(sessions, job_id):
    with sessions.begin() as s:
        s.execute(update(Job).where(Job.id == job_id).values(max_attempts=2))
    outcomes = []
    for worker in ("worker-a", "worker-b"):
        with sessions.begin() as s:
            job = jobstate.claim_job(s, job_id, worker, lease_s=60)
            assert not jobstate.give_up_if_exhausted(s, job, worker)  # attempts 1 and 2 both run
        _lose_the_worker(sessions, job_id)
        with sessions.begin() as s:
            outcomes.append(jobstate.recover_lost_job(s, job_id))
    assert outcomes == ["queued", "failed"]
    with sessions() as s:
        job = s.get(Job, job_id)
    assert (job.attempt, job.error_detail) == (2, "the worker was lost 2 times")


def test_a_requeued_job_keeps_its_first_start_and_dates_each_attempt(sessions, job_id):
    starts = []
    for worker in ("worker-a", "worker-b"):
        with sessions.begin() as s:
            job = jobstate.claim_job(s, job_id, worker, lease_s=60)
            starts.append((job.started_at, job.attempt_started_at))
        _lose_the_worker(sessions, job_id)
        with sessions.begin() as s:
            assert jobstate.recover_lost_job(s, job_id) == "queued"
    (first, first_attempt), (second, second_attempt) = starts
    assert first == first_attempt and second == first  # the elapsed time counts from the first attempt
    assert second_attempt > first_attempt


def test_a_job_with_max_attempts_n_runs_n_attempts_when_a_redelivery_reclaims_it(sessions, job_id):
    with sessions.begin() as s:
        s.execute(update(Job).where(Job.id == job_id).values(max_attempts=2))
    given_up = []
    for worker in ("worker-a", "worker-b", "worker-c"):  # no reaper: each lease runs out, the next claims
        with sessions.begin() as s:
            job = jobstate.claim_job(s, job_id, worker, lease_s=60)
            given_up.append(jobstate.give_up_if_exhausted(s, job, worker))
        _lose_the_worker(sessions, job_id)
    assert given_up == [False, False, True]
    with sessions() as s:
        job = s.get(Job, job_id)
    assert (job.status, job.attempt, job.error_detail) == ("failed", 3, "gave up after 2 attempts")


def test_cancel_of_a_queued_job_is_immediate_and_a_claim_then_fails(sessions, job_id):
    with sessions.begin() as s:
        assert jobstate.request_cancel(s, job_id) == "cancelled"
    with sessions.begin() as s:
        assert jobstate.claim_job(s, job_id, "worker-a", 60) is None


def test_cancel_of_a_running_job_flags_it_for_its_worker(sessions, job_id):
    with sessions.begin() as s:
        jobstate.claim_job(s, job_id, "worker-a", lease_s=60)
    with sessions.begin() as s:
        assert jobstate.request_cancel(s, job_id) == "running"
        assert jobstate.cancelling(s, job_id)


class RecordingDispatcher:
    """The broker edge: records what was sent; `waiting` is what the broker says its queues hold."""

    def __init__(self, waiting: dict[str, int] | None = None) -> None:
        self.sent: list[tuple[str, str]] = []
        self.waiting = waiting

    def enqueue(self, job_id: str, queue: str) -> bool:
        self.sent.append((job_id, queue))
        return True

    def pending_messages(self, queue: str) -> int | None:
        return None if self.waiting is None else self.waiting.get(queue, 0)


def test_reaper_requeues_a_job_whose_worker_vanished(db_url, sessions, job_id, tmp_path):
    from core.reaper import reap_once

    with sessions.begin() as s:
        jobstate.claim_job(s, job_id, "worker-a", lease_s=60)
        s.execute(update(Job).where(Job.id == job_id).values(lease_expires_at=utcnow() - timedelta(seconds=1)))
    dispatcher = RecordingDispatcher()
    result = reap_once(make_settings(tmp_path, database_url=db_url), dispatcher)
    assert job_id in result["requeued"] and (job_id, "q") in dispatcher.sent
    with sessions() as s:
        job = s.get(Job, job_id)
    assert job.status == "queued" and job.lease_owner is None
    assert _states(sessions, job_id)[-1] == (3, "queued")


def test_reaper_fails_a_job_that_lost_its_worker_too_often(db_url, sessions, job_id, tmp_path):
    from core.reaper import reap_once

    with sessions.begin() as s:
        jobstate.claim_job(s, job_id, "worker-a", lease_s=60)
        s.execute(
            update(Job).where(Job.id == job_id).values(attempt=3, lease_expires_at=utcnow() - timedelta(seconds=1))
        )
    result = reap_once(make_settings(tmp_path, database_url=db_url), RecordingDispatcher())
    assert job_id in result["failed"]
    with sessions() as s:
        job = s.get(Job, job_id)
    assert (job.status, job.error_type) == ("failed", "crashed")


def test_reaper_resends_a_queued_job_nobody_claimed_once_per_period(db_url, sessions, job_id, tmp_path):
    """The API committed the row but the message never reached (or was lost by) the broker."""
    from core.reaper import reap_once

    settings = make_settings(tmp_path, database_url=db_url, requeue_after_s=60)
    with sessions.begin() as s:
        s.execute(update(Job).where(Job.id == job_id).values(updated_at=utcnow() - timedelta(seconds=61)))
    dispatcher = RecordingDispatcher()
    assert job_id in reap_once(settings, dispatcher)["resent"] and (job_id, "q") in dispatcher.sent
    # Sent again only after another full period: a job waiting behind others gets few duplicates.
    assert job_id not in reap_once(settings, dispatcher)["resent"]
    assert dispatcher.sent.count((job_id, "q")) == 1
    with sessions() as s:
        job = s.get(Job, job_id)
        logs = s.scalars(select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.type == "log")).all()
    assert job.status == "queued"
    assert [e.payload["message"] for e in logs] == [
        "re-sent to the queue: not claimed for 60 s and its message is missing from the broker"
    ]


def test_reaper_does_not_resend_a_job_whose_message_still_waits(db_url, sessions, job_id, tmp_path):
    """A long queue is not a lost message: no duplicates pile up behind a busy worker."""
    from core.reaper import reap_once

    settings = make_settings(tmp_path, database_url=db_url, requeue_after_s=60)
    with sessions.begin() as s:
        s.execute(update(Job).where(Job.id == job_id).values(updated_at=utcnow() - timedelta(seconds=61)))
        queued = s.scalar(select(func.count()).where(Job.status == "queued", Job.queue == "q"))
    dispatcher = RecordingDispatcher(waiting={"q": queued})  # every queued row has its message
    assert reap_once(settings, dispatcher)["resent"] == [] and dispatcher.sent == []
    dispatcher.waiting = {"q": queued - 1}  # the broker lost one (a restart without persistence)
    assert len(reap_once(settings, dispatcher)["resent"]) == 1


def test_reaper_cancels_a_job_that_lost_its_worker_while_cancelling(db_url, sessions, job_id, tmp_path):
    """Back to the queue it would stay queued forever: the claim refuses a job with a pending cancel."""
    from core.reaper import reap_once

    with sessions.begin() as s:
        jobstate.claim_job(s, job_id, "worker-a", lease_s=60)
        jobstate.request_cancel(s, job_id)
        s.execute(update(Job).where(Job.id == job_id).values(lease_expires_at=utcnow() - timedelta(seconds=1)))
    dispatcher = RecordingDispatcher()
    result = reap_once(make_settings(tmp_path, database_url=db_url), dispatcher)
    assert job_id in result["cancelled"] and dispatcher.sent == []
    with sessions() as s:
        assert s.get(Job, job_id).status == "cancelled"


def test_the_api_process_reaps_on_its_own(db_url, sessions, job_id, tmp_path):
    """A worker's beat-scheduled reap waits behind the job it runs; the API's reaper loop does not."""
    from tests.service.support import open_api, wait_until

    with sessions.begin() as s:
        jobstate.claim_job(s, job_id, "worker-a", lease_s=60)
        s.execute(update(Job).where(Job.id == job_id).values(lease_expires_at=utcnow() - timedelta(seconds=1)))
    settings = make_settings(tmp_path, database_url=db_url, reap_interval_s=0.2)
    with open_api(settings):  # the lifespan starts the loop; nothing else runs here
        wait_until(lambda: _states(sessions, job_id)[-1][1] == "queued", 10, what="the API reaped the job")


def test_a_lease_whose_owner_process_is_gone_here_ends_at_once(sessions, job_id):
    import subprocess
    import sys

    from core.lease_owner import gone_here, lease_owner

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    here = lease_owner("w@h", "task1234")
    dead = here.replace(f":{os.getpid()}:", f":{child.pid}:", 1)
    elsewhere = dead.rsplit(":", 1)[0] + ":other-machine/4026531836"
    assert gone_here(dead) and not gone_here(here) and not gone_here(elsewhere) and not gone_here(None)
    for owner, expected in ((here, []), (elsewhere, []), (dead, [job_id])):
        with sessions.begin() as s:
            s.execute(update(Job).where(Job.id == job_id).values(status="queued", lease_owner=None))
            assert jobstate.claim_job(s, job_id, owner, lease_s=120) is not None
        with sessions.begin() as s:
            assert jobstate.expire_if_owner_gone(s, [job_id]) == expected
            # Only the dead owner's job can be claimed again now; a live owner's lease still runs.
            assert (jobstate.claim_job(s, job_id, "w2@h:1:t:x", lease_s=120) is not None) == bool(expected)
