"""Warm-up against the local server: the states on the bus, a first request that finds its connection open,
a failure that is a warning and not an error, and the idle ping loop. Reuse is asserted on the request's
phases (no connect, no TLS), never on how long anything took."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import Any

import peers as P
import pytest

from llmchat.core import (
    ChatClient,
    ConfigError,
    HttpSettings,
    RetrySettings,
    ServerError,
    Settings,
    TLSError,
    Warmer,
    WarmupState,
)
from llmchat.core.http._transport import _ssl_context
from llmchat.core.observe._timing import Phases
from llmchat.core.server import RunningServer
from llmchat.core.server._tls import self_signed

Factory = Callable[..., RunningServer]
MESSAGES = [{"role": "user", "content": "hello"}]
MODEL = "llmchat-local"
BOUND_S = 5.0


def states(client: ChatClient) -> list[WarmupState]:
    seen: list[WarmupState] = []
    client.bus.subscribe(WarmupState, seen.append)
    return seen


@pytest.mark.parametrize("http2", ["h2c", False])
async def test_warm_up_opens_the_connection_the_first_request_then_uses(
    server_factory: Factory, http2: Any
) -> None:
    server = server_factory(ttft_ms=0)
    async with ChatClient(base_url=server.base_url, http2=http2, model=MODEL, use_cache=False) as client:
        seen = states(client)
        warmer = Warmer(client, ping_s=0)
        assert warmer.state == "cold" and warmer.rtt_ms is None
        assert await warmer.warm() is True
        reply = await client.complete(MESSAGES, max_tokens=3)
        await warmer.aclose()
    assert [s.state for s in seen] == ["warming", "warm"]
    assert seen[-1].rtt_ms == warmer.rtt_ms and warmer.rtt_ms is not None and warmer.rtt_ms > 0
    assert seen[-1].provider == client.endpoint.name and seen[-1].error is None
    assert warmer.state == "warm"
    assert reply.record.connection_reused is True
    assert reply.record.phases.connect_start_ns is None and reply.record.connect_ms is None


def watch_gets(client: ChatClient) -> list[Phases]:
    """The phases of every GET /models the client sends from now on (the real GET still goes out)."""
    seen: list[Phases] = []
    real = client.models

    async def models(*, phases: Phases | None = None) -> list[str]:
        p = phases if phases is not None else Phases()
        seen.append(p)
        return await real(phases=p)

    client.models = models  # type: ignore[method-assign]
    return seen


async def test_the_ping_is_a_round_trip_on_the_open_connection_apart_from_its_setup(
    server_factory: Factory,
) -> None:
    server = server_factory(ttft_ms=0)
    async with ChatClient(base_url=server.base_url, http2="h2c", model=MODEL, use_cache=False) as client:
        seen = states(client)
        gets = watch_gets(client)
        warmer = Warmer(client, ping_s=0)
        assert await warmer.warm() is True
        # The first GET opened the connection: its connect is the setup; the ping is a second GET on it.
        assert [g.reused for g in gets] == [False, True]
        opened = gets[0]
        assert opened.connect_start_ns is not None and opened.connect_end_ns is not None
        assert warmer.setup_ms == pytest.approx((opened.connect_end_ns - opened.connect_start_ns) / 1e6)
        assert seen[-1].setup_ms == warmer.setup_ms and seen[-1].rtt_ms == warmer.rtt_ms
        # A keep-alive ping on the open connection is one GET, and opens nothing: no new setup.
        setup = warmer.setup_ms
        assert await warmer.warm() is True
        await warmer.aclose()
    assert [g.reused for g in gets] == [False, True, True]
    assert seen[-1].state == "warm" and seen[-1].setup_ms is None and warmer.setup_ms == setup


async def test_a_reply_marks_the_connection_warm_again_after_a_failed_ping(
    peer: Callable[..., P.Peer],
) -> None:
    # A gateway that fails GET /models (the ping) and answers chat completions: the requests succeed, so the
    # connection is not "failed".
    p = peer([P.NGINX_502], later=[P.json_response(200, P.completion("hi"))], then="keep")
    async with ChatClient(base_url=p.base_url, http2=False, model=MODEL, use_cache=False) as client:
        seen = states(client)
        warmer = Warmer(client, ping_s=0)
        assert await warmer.warm() is False
        assert warmer.state == "failed"
        reply = await client.complete(MESSAGES, max_tokens=3)
        await warmer.aclose()
    assert reply.text == "hi"
    assert [s.state for s in seen] == ["warming", "failed", "warm"]
    assert warmer.state == "warm" and warmer.error is None and seen[-1].error is None


async def test_a_failed_request_leaves_the_state_alone(
    peer: Callable[..., P.Peer],
) -> None:
    p = peer([P.NGINX_502], then="keep")
    async with ChatClient(base_url=p.base_url, http2=False, model=MODEL, use_cache=False,
                          retry=RetrySettings(max_attempts=1)) as client:
        seen = states(client)
        warmer = Warmer(client, ping_s=0)
        assert await warmer.warm() is False
        with pytest.raises(ServerError):
            await client.complete(MESSAGES, max_tokens=3)
        await warmer.aclose()
    assert [s.state for s in seen] == ["warming", "failed"]


@pytest.mark.parametrize("http2", ["h2c", False])
async def test_a_cold_client_pays_the_connect_on_its_first_request(
    server_factory: Factory, http2: Any
) -> None:
    server = server_factory(ttft_ms=0)
    async with ChatClient(base_url=server.base_url, http2=http2, model=MODEL, use_cache=False) as client:
        first = await client.complete(MESSAGES, max_tokens=3)
        second = await client.complete(MESSAGES, max_tokens=3)
    assert first.record.connection_reused is False
    assert first.record.phases.connect_start_ns is not None and first.record.connect_ms is not None
    assert second.record.connection_reused is True


async def test_warm_up_over_tls_saves_the_handshake_too(tls_server: RunningServer) -> None:
    settings = Settings(http=HttpSettings(verify=str(tls_server.cert_path)))
    async with ChatClient(settings, base_url=tls_server.base_url, model=MODEL, use_cache=False) as cold:
        cold_reply = await cold.complete(MESSAGES, max_tokens=3)
    async with ChatClient(settings, base_url=tls_server.base_url, model=MODEL, use_cache=False) as client:
        warmer = Warmer(client, ping_s=0)
        assert await warmer.warm()
        warm_reply = await client.complete(MESSAGES, max_tokens=3)
        await warmer.aclose()
    assert cold_reply.record.tls_ms is not None and cold_reply.record.http_version == "HTTP/2"
    assert warm_reply.record.tls_ms is None and warm_reply.record.connect_ms is None
    assert warm_reply.record.http_version == "HTTP/2"


async def test_a_failed_warm_up_is_one_warning_and_a_state(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with ChatClient(base_url=f"http://127.0.0.1:{port}/v1", http2="h2c", model=MODEL,
                          use_cache=False) as client:
        seen = states(client)
        warmer = Warmer(client, ping_s=0)
        with caplog.at_level(logging.DEBUG, logger="llmchat.warmup"):
            assert await warmer.warm() is False
            assert await warmer.warm() is False  # still down: no second warning
        await warmer.aclose()
    assert warmer.state == "failed" and warmer.rtt_ms is None
    assert warmer.error is not None and "connection refused" in warmer.error
    assert [s.state for s in seen] == ["warming", "failed", "warming", "failed"]
    assert seen[1].error == warmer.error
    warnings = [r for r in caplog.records if r.name == "llmchat.warmup" and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "connection refused" in warnings[0].getMessage()
    assert "Traceback" not in caplog.text


async def test_idle_pings_keep_coming_until_aclose(server_factory: Factory) -> None:
    server = server_factory(ttft_ms=0)
    async with ChatClient(base_url=server.base_url, http2="h2c", model=MODEL, use_cache=False) as client:
        warms: list[WarmupState] = []
        enough = asyncio.Event()

        def on_state(event: WarmupState) -> None:
            if event.state == "warm":
                warms.append(event)
                if len(warms) >= 3:
                    enough.set()

        client.bus.subscribe(WarmupState, on_state)
        warmer = Warmer(client, ping_s=0.05)
        warmer.start()
        async with asyncio.timeout(BOUND_S):
            await enough.wait()  # the warm-up and at least two pings
        await warmer.aclose()
        count = len(warms)
        await asyncio.sleep(0.2)  # four ping periods: a loop that survived aclose would ping again
    assert len(warms) == count
    assert all(w.rtt_ms is not None and w.rtt_ms > 0 for w in warms)


async def test_no_ping_while_requests_keep_the_connection_busy(server_factory: Factory) -> None:
    server = server_factory(ttft_ms=0)
    async with ChatClient(base_url=server.base_url, http2="h2c", model=MODEL, use_cache=False) as client:
        seen = states(client)
        warmer = Warmer(client, ping_s=0.3)
        warmer.start()
        async with asyncio.timeout(BOUND_S):
            while warmer.state != "warm":
                await asyncio.sleep(0.005)
        loop = asyncio.get_running_loop()
        busy_until = loop.time() + 0.75  # two and a half ping periods of back-to-back requests
        requests = 0
        while loop.time() < busy_until:
            await client.complete(MESSAGES, max_tokens=2)
            requests += 1
        during = len(seen)
        async with asyncio.timeout(BOUND_S):
            while len(seen) == during:  # idle again: the ping comes back
                await asyncio.sleep(0.01)
        await warmer.aclose()
    assert requests > 3
    assert during == 2  # warming, warm: every request reset the idle clock, so no ping went out
    assert seen[-1].state == "warm"


async def test_ping_s_zero_warms_once_and_stops(server_factory: Factory) -> None:
    server = server_factory(ttft_ms=0)
    async with ChatClient(base_url=server.base_url, http2="h2c", model=MODEL, use_cache=False) as client:
        seen = states(client)
        warmer = Warmer(client, ping_s=0)
        warmer.start()
        task = warmer._task
        assert task is not None
        async with asyncio.timeout(BOUND_S):
            await task  # the loop ends by itself after one warm-up
        await warmer.aclose()
    assert [s.state for s in seen] == ["warming", "warm"]


def test_ping_s_defaults_to_the_providers_keepalive_ping() -> None:
    settings = Settings(http=HttpSettings(keepalive_ping_s=7.5))
    client = ChatClient(settings, base_url="http://127.0.0.1:9/v1", model=MODEL, use_cache=False)
    assert Warmer(client).ping_s == 7.5
    assert Warmer(client, ping_s=0).ping_s == 0


async def test_new_pools_share_one_tls_context_that_follows_ssl_cert_file(
    tls_server: RunningServer, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Building a default TLS context costs ~50 ms of CPU on the event loop, in the first request of every new
    # pool: it is built once per process, but a change of SSL_CERT_FILE still gives a context that honours it.
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_server.cert_path))
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    shared = _ssl_context(HttpSettings())
    assert _ssl_context(HttpSettings()) is shared
    assert _ssl_context(HttpSettings(http2=False)) is not shared  # httpcore sets ALPN on it per connection
    for _ in range(2):  # two pools, one after the other, both trusting the server through SSL_CERT_FILE
        async with ChatClient(base_url=tls_server.base_url, model=MODEL, use_cache=False) as client:
            reply = await client.complete(MESSAGES, max_tokens=2)
        assert reply.record.tls_ms is not None and reply.record.http_version == "HTTP/2"

    other = self_signed()  # a real CA certificate, but not the server's own
    try:
        monkeypatch.setenv("SSL_CERT_FILE", other.trust_path)
        assert _ssl_context(HttpSettings()) is not shared
        async with ChatClient(base_url=tls_server.base_url, model=MODEL, use_cache=False) as client:
            with pytest.raises(TLSError):
                await client.complete(MESSAGES, max_tokens=2)
    finally:
        other.cleanup()

    missing = tmp_path / "no-such-bundle.pem"
    monkeypatch.setenv("SSL_CERT_FILE", str(missing))
    async with ChatClient(base_url=tls_server.base_url, model=MODEL, use_cache=False) as client:
        with pytest.raises(ConfigError) as caught:
            await client.complete(MESSAGES, max_tokens=2)
    message = str(caught.value)
    assert message.startswith(f"cannot load the CA certificates from SSL_CERT_FILE={missing} (")
    assert "unset it" in message and "\n" not in message
