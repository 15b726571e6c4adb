"""The asyncio network backend under httpcore (core/http/_transport.py:AsyncioBackend): every pool uses it, and it keeps
httpcore's contract over real sockets on 127.0.0.1: bytes as they came, timeouts and closes as httpcore's
exceptions, flow control on a large body, and an idle connection the peer closed seen as readable."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpcore
import pytest

import llmchat.core.http._transport as T
from llmchat.core import ChatClient, HttpSettings, Settings
from llmchat.core.http._transport import AsyncioBackend
from llmchat.core.server import RunningServer


@asynccontextmanager
async def peer(handler) -> AsyncIterator[int]:  # type: ignore[no-untyped-def]
    async def handled(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handler(reader, writer)
        finally:
            writer.close()
            await writer.wait_closed()

    server = await asyncio.start_server(handled, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def test_every_pool_the_transport_builds_connects_through_it(local_server: RunningServer) -> None:
    for http2 in (False, "h2c"):
        settings = Settings(http=HttpSettings(http2=http2, warmup=False, trust_env=False))
        async with ChatClient(settings, base_url=local_server.base_url, use_cache=False) as client:
            reply = await client.complete([{"role": "user", "content": "hi"}], max_tokens=3)
            assert reply.record.error is None
            pools = [c._transport._pool for c in client.transport._clients if c is not None]  # type: ignore[attr-defined]
            assert pools, "no httpx client was built"
            # httpcore's private name for the backend a pool connects with (pinned: the transport sets it).
            assert all(isinstance(p._network_backend, AsyncioBackend) for p in pools)
    assert isinstance(T._BACKEND, AsyncioBackend)


async def test_bytes_arrive_in_order_and_a_large_body_flows_under_back_pressure() -> None:
    body = bytes(range(256)) * 8192  # 2 MiB: past the backend's high-water mark, so reading pauses and resumes

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(4)
        writer.write(body)
        await writer.drain()
        writer.close()

    async with peer(handler) as port:
        stream = await AsyncioBackend().connect_tcp("127.0.0.1", port, timeout=5)
        await stream.write(b"ping", timeout=5)
        await asyncio.sleep(0.05)  # let the socket fill the buffer past the high-water mark
        got = bytearray()
        while chunk := await stream.read(65536, timeout=5):
            assert len(chunk) <= 65536
            got += chunk
        assert bytes(got) == body
        assert stream.get_extra_info("is_readable")  # closed by the peer: the pool must not reuse it
        await stream.aclose()


async def test_a_silent_peer_is_a_read_timeout_and_a_refused_port_a_connect_error() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)  # never answers: reads until the client closes
        writer.close()

    async with peer(handler) as port:
        stream = await AsyncioBackend().connect_tcp("127.0.0.1", port, timeout=5)
        assert not stream.get_extra_info("is_readable")  # idle and open: reusable
        assert stream.get_extra_info("server_addr")[1] == port
        with pytest.raises(httpcore.ReadTimeout):
            await stream.read(100, timeout=0.05)
        await stream.aclose()
    with pytest.raises(httpcore.ConnectError):
        await AsyncioBackend().connect_tcp("127.0.0.1", port, timeout=5)


async def test_a_connection_reset_mid_read_is_a_read_error() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)
        writer.transport.abort()  # a TCP reset with the request unanswered

    async with peer(handler) as port:
        stream = await AsyncioBackend().connect_tcp("127.0.0.1", port, timeout=5)
        await stream.write(b"x", timeout=5)
        try:
            data = await stream.read(100, timeout=5)
        except httpcore.ReadError:
            data = b""
        assert data == b""  # a reset reads as the end or as ReadError, never as bytes or a hang
        await stream.aclose()
