"""Attribution, pure: hand-built timing records in, parts out, for every branch of ``attribute``, the
cold-start detector's rule, the server-report checks and the Prometheus reader.

Records are built on a made-up perf_counter clock (t0 = 1 s) with stamps given in milliseconds after t0, so
each expected part is plain arithmetic on the stamps of the test itself.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import llmchat.core.http._openai as wire
from llmchat.core import (
    Attribution,
    ColdStartDetector,
    Phases,
    RetryEvent,
    TimingRecord,
    attribute,
    format_shares,
    parse_server_metrics,
    part_samples,
    shares_over,
)
from llmchat.core.observe._attribution import PARTS, SATURATION_MIN_MS
from llmchat.core.observe._coldstart import Baseline

MS = 1_000_000
T0 = 1_000_000_000
MONO0 = 5_000_000_000_000


def at(ms: float | None) -> int | None:
    return None if ms is None else T0 + round(ms * MS)


def record(
    mode: str = "stream",
    *,
    start: float = 0.2,
    connect: tuple[float, float | None] | None = None,
    tls: tuple[float, float] | None = None,
    send: tuple[float, float | None] | None = (0.5, 1.0),
    headers: float | None = 5.0,
    first: float | None = 100.0,
    end: float | None = 300.0,
    encode_ms: float = 0.1,
    decode_ms: float = 2.0,
    decode_before_first_ms: float = 0.5,
    server: dict[str, Any] | None = None,
    provider: str = "p",
    model: str = "m",
    **fields: Any,
) -> TimingRecord:
    """A finished record; ``server`` is a server_timing given in ms on the server's own clock."""
    phases = Phases(start_ns=at(start) or 0, headers_ns=at(headers))
    if connect:
        phases.connect_start_ns, phases.connect_end_ns = at(connect[0]), at(connect[1])
    if tls:
        phases.tls_start_ns, phases.tls_end_ns = at(tls[0]), at(tls[1])
    if send:
        phases.send_start_ns, phases.send_end_ns = at(send[0]), at(send[1])
    r = TimingRecord(mode=mode, provider=provider, model=model, t0_ns=T0, t0_mono_ns=MONO0, phases=phases)
    r.first_token_ns = at(first) if mode == "stream" else None
    r.last_token_ns = r.first_token_ns
    r.end_ns = at(end)
    r.encode_ns = round(encode_ms * MS)
    r.decode_ns = round(decode_ms * MS)
    r.decode_before_first_ns = round(decode_before_first_ms * MS)
    if server is not None:
        r.server_timing = {k: (MONO0 + round(v * MS) if isinstance(v, int | float) and not isinstance(v, bool)
                               else v) for k, v in server.items()}
    for k, v in fields.items():
        setattr(r, k, v)
    return r


def ms_of(a: Attribution) -> dict[str, float]:
    return {p.key: round(p.ms, 6) for p in a.parts}


def assert_sums(a: Attribution) -> None:
    assert math.isclose(sum(p.ms for p in a.parts), a.total_ms, abs_tol=1e-6)
    if a.total_ms > 0:
        assert math.isclose(sum(a.shares().values()), 1.0, abs_tol=1e-9)


# -- the timeline --------------------------------------------------------------------------------------------
def test_stream_with_llmchat_server_timing_splits_every_span() -> None:
    # Server: received at 10, started at 40 (30 ms queued), first token at 90, last at 270.
    r = record(connect=(0.3, 0.4), server={"received_ns": 10, "started_ns": 40, "first_token_ns": 90,
                                           "last_token_ns": 270})
    a = attribute(r)
    assert a.reporter == "llmchat serve"
    assert ms_of(a) == {
        "encode": 0.1,
        "client_other": 0.1 + 0.1,  # t0..start less encode, and connect end..send start
        "pool_wait": 0.1,
        "connect": 0.1,
        "send": 0.5,
        "server_queue": 30.0,
        "server_prefill": 50.0,
        "server_generation": 180.0,
        # to first token: 99 ms = 80 server + 0.5 decode + 18.5 network
        "network_first_token": 18.5,
        # streaming: 200 ms = 180 server + 1.5 decode + 18.5 network
        "network_stream": 18.5,
        "decode": 2.0,
        "unexplained": 0.0,
    }
    assert_sums(a)
    sources = {p.key: p.source for p in a.parts}
    assert sources["server_queue"] == sources["server_generation"] == "reported"
    assert sources["network_first_token"] == sources["network_stream"] == "derived"
    assert sources["connect"] == sources["decode"] == "measured"
    assert a.total_ms == 300.0


