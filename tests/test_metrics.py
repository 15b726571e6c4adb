"""The metrics pipeline behind the HUD, alone: windows, percentiles, counters, retry line, cost, the bus."""

from __future__ import annotations

import statistics
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from timing_records import MS, record

from llmchat.core.observe._attribution import is_routine_overlap
from llmchat.core.observe._bus import (
    Bus,
    Chunk,
    FirstToken,
    RequestDone,
    RequestStarted,
    RetryPlanned,
    WarmupState,
)
from llmchat.core.observe._timing import Phases
from llmchat.core.observe._window import Metrics, Percentiles, Price, prices_from_settings
from llmchat.core.policy._retry import RetryEvent


def retry_event(attempt: int = 2, wait_s: float = 1.3) -> RetryEvent:
    return RetryEvent(attempt=attempt, max_attempts=4, reason="429", status=429, wait_s=wait_s,
                      wait_source="Retry-After", error="rate limited")


def reference(values: list[float]) -> Percentiles:
    """numpy's default ("linear") percentiles, through the standard library."""
    if len(values) == 1:
        return Percentiles(values[0], values[0], values[0])
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return Percentiles(cuts[49], cuts[94], cuts[98])


# --- windows and percentiles ----------------------------------------------------------------------------


@given(st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=1, max_size=80))
def test_percentiles_match_the_reference_over_the_window(values: list[float]) -> None:
    m = Metrics(window=60, render_window=60)
    for v in values:
        m.observe_render_lag(v)
    got = m.percentiles("render_lag")
    want = reference(values[-60:])
    assert got == pytest.approx(want, rel=1e-9, abs=1e-9)


def test_request_windows_take_each_figure_from_the_record() -> None:
    m = Metrics()
    totals = [345.0, 120.0, 990.0, 410.0, 77.0]
    m.observe_many(record(ttft_ms=t / 3, total_ms=t, ttfb_ms=t / 4) for t in totals)
    assert m.series("total") == pytest.approx(totals)
    assert m.series("ttft") == pytest.approx([t / 3 for t in totals], abs=1e-6)
    assert m.series("ttfb") == pytest.approx([t / 4 for t in totals], abs=1e-6)
    assert m.percentiles("total") == pytest.approx(reference(totals))
    # 50 tokens from first to last token: 49 gaps over (total - 1 - ttft) ms.
    assert m.series("tokens_per_s") == pytest.approx([49_000 / (t - 1 - t / 3) for t in totals], rel=1e-6)


def test_windows_roll_to_the_last_n_requests() -> None:
    m = Metrics(window=3)
    m.observe_many(record(total_ms=t) for t in (900.0, 800.0, 100.0, 200.0, 300.0))
    assert m.series("total") == [100.0, 200.0, 300.0]
    assert m.percentiles("total").p50 == 200.0
    assert m.requests == 5  # the counters are not windowed


def test_percentiles_are_sorted_once_per_change() -> None:
    m = Metrics()
    m.observe_many([record(total_ms=100.0), record(total_ms=300.0)])
    first = m.percentiles("total")
    assert m.percentiles("total") is first  # cached: no sort per read (the HUD reads 10 times a second)
    m.observe_many([record(total_ms=500.0)])
    assert m.percentiles("total") is not first
    assert m.percentiles("total").p50 == 300.0


def test_an_empty_window_has_no_percentiles() -> None:
    assert Metrics().percentiles("ttft") == Percentiles(None, None, None)


def test_a_series_is_a_new_list_each_time_so_a_sparkline_redraws() -> None:
    m = Metrics()
    m.observe_many([record()])
    assert m.series("total") is not m.series("total")


def test_ttft_is_charted_in_stream_mode_only() -> None:
    m = Metrics()
    m.observe_many([record(mode="batch", total_ms=500.0), record(mode="stream", ttft_ms=40.0, total_ms=90.0)])
    assert m.series("total") == [500.0, 90.0]
    assert m.series("ttft") == [40.0]


def test_errors_cancels_and_cache_hits_are_counted_not_charted() -> None:
    m = Metrics()
    m.observe_many([
        record(total_ms=100.0),
        record(total_ms=5000.0, error="read timed out", error_kind="timeout"),
        record(total_ms=7.0, cancelled=True, error_kind="cancelled"),
        record(total_ms=2.0, cache_hit=True),
    ])
    assert m.series("total") == [100.0]
    assert m.requests == 4


def test_a_window_must_hold_something() -> None:
    with pytest.raises(ValueError):
        Metrics(window=0)


# --- counters --------------------------------------------------------------------------------------------


