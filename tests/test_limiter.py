"""Rate-limit headroom and the client-side limiter: the header parser, the buckets on a fake clock, and a
batch against ``llmchat serve --rate-limit N`` that finishes without one 429 where the retry path takes many."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from llmchat.core.client import ChatClient
from llmchat.core.config import BatchSettings, CacheSettings, ProviderSettings, RetrySettings, Settings
from llmchat.core.http import parse_reset, read_headroom
from llmchat.core.load import read_jobs, run_jobs
from llmchat.core.observe import Headroom, RateLimitHeld, RequestDone, TimingRecord, attribute
from llmchat.core.policy import ProviderLimiter, RateLimits, request_charge
from llmchat.core.policy._limiter import NEAR_S
from llmchat.core.server._start import RunningServer

Factory = Callable[..., RunningServer]
MODEL = "llmchat-local"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("6m0s", 360.0), ("1.5s", 1.5), ("20ms", 0.02), ("1h2m3.5s", 3723.5), ("0s", 0.0), ("2", 2.0),
     ("59.999s", 59.999), ("250us", 0.00025)],
)
def test_reset_durations_parse_as_openai_writes_them(text: str, seconds: float) -> None:
    assert parse_reset(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", [None, "", "soon", "5x", "s", "-1", "1s junk", "nan"])
def test_unreadable_resets_are_none(text: str | None) -> None:
    assert parse_reset(text) is None


def test_headroom_reads_requests_and_tokens_and_ignores_junk() -> None:
    got = read_headroom({
        "x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-reset-requests": "1s", "x-ratelimit-limit-tokens": "150000",
        "x-ratelimit-remaining-tokens": "149984", "x-ratelimit-reset-tokens": "6ms",
    })
    assert got == Headroom(60, 59, 1.0, 150000, 149984, 0.006)
    assert read_headroom({"content-type": "application/json"}) is None
    half = read_headroom({"x-ratelimit-remaining-requests": "many", "x-ratelimit-limit-requests": "10"})
    assert half is not None and half.limit_requests == 10 and half.remaining_requests is None


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_configured_bucket_holds_past_its_burst_then_paces() -> None:
    clock = Clock()
    limiter = ProviderLimiter("p", rpm=60, clock=clock)  # one a second, a burst of 60
    waits = [limiter.reserve().wait_s for _ in range(62)]
    # The last of the burst waits for the cushion (NEAR_S of refill), then one a second, queued in order.
    assert waits[:59] == [0.0] * 59
    assert waits[59:] == pytest.approx([NEAR_S, 1 + NEAR_S, 2 + NEAR_S])
    assert limiter.holds == 3
    clock.now += 10.0
    assert limiter.reserve().wait_s == 0.0  # refilled


def test_an_unknown_limit_never_holds_until_the_headers_tell_one() -> None:
    clock = Clock()
    limiter = ProviderLimiter("p", clock=clock)
    first = limiter.reserve()
    assert first.wait_s == 0.0 and not limiter.active
    # The provider: 10, refilled 5 a second (reset = time to full), 9 left after this request; 3 more were
    # sent since, which it may not have counted yet.
    sent = [limiter.reserve() for _ in range(3)]
    limiter.observe(first, Headroom(limit_requests=10, remaining_requests=9, reset_requests_s=0.2))
    assert limiter.active and limiter.requests.capacity == 10
    assert limiter.requests.level == pytest.approx(6.0)
    assert limiter.requests.rate == pytest.approx(5.0)  # (10 - 9) / 0.2 s
    waits = [limiter.reserve().wait_s for _ in range(7)]
    assert waits[:5] == [0.0] * 5 and waits[5:] == pytest.approx([NEAR_S, 0.2 + NEAR_S])
    # A reply that says the provider has less than this process thought lowers the level...
    limiter.observe(sent[2], Headroom(limit_requests=10, remaining_requests=3, reset_requests_s=1.4))
    level = limiter.requests.level
    assert level == pytest.approx(3 - 7)  # seven reserved after that request
    # ...and a reply to an older request than one already counted is stale and changes nothing.
    limiter.observe(sent[0], Headroom(limit_requests=10, remaining_requests=10, reset_requests_s=0.0))
    assert limiter.requests.level == level


def test_a_clean_reading_brings_the_level_back_up_one_request_short_of_it() -> None:
    clock = Clock()
    limiter = ProviderLimiter("p", rpm=60, clock=clock)
    for _ in range(60):
        limiter.reserve()
    paced = limiter.reserve()  # alone: nothing else goes out within NEAR_S of it
    clock.now = paced._sent_at
    paced = limiter.sent(paced)
    assert limiter.requests.level == pytest.approx(-1.0)
    # The provider had more left than that (say another key's traffic stopped counting against it).
    limiter.observe(paced, Headroom(limit_requests=60, remaining_requests=20, reset_requests_s=40.0))
    assert limiter.requests.level == pytest.approx(19.0)
    noisy = [limiter.reserve() for _ in range(2)]  # sent together: their readings may be off either way
    limiter.observe(noisy[0], Headroom(limit_requests=60, remaining_requests=50, reset_requests_s=10.0))
    assert limiter.requests.level == pytest.approx(17.0)  # not raised


def test_tokens_are_a_bucket_of_their_own_and_a_429_blocks_for_retry_after() -> None:
    clock = Clock()
    limiter = ProviderLimiter("p", tpm=600, clock=clock)  # 10 tokens a second
    assert limiter.reserve(500).wait_s == 0.0
    held = limiter.reserve(200)
    assert held.reason == "tokens" and held.wait_s == pytest.approx(10.0 + NEAR_S)
    assert held.describe() == f"client rate limit {held.wait_s:.1f} s (tokens)"
    other = ProviderLimiter("q", clock=clock)
    other.throttled({"retry-after-ms": "1500"})
    blocked = other.reserve()
    assert blocked.reason == "429" and blocked.wait_s == pytest.approx(1.5)
    assert request_charge(b"x" * 40, 16) == 26


def test_a_hold_is_its_own_part_and_never_in_ttfb() -> None:
    r = TimingRecord(mode="batch")
    t0 = r.t0_ns
    r.limit_wait_ns = 1_200_000_000
    r.phases.start_ns = t0 + 1_200_000_000
    r.phases.send_start_ns = r.phases.send_end_ns = t0 + 1_201_000_000
    r.phases.headers_ns = t0 + 1_300_000_000
    r.end_ns = t0 + 1_400_000_000
    assert r.ttfb_ms == pytest.approx(100.0) and r.total_ms == pytest.approx(1400.0)
    a = attribute(r)
    assert a.ms("rate_limit") == pytest.approx(1200.0)
    assert a.part("rate_limit") is not None and a.part("rate_limit").name == "client rate limit"  # type: ignore[union-attr]
    assert a.group_ms()["limit"] == pytest.approx(1200.0)
    assert sum(p.ms for p in a.parts) == pytest.approx(a.total_ms)
    assert r.summary()["rate_limit_wait_ms"] == pytest.approx(1200.0)


async def _batch(server: RunningServer, tmp_path: Path, n: int, *, limits: RateLimits | None,
                 max_tokens: int = 4) -> tuple[list[TimingRecord], list[Any], Any]:
    settings = Settings(cache=CacheSettings(policy="off", path=str(tmp_path / "cache")),
                        batch=BatchSettings(max_size=10, window_ms=1.0, concurrency=8))
    # Today's retry path as it stands, with waits short enough for a test: the server's Retry-After is kept.
    retry = RetrySettings(max_attempts=8, base_delay_s=0.05, max_delay_s=5.0, total_budget_s=30.0)
    jobs, bad = read_jobs([f'{{"id": {i}, "prompt": "line {i}", "max_tokens": {max_tokens}}}' for i in range(n)])
    assert not bad
    records: list[TimingRecord] = []
    held: list[Any] = []
    async with ChatClient(settings, base_url=server.base_url, model=MODEL, http2="h2c", retry=retry,
                          limits=limits) as client:
        client.bus.subscribe(RequestDone, lambda e: records.append(e.record))
        client.bus.subscribe(RateLimitHeld, lambda e: held.append(e.hold))
        summary = await run_jobs(client, jobs, io.StringIO())
    return records, held, summary


async def test_the_limiter_finishes_a_batch_of_four_times_the_limit_without_a_429(
    server_factory: Factory, tmp_path: Path
) -> None:
    # 10 requests per 0.5 s: a batch of 40 needs 1.5 s of refills at least, however it is sent.
    server = server_factory(profile="instant", rate_limit=10, rate_limit_window_s=0.5)
    records, held, summary = await _batch(server, tmp_path, 40, limits=RateLimits())
    assert summary.ok == 40 and summary.failed == 0
    statuses = [e.status for r in records for e in r.retries]
    assert 429 not in statuses
    assert held and all(h.reason in ("requests", "429") for h in held)
    waited = [r for r in records if r.limit_wait_ns > 0]
    assert waited, "no request was held back"
    assert all(r.headroom is not None and r.headroom.limit_requests == 10 for r in records)
    slow = max(waited, key=lambda r: r.limit_wait_ns)
    assert attribute(slow).ms("rate_limit") == pytest.approx(slow.limit_wait_ns / 1e6)
    assert slow.ttfb_ms is not None and slow.ttfb_ms < slow.limit_wait_ns / 1e6 + slow.total_ms  # type: ignore[operator]

    # The same batch on today's path, no limiter: the retry loop meets the wall.
    server2 = server_factory(profile="instant", rate_limit=10, rate_limit_window_s=0.5)
    records2, held2, summary2 = await _batch(server2, tmp_path, 40, limits=None)
    assert not held2
    assert sum(1 for r in records2 for e in r.retries if e.status == 429) > 0


async def test_token_headers_come_from_the_server_and_steer_the_limiter(
    server_factory: Factory, tmp_path: Path
) -> None:
    # 1,000 tokens a second; each request is charged its prompt and max_tokens 100 (about 110 tokens), so 30
    # of them need over 2 s of refills whatever the machine's speed.
    server = server_factory(profile="instant", rate_limit_tokens=1000, rate_limit_window_s=1.0)
    limits = RateLimits()
    records, held, summary = await _batch(server, tmp_path, 30, limits=limits, max_tokens=100)
    assert summary.ok == 30
    assert 429 not in [e.status for r in records for e in r.retries]
    first = records[0].headroom
    assert first is not None and first.limit_tokens == 1000 and first.limit_requests is None
    assert first.remaining_tokens is not None and first.remaining_tokens < 1000
    assert any(h.reason == "tokens" for h in held), [(h.reason, h.wait_s) for h in held]
    assert records[0].summary()["ratelimit"]["limit_tokens"] == 1000


def test_rate_limits_are_validated_and_sized_from_the_providers() -> None:
    from llmchat.core.config import load_settings

    limits = RateLimits.from_settings({"p": ProviderSettings(name="p", rate_limit_rpm=120, rate_limit_tpm=9000)})
    assert limits.get("p").requests.capacity == 120 and limits.get("p").tokens.capacity == 9000
    assert limits.get("p") is limits.get("p") and not limits.get("other").active
    with pytest.raises(Exception, match="providers.p.rate_limit_rpm must be a non-negative integer"):
        load_settings(None, overrides={"providers.p.rate_limit_rpm": -1})


def test_ask_json_bench_json_and_the_request_log_carry_the_headroom(
    server_factory: Factory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from llmchat.tui.cli import main

    server = server_factory(profile="instant", rate_limit=1000, rate_limit_tokens=100_000)
    log = tmp_path / "requests.jsonl"
    config = tmp_path / "config.toml"
    config.write_text(f'[log]\nrequests_path = "{log}"\n', encoding="utf-8")
    assert main(["ask", "hi", "--json", "--base-url", server.base_url, "--model", MODEL,
                 "--config", str(config)]) == 0
    asked = json.loads(capsys.readouterr().out)
    assert asked["ratelimit"]["limit_requests"] == 1000 and asked["ratelimit"]["limit_tokens"] == 100_000
    assert asked["ratelimit"]["remaining_requests"] == 999 and asked["rate_limit_wait_ms"] == 0
    logged = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    assert logged[-1]["ratelimit"]["remaining_requests"] == 999
    path = tmp_path / "bench.jsonl"
    assert main(["bench", "--base-url", server.base_url, "--model", MODEL, "--requests", "4", "--users", "1",
                 "--quiet", "--rate-limit-client", "--json", str(path)]) == 0
    capsys.readouterr()
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    requests = [line for line in lines if line["type"] == "request"]
    assert len(requests) == 4 and all(r["ratelimit"]["limit_requests"] == 1000 for r in requests)
    assert all(990 <= r["ratelimit"]["remaining_requests"] < 1000 for r in requests)  # refilling meanwhile
