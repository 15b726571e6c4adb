"""The in-process bus: live events and finished records, from the engine to whoever listens.

Subscribers register per event type. Publishing to a type nobody listens to costs one dict lookup, so the
engine can publish per-chunk events without slowing anyone down who does not want them. Callbacks run
synchronously in the publisher's task and must be quick (hand work off with ``call_soon`` if it is not); a
callback that raises is logged and dropped from nothing else.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from llmchat.core.observe._timing import TimingRecord

log = logging.getLogger("llmchat.bus")

E = TypeVar("E")


@dataclass(frozen=True, slots=True)
class RequestStarted:
    record: TimingRecord
    messages: Sequence[Mapping[str, Any]] = ()
    """The chat messages sent (empty for embeddings): for logs that opt in to text, never for figures."""


@dataclass(frozen=True, slots=True)
class RetryPlanned:
    record: TimingRecord
    event: Any  # llmchat.core.policy._retry.RetryEvent; .describe() gives "retry 2/4 in 1.3 s (429, Retry-After)"


@dataclass(frozen=True, slots=True)
class RateLimitHeld:
    """The client's own rate limiter holds a request back before sending it: published as the wait starts."""

    record: TimingRecord
    hold: Any  # llmchat.core.policy._limiter.Hold; .describe() gives "client rate limit 1.2 s (requests)"


@dataclass(frozen=True, slots=True)
class FirstToken:
    record: TimingRecord


@dataclass(frozen=True, slots=True)
class Chunk:
    record: TimingRecord
    text: str
    arrived_ns: int


@dataclass(frozen=True, slots=True)
class RequestDone:
    record: TimingRecord
    text: str | None = None
    """The answer text that arrived, whole or up to a failure (None for embeddings): for opt-in text logs."""


@dataclass(frozen=True, slots=True)
class WarmupState:
    provider: str
    state: str  # cold | warming | warm | failed
    rtt_ms: float | None = None
    """The last ping: a round trip on the open connection (never one that had to open it)."""
    error: str | None = None
    setup_ms: float | None = None
    """What opening the connection cost (TCP connect and TLS), when warm-up opened one."""


@dataclass(frozen=True, slots=True)
class ServerMetricsSampled:
    """A scrape of a provider's /metrics (``ServerMetricsPoller``): the normalised gauges, or None and why."""

    provider: str
    metrics: Mapping[str, float] | None
    error: str | None = None


class Bus:
    """Typed publish/subscribe. ``subscribe(RequestDone, fn)`` returns a function that unsubscribes."""

    __slots__ = ("_subs",)

    def __init__(self) -> None:
        self._subs: dict[type, list[Callable[[Any], object]]] = {}

    def subscribe(self, kind: type[E], callback: Callable[[E], object]) -> Callable[[], None]:
        self._subs.setdefault(kind, []).append(callback)

        def unsubscribe() -> None:
            subs = self._subs.get(kind, [])
            if callback in subs:
                subs.remove(callback)
                if not subs:
                    del self._subs[kind]

        return unsubscribe

    def wants(self, kind: type) -> bool:
        """True when someone listens to ``kind``: lets a hot path skip building the event at all."""
        return kind in self._subs

    def publish(self, event: object) -> None:
        subs = self._subs.get(type(event))
        if not subs:
            return
        for callback in tuple(subs):
            try:
                callback(event)
            except Exception:  # a broken subscriber must not break the request that published
                log.exception("bus subscriber %r failed on %s", callback, type(event).__name__)