def test_a_server_that_reports_nothing_gets_network_and_server_merged_and_labelled() -> None:
    a = attribute(record())
    assert a.reporter == ""
    merged = [p for p in a.parts if p.group == "network+server"]
    assert [p.key for p in merged] == ["network_server", "network_server_stream"]
    assert all("not reported" in p.name and p.source == "measured" for p in merged)
    assert not any(p.group == "server" for p in a.parts)
    assert ms_of(a)["network_server"] == 99.0 - 0.5 and ms_of(a)["network_server_stream"] == 200.0 - 1.5
    assert_sums(a)


def test_llama_cpp_timings_are_prefill_and_generation() -> None:
    a = attribute(record(server_reported={"prompt_ms": 60.0, "predicted_ms": 150.0, "prompt_n": 12.0}))
    assert a.reporter == "llama.cpp"
    parts = ms_of(a)
    assert parts["server_prefill"] == 60.0 and parts["server_generation"] == 150.0
    assert "server_queue" not in parts  # llama.cpp's timings say nothing about queueing
    assert parts["network_first_token"] == 99.0 - 60.0 - 0.5
    assert parts["network_stream"] == 200.0 - 150.0 - 1.5
    assert_sums(a)


def test_openai_processing_ms_splits_the_time_to_headers_only() -> None:
    a = attribute(record(headers=50.0, server_processing_ms=35.0))
    parts = ms_of(a)
    assert a.reporter == "openai-processing-ms"
    assert parts["server_processing"] == 35.0
    assert parts["network_first_token"] == 49.0 - 35.0  # send end (1) to headers (50), less the server's
    assert parts["network_server"] == 100.0 - 50.0 - 0.5  # headers to first token: not reported
    assert parts["network_server_stream"] == 200.0 - 1.5
    assert_sums(a)


def test_batch_with_server_timing_is_server_total_network_and_decode() -> None:
    r = record("batch", headers=250.0, end=260.0, decode_ms=3.0,
               server={"received_ns": 5, "first_token_ns": 105, "last_token_ns": 245})
    a = attribute(r)
    parts = ms_of(a)
    assert parts["server_queue"] == 0.0 and parts["server_prefill"] == 100.0
    assert parts["server_generation"] == 140.0
    assert parts["network_reply"] == 259.0 - 240.0 - 3.0
    assert parts["decode"] == 3.0 and "network_first_token" not in parts
    assert_sums(a)


def test_batch_with_openai_processing_ms() -> None:
    a = attribute(record("batch", end=400.0, decode_ms=1.0, server_processing_ms=300.0))
    parts = ms_of(a)
    assert parts["server_processing"] == 300.0 and parts["network_reply"] == 399.0 - 300.0 - 1.0
    assert_sums(a)


def test_batch_without_report_is_merged() -> None:
    a = attribute(record("batch", end=50.0, decode_ms=1.0))
    assert ms_of(a)["network_server"] == 49.0 - 1.0
    assert_sums(a)


def test_a_stream_without_content_uses_the_reply_span() -> None:
    r = record(first=None, end=80.0, server={"received_ns": 2, "first_token_ns": 70, "last_token_ns": 70})
    parts = ms_of(attribute(r))
    assert parts["server_prefill"] == 68.0 and parts["server_generation"] == 0.0
    assert parts["network_reply"] == 79.0 - 68.0 - 2.0


def test_a_cache_hit_is_all_client() -> None:
    r = record(end=1.5, cache_hit=True, server={"received_ns": 0, "first_token_ns": 1, "last_token_ns": 2})
    a = attribute(r)
    assert [(p.key, p.group, p.ms) for p in a.parts] == [
        ("cache", "client", 1.5), ("unexplained", "unexplained", 0)
    ]
    assert a.flags == ["cache_hit"] and a.reporter == "cache"
    assert a.shares() == {"client": 1.0, "unexplained": 0.0}


