"""Which folder a local `amct serve` keeps its files in, by URL: how the CLI finds its key from any folder.

The embedded server writes its admin key to `<data dir>/api-key` (service/auth.py). `amct serve` also
records `{url: data dir}` in a per-user file, `servers.json` under `$AMCT_CONFIG_DIR` (default
`$XDG_CONFIG_HOME/amct`, else `~/.config/amct`), so a client command run in any folder (`samples/`, as
docs/service.md has you do) finds the key of the server it talks to. The file holds paths, never a key.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

SERVERS_FILE = "servers.json"
KEY_FILE = "api-key"  # the name service/auth.py writes the embedded server's key under
# What a browser or the CLI may type for a server that listens on every interface or on loopback.
LOOPBACK = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "::", ""}


def config_dir() -> Path:
    if os.environ.get("AMCT_CONFIG_DIR"):
        return Path(os.environ["AMCT_CONFIG_DIR"])
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "amct"


def registry_path() -> Path:
    return config_dir() / SERVERS_FILE


def normalise(url: str) -> str:
    """`http://localhost:8000/` and `http://127.0.0.1:8000` name one server."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    host = (parts.hostname or "").lower()
    host = "127.0.0.1" if host in LOOPBACK else host
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme or 'http'}://{host}:{port}"


def _read() -> dict[str, str]:
    try:
        data = json.loads(registry_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def remember(url: str, data_dir: Path) -> None:
    """Record that the server at `url` keeps its files in `data_dir` (replacing an older entry)."""
    servers = _read()
    servers[normalise(url)] = str(Path(data_dir).resolve())
    path = registry_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written whole, then renamed: two servers starting at once never leave half a file.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".servers-")
        with os.fdopen(fd, "w") as f:
            json.dump(servers, f, indent=2, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: the CLI then needs --data-dir or --api-key, as before


def key_file_for(url: str) -> Path | None:
    """`<data dir>/api-key` of the local server recorded for `url`, or None."""
    data_dir = _read().get(normalise(url))
    return Path(data_dir) / KEY_FILE if data_dir else None
