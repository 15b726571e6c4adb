"""The HTTP/1.1 pool the transport keeps itself: one connection per slot, lowest free slot first, a queue
bounded by http.pool_timeout_s, and slots past max_keepalive_connections that close when idle. Real sockets
against the local server; a stream held open after its first piece keeps its slot busy, and one closed before
its end drops its connection (httpcore cannot reuse a half-read HTTP/1.1 response) but frees its slot."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import replace
from typing import Any

import pytest

import llmchat.core.errors as errors
from llmchat.core import ChatClient, HttpSettings, RetrySettings, Settings
from llmchat.core.client._client import ChatStream
from llmchat.core.observe._attribution import attribute
from llmchat.core.server import RunningServer

MSG = [{"role": "user", "content": "pool me"}]
MODEL = "llmchat-local"


def _client(server: RunningServer, **http: Any) -> ChatClient:
    settings = replace(Settings(), http=replace(HttpSettings(http2=False, warmup=False), **http))
    return ChatClient(settings, base_url=server.base_url, model=MODEL, use_cache=False,
                      retry=RetrySettings(max_attempts=1))


async def _hold(stream: ChatStream) -> ChatStream:
    """Start ``stream`` and stop after its first piece: its response, and so its slot, stays open."""
    it: AsyncIterator[str] = aiter(stream)
    assert await asyncio.wait_for(anext(it), 5.0)
    return stream


async def _wave(client: ChatClient, n: int) -> list[bool]:
    """``n`` streams open at once, then all finished; whether each went out on a reused connection."""
    async with AsyncExitStack() as stack:
        streams = [await _hold(await stack.enter_async_context(client.stream(MSG, max_tokens=20)))
                   for _ in range(n)]
        for s in streams:
            async for _ in s:
                pass
    return [s.record.connection_reused for s in streams]


async def test_one_request_at_a_time_keeps_to_one_warm_connection(local_server: RunningServer) -> None:
    async with _client(local_server, max_connections=8) as client:
        reused = [(await client.complete(MSG, max_tokens=5)).record.connection_reused for _ in range(5)]
    assert reused == [False, True, True, True, True]


async def test_requests_in_flight_get_a_connection_each_and_the_next_wave_reuses_them(
    local_server: RunningServer,
) -> None:
    async with _client(local_server, max_connections=4) as client:
        first = await _wave(client, 3)
        second = await _wave(client, 3)
    assert first == [False, False, False]
    assert second == [True, True, True]


async def test_slots_past_max_keepalive_connections_close_when_idle(local_server: RunningServer) -> None:
    async with _client(local_server, max_connections=3, max_keepalive_connections=1) as client:
        await _wave(client, 3)
        second = await _wave(client, 3)
    assert second == [True, False, False]


async def test_a_full_pool_queues_and_then_times_out_with_a_pool_error(local_server: RunningServer) -> None:
    async with _client(local_server, max_connections=2, pool_timeout_s=0.3) as client:
        async with client.stream(MSG, max_tokens=20) as a, client.stream(MSG, max_tokens=20) as b:
            await _hold(a)
            await _hold(b)
            with pytest.raises(errors.TimeoutError) as caught:
                await asyncio.wait_for(client.complete(MSG, max_tokens=5), 5.0)
        assert caught.value.phase == "pool"
        assert str(caught.value) == (
            f"no free connection to {client.endpoint.hostport} within 0.3 s (http.pool_timeout_s); too many "
            "requests in flight for http.max_connections = 2"
        )
        # The held streams were cut short: their connections are gone, their slots are back (a leaked one
        # would time out in 0.3 s), and the new connections are reused after that.
        assert await _wave(client, 2) == [False, False]
        assert await _wave(client, 2) == [True, True]


async def test_a_queued_request_goes_out_when_a_slot_frees(local_server: RunningServer) -> None:
    async with _client(local_server, max_connections=2, pool_timeout_s=5.0) as client:
        async with client.stream(MSG, max_tokens=20) as a, client.stream(MSG, max_tokens=20) as b:
            await _hold(a)
            await _hold(b)
            queued = asyncio.create_task(client.complete(MSG, max_tokens=5))
            await asyncio.sleep(0)  # let it reach the queue
            assert not queued.done()
            await a.aclose()
            reply = await asyncio.wait_for(queued, 5.0)
    assert reply.text and not reply.record.connection_reused  # a's slot, its connection dropped with a
    assert reply.record.pool_wait_ms is not None and reply.record.pool_wait_ms > 0


async def test_a_cancelled_wait_and_a_stream_left_early_give_their_slots_back(
    local_server: RunningServer,
) -> None:
    async with _client(local_server, max_connections=2, pool_timeout_s=0.5) as client:
        async with client.stream(MSG, max_tokens=20) as a, client.stream(MSG, max_tokens=20) as b:
            await _hold(a)
            await _hold(b)
            waiting = asyncio.create_task(client.complete(MSG, max_tokens=5))
            await asyncio.sleep(0)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
        # a and b were left after one piece: both slots must be free again (a leaked one times out in 0.5 s).
        assert await _wave(client, 2) == [False, False]
        assert await _wave(client, 2) == [True, True]


async def test_http2_pools_stay_one_multiplexed_connection(local_server: RunningServer) -> None:
    async with _client(local_server, http2="h2c", max_connections=4) as client:
        first = await _wave(client, 3)
    assert first.count(False) == 1


async def test_pool_wait_is_the_wait_for_a_slot_and_building_the_client_is_setup(
    local_server: RunningServer,
) -> None:
    # Not entered, so not prepared: the first request builds the slot's client on its way, and its record
    # keeps that as setup, apart from the pool wait. The second waits for the one slot the first holds.
    client = _client(local_server, max_connections=1, pool_timeout_s=5.0)
    try:
        async with client.stream(MSG, max_tokens=20) as a:
            await _hold(a)
            queued = asyncio.create_task(client.complete(MSG, max_tokens=5))
            await asyncio.sleep(0.05)  # a real wait for the slot, however long it turns out to be
            assert not queued.done()
            released = time.perf_counter_ns()
        b = (await asyncio.wait_for(queued, 5.0)).record
    finally:
        await client.aclose()
    first = a.record.phases
    assert first.setup_ns > 0 and b.phases.setup_ns == 0
    # The span before the first connection event is the setup plus the pool wait, nothing dropped.
    assert first.connect_start_ns is not None
    assert first.pool_wait_ns == first.connect_start_ns - first.start_ns - first.setup_ns
    # The queued request's pool wait covers at least the time the slot stayed taken after it started...
    assert b.phases.pool_wait_ns is not None and b.phases.pool_wait_ns >= released - b.phases.start_ns
    # ...and the first request, which found the slot free, waited far less than that.
    assert first.pool_wait_ns is not None and first.pool_wait_ns < b.phases.pool_wait_ns
    parts = {p.key: p.ms for p in attribute(a.record).parts}
    assert parts["client_setup"] == pytest.approx(first.setup_ns / 1e6)
    assert parts["pool_wait"] == pytest.approx(first.pool_wait_ns / 1e6)


async def test_a_client_entered_builds_its_pool_before_the_first_request(local_server: RunningServer) -> None:
    for http2 in ("h2c", False):
        async with _client(local_server, http2=http2) as client:
            assert client.transport.is_open  # built on entering, the SSL context off the event loop
            reply = await client.complete(MSG, max_tokens=5)
        assert reply.record.phases.setup_ns == 0 and not reply.record.connection_reused
        assert "client_setup" not in {p.key for p in attribute(reply.record).parts}