def test_retries_and_their_waits_are_their_own_group() -> None:
    event = RetryEvent(attempt=2, max_attempts=4, reason="503", status=503, wait_s=0.5, wait_source="backoff",
                       error="x")
    r = record(start=520.0, send=(520.5, 521.0), headers=525.0, first=600.0, end=700.0, retries=[event])
    a = attribute(r)
    part = a.part("retries")
    assert part is not None and part.group == "retry" and part.ms == 520.0 - 0.1
    assert "client_other" not in ms_of(a)
    assert_sums(a)


def test_tls_is_network_and_setup_gaps_are_client() -> None:
    a = attribute(record(start=0.2, connect=(1.0, 11.0), tls=(11.5, 31.5), send=(32.0, 33.0), first=120.0))
    parts = ms_of(a)
    assert parts["pool_wait"] == 0.8 and parts["connect"] == 10.0 and parts["tls"] == 20.0
    assert parts["client_other"] == round(0.1 + 0.5 + 0.5, 6)
    assert {p.key: p.group for p in a.parts}["tls"] == "network"
    assert_sums(a)


def test_client_setup_on_the_request_path_is_its_own_part_not_pool_wait() -> None:
    r = record(start=0.2, connect=(3.2, 4.0), send=(4.0, 4.5), first=120.0)
    r.phases.setup_ns = int(2.5 * MS)  # the slot's client built on the way: 2.5 of the 3.0 ms before connecting
    a = attribute(r)
    parts = ms_of(a)
    assert parts["client_setup"] == 2.5 and parts["pool_wait"] == 0.5
    assert {p.key: p.group for p in a.parts}["client_setup"] == "client"
    assert r.pool_wait_ms == 0.5
    assert_sums(a)
    assert "client_setup" not in ms_of(attribute(record(start=0.2, connect=(3.2, 4.0), send=(4.0, 4.5))))


def test_a_request_that_failed_while_connecting_keeps_what_it_has() -> None:
    r = record(connect=(0.3, None), send=None, headers=None, first=None, end=40.0, error="refused",
               error_kind="connect")
    a = attribute(r)
    parts = ms_of(a)
    assert parts["connect"] == 40.0 - 0.3 and parts["pool_wait"] == 0.1
    assert any("ended early (connect)" in n for n in a.notes)
    assert_sums(a)


def test_a_record_still_running_gives_an_empty_attribution() -> None:
    a = attribute(record(end=None), render_lag_ms=3.0)
    assert a.parts == [] and a.total_ms == 0.0 and a.shares() == {}
    assert a.notes == ["the request has not finished"]
    assert [p.key for p in a.after] == ["render_lag"]


def test_render_lag_is_after_arrival_and_outside_the_total() -> None:
    a = attribute(record(), render_lag_ms=7.5)
    assert [(p.key, p.group, p.ms, p.source) for p in a.after] == [("render_lag", "client", 7.5, "measured")]
    assert a.total_ms == 300.0
    assert_sums(a)
    assert a.to_dict()["after"][0]["name"] == "render (after arrival)"


def test_a_reported_span_longer_than_the_measured_one_shows_as_negative_unexplained() -> None:
    # The server claims 150 ms to first token; the client measured only 99 ms from send end to first token.
    r = record(server={"received_ns": 0, "first_token_ns": 150, "last_token_ns": 300})
    a = attribute(r)
    parts = ms_of(a)
    assert parts["network_first_token"] == 0.0  # a derived part never goes negative...
    assert parts["unexplained"] < 0  # ...the overlap is shown, not hidden
    assert parts["unexplained"] == -(150.0 + 0.5 - 99.0)
    assert any("more than the measured to-first-token span" in n for n in a.notes)
    assert_sums(a)


