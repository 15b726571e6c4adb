"""The retry decision (plan_retry) and the retry loop (call_with_retries).

The ``send`` coroutines below are the loop's input, not transport mocks: they stand for one attempt of a
request and fail or succeed as each test needs. The end-to-end runs against the local server live with the
client's tests.
"""

from __future__ import annotations

import asyncio
import random
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmchat.core.config._settings import RetrySettings
from llmchat.core.errors import (
    APIError,
    AuthError,
    CancelledByUser,
    ConnectError,
    DisconnectedError,
    HTTPStatusError,
    NotFoundError,
    ProtocolError,
    RateLimitError,
    ServerError,
    StreamCutError,
    TimeoutError,
    TLSError,
)
from llmchat.core.policy._retry import RetryEvent, call_with_retries, plan_retry

DEFAULTS = RetrySettings()
NOW = datetime(2030, 6, 1, 12, 0, 0, tzinfo=UTC)


def http(status: int, **headers: str) -> HTTPStatusError:
    return HTTPStatusError(f"server said {status}", status=status, headers=headers)


def plan(
    error: BaseException,
    *,
    attempt: int = 1,
    retry: RetrySettings = DEFAULTS,
    waited_s: float = 0.0,
    seed: int = 7,
    stale_retried: bool = False,
) -> RetryEvent | None:
    return plan_retry(
        error,
        attempt=attempt,
        settings=retry,
        waited_s=waited_s,
        rng=random.Random(seed),
        stale_retried=stale_retried,
        now=NOW,
    )


# -- plan_retry: what is retried --


@pytest.mark.parametrize("status", [400, 401, 403, 404, 405, 413, 422, 451, 499])
def test_client_errors_other_than_408_409_429_are_not_retried(status: int) -> None:
    assert plan(http(status)) is None


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 504, 529, 599])
def test_408_409_429_and_every_5xx_are_retried_with_the_status_as_reason(status: int) -> None:
    error = http(status)
    event = plan(error)
    assert event is not None
    assert (event.attempt, event.max_attempts) == (2, 4)
    assert event.reason == str(status)
    assert event.status == status
    assert event.wait_source == "backoff"
    assert event.error == str(error)


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (ConnectError("connection refused by 127.0.0.1:9"), "connect"),
        (TimeoutError("connect timed out", phase="connect"), "timeout_connect"),
        (TimeoutError("no free connection", phase="pool"), "timeout_pool"),
        (RateLimitError("rate limited", status=429), "429"),
        (ServerError("bad gateway", status=502), "502"),
    ],
)
def test_retryable_error_classes(error: APIError, reason: str) -> None:
    event = plan(error)
    assert event is not None
    assert event.reason == reason


@pytest.mark.parametrize(
    "error",
    [
        TLSError("certificate verify failed"),
        TimeoutError("read timed out", phase="read"),
        TimeoutError("write timed out", phase="write"),
        DisconnectedError("server disconnected", reused=False),
        ProtocolError("an HTML page instead of JSON"),
        StreamCutError("connection dropped mid-reply"),
        CancelledByUser("stopped"),
        AuthError("bad key", status=401),
        NotFoundError("no such model", status=404),
        APIError("something else"),
        ValueError("not an API error"),
        asyncio.CancelledError(),
        KeyboardInterrupt(),
    ],
    ids=lambda e: type(e).__name__ + "-" + str(getattr(e, "phase", getattr(e, "reused", ""))),
)
def test_non_retryable_errors(error: BaseException) -> None:
    assert plan(error) is None


def test_x_should_retry_true_makes_a_400_retryable() -> None:
    event = plan(http(400, **{"x-should-retry": "true"}))
    assert event is not None
    assert event.reason == "400"


def test_x_should_retry_false_stops_a_503() -> None:
    assert plan(http(503, **{"X-Should-Retry": "false"})) is None


@pytest.mark.parametrize(
    "error",
    [
        HTTPStatusError("503", status=503, body_started=True),
        ConnectError("refused", body_started=True),
        DisconnectedError("closed", reused=True, body_started=True),
        HTTPStatusError("400", status=400, headers={"x-should-retry": "true"}, body_started=True),
    ],
)
def test_nothing_is_retried_once_the_body_has_started(error: APIError) -> None:
    assert plan(error) is None


