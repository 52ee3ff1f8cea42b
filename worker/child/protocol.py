"""What the child tells the worker: JSON lines on stdout, and files in the job folder.

`progress`, `phase`, `metric` and `log` lines stream while it runs; at the end it writes
`result.json` (`metrics`, `artifacts` [{kind, path, media_type}]) or `error.json` (`type`, `detail`).
"""

from __future__ import annotations

import json
import sys
from typing import Any

RESULT_FILE = "result.json"
ERROR_FILE = "error.json"
SPEC_FILE = "spec.json"


def emit(type_: str, **payload: Any) -> None:
    sys.stdout.write(json.dumps({"type": type_, **payload}) + "\n")
    sys.stdout.flush()


def parse_line(line: str) -> dict | None:
    """A protocol line, or None for anything else the user's model printed."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        message = json.loads(line)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("type") not in ("progress", "phase", "metric", "log"):
        return None
    return message