# -- malformed reports never break anything ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("server_timing", "note"),
    [
        ({"received_ns": "soon", "first_token_ns": 10, "last_token_ns": 20}, "received_ns is not a non-neg"),
        ({"received_ns": -1, "first_token_ns": 10, "last_token_ns": 20}, "received_ns is not a non-neg"),
        ({"received_ns": 0, "last_token_ns": 20}, "first_token_ns is missing"),
        ({"received_ns": 0, "first_token_ns": 30, "last_token_ns": 20}, "out of order"),
        ({"received_ns": True, "first_token_ns": 30, "last_token_ns": 40}, "received_ns is not a non-neg"),
        ({"received_ns": 0, "first_token_ns": 1, "last_token_ns": 10**17}, "more than a day"),
        ("garbage", "not an object"),
    ],
)
def test_malformed_server_timing_is_ignored_with_a_note(server_timing: Any, note: str) -> None:
    r = record()
    r.server_timing = (
        {k: (v if isinstance(v, str) or isinstance(v, bool) or v < 0 else MONO0 + v * MS) for k, v in
         server_timing.items()} if isinstance(server_timing, dict) else server_timing
    )
    a = attribute(r)
    assert a.reporter == "" and "network_server" in ms_of(a)
    assert any(note in n for n in a.notes), a.notes
    assert_sums(a)


def test_a_bad_started_stamp_drops_only_the_queue_split() -> None:
    r = record(server={"received_ns": 10, "started_ns": 95, "first_token_ns": 90, "last_token_ns": 270})
    a = attribute(r)
    assert a.reporter == "llmchat serve" and ms_of(a)["server_queue"] == 0.0
    assert ms_of(a)["server_prefill"] == 80.0
    assert any("started_ns ignored" in n for n in a.notes)


@pytest.mark.parametrize(
    "timings",
    [
        {"prompt_ms": float("nan"), "predicted_ms": -3.0},
        {"prompt_ms": "12", "predicted_ms": True},
        {"prompt_n": 4.0},
        "not a dict",
    ],
)
def test_malformed_llama_timings_are_ignored_with_a_note(timings: Any) -> None:
    a = attribute(record(server_reported=timings))
    assert a.reporter == "" and a.notes and "network_server" in ms_of(a)
    assert_sums(a)


def test_half_valid_llama_timings_keep_the_valid_half() -> None:
    a = attribute(record(server_reported={"prompt_ms": 40.0, "predicted_ms": float("inf")}))
    assert a.reporter == "llama.cpp" and ms_of(a)["server_prefill"] == 40.0
    assert "server_generation" not in ms_of(a) and "network_server_stream" in ms_of(a)
    assert any("predicted_ms ignored" in n for n in a.notes)


@pytest.mark.parametrize("value", [float("nan"), -5.0, float("inf")])
def test_a_bad_openai_processing_header_is_ignored(value: float) -> None:
    a = attribute(record(server_processing_ms=value))
    assert a.reporter == "" and any("openai-processing-ms ignored" in n for n in a.notes)


def test_llmchat_report_wins_over_the_others() -> None:
    r = record(server={"received_ns": 0, "first_token_ns": 50, "last_token_ns": 100},
               server_reported={"prompt_ms": 1.0}, server_processing_ms=2.0)
    assert attribute(r).reporter == "llmchat serve"


_stamp = st.one_of(st.none(), st.floats(min_value=-50, max_value=500, allow_nan=False))


@settings(max_examples=300, deadline=None)
@given(
    mode=st.sampled_from(["stream", "batch", "embed"]),
    stamps=st.lists(_stamp, min_size=9, max_size=9),
    decode=st.floats(min_value=0, max_value=400),
    server=st.one_of(
        st.none(),
        st.dictionaries(st.sampled_from(["received_ns", "started_ns", "first_token_ns", "last_token_ns"]),
                        st.one_of(st.integers(min_value=-10, max_value=10**6), st.text(max_size=3),
                                  st.booleans())),
    ),
    llama=st.one_of(st.none(), st.dictionaries(st.sampled_from(["prompt_ms", "predicted_ms"]),
                                               st.floats(allow_nan=True, allow_infinity=True))),
    processing=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
    cache_hit=st.booleans(),
)
def test_any_record_attributes_without_raising_and_parts_sum_to_the_total(
    mode: str, stamps: list[float | None], decode: float, server: dict[str, Any] | None,
    llama: dict[str, float] | None, processing: float | None, cache_hit: bool,
) -> None:
    start, c0, c1, s0, s1, headers, first, end, retry = stamps
    r = record(mode, start=start or 0.0, connect=(c0, c1) if c0 is not None else None,
               send=(s0, s1) if s0 is not None else None, headers=headers, first=first,
               end=None if end is None else abs(end), decode_ms=decode, decode_before_first_ms=decode / 2,
               server_reported=llama, server_processing_ms=processing, cache_hit=cache_hit)
    r.server_timing = server
    if retry is not None:
        r.retries = ["x"]
    a = attribute(r, render_lag_ms=1.0, detector=ColdStartDetector(), server_metrics={"requests_waiting": 0})
    assert_sums(a)
    assert all(p.ms >= 0 for p in a.parts if p.key != "unexplained")
    json.dumps(a.to_dict())


