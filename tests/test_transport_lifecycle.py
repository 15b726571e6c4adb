"""Connections with a life cycle: a server that retires a connection after N requests (GOAWAY over HTTP/2,
``Connection: close`` over HTTP/1.1, as nginx does) costs the client no request, and the client can retire its
connections itself first (``http.max_requests_per_connection``).

Real sockets to the local server (``llmchat serve --max-requests-per-connection N``), over h2c, TLS h2 and
HTTP/1.1. The transport's private hooks into httpcore and h2 are pinned first, so a dependency that moves one
fails here with a message naming it.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import types
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import h2.connection
import h2.events
import h11
import h11._readers
import httpcore
import httpx
import pytest
from hyperframe.frame import GoAwayFrame

import llmchat.core.http._transport as T
from llmchat.core import ChatClient, HttpSettings, RetrySettings, Settings
from llmchat.core.client._client import ChatStream
from llmchat.core.server import RunningServer

Factory = Callable[..., RunningServer]
MSG = [{"role": "user", "content": "retire me"}]
MODEL = "llmchat-local"
FAST_RETRY = RetrySettings(max_attempts=4, base_delay_s=0.01, max_delay_s=0.05)


def test_the_private_names_the_transport_relies_on_are_still_there() -> None:
    def has(owner: object, *names: str) -> None:
        for name in names:
            assert hasattr(owner, name), (
                f"{getattr(owner, '__name__', owner)} has no {name!r} any more: core/http/_transport.py's "
                "connection "
                "life cycle (GOAWAY, rotation) relies on it; see the classes there"
            )

    has(httpx.AsyncHTTPTransport(), "_pool")
    assert isinstance(httpx.AsyncHTTPTransport()._pool, httpcore.AsyncConnectionPool)
    has(httpcore.AsyncHTTPConnection, "_connect")
    conn = httpcore.AsyncHTTPConnection(httpcore.Origin(b"http", b"127.0.0.1", 9))
    has(
        conn,
        "_request_lock",
        "_connection",
        "_connect_failed",
        "_origin",
        "_keepalive_expiry",
        "_http1",
        "_http2",
    )
    has(
        httpcore.AsyncHTTP2Connection,
        "CONFIG",
        "_read_incoming_data",
        "_receive_events",
        "_response_closed",
        "_write_outgoing_data",
        # The stream life cycle (cancel's RST_STREAM, an answer while the body uploads, no HEADERS after GOAWAY).
        "_send_request_headers",
        "_send_request_body",
        "_wait_for_outgoing_flow",
        "_receive_stream_event",
    )
    h2conn = httpcore.AsyncHTTP2Connection(httpcore.Origin(b"http", b"127.0.0.1", 9), stream=None)  # type: ignore[arg-type]
    has(h2conn, "_events", "_h2_state", "_network_stream", "_write_lock", "_write_exception", "_connection_error")
    assert list(inspect.signature(httpcore.AsyncHTTP2Connection._wait_for_outgoing_flow).parameters) == [
        "self", "request", "stream_id"]
    has(h2.connection.H2Connection, "receive_data", "reset_stream", "data_to_send")
    assert h2.events.StreamEnded(stream_id=1).stream_id == 1
    # An idle HTTP/1.1 connection the server closed: httpcore's has_expired says so, via is_readable.
    has(httpcore.AsyncHTTP11Connection, "has_expired")
    assert "is_readable" in inspect.getsource(httpcore.AsyncHTTP11Connection.has_expired)
    has(httpcore.AsyncHTTP11Connection, "_response_closed", "_receive_response_body", "READ_NUM_BYTES")
    # The chunked body read in _H11Connection: httpcore's body loop takes (self, request) and reads through
    # _network_stream; h11 keeps its body reader and buffer here, and a chunk's progress in the reader.
    assert list(inspect.signature(httpcore.AsyncHTTP11Connection._receive_response_body).parameters) == [
        "self", "request"]
    h1 = httpcore.AsyncHTTP11Connection(httpcore.Origin(b"http", b"127.0.0.1", 9), stream=None)  # type: ignore[arg-type]
    has(h1, "_h11_state", "_network_stream")
    has(h11.Connection(h11.CLIENT), "_reader", "_receive_buffer")
    has(h11._readers.ChunkedReader(), "_bytes_in_chunk", "_bytes_to_discard", "_reading_trailer")
    # h2 dispatches each frame through a table of bound methods built in __init__: the GOAWAY entry must be
    # the override, or h2 closes its state machine on a GOAWAY again.
    state = T._GracefulH2State(config=h2.config.H2Configuration(client_side=True))
    has(state, "_frame_dispatch_table", "streams")
    entry = state._frame_dispatch_table[GoAwayFrame]
    assert isinstance(entry, types.MethodType) and entry.__func__ is T._GracefulH2State._receive_goaway_frame


async def _pool_of(client: ChatClient) -> list[Any]:
    transport = client.transport
    connections: list[Any] = []
    for c in transport._clients:  # type: ignore[attr-defined]  # the httpx-backed Transport's own
        if c is not None:
            inner: Any = c._transport  # httpx's transport (typed as the base class): its httpcore pool
            connections += inner._pool.connections
    return [c._connection for c in connections]


@pytest.mark.parametrize("http2", ["h2c", False])
async def test_the_pool_speaks_through_the_life_cycle_classes(
    local_server: RunningServer, http2: Any
) -> None:
    async with _client(local_server, http2=http2) as client:
        await client.complete(MSG, max_tokens=2)
        kinds = {type(c) for c in await _pool_of(client)}
    assert kinds == {T._H2Connection if http2 else T._H11Connection}


def _client(
    server: RunningServer, *, http2: Any = "h2c", retry: RetrySettings = FAST_RETRY, **http: Any
) -> ChatClient:
    verify: Any = server.cert_path or True
    base = HttpSettings(http2=http2, warmup=False, verify=verify, max_requests_per_connection=0)
    settings = replace(Settings(), http=replace(base, **http))
    return ChatClient(settings, base_url=server.base_url, model=MODEL, use_cache=False, retry=retry)


async def _many(client: ChatClient, n: int, concurrency: int) -> list[ChatStream]:
    queue = iter(range(n))
    done: list[ChatStream] = []

    async def worker() -> None:
        for _ in queue:
            stream = client.stream(MSG, max_tokens=12)
            async for _ in stream:
                pass
            done.append(stream)

    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(concurrency))), 60)
    return done


@pytest.mark.parametrize("proto", ["h2c", "h2", "http/1.1"])
async def test_streams_through_a_server_that_retires_connections_all_succeed(
    server_factory: Factory, proto: str
) -> None:
    # 600 streams, 20 at a time, through a server that retires each connection after 100 requests: several
    # GOAWAYs (or Connection: close) with streams in flight, and streams sent before the client knew of one.
    # The client does not rotate (0), so the server's signal is all it has. (By hand: 2,500 streams against
    # the default 1,000, h2c and TLS h2, 0 errors too.)
    server = server_factory(profile="instant", max_requests_per_connection=100, tls=proto == "h2")
    async with _client(
        server, http2={"h2c": "h2c", "h2": True, "http/1.1": False}[proto], max_connections=20
    ) as client:
        reference = await client.complete(MSG, max_tokens=12)
        streams = await _many(client, 600, 20)
    assert len(streams) == 600
    assert {s.text for s in streams} == {reference.text}
    assert {s.record.http_version for s in streams} == {"HTTP/1.1" if proto == "http/1.1" else "HTTP/2"}
    opened = sum(not s.record.connection_reused for s in streams)
    retries = [r for s in streams for r in s.record.retries]
    if proto == "http/1.1":
        assert (
            opened >= 600 // 100 and retries == []
        )  # Connection: close comes with the reply: nothing is lost
    else:
        assert opened >= 600 // 100 - 1
        assert {r.reason for r in retries} <= {"goaway"}
        firsts = [s.record.retries[0] for s in streams if s.record.retries]
        assert all(r.wait_s == 0 and r.wait_source == "immediate" for r in firsts)


@pytest.mark.parametrize("http2", ["h2c", False])
async def test_the_client_rotates_a_connection_after_max_requests_per_connection(
    server_factory: Factory, http2: Any
) -> None:
    server = server_factory(profile="instant", max_requests_per_connection=0)
    async with _client(server, http2=http2, max_requests_per_connection=10) as client:
        records = [(await client.complete(MSG, max_tokens=2)).record for _ in range(25)]
    assert [i for i, r in enumerate(records) if not r.connection_reused] == [0, 10, 20]
    assert all(not r.retries for r in records)


async def _hold(stream: ChatStream) -> AsyncIterator[str]:
    it = aiter(stream)
    assert await asyncio.wait_for(anext(it), 5.0)
    return it


async def test_a_rotated_connection_lets_its_streams_in_flight_finish(server_factory: Factory) -> None:
    server = server_factory(profile="instant", max_requests_per_connection=0)
    async with _client(server, max_requests_per_connection=2) as client:
        async with client.stream(MSG, max_tokens=40) as a, client.stream(MSG, max_tokens=40) as b:
            rest = [await _hold(a), await _hold(b)]
            third = await client.complete(MSG, max_tokens=40)  # the old connection is full: a new one
            for it in rest:
                async for _ in it:
                    pass
        assert not third.record.connection_reused
        assert a.text == b.text == third.text and a.finish_reason == b.finish_reason == "length"
        assert len(await _pool_of(client)) == 1  # the retired connection closed once its last stream ended


async def test_a_goaway_lets_the_streams_it_names_finish(server_factory: Factory) -> None:
    # The server takes two requests and sends its GOAWAY as the second arrives: both replies, held open
    # after their first piece, must still come whole; the third request goes to a new connection.
    server = server_factory(profile="instant", max_requests_per_connection=2)
    async with _client(server) as client:
        async with client.stream(MSG, max_tokens=40) as a, client.stream(MSG, max_tokens=40) as b:
            rest = [await _hold(a), await _hold(b)]
            third = await client.complete(MSG, max_tokens=40)
            for it in rest:
                async for _ in it:
                    pass
    assert a.text == b.text == third.text and a.finish_reason == b.finish_reason == "length"
    assert not third.record.connection_reused and not third.record.retries
    assert not a.record.retries and not b.record.retries


async def test_requests_the_server_did_not_take_are_sent_again_at_once(server_factory: Factory) -> None:
    # A server that takes one request per connection; three go out together on a fresh connection: it takes
    # the first and names it in its GOAWAY; a request whose HEADERS went out before the client could know is
    # sent again at once (reason goaway); one still waiting for a stream when the connection closed was never
    # sent, and the pool gives it another connection with no retry at all.
    server = server_factory(profile="instant", max_requests_per_connection=1)
    async with _client(server) as client:
        replies = await asyncio.wait_for(
            asyncio.gather(*(client.complete(MSG, max_tokens=3) for _ in range(3))), 20
        )
    assert len({r.text for r in replies}) == 1 and all(r.text for r in replies)
    # Whether a HEADERS went out before the GOAWAY came depends on timing: those are retried; the others were
    # never sent there and went to another connection without a retry.
    retried = [r.record for r in replies if r.record.retries]
    assert sum(not r.record.connection_reused for r in replies) >= 2  # the first, and at least one elsewhere
    for record in retried:
        assert [e.reason for e in record.retries] == ["goaway"] * len(record.retries)
        assert record.retries[0].wait_source == "immediate" and record.retries[0].wait_s == 0
        assert record.retries[0].describe().endswith("(goaway, immediate)")


async def test_with_retries_off_an_untaken_request_fails_with_one_clear_line(server_factory: Factory) -> None:
    server = server_factory(profile="instant", max_requests_per_connection=1)
    async with _client(server, retry=RetrySettings(max_attempts=1)) as client:
        results = await asyncio.gather(
            *(client.complete(MSG, max_tokens=3) for _ in range(3)), return_exceptions=True
        )
    # A request whose HEADERS went out before the GOAWAY came fails with the one line; one that was still
    # waiting for a stream is never sent there, and the pool gives it another connection (no error at all).
    errors = [r for r in results if isinstance(r, Exception)]
    assert len(errors) <= 2
    hostport = client.endpoint.hostport
    assert not errors or {str(e) for e in errors} == {
        f"{hostport} retired its HTTP/2 connection (GOAWAY, NO_ERROR) before taking this request, so it was "
        "not "
        "processed; try again"
    }
    assert {type(e).__name__ for e in errors} <= {"DisconnectedError"}
    assert all(e.retryable and e.reason == "goaway" for e in errors)  # type: ignore[attr-defined]
    counts = collections.Counter(type(r).__name__ for r in results)
    assert counts["ChatReply"] == 3 - len(errors) >= 1
