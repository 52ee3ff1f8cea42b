"""The Celery app, configured for hour-long jobs whose truth lives in the database (spec §2a).

`celery -A worker.main worker -Q amct.jobs.cpu` runs a worker; one queue per device kind.
With no BROKER_URL the transport is kombu's filesystem one under the data folder: no broker
server at all (the embedded mode of `python -m service`).
"""

from __future__ import annotations

from celery import Celery
from kombu import Queue

from service.settings import DEVICES, Settings


def _transport_options(settings: Settings) -> dict:
    url = settings.resolved_broker_url
    if url.startswith("filesystem://"):
        folder = settings.broker_folder
        (folder / "queue").mkdir(parents=True, exist_ok=True)
        (folder / "processed").mkdir(parents=True, exist_ok=True)
        (folder / "control").mkdir(parents=True, exist_ok=True)
        # The same folder in and out: producer and consumer are different processes on one machine.
        # control_folder too, or kombu writes its broadcast exchanges to ./control in the CWD.
        return {"data_folder_in": str(folder / "queue"), "data_folder_out": str(folder / "queue"),
                "processed_folder": str(folder / "processed"), "control_folder": str(folder / "control"),
                "store_processed": False,
                "polling_interval": settings.broker_poll_s}
    # Redis re-delivers an unacked message after visibility_timeout: it must outlive any job.
    return {"visibility_timeout": settings.visibility_timeout_s}


def make_celery(settings: Settings | None = None) -> Celery:
    settings = settings or Settings()
    app = Celery("amct", broker=settings.resolved_broker_url, include=["worker.tasks"])
    app.conf.update(
        broker_transport_options=_transport_options(settings),
        broker_connection_retry_on_startup=True,
        task_queues=[Queue(settings.queue_for(d)) for d in DEVICES],
        task_default_queue=settings.queue_for("cpu"),
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,  # the jobs table holds results, not a result backend
        task_acks_late=True,  # ack after the run: a lost worker's job is delivered again…
        task_reject_on_worker_lost=True,  # …and a killed child re-queues instead of acking
        worker_prefetch_multiplier=1,  # a long job must not hold the next one hostage
        worker_max_tasks_per_child=1,  # a fresh process per job
        worker_cancel_long_running_tasks_on_connection_loss=True,
        # The runner stops a job at job_time_limit_s itself; Celery's limits are the backstop.
        task_soft_time_limit=settings.job_time_limit_s + 300,
        task_time_limit=settings.job_time_limit_s + 600,
        beat_schedule={"reap-lost-jobs": {"task": "worker.tasks.reap", "schedule": 60.0,
                                          "options": {"queue": settings.queue_for("cpu")}}},
        worker_send_task_events=False,
    )
    app.amct_settings = settings  # the tasks read the same settings the app was built from
    return app
