"""The module `celery -A worker.main worker` loads: the app built from the environment's settings, with the tasks."""

from service.queue import make_celery

app = make_celery(include=["worker.tasks"])
