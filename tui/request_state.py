"""What a request in flight is doing, in words: the state line under a pending reply, and the HUD's live line.

Read on a ticker (at most 10 times a second), never per token. Everything comes from the request's own
``TimingRecord``, which the engine fills in as the request runs (first and last token, chunks so far, the
cache hit, the last attempt's response headers), and from the retry the bus announced last: a request costs
this module nothing while its tokens stream.

The states, in the order a request can pass through them: waiting for the first token (or, in batch mode, for
the reply), thinking (reasoning deltas before the answer), streaming, stalled (no token for ``stall_s``),
waiting to retry (with the reason in words and a countdown), retrying (the wait is over and the next attempt
has no answer yet), held (the client's own rate limiter keeps an attempt back, with a countdown), and from
cache.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rich.cells import cell_len
from rich.text import Text

from llmchat.core import Bus, RateLimitHeld, RequestStarted, RetryPlanned, TimingRecord
from llmchat.tui.fit import fit

_NS_PER_S = 1_000_000_000
_SEP = " · "

Kind = Literal["sending", "waiting", "thinking", "streaming", "stalled", "retry-wait", "retrying", "held", "cached"]

#: What an HTTP status a retry follows means, in words.
_STATUS_WORDS = {
    408: "request timeout", 409: "conflict", 425: "too early", 429: "rate limited", 500: "server error",
    502: "bad gateway", 503: "server unavailable", 504: "gateway timeout", 529: "server overloaded",
}
#: The retry reasons that are not statuses (``RetryEvent.reason``), in words.
_REASON_WORDS = {
    "connect": "could not connect",
    "timeout_connect": "connecting timed out",
    "timeout_pool": "no free connection in time",
    "stale connection": "the server had closed the idle connection",
    "goaway": "the server is closing the connection (HTTP/2 GOAWAY)",
    "refused stream": "the server refused the stream",
}
_SERVER_ASKED = ("retry-after-ms", "Retry-After")
#: Why the client's limiter holds a request (``Hold.reason``), in words.
_HOLD_WORDS = {
    "requests": "client rate limit (requests per minute)",
    "tokens": "client rate limit (tokens per minute)",
    "429": "the server asked to wait (HTTP 429)",
}


@dataclass(frozen=True, slots=True)
class Retry:
    """A retry the bus announced: the ``RetryEvent`` and when it was planned (``perf_counter_ns``)."""

    event: Any
    planned_ns: int


@dataclass(frozen=True, slots=True)
class Held:
    """A hold the bus announced (``RateLimitHeld``): the limiter's ``Hold`` and when it began
    (``perf_counter_ns``)."""

    hold: Any
    started_ns: int


@dataclass(frozen=True, slots=True)
class Part:
    """One piece of a state line: its forms, from the one wanted to the last resort ("" drops it)."""

    forms: tuple[str, ...]
    style: str = "status.live"
    rank: int = 1
    """How much it matters: 0 is kept whatever the width; higher ranks are shortened first."""
    hint: bool = False
    """It names a key (``Esc cancels``): the HUD, where no key applies, leaves it out."""


@dataclass(frozen=True, slots=True)
class State:
    """What the request is doing as of one moment: its kind, the parts that say it, and the time elapsed."""

    kind: Kind
    parts: tuple[Part, ...]
    elapsed_s: float
    elapsed_rank: int = 0
    """How much the elapsed time matters here: 0 keeps it; a countdown says more while a retry waits."""

    @property
    def plain(self) -> str:
        """The whole line at any width (every part's first form), elapsed time last."""
        return _SEP.join([*(p.forms[0] for p in self.parts), seconds(self.elapsed_s)])

    def pieces(self, width: int, *, elapsed: bool = True, hints: bool = True) -> list[tuple[str, str]]:
        """The parts fitted to ``width`` cells, as (text, style name) in their order: shortened (least
        important first) until they fit. ``elapsed`` adds the time since the request started, last;
        ``hints`` keeps the parts that name a key (``Esc cancels``)."""
        parts = [p for p in self.parts if hints or not p.hint]
        if elapsed:
            shown = seconds(self.elapsed_s)
            parts.append(Part((shown, "") if self.elapsed_rank else (shown,), rank=self.elapsed_rank))
        importance = sorted(range(len(parts)), key=lambda i: parts[i].rank)
        chosen = fit([p.forms for p in parts], _width, width, importance=importance)
        return [(form, part.style) for part, form in zip(parts, chosen, strict=True) if form]

    def line(self, width: int, *, elapsed: bool = True) -> Text:
        """The state line ``width`` cells wide (``pieces``), cut with an ellipsis if even that is too long."""
        text = Text(end="", no_wrap=True, overflow="ellipsis")
        for form, style in self.pieces(width, elapsed=elapsed):
            if text:
                text.append(_SEP, "status.live")
            text.append(form, style)
        text.truncate(width, overflow="ellipsis")
        return text


def _width(texts: Sequence[str]) -> int:
    shown = [t for t in texts if t]
    return sum(cell_len(t) for t in shown) + len(_SEP) * max(0, len(shown) - 1)


def seconds(value: float) -> str:
    """A duration as the state line shows it: ``3.2 s`` under a minute, ``75 s`` after."""
    return f"{value:.1f} s" if value < 60 else f"{value:.0f} s"


def _countdown(value: float) -> str:
    # Rounded up: "in 0 s" while the wait is still on would be a lie.
    return f"{value:.1f} s" if value < 10 else f"{math.ceil(value)} s"


def _wait(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".") + " s"


def retry_reason(event: Any) -> str:
    """Why a retry happens, in words: ``rate limited (HTTP 429)``, ``could not connect``."""
    status = event.status
    if status is not None:
        words = _STATUS_WORDS.get(status, "server error" if status >= 500 else "error")
        return f"{words} (HTTP {status})"
    return str(_REASON_WORDS.get(event.reason, event.reason))


def describe(
    record: TimingRecord | None,
    now_ns: int,
    *,
    stall_s: float,
    cancel_key: str = "Esc",
    retry: Retry | None = None,
    held: Held | None = None,
    reasoning_chars: int = 0,
    reasoning_quiet_s: float = 0.0,
    since_ns: int | None = None,
) -> State:
    """The state of the request behind ``record`` at ``now_ns`` (``perf_counter_ns``).

    ``retry`` is the last retry announced for it, ``held`` the last hold of the client's rate limiter;
    ``reasoning_chars`` how much reasoning has come (before the
    answer) and ``reasoning_quiet_s`` how long since it last grew; ``since_ns`` when the reply was asked for,
    used while there is no record yet (batch mode opens its record inside the client).
    """
    cancel = Part((f"{cancel_key} cancels", ""), rank=2, hint=True)
    if record is None:
        elapsed = 0.0 if since_ns is None else (now_ns - since_ns) / _NS_PER_S
        return State("sending", (Part(("sending",), rank=0),), max(0.0, elapsed))
    elapsed = max(0.0, (now_ns - record.t0_ns) / _NS_PER_S)
    tokens = record.content_chunks
    if record.cache_hit:
        parts = [Part(("from cache",), "status.cached", rank=0)]
        if tokens:
            parts.append(Part((f"{tokens:,} tokens",)))
        return State("cached", tuple(parts), elapsed)
    if held is not None and record.first_token_ns is None:
        left = (held.started_ns + int(float(held.hold.wait_s) * _NS_PER_S) - now_ns) / _NS_PER_S
        if left > 0:
            return _holding(held, left, elapsed, cancel)
    if retry is not None and record.first_token_ns is None and not _answered_after(record, retry.planned_ns):
        return _retrying(retry, now_ns, elapsed, cancel)
    if record.first_token_ns is None:
        if reasoning_chars:
            if reasoning_quiet_s >= stall_s:
                return State("stalled", (
                    Part((f"stalled: no reasoning for {reasoning_quiet_s:.0f} s", "stalled"),
                         "status.warning", rank=0),
                    Part((f"{reasoning_chars:,} characters of reasoning so far", ""), rank=3), cancel,
                ), elapsed)
            return State("thinking", (
                Part(("thinking",), rank=0),
                Part((f"{reasoning_chars:,} characters of reasoning", ""), rank=3),
            ), elapsed)
        what = "waiting for the first token" if record.mode == "stream" else "waiting for the reply"
        short = "waiting"
        parts = [Part((what, short), "status.warning" if elapsed >= stall_s else "status.live", rank=0)]
        if elapsed >= stall_s:
            parts.append(cancel)
        return State("waiting", tuple(parts), elapsed)
    last = record.last_token_ns or record.first_token_ns
    quiet = (now_ns - last) / _NS_PER_S
    so_far = f"{tokens:,} token{'' if tokens == 1 else 's'}"
    if quiet >= stall_s:
        return State("stalled", (
            Part((f"stalled: no token for {quiet:.0f} s", "stalled"), "status.warning", rank=0),
            Part((f"{so_far} so far", so_far, ""), rank=1), cancel,
        ), elapsed)
    parts = [Part(("streaming",), rank=0), Part((so_far,), rank=1)]
    if record.ttft_ms is not None:
        parts.append(Part((f"TTFT {record.ttft_ms:.0f} ms", ""), rank=3))
    return State("streaming", tuple(parts), elapsed)


def _answered_after(record: TimingRecord, planned_ns: int) -> bool:
    # The attempt after the wait got its response headers: the retry is over. The failed attempt's own
    # headers (a 429) came before the retry was planned.
    headers = record.phases.headers_ns
    return headers is not None and headers > planned_ns


def _retrying(retry: Retry, now_ns: int, elapsed: float, cancel: Part) -> State:
    event = retry.event
    why = retry_reason(event)
    attempt = f"{event.attempt} of {event.max_attempts}"
    left = (retry.planned_ns + int(float(event.wait_s) * _NS_PER_S) - now_ns) / _NS_PER_S
    if left <= 0:
        return State("retrying", (
            Part((f"retrying: attempt {attempt}", f"attempt {attempt}"), "status.warning", rank=0),
            Part((f"after {why}", ""), rank=3),
        ), elapsed)
    if event.wait_source in _SERVER_ASKED:
        asked = f"server asked to wait {_wait(event.wait_s)}"
        words = why.partition(" (")[0]
        both = f"{words}, HTTP {event.status}" if event.status is not None else words
        reason = Part((f"{asked} ({both})", f"{asked} ({words})", why, ""), "status.warning", rank=1)
    else:
        reason = Part((why, ""), "status.warning", rank=1)
    countdown = Part((f"retry {attempt} in {_countdown(left)}",), "status.warning", rank=0)
    return State("retry-wait", (reason, countdown, cancel), elapsed, elapsed_rank=3)


def _holding(held: Held, left: float, elapsed: float, cancel: Part) -> State:
    # The request has not gone out: the wait is the client's own, so the line says whose and why, and the
    # countdown is to the moment it is sent.
    reason = str(held.hold.reason)
    words = _HOLD_WORDS.get(reason, f"client rate limit ({reason})")
    why = Part((f"held: {words}", "held: client rate limit" if reason != "429" else "held: HTTP 429", "held"),
               "status.warning", rank=1)
    countdown = Part((f"sends in {_countdown(left)}",), "status.warning", rank=0)
    return State("held", (why, countdown, cancel), elapsed, elapsed_rank=3)


class RequestWatch:
    """The request behind one pending reply, followed on the bus for its retries; ``state(now_ns)`` says
    what it is doing. Make one per reply, ``follow`` the bus, and call the function it returns at the end.

    ``label`` is what the reply is labelled with (the model) until the request names its own.
    """

    def __init__(self, *, stall_s: float, cancel_key: str, label: str = "") -> None:
        self.stall_s = stall_s
        self.cancel_key = cancel_key
        self.label = label
        self.record: TimingRecord | None = None
        """The request's record, once known (a stream has it at once; batch mode's comes with its start)."""
        self.retry: Retry | None = None
        self.held: Held | None = None
        self._since_ns = time.perf_counter_ns()
        self._reasoning: Callable[[], str] | None = None
        self._reasoning_chars = 0
        self._reasoning_grew_ns = self._since_ns

    def follow(self, bus: Bus, *, record: TimingRecord | None = None,
               messages: object = None) -> Callable[[], None]:
        """Watch ``record``, or the request that starts with exactly the ``messages`` list (batch mode);
        returns the function that stops listening to ``bus``."""
        if record is not None:
            self.record = record

        def started(event: RequestStarted) -> None:
            if self.record is None and messages is not None and event.messages is messages:
                self.record = event.record

        def planned(event: RetryPlanned) -> None:
            if event.record is self.record:
                self.retry = Retry(event.event, time.perf_counter_ns())

        def holding(event: RateLimitHeld) -> None:
            if event.record is self.record:
                self.held = Held(event.hold, time.perf_counter_ns())

        offs = [bus.subscribe(RequestStarted, started), bus.subscribe(RetryPlanned, planned),
                bus.subscribe(RateLimitHeld, holding)]

        def stop() -> None:
            for off in offs:
                off()

        return stop

    def reasoning_from(self, source: Callable[[], str]) -> None:
        """Where the reasoning received so far can be read (``ChatStream.reasoning``), for "thinking"."""
        self._reasoning = source

    def state(self, now_ns: int) -> State:
        """What the request is doing at ``now_ns``."""
        record = self.record
        if self._reasoning is not None and record is not None and record.first_token_ns is None:
            # Read only until the answer starts: the reasoning is joined from its pieces on each read.
            chars = len(self._reasoning())
            if chars != self._reasoning_chars:
                self._reasoning_chars, self._reasoning_grew_ns = chars, now_ns
        return describe(
            record, now_ns, stall_s=self.stall_s, cancel_key=self.cancel_key, retry=self.retry, held=self.held,
            reasoning_chars=self._reasoning_chars,
            reasoning_quiet_s=(now_ns - self._reasoning_grew_ns) / _NS_PER_S, since_ns=self._since_ns,
        )

    def __call__(self, now_ns: int, width: int) -> tuple[str, Text]:
        """The reply's label and its state line ``width`` cells wide (what ``ChatMessage.follow`` reads)."""
        record = self.record
        if record is not None and record.model:
            self.label = record.model
        return self.label, self.state(now_ns).line(width)


__all__ = ["Held", "Part", "RequestWatch", "Retry", "State", "describe", "retry_reason", "seconds"]