def test_max_attempts_1_means_no_retry() -> None:
    assert plan(http(503), retry=RetrySettings(max_attempts=1)) is None
    assert plan(DisconnectedError("closed", reused=True), retry=RetrySettings(max_attempts=1)) is None


def test_attempts_stop_at_max_attempts() -> None:
    last = plan(http(503), attempt=3)
    assert last is not None and last.attempt == 4
    assert plan(http(503), attempt=4) is None


def test_a_stale_reused_connection_is_retried_at_once_the_first_time() -> None:
    event = plan(DisconnectedError("server disconnected without sending a response", reused=True))
    assert event is not None
    assert (event.wait_s, event.wait_source, event.reason) == (0.0, "immediate", "stale connection")
    assert event.describe() == "retry 2/4 in 0.0 s (stale connection, immediate)"

    again = plan(DisconnectedError("closed again", reused=True), attempt=2, stale_retried=True)
    assert again is not None
    assert again.wait_source == "backoff"
    assert again.reason == "stale connection"


@pytest.mark.parametrize("reason", ["goaway", "refused stream"])
def test_a_request_the_server_did_not_take_goes_again_at_once_with_its_reason(reason: str) -> None:
    # HTTP/2 says so outright (a GOAWAY's last stream below it, or REFUSED_STREAM): no backoff for a server
    # that is only retiring a connection.
    event = plan(DisconnectedError("not processed", reused=True, reason=reason))
    assert event is not None
    assert (event.wait_s, event.wait_source, event.reason) == (0.0, "immediate", reason)
    assert event.describe() == f"retry 2/4 in 0.0 s ({reason}, immediate)"


# -- plan_retry: how long --


def test_retry_after_ms_wins_over_retry_after() -> None:
    event = plan(http(429, **{"retry-after-ms": "250", "retry-after": "7"}))
    assert event is not None
    assert (event.wait_s, event.wait_source) == (0.25, "retry-after-ms")


def test_retry_after_in_seconds() -> None:
    event = plan(http(429, **{"Retry-After": "7"}))
    assert event is not None
    assert (event.wait_s, event.wait_source) == (7.0, "Retry-After")
    assert event.describe() == "retry 2/4 in 7.0 s (429, Retry-After)"


def test_retry_after_as_a_future_http_date() -> None:
    when = format_datetime(NOW + timedelta(seconds=20), usegmt=True)
    event = plan(http(503, **{"retry-after": when}))
    assert event is not None
    assert event.wait_source == "Retry-After"
    assert event.wait_s == pytest.approx(20.0)


def test_retry_after_as_a_past_http_date_means_now() -> None:
    when = format_datetime(NOW - timedelta(minutes=5), usegmt=True)
    event = plan(http(503, **{"retry-after": when}))
    assert event is not None
    assert (event.wait_s, event.wait_source) == (0.0, "Retry-After")


def test_retry_after_http_date_uses_the_wall_clock_by_default() -> None:
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    event = plan_retry(
        http(429, **{"retry-after": when}), attempt=1, settings=DEFAULTS, waited_s=0.0, rng=random.Random(1)
    )
    assert event is not None
    # HTTP dates have whole seconds, so the wait is within a second of 30 (and the test takes far less).
    assert 28.0 < event.wait_s <= 30.0


@pytest.mark.parametrize(
    "headers",
    [
        {"retry-after-ms": "soon"},
        {"retry-after-ms": "-5"},
        {"retry-after-ms": "nan"},
        {"retry-after-ms": "inf"},
        {"retry-after": "tomorrow"},
        {"retry-after": "-3"},
        {"retry-after": ""},
        {"retry-after": "Mon, 99 Foo 2030 99:99:99 GMT"},
    ],
)
def test_invalid_wait_headers_fall_back_to_backoff(headers: dict[str, str]) -> None:
    event = plan(http(429, **headers))
    assert event is not None
    assert event.wait_source == "backoff"
    assert 0.0 <= event.wait_s <= DEFAULTS.base_delay_s


def test_an_invalid_retry_after_ms_falls_through_to_a_valid_retry_after() -> None:
    event = plan(http(429, **{"retry-after-ms": "later", "retry-after": "3"}))
    assert event is not None
    assert (event.wait_s, event.wait_source) == (3.0, "Retry-After")