def test_errors_by_kind_and_cancels_apart() -> None:
    m = Metrics()
    m.observe_many([
        record(error="429 x", error_kind="rate_limit"),
        record(error="t", error_kind="timeout"),
        record(error="t", error_kind="timeout"),
        record(error="odd", error_kind=None),
        record(cancelled=True, error_kind="cancelled"),
        record(),
    ])
    assert dict(m.errors) == {"timeout": 2, "rate_limit": 1, "error": 1}
    assert m.error_count == 4
    assert m.cancelled == 1
    assert m.requests == 6


def test_cache_hits_and_misses_count_real_lookups_only() -> None:
    m = Metrics()
    assert m.hit_ratio is None
    looked: dict[str, Any] = {"cache_lookup": True}
    m.observe_many([record(cache_hit=True, **looked), record(**looked), record(**looked),
                    record(cache_hit=True, **looked), record(cancelled=True, error_kind="cancelled")])
    assert (m.cache_hits, m.cache_misses) == (2, 2)  # a cancel that never looked is neither
    assert m.hit_ratio == 0.5
    # Streamed requests never look in the cache (unless replay_streams is on): neither hits nor misses,
    # as Prometheus counts them.
    streamed = Metrics()
    streamed.observe_many([record(), record(), record(error="refused", error_kind="connect")])
    assert (streamed.cache_hits, streamed.cache_misses, streamed.hit_ratio) == (0, 0, None)
    # A request cancelled after its lookup missed did look: a miss.
    late = Metrics()
    late.observe_many([record(cancelled=True, error_kind="cancelled", **looked)])
    assert (late.cache_hits, late.cache_misses) == (0, 1)


def test_every_failed_request_is_an_error_even_one_that_never_got_a_response() -> None:
    m = Metrics()
    refused = record(error="connection refused", error_kind="connect")
    refused.status = None
    # A bad base_url (a ConfigError) or an empty model list (a UsageError) ends the request before any
    # connection, and the client records no error kind for them: still a failure, never a 1 ms reply.
    unanswered = record(total_ms=0.9)
    unanswered.status = None
    hit = record(total_ms=2.0, cache_hit=True, cache_lookup=True)
    hit.status = None  # a cache hit has no status either, and it is not a failure
    m.observe_many([refused, unanswered, hit, record(total_ms=300.0)])
    assert dict(m.errors) == {"connect": 1, "no_reply": 1}
    assert m.error_count == 2
    assert m.series("total") == [300.0]  # failures are counted, never charted
    assert [r.total_ms for r in m.replies] == [300.0]


def test_a_spread_says_how_many_values_it_has() -> None:
    m = Metrics()
    assert m.spread("total") == (0, None, None, None, None, None)
    m.observe_many(record(total_ms=t) for t in (300.0, 100.0, 200.0))
    spread = m.spread("total")
    assert (spread.n, spread.min, spread.p50, spread.max) == (3, 100.0, 200.0, 300.0)
    assert m.spread("total") is spread  # sorted once per change
    assert m.percentiles("total") == (spread.p50, spread.p95, spread.p99)


def test_in_flight_goes_up_and_down_and_never_below_zero() -> None:
    m = Metrics()
    a, b = record(), record()
    m.observe_started(a)
    m.observe_started(b)
    assert (m.in_flight, m.started) == (2, 2)
    m.observe_done(a)
    assert m.in_flight == 1
    m.observe_done(b)
    m.observe_done(record())  # finished without a start seen (subscribed mid-request)
    assert m.in_flight == 0
    assert m.requests == 3


def test_last_is_the_last_finished_request() -> None:
    m = Metrics()
    a, b = record(total_ms=10.0), record(total_ms=20.0)
    m.observe_started(a)
    m.observe_started(b)
    m.observe_done(b)
    m.observe_done(a)
    assert m.last is a


# --- the retry line ------------------------------------------------------------------------------------


def test_the_retry_line_shows_until_the_first_token() -> None:
    m = Metrics()
    r = record()
    m.observe_started(r)
    m.observe_retry(r, retry_event())
    assert m.pending_retry == "retry 2/4 in 1.3 s (429, Retry-After)"
    assert m.retries == 1
    m.observe_first_token(r)
    assert m.pending_retry is None


def test_the_retry_line_ends_with_the_request() -> None:
    m = Metrics()
    r = record(mode="batch")
    m.observe_started(r)
    m.observe_retry(r, retry_event(attempt=3))
    assert m.pending_retry == "retry 3/4 in 1.3 s (429, Retry-After)"
    m.observe_done(r)
    assert m.pending_retry is None


