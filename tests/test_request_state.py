"""What the state line says, from a TimingRecord with stamps set by hand and a fixed clock: every state, the
reasons in words, the countdown, and how the line shortens to a width (tui/request_state.py, tui/fit.py)."""

from __future__ import annotations

import math

import pytest

from llmchat.core import Bus, RateLimitHeld, RequestStarted, RetryEvent, RetryPlanned, TimingRecord
from llmchat.core.policy import ProviderLimiter
from llmchat.tui.fit import fit
from llmchat.tui.request_state import Held, RequestWatch, Retry, describe, retry_reason

S = 1_000_000_000
T0 = 10 * S


def _record(mode: str = "stream") -> TimingRecord:
    return TimingRecord(mode=mode, model="llmchat-local", t0_ns=T0)


def _event(reason: str = "429", status: int | None = 429, wait_s: float = 45.0,
           source: str = "retry-after-ms", attempt: int = 2) -> RetryEvent:
    return RetryEvent(attempt=attempt, max_attempts=4, reason=reason, status=status, wait_s=wait_s,
                      wait_source=source, error="x")


def test_waiting_counts_up_from_the_request_start_and_names_what_it_waits_for() -> None:
    r = _record()
    assert describe(r, T0 + S // 2, stall_s=3).plain == "waiting for the first token · 0.5 s"
    assert describe(_record("batch"), T0 + 5 * S, stall_s=30).plain == "waiting for the reply · 5.0 s"
    # Past stall_s the wait is a warning and says how to stop it.
    late = describe(r, T0 + 14 * S, stall_s=3, cancel_key="Ctrl+X")
    assert late.plain == "waiting for the first token · Ctrl+X cancels · 14.0 s"
    assert late.parts[0].style == "status.warning"


def test_streaming_shows_tokens_so_far_and_ttft_and_a_stall_after_stall_s() -> None:
    r = _record()
    r.first_token_ns, r.last_token_ns, r.content_chunks = T0 + S // 4, T0 + 2 * S, 42
    assert describe(r, T0 + 2 * S, stall_s=3).plain == "streaming · 42 tokens · TTFT 250 ms · 2.0 s"
    stalled = describe(r, T0 + 6 * S, stall_s=3)
    assert stalled.kind == "stalled"
    assert stalled.plain == "stalled: no token for 4 s · 42 tokens so far · Esc cancels · 6.0 s"


def test_a_rate_limit_counts_down_with_its_reason_in_words() -> None:
    r = _record()
    r.phases.headers_ns = T0 + S  # the 429's own headers, before the retry was planned
    retry = Retry(_event(), T0 + S)
    state = describe(r, T0 + 8 * S, stall_s=3, retry=retry)
    assert state.kind == "retry-wait"
    assert state.plain == ("server asked to wait 45 s (rate limited, HTTP 429) · retry 2 of 4 in 38 s · "
                           "Esc cancels · 8.0 s")
    assert "in 1.5 s" in describe(r, T0 + S + 43_500_000_000, stall_s=3, retry=retry).plain
    # The wait is over and the next attempt has no answer yet: retrying.
    after = describe(r, T0 + 47 * S, stall_s=3, retry=retry)
    assert after.plain == "retrying: attempt 2 of 4 · after rate limited (HTTP 429) · 47.0 s"
    # Its headers came: the retry is over, the request waits for its first token again.
    r.phases.headers_ns = T0 + 47 * S
    assert describe(r, T0 + 48 * S, stall_s=60, retry=retry).kind == "waiting"


def _hold(reason: str, wait_s: float) -> object:
    """A real hold of the client's limiter, for ``reason``: a 1-per-minute bucket spent, or a 429."""
    clock = [0.0]
    limiter = ProviderLimiter("p", rpm=1 if reason == "requests" else 0, tpm=100 if reason == "tokens" else 0,
                              clock=lambda: clock[0])
    if reason == "429":
        limiter.throttled({"retry-after": str(wait_s)})
    else:
        limiter.reserve(100 if reason == "tokens" else 1)
    hold = limiter.reserve(100 if reason == "tokens" else 1)
    assert hold.reason == reason and hold.wait_s > 0
    return hold


@pytest.mark.parametrize(("reason", "words"), [
    ("requests", "held: client rate limit (requests per minute)"),
    ("tokens", "held: client rate limit (tokens per minute)"),
    ("429", "held: the server asked to wait (HTTP 429)"),
])
def test_a_hold_of_the_clients_own_limiter_counts_down_to_the_send(reason: str, words: str) -> None:
    r = _record()
    hold = _hold(reason, 30.0)
    wait = float(hold.wait_s)  # type: ignore[attr-defined]
    state = describe(r, T0 + 2 * S, stall_s=3, held=Held(hold, T0))
    assert state.kind == "held"
    assert state.plain == f"{words} · sends in {math.ceil(wait - 2)} s · Esc cancels · 2.0 s"  # rounded up
    # Sent: the line waits for the first token again, and a retry announced later is shown as a retry.
    after = describe(r, T0 + int((wait + 0.5) * S), stall_s=600, held=Held(hold, T0))
    assert after.kind == "waiting"
    narrow = state.line(30).plain
    assert "sends in" in narrow and len(narrow) <= 30, narrow


@pytest.mark.parametrize(("event", "words"), [
    (_event("503", 503, source="backoff"), "server unavailable (HTTP 503)"),
    (_event("502", 502, source="backoff"), "bad gateway (HTTP 502)"),
    (_event("599", 599, source="backoff"), "server error (HTTP 599)"),
    (_event("connect", None, source="backoff"), "could not connect"),
    (_event("goaway", None, wait_s=0.0, source="immediate"),
     "the server is closing the connection (HTTP/2 GOAWAY)"),
])
def test_every_retry_reason_reads_as_words(event: RetryEvent, words: str) -> None:
    assert retry_reason(event) == words
    assert "backoff" not in describe(_record(), T0, stall_s=3, retry=Retry(event, T0)).plain


def test_a_backoff_says_the_reason_not_that_the_server_asked() -> None:
    state = describe(_record(), T0 + S, stall_s=3, retry=Retry(_event("503", 503, 1.3, "backoff"), T0))
    assert state.plain == "server unavailable (HTTP 503) · retry 2 of 4 in 0.3 s · Esc cancels · 1.0 s"


def test_thinking_and_a_stall_while_thinking() -> None:
    r = _record()
    r.phases.headers_ns = T0 + S // 10
    assert describe(r, T0 + 2 * S, stall_s=3, reasoning_chars=1204, reasoning_quiet_s=0.5).plain == (
        "thinking · 1,204 characters of reasoning · 2.0 s")
    quiet = describe(r, T0 + 9 * S, stall_s=3, reasoning_chars=1204, reasoning_quiet_s=5)
    assert quiet.kind == "stalled" and quiet.plain.startswith("stalled: no reasoning for 5 s")


def test_from_cache() -> None:
    r = _record()
    r.cache_hit, r.content_chunks = True, 12
    assert describe(r, T0 + S // 100, stall_s=3).plain == "from cache · 12 tokens · 0.0 s"


@pytest.mark.parametrize("width", [100, 72, 56, 40, 30])
def test_the_line_shortens_to_its_width_and_keeps_the_countdown(width: int) -> None:
    r = _record()
    state = describe(r, T0 + 8 * S, stall_s=3, retry=Retry(_event(), T0 + S))
    line = state.line(width).plain
    assert len(line) <= width and "retry 2 of 4 in 38 s" in line, line
    if width >= 72:
        assert line.startswith("server asked to wait 45 s (rate limited"), line
    if width >= 56:
        assert "HTTP 429" in line or "rate limited" in line, line


def test_fit_shortens_the_least_important_first_a_level_at_a_time() -> None:
    forms = [("alpha long", "alpha", ""), ("beta long", "beta", ""), ("gamma",)]

    def width(chosen: list[str]) -> int:
        return len(" ".join(c for c in chosen if c))

    assert fit(forms, width, 100) == ["alpha long", "beta long", "gamma"]
    assert fit(forms, width, 21) == ["alpha long", "beta", "gamma"]
    assert fit(forms, width, 16) == ["alpha", "beta", "gamma"]
    assert fit(forms, width, 12) == ["alpha", "", "gamma"]
    assert fit(forms, width, 1) == ["", "", "gamma"]  # the last resort of every part
    assert fit(forms, width, 21, importance=[1, 0, 2]) == ["alpha", "beta long", "gamma"]
    with pytest.raises(ValueError):
        fit([()], width, 10)


def test_the_watch_takes_the_request_of_its_messages_and_its_retries_from_the_bus() -> None:
    bus = Bus()
    messages = [{"role": "user", "content": "hi"}]
    watch = RequestWatch(stall_s=3, cancel_key="Esc", label="")
    stop = watch.follow(bus, messages=messages)
    other = TimingRecord(model="other")
    bus.publish(RequestStarted(other, [{"role": "user", "content": "hi"}]))  # equal, not the same list
    assert watch.record is None
    mine = TimingRecord(model="llmchat-local", mode="batch")
    bus.publish(RequestStarted(mine, messages))
    assert watch.record is mine
    bus.publish(RetryPlanned(other, _event()))
    assert watch.retry is None
    bus.publish(RetryPlanned(mine, _event()))
    assert watch.retry is not None and watch.retry.event.attempt == 2
    label, line = watch(mine.t0_ns + S, 200)
    assert label == "llmchat-local" and "retry 2 of 4" in line.plain
    bus.publish(RateLimitHeld(other, _hold("requests", 0)))
    assert watch.held is None
    bus.publish(RateLimitHeld(mine, _hold("requests", 0)))
    assert watch.held is not None and watch.held.hold.reason == "requests"
    assert "held: client rate limit" in watch.state(watch.held.started_ns + S).plain
    stop()
    assert not bus.wants(RequestStarted) and not bus.wants(RetryPlanned) and not bus.wants(RateLimitHeld)
