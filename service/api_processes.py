"""The production API: `python -m service api --workers N`, N uvicorn processes on one port.

Why not `uvicorn service.app:app_from_env --factory --workers N`: uvicorn's supervisor binds the listening
socket itself and leaves its `proto` at 0; accepted connections inherit it, and asyncio turns TCP_NODELAY
on only for sockets that report IPPROTO_TCP. With Nagle's algorithm left on, a response written in two
segments waits for the client's delayed ACK: about 45 ms on every keep-alive request, measured here
against 4.5 ms from one process (uvicorn issue #3149, open in 0.54; one process is not affected because
asyncio binds that socket itself). So this binds the socket as uvicorn does and re-wraps it with the
protocol named, then hands it to uvicorn's own supervisor, as `uvicorn.run` does.
"""

from __future__ import annotations

import socket
import sys

import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors import Multiprocess

APP = "service.app:app_from_env"


class TcpConfig(uvicorn.Config):
    """uvicorn's Config whose listening TCP socket says IPPROTO_TCP, so its connections get TCP_NODELAY."""

    def bind_socket(self) -> socket.socket:
        sock = super().bind_socket()
        if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.proto == socket.IPPROTO_TCP:
            return sock
        tcp = socket.socket(sock.family, sock.type, socket.IPPROTO_TCP, fileno=sock.detach())
        tcp.set_inheritable(True)
        return tcp


def run(host: str, port: int, workers: int, log_level: str = "info") -> None:
    """Serve until stopped. Exits with uvicorn's STARTUP_FAILURE (3) when a process failed its start-up: the
    supervisor then stops the others and returns normally, and a 0 would tell a container's restart policy
    (`on-failure`) and its operator that nothing went wrong."""
    config = TcpConfig(APP, factory=True, host=host, port=port, workers=workers, log_level=log_level)
    sock = config.bind_socket()
    if workers > 1:
        supervisor = Multiprocess(config, sockets=[sock])
        supervisor.run()
        if any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes):
            sys.exit(STARTUP_FAILURE)
    else:
        server = uvicorn.Server(config)
        server.run(sockets=[sock])
        if not server.started:
            sys.exit(STARTUP_FAILURE)