def test_the_retry_line_ends_when_the_next_attempt_gets_its_headers() -> None:
    m = Metrics()
    r = record()
    r.phases.headers_ns = r.t0_ns + 5 * MS  # the failed attempt's 429 had headers too
    m.observe_started(r)
    m.observe_retry(r, retry_event())
    r.phases = Phases(start_ns=r.t0_ns + 1300 * MS)  # what the client does when the next attempt starts
    assert m.pending_retry is not None  # sent, not answered yet
    r.phases.headers_ns = r.t0_ns + 1320 * MS
    assert m.pending_retry is None


def test_another_requests_first_token_leaves_the_retry_line() -> None:
    m = Metrics()
    retried, other = record(), record()
    m.observe_started(retried)
    m.observe_started(other)
    m.observe_retry(retried, retry_event())
    m.observe_first_token(other)
    m.observe_done(other)
    assert m.pending_retry == "retry 2/4 in 1.3 s (429, Retry-After)"


def test_a_planned_wait_is_activity_not_a_stall() -> None:
    m = Metrics()
    r = record(t0_ns=time.perf_counter_ns())
    r.last_token_ns = None
    m.observe_started(r)
    before = time.perf_counter_ns()
    m.observe_retry(r, retry_event(wait_s=30.0))
    activity = m.last_activity_ns()
    assert activity is not None and activity >= before + 30 * 1_000_000_000


def test_thinking_is_activity_not_a_stall() -> None:
    m = Metrics()
    r = record(t0_ns=1_000 * MS)
    r.last_token_ns = None
    m.observe_started(r)
    assert m.last_activity_ns() == 1_000 * MS
    r.first_reasoning_ns = r.last_reasoning_ns = 4_000 * MS  # thinking, no answer token yet
    assert m.last_activity_ns() == 4_000 * MS


def test_pending_since_is_the_oldest_request_in_flight() -> None:
    m = Metrics()
    assert m.pending_since_ns() is None and m.last_activity_ns() is None
    old, new = record(t0_ns=1_000 * MS), record(t0_ns=2_000 * MS)
    old.last_token_ns = new.last_token_ns = None
    m.observe_started(new)
    m.observe_started(old)
    assert m.pending_since_ns() == 1_000 * MS
    assert m.last_activity_ns() == 2_000 * MS
    new.last_token_ns = 2_500 * MS
    assert m.last_activity_ns() == 2_500 * MS


def test_the_limiters_hold_of_a_request_is_known_until_it_ends() -> None:
    from llmchat.core.policy import ProviderLimiter

    limiter = ProviderLimiter("p", rpm=1, clock=lambda: 0.0)
    limiter.reserve(1)
    hold = limiter.reserve(1)  # the minute's one request is spent: this one waits
    m = Metrics()
    held, other = record(), record()
    m.observe_started(held)
    m.observe_started(other)
    before = time.perf_counter_ns()
    m.observe_hold(held, hold)
    assert m.planned_hold(other) is None
    got = m.planned_hold(held)
    assert got is not None and got[0] is hold and got[1] >= before
    m.observe_done(held)
    assert m.planned_hold(held) is None and m.pending_hold is None


def test_the_running_request_and_its_planned_retry() -> None:
    m = Metrics()
    assert m.running is None
    first, second = record(), record()
    m.observe_started(first)
    m.observe_started(second)
    assert m.running is second  # the one started last
    before = time.perf_counter_ns()
    m.observe_retry(first, retry_event(wait_s=30.0))
    assert m.planned_retry(second) is None
    planned = m.planned_retry(first)
    assert planned is not None and planned[0].wait_s == 30.0 and planned[1] >= before
    m.observe_first_token(first)
    assert m.planned_retry(first) is None
    m.observe_done(second)
    assert m.running is first
    m.observe_done(first)
    assert m.running is None


# --- cost --------------------------------------------------------------------------------------------------


def test_cost_from_the_servers_usage() -> None:
    m = Metrics(prices={"gpt-4o-mini": Price(0.15, 0.6)})
    assert m.cost_total is None
    priced: dict[str, Any] = {"model": "gpt-4o-mini", "usage_from_server": True}
    m.observe_many([record(prompt_tokens=1000, output_tokens=500, **priced)])
    assert m.cost_last == pytest.approx((1000 * 0.15 + 500 * 0.6) / 1e6)
    m.observe_many([record(prompt_tokens=2_000_000, output_tokens=0, **priced)])
    assert m.cost_last == pytest.approx(0.3)
    assert m.cost_total == pytest.approx(0.3 + (1000 * 0.15 + 500 * 0.6) / 1e6)


