"""The local server retires a connection after ``max_requests_per_connection`` requests the way nginx does
(``keepalive_requests``, 1,000 by default): HTTP/1.1 with ``Connection: close`` on the last response, HTTP/2
with a GOAWAY as the last request arrives, after which it still finishes every stream up to that one and
ignores the ones opened after it. 0 keeps connections open for good (long benchmarks).

The HTTP/2 tests speak h2 by hand over a socket, so they see the frames themselves: which stream the GOAWAY
names, which streams get their replies after it, which never do.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import h2.connection
import h2.events
import httpx
import hypercorn.protocol

from llmchat.core import ServerSettings
from llmchat.core.http._transport import _GracefulH2State
from llmchat.core.server import RunningServer
from llmchat.core.server._retire import RetiringH2Protocol

Factory = Callable[..., RunningServer]
WAIT_S = 5.0


class RawH2:
    """An h2c client on a blocking socket that records every event per stream. Its state machine stays open on
    a GOAWAY (llmchat's own, ``_GracefulH2State``), so the replies the server finishes after one are read."""

    def __init__(self, server: RunningServer) -> None:
        self.sock = socket.create_connection((server.host, server.port), timeout=WAIT_S)
        self.conn = _GracefulH2State(config=h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())
        self.host = f"{server.host}:{server.port}"
        self.ended: set[int] = set()
        self.status: dict[int, int] = {}
        self.goaway: h2.events.ConnectionTerminated | None = None

    def get(self, path: str) -> int:
        sid = self.conn.get_next_available_stream_id()
        self.conn.send_headers(
            sid,
            [(":method", "GET"), (":scheme", "http"), (":authority", self.host), (":path", path)],
            end_stream=True,
        )
        self.sock.sendall(self.conn.data_to_send())
        return sid

    def read_until(self, done: Callable[[], bool]) -> None:
        while not done():
            data = self.sock.recv(65536)
            if not data:
                return
            for event in self.conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    self.status[event.stream_id] = int(dict(event.headers)[b":status"])
                elif isinstance(event, h2.events.StreamEnded):
                    self.ended.add(event.stream_id)
                elif isinstance(event, h2.events.DataReceived):
                    self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.ConnectionTerminated):
                    self.goaway = event
            self.sock.sendall(self.conn.data_to_send())

    def close(self) -> None:
        self.sock.close()


def test_the_default_follows_nginx() -> None:
    assert ServerSettings().max_requests_per_connection == 1000


def test_http2_retires_with_a_goaway_that_lets_the_streams_in_flight_finish(server_factory: Factory) -> None:
    server = server_factory(profile="instant", max_requests_per_connection=3)
    # hypercorn names its HTTP/2 class through this module when a connection starts: the server swapped in its
    # own. If hypercorn moves the name, this fails here rather than as lost replies below.
    assert vars(hypercorn.protocol)["H2Protocol"] is RetiringH2Protocol, (
        "hypercorn no longer builds its h2 protocol "
        "through hypercorn.protocol.H2Protocol: core/server/_retire.py's install() has no effect"
    )
    raw = RawH2(server)
    try:
        first = raw.get("/health")
        raw.read_until(lambda: first in raw.ended)
        # Three more at once: the server takes two (its limit is three) and names the second as its last.
        ids = [raw.get("/health") for _ in range(3)]
        raw.read_until(lambda: raw.goaway is not None and set(ids[:2]) <= raw.ended)
        assert raw.goaway is not None and raw.goaway.last_stream_id == ids[1]
        assert raw.goaway.error_code == 0
        assert {sid: raw.status.get(sid) for sid in [first, *ids]} == {
            first: 200,
            ids[0]: 200,
            ids[1]: 200,
            ids[2]: None,
        }
        assert ids[2] not in raw.ended  # past the GOAWAY: never answered, the client sends it again elsewhere
    finally:
        raw.close()


async def test_http11_retires_with_connection_close_on_the_last_response(server_factory: Factory) -> None:
    server = server_factory(profile="instant", max_requests_per_connection=3)
    opened: list[str] = []

    async def trace(name: str, info: dict[str, object]) -> None:
        if name == "connection.connect_tcp.complete":
            opened.append(name)

    async with httpx.AsyncClient(base_url=server.url, http1=True, http2=False) as client:
        closing = []
        for _ in range(5):
            resp = await client.get("/health", extensions={"trace": trace})
            assert resp.status_code == 200
            closing.append(resp.headers.get("connection"))
    assert closing == [None, None, "close", None, None]
    assert len(opened) == 2  # the fourth request went out on a new connection


async def test_0_keeps_one_h2_connection_past_a_thousand_requests(server_factory: Factory) -> None:
    # Plain httpx fails every stream on a connection that got a GOAWAY: 1,010 replies mean there was none.
    server = server_factory(profile="instant", max_requests_per_connection=0)
    async with httpx.AsyncClient(http1=False, http2=True, base_url=server.url) as client:
        statuses = set()
        for _ in range(1010):
            statuses.add((await client.get("/health")).status_code)
    assert statuses == {200}