def test_a_server_wait_above_the_cap_fails_fast_and_says_when_to_try_again() -> None:
    error = HTTPStatusError("server said 429", status=429, headers={"Retry-After": "300"}, partial_text="")
    with pytest.raises(RateLimitError) as caught:
        plan(error)
    fast = caught.value
    expected_time = (NOW + timedelta(seconds=300)).astimezone().strftime("%H:%M:%S")
    assert str(fast) == (
        "rate limited (429): the server asks to wait 300 s, more than retry.max_delay_s = 60 s; "
        f"try again after {expected_time} or raise retry.max_delay_s"
    )
    assert fast.status == 429
    assert fast.retryable is False
    assert fast.headers == {"retry-after": "300"}
    assert fast.__cause__ is error


def test_a_5xx_wait_above_the_cap_fails_fast_as_a_server_error() -> None:
    with pytest.raises(ServerError, match=r"server error \(503\).*retry\.max_delay_s = 10 s"):
        plan(http(503, **{"retry-after-ms": "90000"}), retry=RetrySettings(max_delay_s=10))


def test_a_fail_fast_copy_keeps_the_class_and_fields_of_a_non_http_error() -> None:
    error = TimeoutError("pool timeout", phase="pool", headers={"retry-after": "600"}, partial_text="so far")
    with pytest.raises(TimeoutError, match="retry.max_delay_s") as caught:
        plan(error)
    assert caught.value.phase == "pool"
    assert caught.value.partial_text == "so far"
    assert caught.value.retryable is False


def test_a_wait_that_would_exceed_the_budget_is_not_made() -> None:
    budget = RetrySettings(total_budget_s=10.0)
    assert plan(http(429, **{"retry-after": "4"}), waited_s=6.5, retry=budget) is None
    exactly = plan(http(429, **{"retry-after": "4"}), waited_s=6.0, retry=budget)
    assert exactly is not None and exactly.wait_s == 4.0


def test_a_backoff_draw_that_would_exceed_the_budget_is_not_made() -> None:
    tight = RetrySettings(total_budget_s=1.0, base_delay_s=100.0, max_delay_s=100.0)
    outcomes = []
    for seed in range(200):
        draw = random.Random(seed).uniform(0.0, 100.0)
        event = plan(http(503), retry=tight, seed=seed)
        assert (event is None) == (draw > 1.0)
        outcomes.append(event is None)
    # Both branches were exercised: some draws fit in the budget, most do not.
    assert any(outcomes) and not all(outcomes)


@pytest.mark.parametrize("attempt", [1, 2, 3, 4, 5, 6])
def test_full_jitter_stays_within_the_exponential_ceiling(attempt: int) -> None:
    retry = RetrySettings(max_attempts=10, base_delay_s=0.5, max_delay_s=4.0, total_budget_s=1000.0)
    ceiling = min(retry.max_delay_s, retry.base_delay_s * 2 ** (attempt - 1))
    rng = random.Random(attempt)
    waits = []
    for _ in range(400):
        event = plan_retry(http(503), attempt=attempt, settings=retry, waited_s=0.0, rng=rng)
        assert event is not None
        waits.append(event.wait_s)
    assert all(0.0 <= w <= ceiling for w in waits)
    assert len(set(waits)) > 300
    # The draws cover the whole range, so the ceiling really grows (and caps) as the attempts go on.
    assert max(waits) > 0.9 * ceiling
    assert min(waits) < 0.1 * ceiling


@settings(max_examples=200, deadline=None)
@given(
    status=st.sampled_from([408, 409, 429, 500, 503]),
    attempt=st.integers(min_value=1, max_value=2000),
    waited=st.floats(min_value=0, max_value=200),
    seed=st.integers(min_value=0, max_value=2**32),
    max_attempts=st.integers(min_value=1, max_value=5000),
)
def test_a_planned_wait_never_exceeds_the_cap_nor_the_budget(
    status: int, attempt: int, waited: float, seed: int, max_attempts: int
) -> None:
    retry = RetrySettings(max_attempts=max_attempts)
    event = plan_retry(
        http(status), attempt=attempt, settings=retry, waited_s=waited, rng=random.Random(seed)
    )
    if event is not None:
        assert 0.0 <= event.wait_s <= retry.max_delay_s
        assert waited + event.wait_s <= retry.total_budget_s
        assert event.attempt == attempt + 1 <= max_attempts


