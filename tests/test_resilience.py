"""Retries and stale connections through ChatClient, against the real local server on 127.0.0.1.

Where the local server cannot say what a test needs (a Retry-After short enough to wait for: its limiter's
window is a minute; ``x-should-retry``, which it never sends) a scripted HTTP/1.1 peer on a real socket
answers instead. Waits are checked as lower bounds on the monotonic clock, never as upper bounds.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from llmchat.core import (
    ChatClient,
    ConnectError,
    HttpSettings,
    HTTPStatusError,
    RateLimitError,
    RetryEvent,
    RetryPlanned,
    RetrySettings,
    ServerError,
    Settings,
    StreamCutError,
    TimeoutError,
)
from llmchat.core.server import RunningServer

Factory = Callable[..., RunningServer]
MESSAGES = [{"role": "user", "content": "Tell me about connection pools."}]
MODEL = "llmchat-local"
FAST = RetrySettings(max_attempts=4, base_delay_s=0.05, max_delay_s=1.0, total_budget_s=10.0)
"""Real backoff, small enough that four attempts take well under a second."""
EARLY_NS = 1_000_000
"""asyncio may wake a timer up to its clock resolution early; 1 ms covers it with room to spare."""


def make_client(base_url: str, *, http2: Any = "h2c", retry: RetrySettings = FAST,
                settings: Settings | None = None) -> ChatClient:
    return ChatClient(settings, base_url=base_url, http2=http2, model=MODEL, use_cache=False, retry=retry)


@dataclass
class Planned:
    """Every RetryPlanned seen on the bus, with the moment it was published and the attempt that failed."""

    events: list[RetryEvent] = field(default_factory=list)
    published_ns: list[int] = field(default_factory=list)
    failed_attempt_start_ns: list[int] = field(default_factory=list)
    in_record_when_published: list[bool] = field(default_factory=list)

    def __call__(self, planned: RetryPlanned) -> None:
        self.published_ns.append(time.perf_counter_ns())
        self.events.append(planned.event)
        self.failed_attempt_start_ns.append(planned.record.phases.start_ns)
        self.in_record_when_published.append(planned.event in planned.record.retries)


def watch(client: ChatClient) -> Planned:
    planned = Planned()
    client.bus.subscribe(RetryPlanned, planned)
    return planned


async def read_stream(client: ChatClient, **params: Any) -> tuple[list[str], Any]:
    stream = client.stream(MESSAGES, **params)
    pieces = [piece async for piece in stream]
    return pieces, stream


def free_port() -> int:
    """A port nothing listens on (bound, then released, so connecting to it is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- a scripted peer for the headers the local server does not send ---------------------------------------


@dataclass
class Scripted:
    status: int
    headers: dict[str, str] = field(default_factory=dict)


def _completion(text: str) -> bytes:
    return json.dumps({
        "id": "chatcmpl-scripted", "object": "chat.completion", "created": 0, "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }).encode()


class ScriptedPeer:
    """An HTTP/1.1 server on 127.0.0.1 that answers request n with ``script[n]`` (an error with the given
    headers, or a 200 chat completion past the end of the script) and stamps when each request arrived."""

    def __init__(self, script: list[Scripted]) -> None:
        self.script = list(script)
        self.arrived_ns: list[int] = []
        self._server: asyncio.Server | None = None

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/v1"

    async def __aenter__(self) -> ScriptedPeer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.arrived_ns.append(time.perf_counter_ns())
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                n = len(self.arrived_ns) - 1
                if n < len(self.script):
                    step = self.script[n]
                    status, headers = step.status, step.headers
                    error = {"message": f"scripted {status}", "type": "scripted"}
                    body = json.dumps({"error": error}).encode()
                else:
                    status, headers, body = 200, {}, _completion("scripted ok")
                lines = [f"HTTP/1.1 {status} Scripted", "content-type: application/json",
                         f"content-length: {len(body)}", *(f"{k}: {v}" for k, v in headers.items())]
                writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client closed its connection
        finally:
            writer.close()


# -- retries against the local server ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["batch", "stream"])
async def test_5xx_every_time_spends_every_attempt_and_waits_as_announced(
    server_factory: Factory, mode: str
) -> None:
    server = server_factory(profile="instant", error_rate=1.0)
    async with make_client(server.base_url) as client:
        planned = watch(client)
        with pytest.raises(ServerError) as caught:
            if mode == "batch":
                await client.complete(MESSAGES, max_tokens=5)
            else:
                await read_stream(client, max_tokens=5)
    err = caught.value
    record = err.record
    assert record is not None and record.attempts == FAST.max_attempts
    assert str(err).endswith(f"(after {FAST.max_attempts} attempts)")
    assert err.status in (500, 502, 503) and record.error_kind == f"http_{err.status}"
    assert [e.attempt for e in record.retries] == [2, 3, 4]
    assert planned.events == record.retries
    assert all(planned.in_record_when_published)  # recorded before it was announced
    for k, event in enumerate(record.retries):
        assert event.max_attempts == FAST.max_attempts
        assert event.reason == str(event.status) and event.status in (500, 502, 503)
        assert event.wait_source == "backoff"
        # Full jitter: between zero and the exponential ceiling for this attempt.
        assert 0.0 <= event.wait_s <= min(FAST.max_delay_s, FAST.base_delay_s * 2**k)
        assert event.describe().startswith(f"retry {event.attempt}/{FAST.max_attempts} in ")
    # Each next attempt started no sooner than the wait announced before it.
    starts = [*planned.failed_attempt_start_ns[1:], record.phases.start_ns]
    for published, event, started in zip(planned.published_ns, planned.events, starts, strict=True):
        assert started - published >= event.wait_s * 1e9 - EARLY_NS


async def test_a_refused_connection_is_retried_then_reported() -> None:
    async with make_client(f"http://127.0.0.1:{free_port()}/v1") as client:
        planned = watch(client)
        with pytest.raises(ConnectError, match="connection refused") as caught:
            await client.complete(MESSAGES)
    record = caught.value.record
    assert record is not None and record.attempts == FAST.max_attempts
    assert [e.reason for e in planned.events] == ["connect"] * (FAST.max_attempts - 1)
    assert all(e.status is None for e in planned.events)


async def test_a_pool_timeout_is_retried_until_a_connection_frees_up(server_factory: Factory) -> None:
    # One HTTP/1.1 connection, held by a slow stream: the next request cannot get it within pool_timeout_s,
    # which is retryable (nothing was sent), and goes out once the stream ends.
    server = server_factory(profile="instant", tokens_per_s=40)
    one = HttpSettings(max_connections=1, max_keepalive_connections=1, pool_timeout_s=0.05)
    settings = Settings(http=one)
    retry = RetrySettings(max_attempts=40, base_delay_s=0.05, max_delay_s=0.1, total_budget_s=10.0)
    async with make_client(server.base_url, http2=False, retry=retry, settings=settings) as client:
        planned = watch(client)
        async with asyncio.timeout(10):
            stream = client.stream(MESSAGES, max_tokens=20)  # half a second of tokens
            first_piece = await anext(aiter(stream))
            waiting = asyncio.create_task(client.complete(MESSAGES, max_tokens=2))
            rest = [piece async for piece in stream]
            reply = await waiting
    assert first_piece and rest and stream.record.error is None
    assert reply.record.error is None and reply.record.attempts >= 2
    assert {e.reason for e in reply.record.retries} == {"timeout_pool"}
    assert planned.events == reply.record.retries and all(e.status is None for e in planned.events)


async def test_a_429_asking_for_longer_than_max_delay_fails_fast(server_factory: Factory) -> None:
    # The server's limiter counts a minute, so its Retry-After is ~60 s: above max_delay_s, nothing is waited.
    server = server_factory(profile="instant", rate_limit=1)
    async with make_client(server.base_url) as client:
        planned = watch(client)
        await client.complete(MESSAGES, max_tokens=3)
        with pytest.raises(RateLimitError) as caught:
            await client.complete(MESSAGES, max_tokens=3)
    err = caught.value
    assert err.status == 429 and not err.retryable
    assert "asks to wait" in str(err) and "retry.max_delay_s = 1 s" in str(err)
    assert 1_000 < float(err.headers["retry-after-ms"]) <= 60_000
    assert err.record is not None and err.record.attempts == 1 and err.record.retries == []
    assert planned.events == []


async def test_no_retry_once_the_first_byte_reached_the_caller(server_factory: Factory) -> None:
    server = server_factory(profile="instant", drop_rate=1.0)
    for http2 in (False, "h2c"):
        async with make_client(server.base_url, http2=http2) as client:
            planned = watch(client)
            pieces: list[str] = []
            stream = client.stream(MESSAGES, max_tokens=60)
            with pytest.raises(StreamCutError) as caught:
                async for piece in stream:
                    pieces.append(piece)
        err = caught.value
        assert pieces, "the server sends at least one token before it cuts"
        assert err.partial_text == "".join(pieces) == stream.text
        assert err.record is not None and err.record.attempts == 1 and err.record.retries == []
        assert err.record.error_kind == "stream_cut" and "tokens arrived and are kept" in str(err)
        assert planned.events == []


async def test_a_stall_past_the_read_timeout_mid_stream_is_not_retried(server_factory: Factory) -> None:
    server = server_factory(profile="instant", stall_ms=2000)
    settings = Settings(http=HttpSettings(read_timeout_s=0.2))
    async with make_client(server.base_url, settings=settings) as client:
        planned = watch(client)
        pieces: list[str] = []
        with pytest.raises(TimeoutError) as caught:
            async for piece in client.stream(MESSAGES, max_tokens=40):
                pieces.append(piece)
    err = caught.value
    assert err.phase == "read" and pieces and err.partial_text == "".join(pieces)
    assert err.record is not None and err.record.attempts == 1 and planned.events == []


async def test_a_read_timeout_before_the_headers_is_not_retried(server_factory: Factory) -> None:
    # Only connect and pool timeouts are retried: a read timeout may mean the server is working on it.
    server = server_factory(profile="instant", ttft_ms=1500)
    settings = Settings(http=HttpSettings(read_timeout_s=0.2))
    async with make_client(server.base_url, settings=settings) as client:
        planned = watch(client)
        with pytest.raises(TimeoutError) as caught:
            await client.complete(MESSAGES, max_tokens=3)
    assert caught.value.phase == "read"
    assert caught.value.record is not None and caught.value.record.attempts == 1 and planned.events == []


# -- the server's wait headers, from a scripted peer --------------------------------------------------------


async def test_retry_after_ms_wins_over_retry_after_and_is_waited() -> None:
    script = [Scripted(429, {"retry-after-ms": "250", "retry-after": "30"})]
    async with ScriptedPeer(script) as peer:
        async with make_client(peer.base_url, http2=False) as client:
            planned = watch(client)
            reply = await client.complete(MESSAGES)
    assert reply.text == "scripted ok" and reply.record.attempts == 2
    (event,) = reply.record.retries
    assert (event.attempt, event.reason, event.status) == (2, "429", 429)
    assert (event.wait_s, event.wait_source) == (0.25, "retry-after-ms")
    assert event.describe() == "retry 2/4 in 0.2 s (429, retry-after-ms)"
    assert planned.events == [event]
    first, second = peer.arrived_ns
    assert second - first >= 0.25e9 - EARLY_NS
    assert second - planned.published_ns[0] >= 0.25e9 - EARLY_NS  # announced first, then waited


async def test_retry_after_in_seconds_is_waited() -> None:
    async with ScriptedPeer([Scripted(503, {"retry-after": "1"})]) as peer:
        async with make_client(peer.base_url, http2=False) as client:
            reply = await client.complete(MESSAGES)
    (event,) = reply.record.retries
    assert (event.reason, event.wait_s, event.wait_source) == ("503", 1.0, "Retry-After")
    first, second = peer.arrived_ns
    assert second - first >= 1e9 - EARLY_NS


@pytest.mark.parametrize(
    ("status", "should_retry", "retried"),
    [(503, "false", False), (400, "true", True), (408, None, True), (409, None, True), (400, None, False)],
)
async def test_x_should_retry_and_the_retryable_statuses(status: int, should_retry: str | None,
                                                         retried: bool) -> None:
    headers = {"retry-after-ms": "10"}
    if should_retry is not None:
        headers["x-should-retry"] = should_retry
    async with ScriptedPeer([Scripted(status, headers)]) as peer:
        async with make_client(peer.base_url, http2=False) as client:
            if retried:
                reply = await client.complete(MESSAGES)
                assert reply.record.attempts == 2
                planned = [(e.reason, e.wait_source) for e in reply.record.retries]
                assert planned == [(str(status), "retry-after-ms")]
            else:
                with pytest.raises(HTTPStatusError) as caught:
                    await client.complete(MESSAGES)
                assert caught.value.status == status
                assert caught.value.record is not None and caught.value.record.attempts == 1
    assert len(peer.arrived_ns) == (2 if retried else 1)


# -- stale keep-alive connections ---------------------------------------------------------------------------


@pytest.fixture
def closing_server(server_factory: Factory) -> Iterator[RunningServer]:
    yield server_factory(profile="instant", close_after_stream=True)


async def test_a_host_that_closes_after_each_stream_costs_one_retry_per_pool_not_one_per_request(
    closing_server: RunningServer,
) -> None:
    # llama.cpp's habit: keep-alive promised, connection closed after every stream. The first time the client
    # cannot see it coming (the socket still looks open), so that request fails without a response on the
    # reused connection and goes out again at once, unseen by the user. From then on the pool remembers the
    # host: every request opens a fresh connection and none pays a retry; the record says so once.
    async with make_client(closing_server.base_url, http2=False) as client:
        planned = watch(client)
        first_pieces, first = await read_stream(client, max_tokens=8)
        second_pieces, second = await read_stream(client, max_tokens=8)
        later = [await read_stream(client, max_tokens=8) for _ in range(4)]
        after_stream = await client.complete(MESSAGES, max_tokens=8)
    assert first.record.attempts == 1 and first.record.retries == [] and not first.record.connection_reused
    assert second.record.error is None and second.record.attempts == 2
    (event,) = second.record.retries
    assert (event.reason, event.wait_s, event.wait_source, event.status) == (
        "stale connection", 0.0, "immediate", None)
    assert second.record.phases.closes_after_response  # said once, here
    assert second_pieces == first_pieces and second.text == after_stream.text
    for record in [stream.record for _, stream in later] + [after_stream.record]:
        assert record.error is None and record.attempts == 1 and record.retries == []
        assert record.connection_reused is False  # a fresh connection each time, never the closed one
        assert record.http_version == "HTTP/1.1"
        assert not record.phases.closes_after_response
    assert [e.reason for e in planned.events] == ["stale connection"]


async def test_a_connection_kept_open_after_a_stream_is_reused(server_factory: Factory) -> None:
    server = server_factory(profile="instant")
    async with make_client(server.base_url, http2=False) as client:
        _, first = await read_stream(client, max_tokens=8)
        _, second = await read_stream(client, max_tokens=8)
        after_stream = await client.complete(MESSAGES, max_tokens=8)
    assert first.record.connection_reused is False
    for record in (second.record, after_stream.record):
        assert record.connection_reused is True and record.phases.connect_start_ns is None
        assert record.attempts == 1 and record.retries == []
