"""The module `celery -A worker.main worker` loads: the app built from the environment's settings."""

from worker.celery_app import make_celery

app = make_celery()