def test_describe_rounds_to_a_tenth_of_a_second() -> None:
    event = RetryEvent(
        attempt=2,
        max_attempts=4,
        reason="429",
        status=429,
        wait_s=1.26,
        wait_source="Retry-After",
        error="rate limited",
    )
    assert event.describe() == "retry 2/4 in 1.3 s (429, Retry-After)"
    backoff = RetryEvent(
        attempt=3,
        max_attempts=4,
        reason="503",
        status=503,
        wait_s=0.04,
        wait_source="backoff",
        error="unavailable",
    )
    assert backoff.describe() == "retry 3/4 in 0.0 s (503, backoff)"


# -- call_with_retries --


class Script:
    """A ``send`` that fails with the given errors in turn, then returns ``result``; it logs what happened."""

    def __init__(self, *failures: BaseException, result: str = "reply") -> None:
        self.failures = list(failures)
        self.result = result
        self.calls: list[int] = []
        self.log: list[tuple[str, int]] = []
        self.started_ns: list[int] = []

    async def __call__(self, attempt: int) -> str:
        self.started_ns.append(time.perf_counter_ns())
        self.calls.append(attempt)
        self.log.append(("send", attempt))
        await asyncio.sleep(0)
        if self.failures:
            raise self.failures.pop(0)
        return self.result


FAST = RetrySettings(max_attempts=4, base_delay_s=0.001, max_delay_s=0.01, total_budget_s=5.0)


async def test_success_after_two_failures_reports_each_retry_in_order() -> None:
    send = Script(http(503, **{"retry-after-ms": "1"}), http(429, **{"retry-after-ms": "2"}))
    events: list[RetryEvent] = []

    def on_retry(event: RetryEvent) -> None:
        events.append(event)
        send.log.append(("retry", event.attempt))

    result = await asyncio.wait_for(call_with_retries(send, FAST, on_retry=on_retry), timeout=5)

    assert result == "reply"
    assert send.calls == [1, 2, 3]
    assert [e.attempt for e in events] == [2, 3]
    assert [e.describe() for e in events] == [
        "retry 2/4 in 0.0 s (503, retry-after-ms)",
        "retry 3/4 in 0.0 s (429, retry-after-ms)",
    ]
    # Each retry is announced before the attempt it plans, as it happens.
    assert send.log == [("send", 1), ("retry", 2), ("send", 2), ("retry", 3), ("send", 3)]


async def test_an_async_on_retry_is_awaited_before_the_next_attempt() -> None:
    send = Script(ConnectError("refused"), ConnectError("refused"))
    seen: list[int] = []

    async def on_retry(event: RetryEvent) -> None:
        await asyncio.sleep(0)
        seen.append(event.attempt)
        send.log.append(("retry", event.attempt))

    assert await asyncio.wait_for(call_with_retries(send, FAST, on_retry=on_retry), timeout=5) == "reply"
    assert seen == [2, 3]
    assert send.log == [("send", 1), ("retry", 2), ("send", 2), ("retry", 3), ("send", 3)]


async def test_the_final_error_is_raised_as_itself_naming_the_attempts() -> None:
    errors = [http(503, **{"retry-after-ms": "1"}) for _ in range(4)]
    send = Script(*errors)
    with pytest.raises(HTTPStatusError) as caught:
        await asyncio.wait_for(call_with_retries(send, FAST), timeout=5)
    assert caught.value is errors[-1]
    assert type(caught.value) is HTTPStatusError
    assert str(caught.value) == "server said 503 (after 4 attempts)"
    assert caught.value.status == 503
    assert send.calls == [1, 2, 3, 4]


async def test_a_non_retryable_error_is_raised_after_one_call() -> None:
    error = http(400)
    send = Script(error)
    events: list[RetryEvent] = []
    with pytest.raises(HTTPStatusError) as caught:
        await asyncio.wait_for(call_with_retries(send, FAST, on_retry=events.append), timeout=5)
    assert caught.value is error
    assert str(caught.value) == "server said 400"
    assert send.calls == [1]
    assert events == []


async def test_a_non_api_exception_is_not_retried() -> None:
    send = Script(ValueError("bug"))
    with pytest.raises(ValueError, match="^bug$"):
        await asyncio.wait_for(call_with_retries(send, FAST), timeout=5)
    assert send.calls == [1]


