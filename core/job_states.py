"""A job's status names, defined once (no dependencies: the Python client imports them, and GET /v1/meta
lists them for the dashboard). The state machine over them is core/db/jobstate.py."""

from __future__ import annotations

QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED = "queued", "running", "succeeded", "failed", "cancelled"
STATES = (QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED)
TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})
