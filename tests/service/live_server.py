"""A real `python -m service serve` (API + embedded Celery worker, SQLite, filesystem queue) on a free port.

For the tests that need the service over real HTTP: the CLI's client commands and the browser.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from job_host.sandbox import stop_group
from tests.service.support import ROOT, wait_until

# Unset so the server falls back to its embedded defaults under --data-dir.
WIRING = ("DATABASE_URL", "BROKER_URL", "ARTIFACT_STORE", "AMCT_DATABASE_URL", "AMCT_BROKER_URL", "AMCT_ARTIFACT_STORE")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    def __init__(self, folder: Path, **env: str) -> None:
        self.folder, self.port = folder, free_port()
        self.data_dir = folder / "data"
        # Where `amct serve` records its data dir for the CLI's key lookup (service/local_servers.py): the
        # test's own folder, never the user's ~/.config.
        self.config_dir = folder / "config"
        self.base_url = f"http://127.0.0.1:{self.port}"
        environ = {k: v for k, v in os.environ.items() if k not in WIRING}
        environ.update(
            PYTHONPATH=str(ROOT),
            OMP_NUM_THREADS="2",
            AMCT_HEARTBEAT_S="1",
            AMCT_BROKER_POLL_S="0.05",
            AMCT_SSE_POLL_S="0.05",
            AMCT_CONFIG_DIR=str(self.config_dir),
            **env,
        )
        self.log = open(folder / "serve.log", "wb")  # noqa: SIM115 - open for the server's whole life
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "service",
                "serve",
                "--port",
                str(self.port),
                "--data-dir",
                str(self.data_dir),
                # npu too: a claimed device without torch_npu fails its jobs clearly
                # (test_cli, test_dashboard), where an unserved one is refused at submit
                "--worker-devices",
                "cpu,npu",
            ],
            cwd=ROOT,
            env=environ,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wait_until(self._ready, 120, interval=0.2, what="the server answers /readyz")
        except BaseException:
            self.stop()
            raise

    def _ready(self) -> bool:
        assert self.proc.poll() is None, self.log_text()
        try:
            return httpx.get(f"{self.base_url}/readyz", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    @property
    def api_key(self) -> str | None:
        """The admin key the first start wrote for local clients (None when the server runs without keys)."""
        path = self.data_dir / "api-key"
        return path.read_text().strip() if path.exists() else None

    def client(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=60)

    def log_text(self) -> str:
        return (self.folder / "serve.log").read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        stop_group(self.proc, 30)
        self.log.close()