async def test_a_retryable_failure_then_a_fatal_one_names_both_attempts() -> None:
    send = Script(ConnectError("refused"), http(404))
    with pytest.raises(HTTPStatusError, match=r"^server said 404 \(after 2 attempts\)$"):
        await asyncio.wait_for(call_with_retries(send, FAST), timeout=5)


async def test_a_wait_above_the_cap_fails_fast_without_retrying() -> None:
    send = Script(http(429, **{"retry-after": "3600"}))
    events: list[RetryEvent] = []
    with pytest.raises(RateLimitError, match="retry.max_delay_s"):
        await asyncio.wait_for(call_with_retries(send, DEFAULTS, on_retry=events.append), timeout=5)
    assert send.calls == [1]
    assert events == []


async def test_a_stale_connection_goes_out_again_at_once() -> None:
    send = Script(DisconnectedError("server disconnected without sending a response", reused=True))
    events: list[RetryEvent] = []
    result = await asyncio.wait_for(call_with_retries(send, DEFAULTS, on_retry=events.append), timeout=5)
    assert result == "reply"
    assert send.calls == [1, 2]
    assert [(e.wait_s, e.wait_source) for e in events] == [(0.0, "immediate")]


async def test_only_the_first_stale_connection_skips_the_backoff() -> None:
    stale = [DisconnectedError("closed", reused=True) for _ in range(3)]
    send = Script(*stale)
    events: list[RetryEvent] = []
    await asyncio.wait_for(call_with_retries(send, FAST, on_retry=events.append), timeout=5)
    assert [e.wait_source for e in events] == ["immediate", "backoff", "backoff"]


async def test_the_wait_budget_ends_the_retries() -> None:
    retry = RetrySettings(max_attempts=10, base_delay_s=0.001, max_delay_s=1.0, total_budget_s=0.05)
    send = Script(*[http(429, **{"retry-after-ms": "30"}) for _ in range(10)])
    events: list[RetryEvent] = []
    with pytest.raises(HTTPStatusError, match=r"\(after 2 attempts\)$"):
        await asyncio.wait_for(call_with_retries(send, retry, on_retry=events.append), timeout=5)
    assert send.calls == [1, 2]
    assert len(events) == 1


async def test_measured_sleeps_honour_the_planned_waits() -> None:
    send = Script(http(429, **{"retry-after-ms": "30"}), http(503), http(503))
    retry = RetrySettings(max_attempts=4, base_delay_s=0.02, max_delay_s=0.05, total_budget_s=5.0)
    events: list[RetryEvent] = []
    await asyncio.wait_for(
        call_with_retries(send, retry, on_retry=events.append, rng=random.Random(3)), timeout=5
    )
    gaps_s = [(b - a) / 1e9 for a, b in zip(send.started_ns, send.started_ns[1:], strict=False)]
    assert events[0].wait_s == 0.03
    assert gaps_s[0] >= 0.03
    # What was announced is what was slept, backoff draws included.
    for event, gap in zip(events, gaps_s, strict=True):
        assert gap >= event.wait_s


async def test_cancelling_during_a_wait_ends_promptly() -> None:
    retry = RetrySettings(max_attempts=4, max_delay_s=60.0, total_budget_s=120.0)
    send = Script(http(503, **{"retry-after-ms": "30000"}))
    announced = asyncio.Event()

    def on_retry(event: RetryEvent) -> None:
        assert event.wait_s == 30.0
        announced.set()

    task = asyncio.create_task(call_with_retries(send, retry, on_retry=on_retry))
    await asyncio.wait_for(announced.wait(), timeout=5)
    await asyncio.sleep(0)  # let the task reach its sleep
    started = time.perf_counter_ns()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, timeout=1.0)
    assert (time.perf_counter_ns() - started) / 1e9 < 1.0
    assert task.cancelled()
    assert send.calls == [1]


async def test_cancelling_during_an_attempt_is_not_retried() -> None:
    in_flight = asyncio.Event()
    calls: list[int] = []

    async def send(attempt: int) -> str:
        calls.append(attempt)
        in_flight.set()
        await asyncio.Event().wait()  # a reply that never comes
        return "unreachable"

    task = asyncio.create_task(call_with_retries(send, FAST))
    await asyncio.wait_for(in_flight.wait(), timeout=5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, timeout=1.0)
    assert task.cancelled()
    assert calls == [1]
