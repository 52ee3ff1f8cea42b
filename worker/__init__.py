"""Celery worker: tasks claim a job and hand it to the runner; the runner drives the job process."""
