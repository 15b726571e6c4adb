"""When to send a failed request again, how long to wait first, and the loop that does it (on tenacity).

``plan_retry`` is the decision, pure and testable on its own: retry or not, why, and for how long. The wait is
what the server asked for (``retry-after-ms``, then ``Retry-After``) or else full-jitter exponential backoff.
``call_with_retries`` runs a request through tenacity's ``AsyncRetrying`` with that decision, and hands each
planned retry to a callback *before* it sleeps, so what a UI shows ("retry 2/4 in 1.3 s (429, Retry-After)")
is exactly the wait that then happens.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import TypeVar

from tenacity import AsyncRetrying, RetryCallState, stop_after_attempt

from llmchat.core.config import RetrySettings
from llmchat.core.errors import APIError, DisconnectedError, LLMChatError, RateLimitError, ServerError

T = TypeVar("T")

__all__ = ["RetryEvent", "call_with_retries", "plan_retry"]

# 2 ** 62 times any sane base delay is far above any cap; the clamp only keeps the float from overflowing
# when someone sets max_attempts absurdly high.
_MAX_EXPONENT = 62


@dataclass(frozen=True, slots=True)
class RetryEvent:
    """One planned retry: which attempt comes next, why, and how long the loop waits before making it."""

    attempt: int
    """The number of the attempt about to be made, 2..max_attempts."""
    max_attempts: int
    reason: str
    """Short: "429", "503", "connect", "timeout_connect", "stale connection", "goaway" ..."""
    status: int | None
    wait_s: float
    wait_source: str
    """Where the wait came from: "retry-after-ms", "Retry-After", "backoff", "immediate" (stale conn.)."""
    error: str
    """The one-line message of the failure being retried."""

    def describe(self) -> str:
        """The status-bar line, e.g. ``retry 2/4 in 1.3 s (429, Retry-After)``; the wait rounded to 0.1 s."""
        counter = f"{self.attempt}/{self.max_attempts}"
        return f"retry {counter} in {self.wait_s:.1f} s ({self.reason}, {self.wait_source})"


def plan_retry(
    error: BaseException,
    *,
    attempt: int,
    settings: RetrySettings,
    waited_s: float,
    rng: random.Random,
    stale_retried: bool = False,
    now: datetime | None = None,
) -> RetryEvent | None:
    """Decide whether a request goes again after its attempt ``attempt`` (1-based) failed with ``error``.

    Returns the planned retry, or None for "do not retry": not an ``APIError``, not retryable, a body byte
    already reached the caller, ``settings.max_attempts`` spent, or the wait would take the waits of this
    request (``waited_s`` so far) past ``settings.total_budget_s``. A stale reused connection is retried at
    once the first time (``stale_retried`` says an immediate retry was already spent on this request).
    The server's wait (``retry-after-ms``, then ``Retry-After`` in seconds or as an HTTP date) is used when it
    is valid; otherwise full-jitter backoff drawn from ``rng``. ``now`` (aware; default the wall clock) only
    resolves HTTP dates and the time shown in a fail-fast message.

    Raises a fail-fast copy of ``error`` (``RateLimitError`` for 429, ``ServerError`` for 5xx, else the same
    class; not retryable) whose message says when to try again, when the server asks for a wait longer than
    ``settings.max_delay_s``. Reads no clock unless an HTTP date or a fail-fast message needs it.
    """
    if not isinstance(error, APIError) or not error.retryable or error.body_started:
        return None
    if attempt >= settings.max_attempts:
        return None

    reason = _reason(error)
    stale = isinstance(error, DisconnectedError) and error.reused
    if stale and not stale_retried:
        # The server closed an idle keep-alive connection (llama.cpp does after every stream), or said over
        # HTTP/2 that it never took the request (GOAWAY, REFUSED_STREAM): nothing is wrong with the server, so
        # the fresh connection goes out at once instead of after a backoff.
        wait_s, source = 0.0, "immediate"
    else:
        server_wait = _server_wait(error.headers, now)
        if server_wait is not None:
            wait_s, source = server_wait
            if wait_s > settings.max_delay_s:
                raise _fail_fast(error, wait_s, settings.max_delay_s, now) from error
        else:
            exponent = min(max(attempt - 1, 0), _MAX_EXPONENT)
            ceiling = min(settings.max_delay_s, settings.base_delay_s * 2**exponent)
            wait_s, source = rng.uniform(0.0, ceiling), "backoff"

    if waited_s + wait_s > settings.total_budget_s:
        return None
    return RetryEvent(
        attempt=attempt + 1,
        max_attempts=settings.max_attempts,
        reason=reason,
        status=error.status,
        wait_s=wait_s,
        wait_source=source,
        error=str(error),
    )


async def call_with_retries(
    send: Callable[[int], Awaitable[T]],
    settings: RetrySettings,
    *,
    on_retry: Callable[[RetryEvent], object] | None = None,
    rng: random.Random | None = None,
) -> T:
    """Return what ``send(1)`` returns, sending again as ``send(2)``, ``send(3)`` ... while plan_retry allows.

    Before each wait ``on_retry(event)`` is called (awaited when it returns an awaitable) with the very event
    whose ``wait_s`` is then slept. The final failure is raised as itself, not wrapped; when more than one
    attempt was made its message ends with ``(after N attempts)``. A fail-fast error from ``plan_retry`` and
    anything ``on_retry`` raises propagate as they are. ``asyncio.CancelledError`` is never retried and
    cancels a wait at once.
    """
    run = _Loop(settings, on_retry, rng if rng is not None else random.Random())

    async def one_attempt() -> T:
        run.attempt += 1
        return await send(run.attempt)

    retrying = AsyncRetrying(
        sleep=asyncio.sleep,
        retry=run.should_retry,
        wait=run.planned_wait,
        # plan_retry already stops at max_attempts; this is a second guard against the loop running on.
        stop=stop_after_attempt(max(settings.max_attempts, 1)),
        before_sleep=run.announce,
        reraise=True,
    )
    result: T = await retrying(one_attempt)
    return result


class _Loop:
    """The state one ``call_with_retries`` shares between tenacity's hooks: the plan made in ``retry=`` is the
    one ``wait=`` returns and ``before_sleep=`` announces."""

    def __init__(
        self, settings: RetrySettings, on_retry: Callable[[RetryEvent], object] | None, rng: random.Random
    ) -> None:
        self.settings = settings
        self.on_retry = on_retry
        self.rng = rng
        self.attempt = 0
        self.waited_s = 0.0
        self.stale_retried = False
        self.event: RetryEvent | None = None

    def should_retry(self, state: RetryCallState) -> bool:
        outcome = state.outcome
        if outcome is None or not outcome.failed:
            return False
        error = outcome.exception()
        if error is None:
            return False
        self.event = plan_retry(
            error,
            attempt=state.attempt_number,
            settings=self.settings,
            waited_s=self.waited_s,
            rng=self.rng,
            stale_retried=self.stale_retried,
        )
        if self.event is None:
            if state.attempt_number > 1 and isinstance(error, LLMChatError):
                # Mutated in place so the caller gets the very error (class, fields, traceback) it knows.
                error.args = (f"{error} (after {state.attempt_number} attempts)",)
            return False
        if self.event.wait_source == "immediate":
            self.stale_retried = True
        self.waited_s += self.event.wait_s
        return True

    def planned_wait(self, state: RetryCallState) -> float:
        return self.event.wait_s if self.event is not None else 0.0

    async def announce(self, state: RetryCallState) -> None:
        if self.on_retry is None or self.event is None:
            return
        outcome = self.on_retry(self.event)
        if inspect.isawaitable(outcome):
            await outcome


def _reason(error: APIError) -> str:
    if isinstance(error, DisconnectedError) and error.reused:
        return error.reason  # "stale connection", "goaway", "refused stream"
    if error.status is not None:
        return str(error.status)
    return error.kind


def _server_wait(headers: dict[str, str], now: datetime | None) -> tuple[float, str] | None:
    """The wait the server asked for and which header said so; None when neither header holds a valid one."""
    ms = _non_negative_float(headers.get("retry-after-ms"))
    if ms is not None:
        return ms / 1000.0, "retry-after-ms"
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = _non_negative_float(value)
    if seconds is not None:
        return seconds, "Retry-After"
    try:
        when = parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        # RFC 5322's "-0000" parses as naive; HTTP dates are GMT by definition.
        when = when.replace(tzinfo=UTC)
    current = now if now is not None else datetime.now(UTC)
    return max(0.0, (when - current).total_seconds()), "Retry-After"


def _non_negative_float(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value.strip())
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


def _fail_fast(error: APIError, wait_s: float, max_delay_s: float, now: datetime | None) -> APIError:
    cls: type[APIError] = type(error)
    if error.status == 429:
        target: type[APIError] = RateLimitError
        label = "rate limited (429)"
    elif error.status is not None and error.status >= 500:
        target, label = ServerError, f"server error ({error.status})"
    else:
        target = cls
        label = f"HTTP {error.status}" if error.status is not None else error.kind
    # Narrow to the specific class only when it is a subclass of what the caller may already catch.
    if issubclass(target, cls):
        cls = target
    local_now = (now if now is not None else datetime.now(UTC)).astimezone()
    at = local_now + timedelta(seconds=wait_s)
    shown = at.strftime("%H:%M:%S") if at.date() == local_now.date() else at.strftime("%Y-%m-%d %H:%M:%S")
    message = (
        f"{label}: the server asks to wait {_seconds(wait_s)} s, more than retry.max_delay_s = "
        f"{_seconds(max_delay_s)} s; try again after {shown} or raise retry.max_delay_s"
    )
    # Built without __init__: the subclasses take different required arguments (phase, reused, status), and
    # every field of the original (status, headers, partial_text ...) must survive into the copy.
    copy = cls.__new__(cls, message)
    copy.__dict__.update(error.__dict__)
    copy.args = (message,)
    copy.retryable = False
    return copy


def _seconds(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")
