"""The client waits for an upload as long as the server's check of it may take, and a request that times out
says the server is busy, not unreachable (issue 39: a 60 s read timeout cut uploads whose check took longer).

The server here is a stand-in at the client's edge: it answers like the API, only late.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from service.cli import app
from service.client import AmctClient, ServiceSlow

DELAY_S = 1.5  # the answer's delay: longer than the client's general timeout below
GENERAL_TIMEOUT_S = 0.5


class _LateServer(BaseHTTPRequestHandler):
    def _answer(self, status: int, body: dict) -> None:
        time.sleep(DELAY_S)
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        self._answer(201, {"id": "model-1", "status": "ready"})

    def do_GET(self) -> None:  # noqa: N802
        self._answer(200, {"items": [], "next_cursor": None})

    def log_message(self, *args) -> None:
        pass


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        pass  # the client that gave up hangs up before the late answer: a broken pipe here, by design


@pytest.fixture
def late_server():
    server = _QuietServer(("127.0.0.1", 0), _LateServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_an_upload_waits_past_the_general_timeout(late_server, tmp_path):
    model = tmp_path / "cnn.pt"
    model.write_bytes(b"x" * 1000)
    with AmctClient(late_server, timeout=GENERAL_TIMEOUT_S) as client:
        started = time.monotonic()
        assert client.upload_model(model, input_shape="1,1,28,28")["status"] == "ready"
        assert time.monotonic() - started >= DELAY_S
        with pytest.raises(ServiceSlow) as slow:  # any other request keeps the general timeout
            client.list()
    assert slow.value.waited_s == GENERAL_TIMEOUT_S


def test_the_cli_says_busy_not_unreachable_on_a_timeout(late_server, monkeypatch):
    monkeypatch.setattr("service.client.DEFAULT_TIMEOUT_S", GENERAL_TIMEOUT_S)
    result = CliRunner().invoke(app, ["jobs", "list", "--server", late_server, "--api-key", "amct_x"])
    assert result.exit_code == 1
    line = result.stderr.strip()
    assert "up but busy" in line and "cannot reach" not in line and "\n" not in line
