"""Attribution end to end: real requests to ``llmchat serve`` profiles whose true split is known, and to raw
peers that report like llama.cpp and OpenAI, report garbage, or report nothing.

Tolerances (stated once, used below):

- a reported server part is within ``SERVER_EARLY_MS`` (2 ms) below and ``SERVER_LATE_MS`` (25 ms) above
  the delay the server was told to add: these are the server's own stamps, so only its timers separate the
  two, and a timer on a busy CPU only ever fires late;
- server generation is within ``GEN_TOL`` (20 %) of ``(tokens - 1) / tokens_per_s``;
- on loopback the network's share of waiting for the first token stays under half the server's
  (``LOOPBACK_NET_MS``), i.e. the server's time is not blamed on the network;
- with an emulated round trip (``llmchat serve --rtt-ms``, whose proxy charges the TCP handshake's round
  trip to the first bytes), a reused connection's network-to-first-token is at least one round trip and a new
  connection's network group at least two, less ``RTT_SLACK_MS`` for the client's own gaps.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import peers as P
import pytest

from llmchat.core import (
    Attribution,
    CacheSettings,
    ChatClient,
    ColdStartDetector,
    HttpSettings,
    HTTPStatusError,
    ProviderSettings,
    Settings,
    TimingRecord,
    UsageError,
    attribute,
    scrape_server_metrics,
)
from llmchat.core.server import RunningServer
from llmchat.tui.cli import main

MODEL = "llmchat-local"
MSG = [{"role": "user", "content": "where does the time go"}]
SERVER_EARLY_MS = 2.0
SERVER_LATE_MS = 25.0
GEN_TOL = 0.20
LOOPBACK_NET_MS = 75.0
RTT_MS = 60.0
RTT_SLACK_MS = 15.0
WAIT_S = 10.0
"""The bound on any one request here: far past what each needs, so a bug fails instead of hanging."""
SATURATION_FREE_MS = 5.0
"""A request that found a free slot queues for less than this (the server's own bookkeeping)."""

Factory = Callable[..., RunningServer]


def _settings(tmp_path: Path, **http: Any) -> Settings:
    return Settings(http=HttpSettings(**http), cache=CacheSettings(path=str(tmp_path / "cache")))


def _client(
    base_url: str, tmp_path: Path, *, http2: Any = "h2c", model: str = MODEL, **http: Any
) -> ChatClient:
    return ChatClient(_settings(tmp_path, **http), base_url=base_url, model=model, http2=http2,
                      use_cache=False)


async def _stream_text(client: ChatClient, **params: Any) -> tuple[str, TimingRecord]:
    """Stream one reply to its end (bounded by WAIT_S); its text and record."""
    async def run() -> tuple[str, TimingRecord]:
        stream = client.stream(MSG, **params)
        async for _ in stream:
            pass
        return stream.text, stream.record

    return await asyncio.wait_for(run(), WAIT_S)


async def _stream(client: ChatClient, **params: Any) -> TimingRecord:
    return (await _stream_text(client, **params))[1]


def _near(reported_ms: float, configured_ms: float) -> bool:
    return configured_ms - SERVER_EARLY_MS <= reported_ms <= configured_ms + SERVER_LATE_MS


def _check_sum(a: Attribution) -> None:
    assert abs(sum(p.ms for p in a.parts) - a.total_ms) < 1e-6


# -- llmchat serve: a known split is recovered ---------------------------------------------------------------
@pytest.mark.parametrize("http2", ["h2c", False], ids=["h2c", "http1"])
async def test_stream_recovers_ttft_and_generation(
    server_factory: Factory, tmp_path: Path, http2: Any
) -> None:
    srv = server_factory(ttft_ms=150, tokens_per_s=200)
    async with _client(srv.base_url, tmp_path, http2=http2) as client:
        r = await _stream(client, max_tokens=40)
    a = attribute(r)
    assert a.reporter == "llmchat serve" and r.output_tokens == 40
    assert _near(a.ms("server_prefill"), 150)
    expected_gen = (r.output_tokens - 1) / 200 * 1000
    assert abs(a.ms("server_generation") - expected_gen) <= GEN_TOL * expected_gen
    assert a.ms("server_queue") < SATURATION_FREE_MS
    assert 0 <= a.ms("network_first_token") < LOOPBACK_NET_MS
    assert a.part("network_server") is None  # the server reported: nothing is left merged
    assert {p.source for p in a.parts if p.group == "server"} == {"reported"}
    assert a.flags == []
    _check_sum(a)


async def test_batch_recovers_the_server_total(server_factory: Factory, tmp_path: Path) -> None:
    srv = server_factory(ttft_ms=150, tokens_per_s=200)
    async with _client(srv.base_url, tmp_path) as client:
        reply = await asyncio.wait_for(client.complete(MSG, max_tokens=40), WAIT_S)
    a = attribute(reply.record)
    assert _near(a.ms("server_prefill"), 150)
    expected_gen = 39 / 200 * 1000
    # The server paces with sleeps, which a loaded machine overruns but never cuts short; and it cannot report
    # more generation than the request took.
    assert (1 - GEN_TOL) * expected_gen <= a.ms("server_generation") <= a.total_ms - a.ms("server_prefill")
    assert 0 <= a.ms("network_reply") < LOOPBACK_NET_MS
    assert a.part("decode") is not None and a.part("decode").source == "measured"  # type: ignore[union-attr]
    _check_sum(a)


async def test_a_stall_is_server_generation_not_network(server_factory: Factory, tmp_path: Path) -> None:
    srv = server_factory(ttft_ms=10, tokens_per_s=1000, stall_ms=300)
    async with _client(srv.base_url, tmp_path) as client:
        r = await _stream(client, max_tokens=20)
    a = attribute(r)
    assert a.ms("server_generation") >= 300
    # The client waited through the stall too; none of it is blamed on the network.
    assert a.ms("network_stream") < 100
    assert a.ms("server_generation") > 0.75 * (a.total_ms - a.ms("server_prefill"))


async def test_a_round_trip_lands_in_network_never_in_server(server_factory: Factory, tmp_path: Path) -> None:
    srv = server_factory(ttft_ms=30, rtt_ms=RTT_MS)
    async with _client(srv.base_url, tmp_path, http2=False) as client:
        new = attribute(await _stream(client, max_tokens=8))
        reused = attribute(await _stream(client, max_tokens=8))
    for a in (new, reused):
        assert _near(a.ms("server_prefill"), 30)  # the server is not charged for the link
        _check_sum(a)
    assert reused.part("connect") is None
    assert reused.ms("network_first_token") >= RTT_MS - 5
    assert new.part("connect") is not None
    # The proxy charges the TCP handshake's round trip to the first bytes: one for it, one for the request.
    assert new.group_ms()["network"] >= 2 * RTT_MS - RTT_SLACK_MS


async def test_tls_handshake_through_a_round_trip_is_network(server_factory: Factory, tmp_path: Path) -> None:
    srv = server_factory(ttft_ms=10, rtt_ms=RTT_MS, tls=True)
    async with _client(srv.base_url, tmp_path, http2=True, verify=srv.cert_path) as client:
        a = attribute(await _stream(client, max_tokens=4))
    tls = a.part("tls")
    assert tls is not None and tls.group == "network" and tls.source == "measured"
    assert tls.ms >= RTT_MS - 5


async def test_two_requests_on_one_slot_show_queueing_and_saturation(
    server_factory: Factory, tmp_path: Path
) -> None:
    srv = server_factory(ttft_ms=200, max_concurrency=1)
    async with _client(srv.base_url, tmp_path) as client:
        records = list(await asyncio.gather(_stream(client, max_tokens=5), _stream(client, max_tokens=5)))
    records.sort(key=lambda r: (r.server_timing or {}).get("received_ns", 0))
    first, second = (attribute(r) for r in records)
    assert first.ms("server_queue") < SATURATION_FREE_MS and "saturation" not in first.flags
    # The second waited until the first's reply was done (its 200 ms to first token, less however much
    # later the second arrived): the queue ends where the first reply ended, and it is most of the wait.
    st1, st2 = records[0].server_timing or {}, records[1].server_timing or {}
    assert st2["started_ns"] >= st1["last_token_ns"]
    assert second.ms("server_queue") >= 100
    assert _near(second.ms("server_prefill"), 200)  # its own prefill starts after the wait
    assert "saturation" in second.flags
    assert second.ms("network_first_token") < LOOPBACK_NET_MS  # the wait is the server's, not the network's


async def test_metrics_of_a_busy_server_are_scraped_and_flag_saturation(
    server_factory: Factory, tmp_path: Path
) -> None:
    srv = server_factory(ttft_ms=300, max_concurrency=1)
    metrics_url = srv.base_url.removesuffix("/v1") + "/metrics"
    async with _client(srv.base_url, tmp_path) as client:
        tasks = [asyncio.create_task(_stream(client, max_tokens=3)) for _ in range(2)]
        snapshot: dict[str, float] = {}
        deadline = time.monotonic() + WAIT_S
        while snapshot.get("requests_waiting", 0) < 1:
            assert time.monotonic() < deadline, f"the server never showed a queued request: {snapshot}"
            snapshot = await scrape_server_metrics(metrics_url)
            await asyncio.sleep(0.01)  # a poll, not a guess: the loop ends on the condition or the deadline
        records = await asyncio.gather(*tasks)
    assert snapshot == {"requests_waiting": 1.0, "requests_running": 1.0}
    a = attribute(records[0], server_metrics=snapshot)
    assert "saturation" in a.flags and any("1 request waiting, 1 running" in n for n in a.notes)
    assert await scrape_server_metrics(metrics_url) == {"requests_waiting": 0.0, "requests_running": 0.0}


async def test_scraping_through_a_client_uses_the_providers_metrics_url(
    server_factory: Factory, tmp_path: Path
) -> None:
    srv = server_factory()
    root = srv.base_url.removesuffix("/v1")
    providers = {
        "local": ProviderSettings(name="local", base_url=srv.base_url, model=MODEL,
                                  metrics_url=root + "/metrics", http={"http2": "h2c"}),
        "bare": ProviderSettings(name="bare", base_url=srv.base_url, model=MODEL),
        "wrong": ProviderSettings(name="wrong", base_url=srv.base_url, model=MODEL,
                                  metrics_url=root + "/v1/metrics"),
    }
    settings = Settings(providers=providers, cache=CacheSettings(path=str(tmp_path / "cache")))
    async with ChatClient(settings, provider="local", use_cache=False) as client:
        assert await scrape_server_metrics(client) == {"requests_waiting": 0.0, "requests_running": 0.0}
    async with ChatClient(settings, provider="bare", use_cache=False) as client:
        with pytest.raises(UsageError, match="providers.bare.metrics_url"):
            await scrape_server_metrics(client)
    async with ChatClient(settings, provider="wrong", use_cache=False) as client:
        with pytest.raises(HTTPStatusError, match="HTTP 404 for the metrics"):
            await scrape_server_metrics(client)


async def test_cold_start_after_idle_is_flagged_and_warm_requests_are_not(
    server_factory: Factory, tmp_path: Path
) -> None:
    srv = server_factory(cold_start_ms=400, idle_unload_s=0.3, ttft_ms=20)
    detector = ColdStartDetector(idle_s=0.3)
    async with _client(srv.base_url, tmp_path) as client:
        # The server's very first request is cold: with no history only the server's own report can say so.
        first = attribute(await _stream(client, max_tokens=3), detector=detector)
        flags = [attribute(await _stream(client, max_tokens=3), detector=detector).flags for _ in range(4)]
        assert flags == [[]] * 4
        await asyncio.sleep(0.4)  # deliberate idle, past the server's idle_unload_s, so it unloads the model
        cold = attribute(await _stream(client, max_tokens=3), detector=detector)
        warm_again = attribute(await _stream(client, max_tokens=3), detector=detector)
    for a in (first, cold):
        assert a.flags == ["cold_start"]
        load = a.part("server_model_load")
        assert load is not None and load.name == "server model load" and load.source == "reported"
        assert load.group == "server" and _near(load.ms, 400)
        assert _near(a.ms("server_prefill"), 20)  # the load is its own part, not prefill
        _check_sum(a)
    assert warm_again.flags == [] and warm_again.part("server_model_load") is None


async def test_a_cache_hit_is_all_client(local_server: RunningServer, tmp_path: Path) -> None:
    async with ChatClient(_settings(tmp_path), base_url=local_server.base_url, model=MODEL, http2="h2c") as c:
        await c.complete(MSG, max_tokens=5, temperature=0)
        hit = await c.complete(MSG, max_tokens=5, temperature=0)
    a = attribute(hit.record)
    assert hit.record.cache_hit and a.flags == ["cache_hit"] and a.reporter == "cache"
    assert a.shares()["client"] == 1.0


# -- peers: what other servers report, or don't --------------------------------------------------------------
def _sse(*events: dict[str, Any], head: bytes = P.SSE_HEAD, before_first: float = 0.0,
         between: float = 0.0) -> list[P.Step]:
    steps: list[P.Step] = [head, P.event(P.delta("", role="assistant"))]
    if before_first:
        steps.append(P.Pause(before_first))
    for i, e in enumerate(events):
        if i and between:
            steps.append(P.Pause(between))
        steps.append(P.event(e))
    return [*steps, P.DONE, P.END]


def _final(**extra: Any) -> dict[str, Any]:
    return {**P.delta("!", finish_reason="stop"), **extra}


async def test_a_server_that_reports_nothing_gets_network_and_server_merged(
    peer: Callable[..., P.Peer], tmp_path: Path
) -> None:
    p = peer(_sse(P.delta("Hello"), P.delta(" there"), _final(), before_first=0.1, between=0.02))
    async with _client(p.base_url, tmp_path, http2=False, model="peer-model") as client:
        r = await _stream(client)
    a = attribute(r)
    assert a.reporter == "" and not any(part.group == "server" for part in a.parts)
    merged = a.part("network_server")
    assert merged is not None and merged.name == "network + server (not reported)"
    assert merged.ms >= 95  # the peer's pause is in there, unsplit: no guess at whose it was
    assert a.shares()["network+server"] > 0.5
    _check_sum(a)


LLAMA_TIMINGS = {"prompt_n": 12, "prompt_ms": 118.0, "prompt_per_token_ms": 9.8, "predicted_n": 3,
                 "predicted_ms": 60.0, "predicted_per_token_ms": 20.0, "predicted_per_second": 50.0}


async def test_llama_cpp_timings_give_prefill_and_generation(
    peer: Callable[..., P.Peer], tmp_path: Path
) -> None:
    p = peer(_sse(P.delta("Hello"), P.delta(" there"), _final(timings=LLAMA_TIMINGS), before_first=0.12,
                  between=0.03))
    async with _client(p.base_url, tmp_path, http2=False, model="peer-model") as client:
        r = await _stream(client)
    a = attribute(r)
    assert a.reporter == "llama.cpp"
    assert a.ms("server_prefill") == 118.0 and a.ms("server_generation") == 60.0
    assert a.part("server_queue") is None
    assert 0 <= a.ms("network_first_token") < 50  # the peer's 120 ms pause is what it reported as prefill
    _check_sum(a)


async def test_openai_processing_header_is_the_server_share_of_time_to_headers(
    peer: Callable[..., P.Peer], tmp_path: Path
) -> None:
    head = P.SSE_HEAD.replace(b"Cache-Control", b"openai-processing-ms: 80\r\nCache-Control")
    p = peer([P.Pause(0.08), *_sse(P.delta("Hi"), _final(), head=head)])
    async with _client(p.base_url, tmp_path, http2=False, model="peer-model") as client:
        r = await _stream(client)
    a = attribute(r)
    assert a.reporter == "openai-processing-ms" and a.ms("server_processing") == 80.0
    assert 0 <= a.ms("network_first_token") < 50
    _check_sum(a)


async def test_openai_processing_header_on_a_whole_reply(peer: Callable[..., P.Peer], tmp_path: Path) -> None:
    whole = P.json_response(200, P.completion("hi"), headers={"openai-processing-ms": "80"})
    p = peer([P.Pause(0.08), whole])
    async with _client(p.base_url, tmp_path, http2=False, model="peer-model") as client:
        reply = await asyncio.wait_for(client.complete(MSG), WAIT_S)
    a = attribute(reply.record)
    assert a.ms("server_processing") == 80.0 and 0 <= a.ms("network_reply") < 50
    _check_sum(a)


@pytest.mark.parametrize(
    ("extra", "note"),
    [
        ({"server_timing": {"received_ns": "soon", "first_token_ns": -5, "last_token_ns": 3}}, "received_ns"),
        ({"server_timing": {"received_ns": 10, "first_token_ns": 500, "last_token_ns": 20}}, "out of order"),
        ({"server_timing": {"first_token_ns": 1}}, "received_ns is missing"),
        ({"server_timing": "yesterday"}, None),
        ({"timings": {"prompt_ms": "fast", "predicted_ms": -1}}, "llama.cpp timings"),
        ({"timings": {"prompt_ms": 1e300}}, "prompt_ms ignored"),
        ({"timings": [1, 2]}, None),
    ],
)
async def test_malformed_server_reports_never_break_a_request(
    peer: Callable[..., P.Peer], tmp_path: Path, extra: dict[str, Any], note: str | None
) -> None:
    p = peer(_sse(P.delta("Hello"), _final(**extra)))
    head = P.SSE_HEAD.replace(b"Cache-Control", b"openai-processing-ms: soon\r\nCache-Control")
    p2 = peer(_sse(P.delta("Hello"), _final(**extra), head=head))
    for base_url in (p.base_url, p2.base_url):
        async with _client(base_url, tmp_path, http2=False, model="peer-model") as client:
            text, record = await _stream_text(client)
        a = attribute(record)
        assert text == "Hello!" and record.error is None
        assert a.reporter == "" and a.part("network_server") is not None
        if note is not None:
            assert any(note in n for n in a.notes), a.notes
        _check_sum(a)


# -- llmchat ask ---------------------------------------------------------------------------------------------
def test_ask_json_carries_the_attribution_and_stats_the_split(
    server_factory: Factory, capsys: pytest.CaptureFixture[str]
) -> None:
    srv = server_factory(ttft_ms=50)
    status = main(["ask", "hello", "--json", "--stats", "--base-url", srv.base_url, "--model", MODEL,
                   "--max-tokens", "8"])
    captured = capsys.readouterr()
    assert status == 0
    obj = json.loads(captured.out)
    attribution = obj["attribution"]
    assert attribution["reporter"] == "llmchat serve" and attribution["total_ms"] == obj["total_ms"]
    parts = {p["key"]: p for p in attribution["parts"]}
    assert _near(parts["server_prefill"]["ms"], 50)
    assert parts["server_prefill"]["source"] == "reported" and parts["decode"]["source"] == "measured"
    assert abs(sum(p["ms"] for p in attribution["parts"]) - attribution["total_ms"]) < 0.01
    split = captured.err.strip().splitlines()[-2]
    assert split.startswith("llmchat: ") and "server" in split and "%" in split