# -- flags ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("queue_ms", "first_ms", "flagged"),
    [
        (30.0, 100.0, True),  # 30 ms, 30 % of the TTFT
        (SATURATION_MIN_MS - 5, 40.0, False),  # a big share, but too short to be more than a busy loop
        (30.0, 200.0, False),  # 30 ms but only 15 % of the TTFT
        (0.0, 100.0, False),
    ],
)
def test_saturation_needs_a_long_and_large_queue_share(
    queue_ms: float, first_ms: float, flagged: bool
) -> None:
    r = record(first=first_ms, end=first_ms + 50,
               server={"received_ns": 1, "started_ns": 1 + queue_ms, "first_token_ns": first_ms - 5,
                       "last_token_ns": first_ms + 40})
    assert ("saturation" in attribute(r).flags) is flagged


def test_batch_saturation_compares_with_the_total() -> None:
    r = record("batch", end=100.0, server={"received_ns": 1, "started_ns": 41, "first_token_ns": 60,
                                           "last_token_ns": 90})
    assert attribute(r).flags == ["saturation"]


def test_metrics_with_requests_waiting_flag_saturation_and_a_full_cache_gets_a_note() -> None:
    metrics = {"requests_waiting": 3, "requests_running": 8, "kv_cache_usage": 0.97}
    a = attribute(record(), server_metrics=metrics)
    assert a.flags == ["saturation"]
    assert any("3 requests waiting, 8 running" in n for n in a.notes)
    assert any("KV cache is 97% full" in n for n in a.notes)
    assert a.to_dict()["server_metrics"] == {"requests_waiting": 3.0, "requests_running": 8.0,
                                             "kv_cache_usage": 0.97}
    quiet = attribute(record(), server_metrics={"requests_waiting": 0, "kv_cache_usage": 0.2})
    assert quiet.flags == [] and quiet.notes == []


def test_the_detector_flags_cold_start_through_attribute() -> None:
    detector = ColdStartDetector(idle_s=1.0)
    warm = [record(first=20, end=30) for _ in range(3)]
    for i, r in enumerate(warm):  # back to back: each starts when the one before ended
        shift = i * 30 * MS
        r.t0_ns += shift
        r.end_ns = (r.end_ns or 0) + shift
        r.first_token_ns = (r.first_token_ns or 0) + shift
    assert all("cold_start" not in attribute(r, detector=detector).flags for r in warm)
    cold = record(first=200, end=210)
    cold.t0_ns += 5_000 * MS  # 5 s after the last one
    for name in ("end_ns", "first_token_ns"):
        setattr(cold, name, getattr(cold, name) + 5_000 * MS)
    a = attribute(cold, detector=detector)
    assert a.flags == ["cold_start"] and any("cold start" in n for n in a.notes)


# -- the cold-start detector's rule --------------------------------------------------------------------------
def timed(t0_s: float, ttft_ms: float, *, mode: str = "stream", server_ms: float | None = None,
          provider: str = "p", model: str = "m", **fields: Any) -> TimingRecord:
    r = TimingRecord(mode=mode, provider=provider, model=model, t0_ns=round(t0_s * 1e9))
    r.first_token_ns = r.t0_ns + round(ttft_ms * MS) if mode == "stream" else None
    r.end_ns = r.t0_ns + round((ttft_ms + 10) * MS)
    if server_ms is not None:
        r.server_timing = {"received_ns": 0, "first_token_ns": round(server_ms * MS),
                           "last_token_ns": round(server_ms * MS)}
    for k, v in fields.items():
        setattr(r, k, v)
    return r


