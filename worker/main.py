"""The module `celery -A worker.main worker` loads: the app built from the environment's settings, with the tasks."""

from core.queue import make_celery
from worker import lifecycle

lifecycle.die_with_the_server()
app = make_celery(include=["worker.tasks"])
