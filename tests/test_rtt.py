"""Round-trip emulation: `llmchat serve --rtt-ms` and `llmchat proxy`, on real sockets on 127.0.0.1.

Latencies are checked as lower bounds only (what the delay guarantees), never as upper bounds a busy machine
could miss; the one exception is a tenfold margin that tells a pipelined delay from a serialized one.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from processes import reap

from llmchat.core import CacheSettings, ChatClient, Http2Mode, HttpSettings, Settings, StreamCutError
from llmchat.core.errors import UsageError
from llmchat.core.server import RunningServer, start_subprocess
from llmchat.core.server._proxy import DelayProxy, Target
from llmchat.tui.cli import main

RTT_MS = 60.0
MODEL = "llmchat-local"  # named, so no GET /models opens the connection before the request measured
WAIT_S = 10.0  # every wait in this file is bounded by this
PROMPT = [{"role": "user", "content": "Tell me about round trips."}]


def _settings(tmp_path: Path, **http: Any) -> Settings:
    return Settings(cache=CacheSettings(path=str(tmp_path / "cache")), http=HttpSettings(**http))


async def _stream(client: ChatClient, **params: Any) -> tuple[str, float, float, bool]:
    """One streamed reply: its text, TTFB, total and whether the connection was reused."""
    stream = client.stream(PROMPT, **params)
    async for _ in stream:
        pass
    r = stream.record
    assert r.ttfb_ms is not None and r.total_ms is not None
    return stream.text, r.ttfb_ms, r.total_ms, r.connection_reused


# --- through ChatClient: what a new and a reused connection cost --------------------------------------------


@pytest.mark.parametrize("http2", ["h2c", False], ids=["h2c", "http1"])
async def test_a_new_connection_costs_two_round_trips_and_a_reused_one_one(
    server_factory: Callable[..., RunningServer], tmp_path: Path, http2: Http2Mode
) -> None:
    server = server_factory(profile="instant", rtt_ms=RTT_MS)
    async with ChatClient(_settings(tmp_path), base_url=server.base_url, http2=http2, model=MODEL,
                          use_cache=False) as c:
        _, first_ttfb, _, first_reused = await _stream(c, max_tokens=20)
        _, again_ttfb, _, again_reused = await _stream(c, max_tokens=20)
    assert not first_reused and again_reused
    assert first_ttfb >= 2 * RTT_MS  # handshake, then request and reply
    assert again_ttfb >= RTT_MS  # request and reply only


async def test_tls_pays_its_handshake_round_trip_too(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    server = server_factory(profile="instant", rtt_ms=RTT_MS, tls=True)
    assert server.base_url.startswith("https://")
    settings = _settings(tmp_path, verify=server.cert_path)
    async with ChatClient(settings, base_url=server.base_url, model=MODEL, use_cache=False) as client:
        stream = client.stream(PROMPT, max_tokens=20)
        async for _ in stream:
            pass
    r = stream.record
    assert r.http_version == "HTTP/2" and not r.connection_reused
    assert r.ttfb_ms is not None and r.ttfb_ms >= 3 * RTT_MS  # TCP, TLS 1.3, then the request
    assert r.tls_ms is not None and r.tls_ms >= RTT_MS


async def test_a_streamed_reply_arrives_intact_and_in_order(
    server_factory: Callable[..., RunningServer], local_server: RunningServer, tmp_path: Path
) -> None:
    # Long enough to cross many TCP reads and the server's 16 KiB writes, with multi-byte characters.
    params = {"max_tokens": 3000, "seed": 7}
    delayed = server_factory(profile="instant", rtt_ms=20)
    async with ChatClient(_settings(tmp_path), base_url=local_server.base_url, http2="h2c",
                          use_cache=False) as direct:
        expected, *_ = await _stream(direct, **params)
    for http2 in ("h2c", False):
        async with ChatClient(_settings(tmp_path), base_url=delayed.base_url, http2=http2,
                              use_cache=False) as client:
            text, *_ = await _stream(client, **params)
        assert text == expected
    assert len(expected) > 5000 and not expected.isascii()


async def test_a_cut_stream_reaches_the_client_as_a_cut_through_the_proxy(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    # The server shuts its socket mid-reply; the proxy must pass the end on, not hold the client open.
    server = server_factory(profile="instant", rtt_ms=20, drop_rate=1.0, tokens_per_s=2000)
    async with ChatClient(_settings(tmp_path), base_url=server.base_url, http2=False, use_cache=False) as c:
        stream = c.stream(PROMPT, max_tokens=200)
        with pytest.raises(StreamCutError) as caught:
            async with asyncio.timeout(WAIT_S):
                async for _ in stream:
                    pass
    assert caught.value.partial_text == stream.text


# --- the proxy on its own, with a raw TCP peer --------------------------------------------------------------


class Peer:
    """An upstream TCP server on 127.0.0.1: echoes, closes on b"bye", and notes when a client ends."""

    def __init__(self) -> None:
        self.server: asyncio.Server | None = None
        self.eof = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                if data == b"bye":
                    break
                writer.write(data)
                await writer.drain()
            else:
                self.eof.set()
        finally:
            writer.close()

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])


@asynccontextmanager
async def proxied(rtt_ms: float) -> AsyncIterator[tuple[Peer, DelayProxy]]:
    peer = Peer()
    peer.server = await asyncio.start_server(peer.handle, "127.0.0.1", 0)
    try:
        async with DelayProxy(Target("127.0.0.1", peer.port, "http", ""), rtt_ms) as proxy:
            yield peer, proxy
    finally:
        peer.server.close()
        await peer.server.wait_closed()


async def _until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(WAIT_S):
        while not condition():
            await asyncio.sleep(0.01)


async def test_bytes_pass_both_ways_intact_and_each_chunk_pays_one_round_trip() -> None:
    async with proxied(RTT_MS) as (_, proxy):
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        payload = os.urandom(3 * 1024 * 1024)  # bigger than the queue's high-water mark
        writer.write(payload)
        async with asyncio.timeout(WAIT_S):
            echoed = await reader.readexactly(len(payload))
        assert echoed == payload
        sent = time.perf_counter_ns()
        writer.write(b"ping")
        async with asyncio.timeout(WAIT_S):
            assert await reader.readexactly(4) == b"ping"
        assert (time.perf_counter_ns() - sent) / 1e6 >= RTT_MS
        writer.close()
        await writer.wait_closed()


async def test_the_delay_is_pipelined_not_serialized() -> None:
    rtt_ms, chunks = 100.0, 40
    async with proxied(rtt_ms) as (_, proxy):
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"warm")  # pay the handshake's round trip first
        async with asyncio.timeout(WAIT_S):
            await reader.readexactly(4)
        start = time.perf_counter_ns()
        for i in range(chunks):
            writer.write(b"%04d" % i)
            await writer.drain()
            await asyncio.sleep(0.002)  # separate TCP segments, so each is its own chunk in the proxy
        async with asyncio.timeout(WAIT_S):
            data = await reader.readexactly(4 * chunks)
        elapsed_ms = (time.perf_counter_ns() - start) / 1e6
        writer.close()
        await writer.wait_closed()
    assert data == b"".join(b"%04d" % i for i in range(chunks))
    assert elapsed_ms >= rtt_ms
    # Serialized, 40 chunks would take 40 round trips (4 s); pipelined they take about one.
    assert elapsed_ms < chunks * rtt_ms / 10


async def test_when_the_upstream_closes_the_client_is_closed_too() -> None:
    async with proxied(20) as (_, proxy):
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"bye")
        async with asyncio.timeout(WAIT_S):
            assert await reader.read() == b""
        writer.close()
        await writer.wait_closed()
        await _until(lambda: proxy.connections == 0)


async def test_when_the_client_closes_the_upstream_sees_it_and_the_link_goes() -> None:
    async with proxied(20) as (peer, proxy):
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"hello")
        async with asyncio.timeout(WAIT_S):
            assert await reader.readexactly(5) == b"hello"
        writer.close()
        await writer.wait_closed()
        async with asyncio.timeout(WAIT_S):
            await peer.eof.wait()
        await _until(lambda: proxy.connections == 0)


async def test_an_upstream_that_refuses_closes_the_client_unanswered() -> None:
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    async with DelayProxy(Target("127.0.0.1", port, "http", ""), 10) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"GET / HTTP/1.1\r\n\r\n")
        async with asyncio.timeout(WAIT_S):
            assert await reader.read() == b""
        writer.close()
        await _until(lambda: proxy.connections == 0)


async def test_closing_the_proxy_drops_open_connections() -> None:
    async with proxied(20) as (_, proxy):
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"x")
        async with asyncio.timeout(WAIT_S):
            await reader.readexactly(1)
        await proxy.aclose()
        async with asyncio.timeout(WAIT_S):
            try:
                assert await reader.read() == b""
            except ConnectionResetError:
                pass  # an abort may arrive as a reset: closed either way
        writer.close()
        assert proxy.connections == 0


def test_target_urls() -> None:
    assert Target.from_url("http://127.0.0.1:8000/v1/") == Target("127.0.0.1", 8000, "http", "/v1")
    assert Target.from_url("https://localhost/v1") == Target("localhost", 443, "https", "/v1")
    assert Target.from_url("http://[::1]/") == Target("::1", 80, "http", "")
    for bad in ("127.0.0.1:8000", "ftp://x/", "http://:80", "http://h:99999/"):
        with pytest.raises(UsageError):
            Target.from_url(bad)


def test_a_negative_rtt_is_refused() -> None:
    with pytest.raises(UsageError, match="rtt"):
        DelayProxy(Target("127.0.0.1", 1, "http", ""), -1)


# --- the command line ---------------------------------------------------------------------------------------


def test_serve_with_rtt_announces_it_and_serves_through_the_proxy() -> None:
    with start_subprocess(["--profile", "instant", "--rtt-ms", "40"]) as server:
        import httpx

        start = time.perf_counter_ns()
        with httpx.Client(timeout=WAIT_S) as client:
            reply = client.get(server.base_url + "/models")
        elapsed_ms = (time.perf_counter_ns() - start) / 1e6
        assert reply.status_code == 200 and reply.json()["data"]
        assert elapsed_ms >= 2 * 40
        assert server.terminate() == 0


def test_serve_ready_line_names_the_rtt(capsys: pytest.CaptureFixture[str]) -> None:
    from llmchat.core.server._start import Listening

    assert Listening("127.0.0.1", 1, "http", None, 50.0).line.endswith("(http/1.1, h2c, rtt 50 ms)")
    assert Listening("127.0.0.1", 1, "http", None).line.endswith("(http/1.1, h2c)")
    assert main(["serve", "--port", "0", "--rtt-ms", "-3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "rtt_ms" in err and "non-negative" in err


def test_proxy_command_forwards_with_the_delay_and_stops_on_sigterm(local_server: RunningServer) -> None:
    import httpx

    command = [sys.executable, "-m", "llmchat.tui", "proxy", "--rtt-ms", "40", "--to", local_server.base_url]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()  # bounded: the child prints it or exits (EOF)
        assert line.startswith("llmchat proxy listening on http://127.0.0.1:"), line
        assert line.endswith(f"-> {local_server.base_url} (rtt 40 ms)")
        url = line.split()[4]
        assert url.endswith("/v1")
        start = time.perf_counter_ns()
        with httpx.Client(timeout=WAIT_S) as client:
            reply = client.get(url + "/models")
        assert reply.status_code == 200
        assert (time.perf_counter_ns() - start) / 1e6 >= 2 * 40
        process.send_signal(signal.SIGTERM)
        assert process.wait(WAIT_S) == 0
        assert process.stderr is not None and process.stderr.read() == ""
    finally:
        reap(process, WAIT_S)


def test_proxy_command_rejects_a_bad_target(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["proxy", "--rtt-ms", "10", "--to", "127.0.0.1:8000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("llmchat: --to '127.0.0.1:8000' is not") and err.count("\n") == 1
