"""The API app served over real HTTP by uvicorn in a thread of the test process: for the CLI and the browser
when no job needs to run (no worker: submitted jobs stay queued). Starts in about a second, where a
LiveServer (a `python -m service serve` with its worker) takes several.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import uvicorn

from service.app import create_app
from tests.service.live_server import free_port
from tests.service.support import make_settings


class AppServer:
    def __init__(self, data_dir: Path) -> None:
        self.settings = make_settings(data_dir)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(create_app(self.settings), host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the threaded API server did not start")
            time.sleep(0.05)

    @property
    def api_key(self) -> str:
        """The admin key the embedded first start wrote (service/auth.py)."""
        return (self.settings.data_dir / "api-key").read_text().strip()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
