"""The local server's latency and fault profile, seen from a real httpx client over real sockets.

Timing assertions are lower bounds the server guarantees (a delay is never shorter than asked), checked on
its own ``server_timing`` stamps or the client's monotonic clock; upper bounds only where they are the point
and then generous.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from llmchat.core.server import RunningServer

Factory = Callable[..., RunningServer]
MESSAGES = [{"role": "user", "content": "hello"}]
UNUSED_TLS = (
    ssl.create_default_context()
)  # one TLS context for all clients: httpx builds one per client otherwise


def client(server: RunningServer, *, h2c: bool = False, key: str | None = None) -> httpx.AsyncClient:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.AsyncClient(
        base_url=server.base_url, http1=not h2c, http2=h2c, headers=headers, timeout=10, verify=UNUSED_TLS
    )


def events(body: bytes) -> list[Any]:
    blocks = [b[len("data: ") :] for b in body.decode().split("\n\n") if b]
    return [b if b == "[DONE]" else json.loads(b) for b in blocks]


def ms(ns: int) -> float:
    return ns / 1e6


async def test_api_key_is_required_and_never_echoed(server_factory: Factory) -> None:
    server = server_factory(api_key="sk-right-key")
    body = {"messages": MESSAGES, "max_tokens": 3}
    async with client(server) as anon, client(server, key="sk-wrong-key-123") as wrong:
        for c in (anon, wrong):
            for r in (
                await c.post("/chat/completions", json=body),
                await c.get("/models"),
                await c.post("/embeddings", json={"input": "x"}),
            ):
                assert r.status_code == 401
                assert r.json()["error"]["code"] == "invalid_api_key"
                assert "sk-" not in r.text and "wrong-key" not in r.text
        health = await anon.get(server.url + "/health")
        assert health.status_code == 200  # a liveness probe needs no key
    async with client(server, key="sk-right-key") as good:
        assert (await good.post("/chat/completions", json=body)).status_code == 200


async def test_rate_limit_is_per_key_with_retry_after(server_factory: Factory) -> None:
    server = server_factory(rate_limit=2)
    body = {"messages": MESSAGES, "max_tokens": 2}
    async with client(server, key="alice") as alice, client(server, key="bob") as bob, client(server) as anon:
        first = await alice.post("/chat/completions", json=body)
        assert first.status_code == 200
        assert first.headers["x-ratelimit-limit-requests"] == "2"
        assert first.headers["x-ratelimit-remaining-requests"] == "1"
        assert (await alice.post("/chat/completions", json=body)).status_code == 200
        limited = await alice.post("/chat/completions", json=body)
        assert limited.status_code == 429
        error = limited.json()["error"]
        assert error["code"] == "rate_limit_exceeded" and error["type"] == "requests"
        retry_after = int(limited.headers["retry-after"])
        retry_after_ms = int(limited.headers["retry-after-ms"])
        assert 1 <= retry_after <= 60 and 0 < retry_after_ms <= 60_000
        assert retry_after == -(-retry_after_ms // 1000)  # whole seconds, rounded up
        assert limited.headers["x-ratelimit-remaining-requests"] == "0"
        assert limited.headers["x-ratelimit-reset-requests"].endswith("s")
        # Other keys, and callers without a key, have buckets of their own.
        assert (await bob.post("/chat/completions", json=body)).status_code == 200
        assert (await anon.post("/embeddings", json={"input": "x"})).status_code == 200
        # Listing models is not a billed request and does not count.
        assert (await bob.get("/models")).status_code == 200
        assert (await bob.post("/chat/completions", json=body)).status_code == 200


async def test_error_rate_gives_openai_shaped_5xx_repeatably(server_factory: Factory) -> None:
    always = server_factory(error_rate=1.0)
    async with client(always) as c:
        statuses = set()
        for _ in range(12):
            r = await c.post("/chat/completions", json={"messages": MESSAGES})
            statuses.add(r.status_code)
            error = r.json()["error"]
            assert error["type"] == "server_error" and set(error) == {"message", "type", "param", "code"}
    assert statuses <= {500, 502, 503} and len(statuses) >= 2

    async def sequence(server: RunningServer) -> list[int]:
        async with client(server) as c:
            return [
                (await c.post("/chat/completions", json={"messages": MESSAGES, "max_tokens": 1})).status_code
                for _ in range(16)
            ]

    a, b = server_factory(error_rate=0.5, seed=11), server_factory(error_rate=0.5, seed=11)
    first = await sequence(a)
    assert first == await sequence(b)  # the same seed, the same faults
    assert 200 in first and any(s >= 500 for s in first)


@pytest.mark.parametrize("h2c", [False, True], ids=["http1", "h2c"])
async def test_drop_cuts_the_connection_mid_stream(server_factory: Factory, h2c: bool) -> None:
    server = server_factory(drop_rate=1.0)
    received = b""
    async with client(server, h2c=h2c) as c:
        with pytest.raises(httpx.TransportError):
            async with c.stream(
                "POST", "/chat/completions", json={"messages": MESSAGES, "stream": True}
            ) as r:
                assert r.status_code == 200
                async for chunk in r.aiter_bytes():
                    received += chunk
    whole = received.rsplit(b"\n\n", 1)[0]  # what arrived, up to the last complete event
    chunks = events(whole + b"\n\n")
    assert len(chunks) >= 2, "the role chunk and at least one content token arrive before the cut"
    assert "[DONE]" not in chunks
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)


async def test_drop_rate_spares_whole_replies(server_factory: Factory) -> None:
    server = server_factory(drop_rate=1.0)
    async with client(server) as c:
        r = await c.post("/chat/completions", json={"messages": MESSAGES})
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "stop"


async def test_ttft_and_tokens_per_s_pace_the_stream(server_factory: Factory) -> None:
    server = server_factory(ttft_ms=60, tokens_per_s=200)
    async with client(server, h2c=True) as c:
        started = time.perf_counter_ns()
        r = await c.post("/chat/completions", json={"messages": MESSAGES, "stream": True, "max_tokens": 21})
        elapsed = time.perf_counter_ns() - started
    timing = events(r.content)[-2]["server_timing"]
    # Token k is due at received + ttft + k / tokens_per_s, and never goes out before it is due.
    assert ms(timing["first_token_ns"] - timing["received_ns"]) >= 60
    assert ms(timing["last_token_ns"] - timing["received_ns"]) >= 60 + 20 / 200 * 1000
    assert ms(elapsed) >= 60 + 100


async def test_whole_replies_take_as_long_as_the_stream_would(server_factory: Factory) -> None:
    server = server_factory(ttft_ms=40, tokens_per_s=250)
    async with client(server) as c:
        r = await c.post("/chat/completions", json={"messages": MESSAGES, "max_tokens": 26})
    timing = r.json()["server_timing"]
    assert ms(timing["first_token_ns"] - timing["received_ns"]) >= 40
    assert ms(timing["last_token_ns"] - timing["received_ns"]) >= 40 + 25 / 250 * 1000


async def test_stall_pauses_the_middle_of_the_stream(server_factory: Factory) -> None:
    server = server_factory(stall_ms=150)
    arrivals: list[int] = []
    chunks: list[Any] = []
    async with client(server) as c:
        async with c.stream("POST", "/chat/completions", json={"messages": MESSAGES, "stream": True}) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    arrivals.append(time.perf_counter_ns())
                    chunks.append(line[len("data: ") :])
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    widest = gaps.index(max(gaps))
    content_chunks = len(chunks) - 2  # less the role chunk and [DONE]
    # The pause falls in the middle: after the role chunk and half the tokens.
    assert widest == 1 + content_chunks // 2 - 1
    # The server guarantees the gap on its side; the client may read the bytes before it a little late.
    timing = json.loads(chunks[-2])["server_timing"]
    assert ms(timing["last_token_ns"] - timing["first_token_ns"]) >= 150
    assert ms(gaps[widest]) >= 150 * 0.8


async def test_cold_start_slows_the_first_request_per_model(server_factory: Factory) -> None:
    server = server_factory(cold_start_ms=300)

    async def ttft_ms(model: str) -> float:
        body = {"model": model, "messages": MESSAGES, "max_tokens": 2}
        timing = (await c.post("/chat/completions", json=body)).json()["server_timing"]
        return ms(timing["first_token_ns"] - timing["received_ns"])

    async with client(server) as c:
        assert await ttft_ms("llmchat-local") >= 300
        assert await ttft_ms("llmchat-local") < 150  # warm now: well below the cold start
        assert await ttft_ms("llmchat-local-large") >= 300  # each model loads on its own


async def test_concurrent_requests_share_one_cold_start(server_factory: Factory) -> None:
    server = server_factory(cold_start_ms=300)
    async with client(server, h2c=True) as c:
        started = time.perf_counter_ns()
        replies = await asyncio.gather(
            *(c.post("/chat/completions", json={"messages": MESSAGES, "max_tokens": 2}) for _ in range(5))
        )
        elapsed = time.perf_counter_ns() - started
    assert all(r.status_code == 200 for r in replies)
    assert ms(elapsed) >= 300
    assert ms(elapsed) < 5 * 300  # they waited for the same load, not one load each


async def test_idle_model_is_unloaded_and_cold_again(server_factory: Factory) -> None:
    server = server_factory(cold_start_ms=300, idle_unload_s=0.3)

    async def ttft_ms() -> float:
        timing = (await c.post("/chat/completions", json={"messages": MESSAGES, "max_tokens": 1})).json()
        return ms(timing["server_timing"]["first_token_ns"] - timing["server_timing"]["received_ns"])

    async with client(server) as c:
        assert await ttft_ms() >= 300
        assert await ttft_ms() < 150
        await asyncio.sleep(0.4)  # the precondition under test: longer than idle_unload_s without traffic
        assert await ttft_ms() >= 300


async def test_close_after_stream_hangs_up_on_the_next_request(server_factory: Factory) -> None:
    server = server_factory(close_after_stream=True)
    stream = {"messages": MESSAGES, "stream": True, "max_tokens": 5}
    async with client(server) as c:
        r = await c.post("/chat/completions", json=stream)
        assert r.status_code == 200 and events(r.content)[-1] == "[DONE]"
        assert "close" not in r.headers.get("connection", "")  # the headers promised keep-alive
        with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
            await c.post("/chat/completions", json=stream)
        # A fresh connection works, and a whole reply does not doom its connection.
        assert (await c.post("/chat/completions", json={"messages": MESSAGES})).status_code == 200
        assert (await c.post("/chat/completions", json={"messages": MESSAGES})).status_code == 200


async def test_without_close_after_stream_the_connection_is_reused(server_factory: Factory) -> None:
    server = server_factory()
    stream = {"messages": MESSAGES, "stream": True, "max_tokens": 5}
    peers = set()
    async with client(server) as c:
        for _ in range(3):
            async with c.stream("POST", "/chat/completions", json=stream) as r:
                peers.add(r.extensions["network_stream"].get_extra_info("client_addr"))
                await r.aread()
    assert len(peers) == 1


async def test_close_after_stream_leaves_h2c_alone(server_factory: Factory) -> None:
    server = server_factory(close_after_stream=True)
    async with client(server, h2c=True) as c:
        for _ in range(3):
            r = await c.post(
                "/chat/completions", json={"messages": MESSAGES, "stream": True, "max_tokens": 3}
            )
            assert r.status_code == 200 and r.http_version == "HTTP/2"


async def test_flaky_profile_is_flaky_and_explicit_settings_win(server_factory: Factory) -> None:
    server = server_factory(
        profile="flaky", ttft_ms=0, tokens_per_s=0, jitter_ms=0, drop_rate=0, rate_limit=0
    )
    assert server.settings.error_rate == pytest.approx(0.1)
    async with client(server) as c:
        statuses = [
            (await c.post("/chat/completions", json={"messages": MESSAGES, "max_tokens": 1})).status_code
            for _ in range(60)
        ]
    assert 200 in statuses and any(s >= 500 for s in statuses)