def test_cost_unknown_without_usage_and_free_from_the_cache() -> None:
    m = Metrics(prices={"m": Price(1.0, 2.0)})
    m.observe_many([record(model="m", usage_from_server=False)])
    assert (m.cost_total, m.cost_last, m.cost_unknown) == (None, None, 1)
    m.observe_many([record(model="m", cache_hit=True, prompt_tokens=10, usage_from_server=True)])
    assert (m.cost_total, m.cost_last) == (0.0, 0.0)
    m.observe_many([record(model="unpriced", prompt_tokens=10, usage_from_server=True)])
    assert (m.cost_total, m.cost_last, m.cost_unknown) == (0.0, 0.0, 1)


def test_prices_from_settings() -> None:
    table = {"a": {"input_per_mtok": 0.15, "output_per_mtok": 0.6}, "b": {"output_per_mtok": 2.0}}
    prices = prices_from_settings(table)
    assert prices == {"a": Price(0.15, 0.6), "b": Price(0.0, 2.0)}


# --- the bus and listeners ------------------------------------------------------------------------------


def test_subscribe_leaves_chunk_events_unasked_for() -> None:
    bus, m = Bus(), Metrics()
    m.subscribe(bus)
    assert not bus.wants(Chunk)  # so the client never builds them for the HUD's sake
    r = record()
    r.content_chunks = 7
    bus.publish(RequestStarted(r))
    bus.publish(RequestDone(r))
    assert m.chunks == 7  # counted from the record instead


def test_subscribe_feeds_everything_and_unsubscribe_stops_it() -> None:
    bus, m = Bus(), Metrics()
    off = m.subscribe(bus, chunks=True)
    assert bus.wants(Chunk)
    r = record()
    bus.publish(WarmupState("local", "warm", 1.5))
    bus.publish(RequestStarted(r))
    bus.publish(RetryPlanned(r, retry_event()))
    assert (m.in_flight, m.retries, m.pending_retry is not None) == (1, 1, True)
    bus.publish(FirstToken(r))
    for i in range(3):
        bus.publish(Chunk(r, "x", r.t0_ns + i))
    bus.publish(RequestDone(r))
    assert (m.in_flight, m.requests, m.chunks, m.last_chunk_ns) == (0, 1, 3, r.t0_ns + 2)
    assert m.pending_retry is None
    assert (m.connection.provider, m.connection.state, m.connection.rtt_ms) == ("local", "warm", 1.5)
    off()
    assert not bus.wants(Chunk) and not bus.wants(RequestDone)
    bus.publish(RequestDone(record()))
    assert m.requests == 1


def test_a_state_without_a_ping_keeps_the_last_round_trip() -> None:
    m = Metrics()
    m.observe_warmup(WarmupState("local", "warm", 2.0))
    m.observe_warmup(WarmupState("local", "failed", None, "refused"))
    assert (m.connection.state, m.connection.rtt_ms, m.connection.error) == ("failed", 2.0, "refused")


def test_listeners_hear_every_observation_but_chunks() -> None:
    m = Metrics()
    heard: list[int] = []
    remove = m.add_listener(lambda: heard.append(m.version))
    r = record()
    m.observe_started(r)
    m.observe_chunk(Chunk(r, "x", 1))
    m.observe_first_token(r)
    m.observe_done(r)
    m.observe_render_lag(3.0)
    m.observe_warmup(WarmupState("local", "warm"))
    assert len(heard) == 5
    assert heard == sorted(set(heard))  # each observation moved the version on
    remove()
    m.observe_render_lag(1.0)
    assert len(heard) == 5


def test_topic_versions_move_only_with_their_topic() -> None:
    m = Metrics()
    m.observe_render_lag(3.0)
    assert (m.requests_version, m.done_version, m.connection_version, m.render_version) == (0, 0, 0, 1)
    m.observe_started(record())
    assert (m.requests_version, m.done_version) == (1, 0)
    m.observe_done(record())
    assert (m.requests_version, m.done_version) == (2, 1)


def test_a_routine_clock_overlap_is_a_few_ms_or_a_few_percent_of_what_the_server_reported() -> None:
    assert is_routine_overlap(4.9, server_ms=10.0) and not is_routine_overlap(5.0, server_ms=10.0)
    assert is_routine_overlap(32.5, server_ms=4923.0)  # 0.7 % of a long stream
    assert not is_routine_overlap(150.0, server_ms=170.0)