def test_cold_start_needs_three_samples_idle_and_the_factor() -> None:
    d = ColdStartDetector(window=20, factor=3.0, idle_s=60.0)
    assert not d.observe(timed(0, 500))  # no history at all: nothing to compare with
    assert not d.observe(timed(1, 20))
    assert not d.observe(timed(100, 500))  # after idle, but only 2 samples so far
    assert not d.observe(timed(101, 20))
    for t in range(102, 106):
        assert not d.observe(timed(t, 20))
    assert d.median("p", "m", "client") == 20
    assert not d.observe(timed(107, 500))  # slow, but no idle before it: load, not a cold start
    assert not d.observe(timed(200, 59))  # idle, but under 3x the median
    assert d.observe(timed(300, 61))  # idle and over 3x
    assert d.observe(timed(400, 600))
    assert d.median("p", "m", "client") == 20  # flagged samples stay out of the window


def test_cold_start_is_per_provider_and_model_and_basis() -> None:
    d = ColdStartDetector(idle_s=10)
    for t in range(5):
        d.observe(timed(t, 20, server_ms=10))
        d.observe(timed(t, 20, model="other"))
    assert d.median("p", "m", "server") == 10 and d.median("p", "m", "client") is None
    # A client-measured 100 ms after idle: there are no client samples for (p, m) to compare it with.
    assert not d.observe(timed(100, 100))
    assert d.observe(timed(200, 100, model="other"))
    assert d.observe(timed(300, 200, server_ms=50))
    assert d.median("q", "m") is None


def test_batch_samples_are_the_total_and_cache_hits_errors_and_cancels_are_not_samples() -> None:
    d = ColdStartDetector(idle_s=10)
    for t in range(3):
        d.observe(timed(t, 20, mode="batch"))
    assert d.median("p", "m", "client") == 30
    assert not d.observe(timed(100, 900, mode="batch", cache_hit=True))
    assert not d.observe(timed(200, 900, mode="batch", error="boom"))
    # The failed request still counted as traffic: no idle before the next.
    assert not d.observe(timed(200.5, 900, mode="batch"))
    assert not d.observe(timed(300, 900, mode="batch", cancelled=True))


def test_reset_makes_the_next_request_count_as_after_idle() -> None:
    d = ColdStartDetector(idle_s=60)
    for t in range(4):
        d.observe(timed(t, 20))
    d.reset("p", "m")
    assert d.observe(timed(5, 100))
    d.reset()
    assert d.observe(timed(6, 100))
    assert not d.observe(timed(7, 100))


