"""`python -m service api --workers N` (service/api_processes.py): its connections get TCP_NODELAY.

The production command itself runs in tests/service/test_api_reads.py (two processes, PostgreSQL); what it
saves per request is measured in bench/service_load.py, not here.
"""

from __future__ import annotations

import asyncio
import socket

import uvicorn

from service.api_processes import APP, TcpConfig


def _nodelay_of_an_accepted_connection(listener: socket.socket) -> int:
    """Serve `listener` as uvicorn's worker does (asyncio's create_server with `sock=`); connect once and read
    TCP_NODELAY off the connection the server accepted."""

    async def accept_one() -> int:
        loop = asyncio.get_running_loop()
        seen: asyncio.Future[int] = loop.create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport) -> None:
                accepted = transport.get_extra_info("socket")
                seen.set_result(accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        server = await loop.create_server(Probe, sock=listener)
        _, writer = await asyncio.open_connection(*listener.getsockname()[:2])
        try:
            return await asyncio.wait_for(seen, 10)
        finally:
            writer.close()
            server.close()

    return asyncio.run(accept_one())


def test_the_api_s_listening_socket_gives_its_connections_tcp_nodelay():
    ours = TcpConfig(APP, factory=True, host="127.0.0.1", port=0).bind_socket()
    assert ours.proto == socket.IPPROTO_TCP and ours.get_inheritable()
    assert _nodelay_of_an_accepted_connection(ours) != 0


def test_uvicorn_s_own_listening_socket_still_needs_it():
    """The reason for TcpConfig (uvicorn issue #3149). When this fails, uvicorn binds its socket right and
    service/api_processes.py can go back to `uvicorn --workers`."""
    theirs = uvicorn.Config(APP, factory=True, host="127.0.0.1", port=0).bind_socket()
    assert theirs.proto == 0
    assert _nodelay_of_an_accepted_connection(theirs) == 0
