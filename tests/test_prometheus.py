"""Prometheus metrics: real requests against the local server, scraped over HTTP on 127.0.0.1 and parsed."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import peers as P
import pytest
from processes import reap
from prometheus_client.parser import text_string_to_metric_families

from llmchat.core import (
    Bus,
    CacheSettings,
    ChatClient,
    LLMChatError,
    NotFoundError,
    RetrySettings,
    ServerError,
    Settings,
    StreamCutError,
    TimingRecord,
    UsageError,
    Warmer,
)
from llmchat.core.observe._attribution import attribute
from llmchat.core.observe._prometheus import LATENCY_BUCKETS, PART_BUCKETS, MetricsServer, start_exporter
from llmchat.core.server import RunningServer, resolve_settings, start_in_thread
from llmchat.core.server._metrics import ServerMetrics, _TokenCounter, route_of

MODEL = "llmchat-local"
WAIT_S = 10.0
REPO = Path(__file__).resolve().parent.parent
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    """Every sample at ``url``, keyed by (sample name, labels)."""
    text = httpx.get(url, timeout=WAIT_S).text
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name`` over the samples whose labels include ``labels`` (0 if none)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def _settings(tmp_path: Path, **retry: int) -> Settings:
    return Settings(cache=CacheSettings(path=str(tmp_path / "cache")), retry=RetrySettings(**retry))


async def _drain(client: ChatClient, **params: Any) -> TimingRecord:
    stream = client.stream([{"role": "user", "content": "metrics"}], **params)
    async for _ in stream:
        pass
    return stream.record


# --- the client's exporter ---------------------------------------------------------------------------------


async def test_requests_end_up_as_counts_and_histograms_that_match_their_records(
    local_server: RunningServer, server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    bus = Bus()
    with start_exporter(bus, 0) as exporter:
        assert exporter.port > 0 and exporter.url == f"http://127.0.0.1:{exporter.port}/metrics"
        records: list[TimingRecord] = []
        async with ChatClient(_settings(tmp_path), base_url=local_server.base_url, model=MODEL, http2="h2c",
                              bus=bus) as client:
            for n in (5, 40, 200):
                records.append(await _drain(client, max_tokens=n))
            first = await client.complete([{"role": "user", "content": "c"}], max_tokens=9, temperature=0)
            again = await client.complete([{"role": "user", "content": "c"}], max_tokens=9, temperature=0)
            assert not first.record.cache_hit and again.record.cache_hit
            await client.complete([{"role": "user", "content": "d"}], max_tokens=9, temperature=0.7)
            await client.embed(["a", "b"])
            with pytest.raises(NotFoundError):
                await client.complete([{"role": "user", "content": "x"}], model="no-such-model")
        samples = scrape(exporter.url)

    requests = "llmchat_requests_total"
    assert value(samples, requests, mode="stream", outcome="ok") == 3
    assert value(samples, requests, mode="batch", outcome="ok") == 3
    assert value(samples, requests, mode="embed", outcome="ok") == 1
    assert value(samples, requests, mode="batch", outcome="error", model="no-such-model") == 1
    assert value(samples, "llmchat_request_errors_total", kind="http_404") == 1
    # Asked twice with temperature 0 (a miss, then a hit); temperature 0.7 is not the cache's business.
    assert value(samples, "llmchat_cache_requests_total", mode="batch", result="miss") == 1
    assert value(samples, "llmchat_cache_requests_total", mode="batch", result="hit") == 1
    assert value(samples, "llmchat_cache_requests_total", mode="embed", result="miss") == 1
    assert value(samples, "llmchat_output_tokens_total", mode="stream") == 5 + 40 + 200
    assert value(samples, "llmchat_requests_in_flight") == 0

    # The TTFT histogram holds exactly the three streams: its count, its sum and every bucket.
    ttft = [r.ttft_ms / 1000 for r in records if r.ttft_ms is not None]
    assert len(ttft) == 3
    name = "llmchat_request_ttft_seconds"
    assert value(samples, name + "_count", mode="stream") == 3
    assert value(samples, name + "_sum", mode="stream") == pytest.approx(sum(ttft), rel=1e-9)
    for le in LATENCY_BUCKETS:
        assert value(samples, name + "_bucket", mode="stream", le=repr(le)) == sum(t <= le for t in ttft)
    assert value(samples, name + "_bucket", mode="stream", le="+Inf") == 3
    # Batch replies from the network are in the duration and TTFB histograms; the cache hit is not.
    assert value(samples, "llmchat_request_duration_seconds_count", mode="batch") == 2
    assert value(samples, "llmchat_request_ttfb_seconds_count", mode="batch") == 2
    assert value(samples, "llmchat_request_ttft_seconds_count", mode="batch") == 0
    # tokens/s needs the first and last token in different reads (an instant reply may come in one).
    decoded = sum(r.tokens_per_s is not None for r in records)
    assert value(samples, "llmchat_output_tokens_per_second_count", mode="stream") == decoded


async def test_retries_by_reason_and_errors_by_class(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    server = server_factory(profile="instant", error_rate=1.0)
    bus = Bus()
    with start_exporter(bus, 0) as exporter:
        settings = _settings(tmp_path, max_attempts=3)
        async with ChatClient(settings, base_url=server.base_url, model=MODEL, bus=bus, use_cache=False,
                              retry=RetrySettings(max_attempts=3, base_delay_s=0.001, max_delay_s=0.01)) as c:
            with pytest.raises(ServerError) as caught:
                await c.complete([{"role": "user", "content": "x"}])
        samples = scrape(exporter.url)
    record = caught.value.record
    assert isinstance(record, TimingRecord)
    reasons = [r.reason for r in record.retries]
    assert len(reasons) == 2
    for reason in set(reasons):
        assert value(samples, "llmchat_retries_total", reason=reason) == reasons.count(reason)
    assert value(samples, "llmchat_retries_total") == 2
    assert value(samples, "llmchat_request_errors_total", kind=record.error_kind or "") == 1
    assert record.error_kind is not None and record.error_kind.startswith("http_5")
    assert value(samples, "llmchat_request_duration_seconds_count") == 0  # failures are counted, not charted


async def test_headroom_gauges_per_provider_and_the_limiters_holds(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    from llmchat.core.policy import RateLimits

    server = server_factory(profile="instant", rate_limit=3, rate_limit_tokens=5000, rate_limit_window_s=0.6)
    bus = Bus()
    with start_exporter(bus, 0) as exporter:
        async with ChatClient(_settings(tmp_path), base_url=server.base_url, model=MODEL, bus=bus,
                              use_cache=False, limits=RateLimits()) as c:
            records = [await _drain(c, max_tokens=2) for _ in range(5)]
        samples = scrape(exporter.url)
    last = records[-1].headroom
    assert last is not None and last.remaining_requests is not None and last.remaining_tokens is not None
    assert value(samples, "llmchat_ratelimit_limit", provider="custom", kind="requests") == 3
    assert value(samples, "llmchat_ratelimit_limit", provider="custom", kind="tokens") == 5000
    assert value(samples, "llmchat_ratelimit_remaining", kind="requests") == last.remaining_requests
    assert value(samples, "llmchat_ratelimit_remaining", kind="tokens") == last.remaining_tokens
    assert 0 < value(samples, "llmchat_ratelimit_reset_seconds", kind="requests") <= 0.6
    held = [r for r in records if r.limit_wait_ns]
    assert held and value(samples, "llmchat_rate_limit_holds_total", provider="custom") >= len(held)
    assert value(samples, "llmchat_rate_limit_hold_seconds_total") > 0
    assert value(samples, "llmchat_request_part_seconds_count", part="rate_limit", group="limit") == len(held)


async def test_in_flight_counts_a_stream_while_it_runs_and_cancels_are_not_errors(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    server = server_factory(profile="instant", tokens_per_s=50)
    bus = Bus()
    with start_exporter(bus, 0) as exporter:
        async with ChatClient(_settings(tmp_path), base_url=server.base_url, model=MODEL, bus=bus) as client:
            stream = client.stream([{"role": "user", "content": "slow"}], max_tokens=500)
            async with asyncio.timeout(WAIT_S):
                async for _ in stream:
                    break  # the first token is in; the rest would take 10 s
            during = await asyncio.to_thread(scrape, exporter.url)
            await stream.aclose()
        after = scrape(exporter.url)
    assert value(during, "llmchat_requests_in_flight", mode="stream") == 1
    assert value(after, "llmchat_requests_in_flight", mode="stream") == 0
    assert value(after, "llmchat_requests_total", outcome="cancelled") == 1
    assert value(after, "llmchat_request_errors_total") == 0


async def test_a_cut_stream_is_an_error_of_its_class(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    server = server_factory(profile="instant", drop_rate=1.0)
    bus = Bus()
    with start_exporter(bus, 0) as exporter:
        async with ChatClient(_settings(tmp_path), base_url=server.base_url, model=MODEL, bus=bus) as client:
            with pytest.raises(StreamCutError):
                await _drain(client, max_tokens=100)
        samples = scrape(exporter.url)
    assert value(samples, "llmchat_request_errors_total", kind="stream_cut", mode="stream") == 1
    assert value(samples, "llmchat_requests_total", outcome="error") == 1


async def test_warmup_state_is_one_state_at_a_time(local_server: RunningServer, tmp_path: Path) -> None:
    bus = Bus()
    with start_exporter(bus, 0) as exporter:
        async with ChatClient(_settings(tmp_path), provider="local", base_url=local_server.base_url,
                              bus=bus) as client:
            warmer = Warmer(client, ping_s=0)
            assert await warmer.warm()
            await warmer.aclose()
        samples = scrape(exporter.url)
    states = {s: value(samples, "llmchat_warmup_state", provider="local", state=s)
              for s in ("cold", "warming", "warm", "failed")}
    assert states == {"cold": 0, "warming": 0, "warm": 1, "failed": 0}
    assert warmer.rtt_ms is not None
    rtt = value(samples, "llmchat_warmup_rtt_seconds", provider="local")
    assert rtt == pytest.approx(warmer.rtt_ms / 1000)
    # What opening the connection cost is a gauge of its own, never mixed into the ping.
    assert warmer.setup_ms is not None
    setup = value(samples, "llmchat_warmup_setup_seconds", provider="local")
    assert setup == pytest.approx(warmer.setup_ms / 1000)


async def test_a_reply_clears_a_failed_warmup_so_the_unreachable_alert_stays_quiet(
    peer: Callable[..., P.Peer], tmp_path: Path
) -> None:
    # A gateway that fails GET /models (warm-up's ping) while chat completions succeed: the provider is
    # reachable, and LLMChatProviderUnreachable (llmchat_warmup_state{state="failed"} == 1) must not fire.
    p = peer([P.NGINX_502], later=[P.json_response(200, P.completion("hi"))], then="keep")
    bus = Bus()
    with start_exporter(bus, 0) as exporter:
        async with ChatClient(_settings(tmp_path), base_url=p.base_url, http2=False, model=MODEL,
                              bus=bus) as client:
            warmer = Warmer(client, ping_s=0)
            assert await warmer.warm() is False
            failed = scrape(exporter.url)
            await client.complete([{"role": "user", "content": "hi"}], max_tokens=3)
            await warmer.aclose()
        after = scrape(exporter.url)
    name = client.endpoint.name
    assert value(failed, "llmchat_warmup_state", provider=name, state="failed") == 1
    assert value(after, "llmchat_warmup_state", provider=name, state="failed") == 0
    assert value(after, "llmchat_warmup_state", provider=name, state="warm") == 1


def test_two_exporters_keep_their_own_counts() -> None:
    a_bus, b_bus = Bus(), Bus()
    with start_exporter(a_bus, 0) as a, start_exporter(b_bus, 0) as b:
        assert a.port != b.port
        from llmchat.core import RequestDone, RequestStarted

        record = TimingRecord(mode="batch", provider="p", model="m")
        record.end_ns = record.t0_ns + 5_000_000
        a_bus.publish(RequestStarted(record))
        a_bus.publish(RequestDone(record))
        assert value(scrape(a.url), "llmchat_requests_total", provider="p") == 1
        assert value(scrape(b.url), "llmchat_requests_total") == 0


def test_model_labels_are_capped() -> None:
    from llmchat.core import RequestDone
    from llmchat.core.observe._prometheus import ClientMetrics

    metrics = ClientMetrics(max_models=2)
    bus = Bus()
    metrics.subscribe(bus)
    for i in range(5):
        bus.publish(RequestDone(TimingRecord(mode="batch", provider="p", model=f"m{i}")))
    models = {s.labels["model"] for fam in metrics.registry.collect() if fam.name == "llmchat_requests"
              for s in fam.samples}
    assert models == {"m0", "m1", "other"}


def test_without_prometheus_client_the_flag_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # makes the import fail, as if missing
    with pytest.raises(UsageError) as caught:
        start_exporter(Bus(), 0)
    assert str(caught.value) == '--metrics-port needs prometheus_client: pip install "llmchat[metrics]"'


def test_a_port_in_use_or_out_of_range_is_one_line() -> None:
    from llmchat.core.observe._prometheus import ClientMetrics

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        expected = rf"^--metrics-port: cannot listen on 127.0.0.1:{port}: .*; pick another port"
        with pytest.raises(LLMChatError, match=expected):
            MetricsServer(ClientMetrics().registry, port)
    with pytest.raises(UsageError, match="from 0 to 65535"):
        MetricsServer(ClientMetrics().registry, 70000)


# --- the server's metrics ---------------------------------------------------------------------------------


async def test_server_counts_routes_statuses_and_the_tokens_it_sent(tmp_path: Path) -> None:
    metrics = ServerMetrics()
    exposed = MetricsServer(metrics.registry, 0)
    server = start_in_thread(resolve_settings({"port": 0, "profile": "instant"}), metrics=metrics)
    cut = start_in_thread(resolve_settings({"port": 0, "profile": "instant", "drop_rate": 1.0}),
                          metrics=metrics)
    try:
        async with ChatClient(_settings(tmp_path), base_url=server.base_url, model=MODEL, http2="h2c",
                              use_cache=False) as client:
            await _drain(client, max_tokens=37)
            await client.complete([{"role": "user", "content": "w"}], max_tokens=11)
            assert await client.models()
        async with ChatClient(_settings(tmp_path), base_url=cut.base_url, model=MODEL, http2=False,
                              use_cache=False) as client:
            stream = client.stream([{"role": "user", "content": "cut"}], max_tokens=300)
            with pytest.raises(StreamCutError):
                async for _ in stream:
                    pass
            got = stream.record.content_chunks
        async with httpx.AsyncClient(timeout=WAIT_S) as raw:
            assert (await raw.get(server.url + "/v1/models/nope")).status_code == 404
            assert (await raw.get(server.url + "/nowhere")).status_code == 404
        samples = await asyncio.to_thread(scrape, exposed.url)
    finally:
        server.close()
        cut.close()
        exposed.close()
    chat = "/v1/chat/completions"
    assert value(samples, "llmchat_server_requests_total", route=chat, method="POST", status="200") == 3
    assert value(samples, "llmchat_server_requests_total", route="/v1/models", status="200") == 1
    assert value(samples, "llmchat_server_requests_total", route="/v1/models/{id}", status="404") == 1
    assert value(samples, "llmchat_server_requests_total", route="other", status="404") == 1
    assert 0 < got < 300
    assert value(samples, "llmchat_server_tokens_sent_total", model=MODEL) == 37 + 11 + got
    assert value(samples, "llmchat_server_requests_in_flight") == 0
    assert value(samples, "llmchat_server_request_duration_seconds_count", route=chat) == 3


def test_token_counting_survives_any_cut_between_sends() -> None:
    events = (
        b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null}}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{"content":"\\"lo"},"finish_reason":null}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{"content":"!"},"finish_reason":"stop"}]}\n\n'
        b'data: {"choices":[],"usage":{"completion_tokens":3}}\n\ndata: [DONE]\n\n'
    )
    for cut in range(len(events) + 1):
        for second in range(cut, len(events) + 1, 7):
            counter = _TokenCounter()
            counter.start([(b"content-type", b"text/event-stream; charset=utf-8")])
            for part in (events[:cut], events[cut:second], events[second:]):
                counter.feed(part)
            assert counter.tokens == 3, (cut, second)
    empty = _TokenCounter()
    empty.start([(b"content-type", b"text/event-stream")])
    empty.feed(b'data: {"choices":[{"delta":{"content":""},"finish_reason":"stop"}]}\n\n')
    assert empty.tokens == 0


def test_route_labels_are_bounded() -> None:
    assert route_of("/v1/chat/completions/") == "/v1/chat/completions"
    assert route_of("/v1/models/abc") == "/v1/models/{id}" and route_of("/metrics") == "/metrics"
    assert route_of("/v1/anything/else") == "other" and route_of("/") == "other"


def test_serve_metrics_port_prints_the_url_before_the_ready_line_and_serves_it() -> None:
    command = [sys.executable, "-m", "llmchat.tui", "serve", "--port", "0", "--profile", "instant",
               "--metrics-port", "0"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert process.stdout is not None
        first = process.stdout.readline().strip()  # bounded: printed, or EOF when the child dies
        ready = process.stdout.readline().strip()
        found = re.fullmatch(r"llmchat server metrics on (http://127\.0\.0\.1:\d+/metrics)", first)
        assert found, first
        base = re.fullmatch(r"llmchat server listening on (http://\S+) \(.*\)", ready)
        assert base, ready
        assert httpx.get(base[1] + "/v1/models", timeout=WAIT_S).status_code == 200
        samples = scrape(found[1])
        assert value(samples, "llmchat_server_requests_total", route="/v1/models", status="200") == 1
        process.terminate()
        assert process.wait(WAIT_S) == 0
        assert process.stderr is not None and process.stderr.read() == ""
    finally:
        reap(process, WAIT_S)


# --- the example alert rules -------------------------------------------------------------------------------


def test_every_metric_the_alert_rules_use_is_exported(local_server: RunningServer) -> None:
    """No YAML parser is needed: the rules are checked line by line, and every llmchat_ name they query must
    be a sample name the exporters produce (promtool check rules validates the PromQL itself)."""
    text = (REPO / "deploy" / "prometheus" / "alerts.yml").read_text(encoding="utf-8")
    alerts = re.findall(r"^\s+- alert: (\w+)$", text, flags=re.M)
    assert {"LLMChatHighP99TTFT", "LLMChatErrorRatio", "LLMChatRetryStorm"} <= set(alerts)
    rules = re.split(r"^\s+- alert: ", text, flags=re.M)[1:]
    for rule in rules:
        for key in ("expr:", "for:", "severity:", "summary:", "description:"):
            assert key in rule, (rule.splitlines()[0], key)
    queried = set(re.findall(r"\b(llmchat_[a-z_]+)\b", "\n".join(
        line for line in text.splitlines() if not line.lstrip().startswith(("#", "summary:", "description:"))
    )))
    from llmchat.core.observe._prometheus import ClientMetrics

    exposed = set()
    for registry in (ClientMetrics().registry, ServerMetrics().registry):
        for family in registry.collect():
            exposed |= {family.name + suffix for suffix in ("", "_total", "_bucket", "_count", "_sum")}
    assert queried and queried <= exposed, queried - exposed


# --- llmchat bench --metrics-port ---------------------------------------------------------------------------


async def test_a_load_run_with_a_shared_bus_exports_every_configuration(local_server: RunningServer) -> None:
    from llmchat.core.load._run import LoadRun, Scenario, Target

    bus = Bus()
    with start_exporter(bus, 0) as exporter:
        target = Target(base_url=local_server.base_url, http2="h2c", model=MODEL, bus=bus)
        load = LoadRun(Scenario(users=2, requests=4, max_tokens=8), ["h2", "h1"], target)
        await load.run()
        samples = await asyncio.to_thread(scrape, exporter.url)
    assert value(samples, "llmchat_requests_total", outcome="ok", mode="stream") == 8
    assert value(samples, "llmchat_request_ttft_seconds_count") == 8
    assert value(samples, "llmchat_requests_in_flight") == 0


def test_bench_metrics_port_announces_where_and_runs(
    local_server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    from llmchat.tui.cli import main

    code = main(["bench", "--quiet", "--base-url", local_server.base_url, "--model", MODEL, "--requests", "3",
                 "--users", "1", "--max-tokens", "4", "--metrics-port", "0"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert re.search(r"^llmchat: metrics on http://127\.0\.0\.1:\d+/metrics$", err, flags=re.M), err


# --- where the time went: the attribution parts as histograms ---------------------------------------------


async def test_each_part_of_each_reply_is_observed_in_its_histogram(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    # One slot: two streams at once, and the second waits in the server's queue (saturation).
    server = server_factory(profile="instant", ttft_ms=60.0, max_concurrency=1)
    bus = Bus()
    with start_exporter(bus, 0) as exporter:
        async with ChatClient(_settings(tmp_path), base_url=server.base_url, model=MODEL, http2="h2c",
                              bus=bus) as client:
            replies = [await _drain(client, max_tokens=8) for _ in range(2)]
            async with asyncio.timeout(WAIT_S):
                replies += await asyncio.gather(_drain(client, max_tokens=8), _drain(client, max_tokens=8))
            first = await client.complete([{"role": "user", "content": "c"}], max_tokens=4, temperature=0)
            hit = await client.complete([{"role": "user", "content": "c"}], max_tokens=4, temperature=0)
            with pytest.raises(NotFoundError) as caught:
                await client.complete([{"role": "user", "content": "x"}], model="no-such-model")
        samples = await asyncio.to_thread(scrape, exporter.url)
    replies.append(first.record)
    assert hit.record.cache_hit and isinstance(caught.value.record, TimingRecord)
    # Expected: every part of every reply from the network; the cache hit and the failure are left out.
    expected: dict[str, list[float]] = {}
    groups: dict[str, str] = {}
    for record in replies:
        for part in attribute(record).parts:
            expected.setdefault(part.key, []).append(max(0.0, part.ms) / 1000)
            groups[part.key] = part.group
    assert {"server_prefill", "server_generation", "network_first_token", "decode"} <= set(expected)
    name = "llmchat_request_part_seconds"
    seen = {dict(labels)["part"] for (n, labels), _ in samples.items() if n == name + "_count"}
    assert seen == set(expected)  # the cache hit's "cache" part is not among them
    for key, values in expected.items():
        assert value(samples, name + "_count", part=key, group=groups[key], model=MODEL) == len(values)
        assert value(samples, name + "_sum", part=key) == pytest.approx(sum(values), rel=1e-9, abs=1e-12)
    prefill = expected["server_prefill"]
    for le in PART_BUCKETS:
        in_bucket = sum(v <= le for v in prefill)
        assert value(samples, name + "_bucket", part="server_prefill", le=repr(le)) == in_bucket
    # Flags count every finished request: the queued stream is saturated, the hit is a hit.
    flags = [f for r in [*replies, hit.record, caught.value.record] for f in attribute(r).flags]
    assert flags.count("saturation") >= 1 and flags.count("cache_hit") == 1
    for flag in ("saturation", "cache_hit"):
        assert value(samples, "llmchat_request_flags_total", flag=flag) == flags.count(flag)


def test_a_negative_unexplained_part_is_observed_as_zero() -> None:
    from llmchat.core import Phases, RequestDone, RequestStarted
    from llmchat.core.observe._prometheus import ClientMetrics

    metrics = ClientMetrics()
    bus = Bus()
    metrics.subscribe(bus)
    ms = 1_000_000
    record = TimingRecord(mode="batch", provider="p", model="m", t0_ns=10**12)
    record.phases = Phases(start_ns=10**12, send_start_ns=10**12 + ms, send_end_ns=10**12 + 2 * ms,
                           headers_ns=10**12 + 50 * ms)
    record.end_ns = 10**12 + 60 * ms
    record.server_processing_ms = 70.0  # 12 ms more than the 58 ms from the send's end to the reply's end
    assert attribute(record).ms("unexplained") == pytest.approx(-12.0)
    bus.publish(RequestStarted(record))
    bus.publish(RequestDone(record))
    parts = {s.labels["part"]: s.value for fam in metrics.registry.collect()
             if fam.name == "llmchat_request_part_seconds" for s in fam.samples if s.name.endswith("_sum")}
    counts = {s.labels["part"]: s.value for fam in metrics.registry.collect()
              if fam.name == "llmchat_request_part_seconds" for s in fam.samples if s.name.endswith("_count")}
    assert counts["unexplained"] == 1 and parts["unexplained"] == 0.0
    assert parts["server_processing"] == pytest.approx(0.070)