@pytest.mark.parametrize("kwargs", [{"window": 2}, {"factor": 1.0}, {"idle_s": -1}])
def test_detector_refuses_nonsense_settings(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ColdStartDetector(**kwargs)  # type: ignore[arg-type]


# -- a model load the server reported ------------------------------------------------------------------------
def loaded(mode: str = "stream", load_ms: Any = 60, **server: Any) -> TimingRecord:
    """Received at 10, first token at 90 (80 ms from the start of work), last at 270, ``load_ms`` of model
    load (a duration, so not shifted onto the server's clock like the stamps)."""
    kw: dict[str, Any] = {"headers": 250.0, "end": 260.0, "decode_ms": 3.0} if mode == "batch" else {}
    r = record(mode, server={"received_ns": 10, "first_token_ns": 90, "last_token_ns": 270, **server}, **kw)
    assert r.server_timing is not None
    number = isinstance(load_ms, int | float) and not isinstance(load_ms, bool)
    r.server_timing["model_load_ns"] = round(load_ms * MS) if number else load_ms
    return r


def test_a_reported_model_load_is_its_own_part_cut_out_of_the_prefill_and_a_cold_start() -> None:
    a = attribute(loaded())  # no detector: the server said it loaded the model, and that is enough
    parts = ms_of(a)
    assert parts["server_model_load"] == 60.0 and parts["server_prefill"] == 20.0
    assert parts["network_first_token"] == 18.5  # as without a load: the load is the server's, not the net's
    load = a.part("server_model_load")
    assert load is not None
    assert (load.name, load.group, load.source) == ("server model load", "server", "reported")
    assert a.flags == ["cold_start"]
    assert any("server reported 60 ms of model load" in n for n in a.notes)
    assert format_shares(a).endswith("[cold_start: server model load 60 ms]")
    assert_sums(a)


def test_a_model_load_in_a_whole_reply_and_after_queueing() -> None:
    a = attribute(loaded("batch", started_ns=25))
    parts = ms_of(a)
    assert (parts["server_queue"], parts["server_model_load"], parts["server_prefill"]) == (15.0, 60.0, 5.0)
    assert "cold_start" in a.flags
    assert_sums(a)


@pytest.mark.parametrize(
    ("value", "note"),
    [("soon", "is not a duration"), (-5, "is not a duration"), (True, "is not a duration"),
     (81, "longer than the time from the start of work to the first token")],
)
def test_a_bad_model_load_is_ignored_with_a_note_and_the_prefill_keeps_it(value: Any, note: str) -> None:
    a = attribute(loaded(load_ms=value))
    assert a.part("server_model_load") is None and ms_of(a)["server_prefill"] == 80.0
    assert "cold_start" not in a.flags and any(note in n for n in a.notes), a.notes


def test_a_reported_load_is_a_cold_start_to_the_detector_and_stays_out_of_its_window() -> None:
    d = ColdStartDetector(idle_s=60)
    for t in range(3):
        assert not d.observe(timed(t, 20, server_ms=20))
    r = loaded()
    r.t0_ns, r.end_ns = round(3.1e9), round(3.1e9) + 300 * MS  # right after the others: no idle
    assert d.observe(r)
    assert d.median("p", "m", "server") == 20


# -- baselines across processes ------------------------------------------------------------------------------
def test_a_seeded_detector_flags_the_first_request_of_a_new_process_after_idle() -> None:
    old = ColdStartDetector(idle_s=60)
    for t in range(4):
        old.observe(timed(t, 20, wall_start=1_000.0 + t))
    [baseline] = old.baselines()
    assert baseline.samples == {"client": (20.0,) * 4} and baseline.last_end_wall == pytest.approx(1_003.03)
    fresh = ColdStartDetector(idle_s=60)
    assert not fresh.observe(timed(0, 500, wall_start=2_000.0))  # nothing to compare with
    seeded = ColdStartDetector(idle_s=60)
    seeded.seed([baseline])
    # perf_counter stamps of another process mean nothing here: the silence is read on the wall clock.
    assert seeded.observe(timed(0, 500, wall_start=2_000.0))
    soon = ColdStartDetector(idle_s=60)
    soon.seed([baseline])
    assert not soon.observe(timed(0, 500, wall_start=1_010.0))  # 7 s after the other process's last request


def test_seeding_keeps_the_newest_window_skips_nonsense_and_never_overrides_what_was_seen() -> None:
    d = ColdStartDetector(window=3, idle_s=60)
    d.observe(timed(0, 20, model="seen"))
    d.seed([
        Baseline("p", "m", {"client": (1.0, 2.0, float("nan"), -4.0, 30.0, 40.0), "other": (5.0,)}, 10.0),
        Baseline("p", "seen", {"client": (900.0,) * 3}, 10.0),
    ])
    assert d.median("p", "m", "client") == 30.0  # 2, 30, 40: the newest three that make sense
    assert d.median("p", "seen", "client") == 20.0
    [m] = [b for b in d.baselines() if b.model == "m"]
    assert m.samples == {"client": (2.0, 30.0, 40.0)} and m.last_end_wall == 10.0


# -- aggregates and output -----------------------------------------------------------------------------------
def test_to_dict_is_json_ready_and_rounded() -> None:
    a = attribute(record(server={"received_ns": 10, "first_token_ns": 90, "last_token_ns": 270}),
                  render_lag_ms=1.23456)
    d = json.loads(json.dumps(a.to_dict()))
    assert d["total_ms"] == 300.0 and d["reporter"] == "llmchat serve"
    assert {p["key"] for p in d["parts"]} <= set(PARTS)
    assert all(set(p) == {"key", "name", "group", "ms", "source"} for p in d["parts"])
    assert d["after"][0]["ms"] == 1.235
    assert math.isclose(sum(d["shares"].values()), 1.0, abs_tol=1e-3)


def test_format_shares_orders_by_size_and_shows_flags() -> None:
    a = attribute(record(server={"received_ns": 10, "started_ns": 40, "first_token_ns": 90,
                                 "last_token_ns": 270}))
    line = format_shares(a)
    assert line.startswith("server 87% · network 12% · client 1%")
    assert line.endswith("[saturation]")
    assert format_shares(attribute(record(end=None))) == ""


def test_shares_over_and_part_samples_pool_several_requests() -> None:
    reported = attribute(record(server={"received_ns": 0, "first_token_ns": 80, "last_token_ns": 280}))
    silent = attribute(record(end=100.0, first=50.0))
    pooled = shares_over([reported, silent])
    total = reported.total_ms + silent.total_ms
    assert math.isclose(pooled["server"], reported.group_ms()["server"] / total)
    assert math.isclose(pooled["network+server"], silent.group_ms()["network+server"] / total)
    assert math.isclose(sum(pooled.values()), 1.0)
    samples = part_samples([reported, silent])
    assert samples["decode"] == [2.0, 2.0] and samples["server_prefill"] == [80.0]
    assert shares_over([]) == {}


# -- Prometheus text -----------------------------------------------------------------------------------------
VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="Qwen/Qwen2.5-7B-Instruct"} 8.0
vllm:num_requests_running{model_name="other"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="Qwen/Qwen2.5-7B-Instruct"} 3.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="Qwen/Qwen2.5-7B-Instruct"} 0.42
vllm:gpu_cache_usage_perc{model_name="other"} 0.9
vllm:iteration_tokens_total_bucket{le="1.0",model_name="Qwen/Qwen2.5-7B-Instruct"} 3.0
vllm:num_requests_swapped{model_name="Qwen/Qwen2.5-7B-Instruct"} 0.0
"""

LLAMA_METRICS = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 1204
# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.25
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 1
"""


def test_vllm_metrics_sum_counts_over_models_and_take_the_fullest_cache() -> None:
    assert parse_server_metrics(VLLM_METRICS) == {
        "requests_running": 9.0, "requests_waiting": 3.0, "kv_cache_usage": 0.9,
    }


def test_llama_cpp_metrics() -> None:
    assert parse_server_metrics(LLAMA_METRICS) == {
        "kv_cache_usage": 0.25, "requests_running": 2.0, "requests_waiting": 1.0,
    }


def test_vllm_v1_cache_name_and_the_local_servers_names() -> None:
    text = ("vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.5 1712345678000\n"
            "llmchat_local:requests_waiting 2\nllmchat_local:requests_running 1\n")
    assert parse_server_metrics(text) == {
        "kv_cache_usage": 0.5, "requests_waiting": 2.0, "requests_running": 1.0,
    }


@pytest.mark.parametrize(
    "text",
    [
        "",
        "# only comments\n# TYPE vllm:num_requests_waiting gauge\n",
        "vllm:num_requests_waiting\n",  # no value
        "vllm:num_requests_waiting{model_name=\"a\"\n",  # labels never closed
        "vllm:num_requests_waiting{model_name=\"a\"} lots\n",
        "vllm:num_requests_waiting NaN\nvllm:num_requests_running +Inf\n",
        "<html>not metrics</html>\n",
        "vllm:num_requests_waiting{} \n",
    ],
)
def test_unreadable_metrics_are_skipped(text: str) -> None:
    assert parse_server_metrics(text) == {}


def test_label_values_may_hold_braces_spaces_and_escaped_quotes() -> None:
    text = 'vllm:num_requests_waiting{model_name="a } b \\" {c}"} 4\n'
    assert parse_server_metrics(text) == {"requests_waiting": 4.0}


# -- the JSON fast path --------------------------------------------------------------------------------------
def test_wire_loads_decodes_what_the_stdlib_does_even_where_orjson_refuses() -> None:
    assert wire.loads(b'{"a": [1, 2.5, "caf\\u00e9"]}') == {"a": [1, 2.5, "café"]}
    # orjson refuses NaN and lone surrogate escapes; the stdlib accepts them and so must the client.
    assert math.isnan(wire.loads('{"x": NaN}')["x"])
    assert wire.loads('"\\ud800"') == "\ud800"
    with pytest.raises(ValueError):
        wire.loads(b"{not json")
    delta = wire.parse_chunk('{"choices":[{"delta":{"content":"hi"}}],"timings":{"prompt_ms":NaN}}')
    assert delta.content == "hi" and delta.timings == pytest.approx({"prompt_ms": float("nan")}, nan_ok=True)
