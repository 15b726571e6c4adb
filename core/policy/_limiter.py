"""The client-side rate limiter: per provider, a token bucket for requests and one for tokens, so bulk work
slows down before the provider's wall instead of running into a storm of 429s and waiting out the backoffs.

Each bucket starts from the config (``providers.NAME.rate_limit_rpm`` / ``rate_limit_tpm``: capacity, and a
refill of that much per minute) and is corrected by every reply's ``x-ratelimit-*`` headers: the provider's
limit becomes the capacity, and what the provider says remains (less what this process sent since the request
that reply answers) sets the level. A provider that says how long until it is full again (the reset) tells
the refill rate too: ``(limit - remaining) / reset``; the smallest of the recent such readings is kept, since
rounding (remaining is floored, the reset rounded up) can only make one reading too fast. A bucket that knows
no limit (none configured, none sent) never holds anything back.

A reply's count is noisy when requests went out together: they may reach the provider in another order,
which moves the reading either way by up to that many. Any reading lowers the level; only a clean one (no
other request sent within ``NEAR_S`` of it, as when the limiter paces them) raises it, to one request short
of it, bringing back what a burst's noisy readings took; the first reading sets it however noisy, as
cautiously as it can (every other request sent so far counted as not yet seen by the provider).

``reserve`` is synchronous and takes the request's share at once (a reservation, as in GCRA): it returns how
long the caller must wait before sending, so concurrent callers queue in order without a lock, and the wait
is known before it starts (the client publishes it, then sleeps it). A 429 drains the bucket and blocks it
for the server's Retry-After. Clocks: ``time.monotonic`` by default (a parameter, for tests).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from llmchat.core.observe import Headroom

__all__ = ["Hold", "ProviderLimiter", "RateLimits", "request_charge"]

#: Per minute: the unit of rate_limit_rpm / _tpm, and of a provider's limit when it says nothing of its reset.
_MINUTE_S = 60.0
#: How many recent rate readings the bucket keeps (their minimum is its rate).
_READINGS = 32
#: Requests sent closer together than this may reach the provider in either order.
NEAR_S = 0.05
#: How many recent reservations' send times are kept to tell that.
_SENDS = 64


def request_charge(body: bytes | None, max_tokens: int | None) -> int:
    """What a request counts against a tokens-per-minute limit, as OpenAI estimates it before the reply: about
    four bytes of prompt per token, plus the ``max_tokens`` asked for."""
    prompt = 0 if not body else math.ceil(len(body) / 4)
    return prompt + (max_tokens or 0)


class _Bucket:
    """One token bucket. ``capacity`` 0: no limit known, never holds."""

    __slots__ = ("capacity", "level", "stamp", "_readings", "_configured_rate", "taken")

    def __init__(self, per_minute: int, now: float) -> None:
        self.capacity = float(per_minute)
        self.level = float(per_minute)
        self.stamp = now
        self._configured_rate = per_minute / _MINUTE_S
        self._readings: deque[float] = deque(maxlen=_READINGS)
        self.taken = 0
        """Everything ever reserved: a reply's headers are corrected for what was taken after its request."""

    @property
    def rate(self) -> float:
        """Refill per second: the slowest recent reading from the headers, else the capacity per minute."""
        if self._readings:
            return min(self._readings)
        return self._configured_rate or self.capacity / _MINUTE_S

    def refill(self, now: float) -> None:
        if now > self.stamp:
            self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
            self.stamp = now

    def wait_s(self, amount: float) -> float:
        """Seconds until ``amount`` is in the bucket (refilled to ``stamp``); 0 when it is, or nothing is known.
        A request larger than the whole bucket waits for a full one, never forever."""
        if self.capacity <= 0:
            return 0.0
        # A cushion of NEAR_S of refill: the provider counts a request when its handler runs, which a busy
        # server does late for one request and not for the next, so two requests sent 1/rate apart can be
        # counted closer together than that.
        need = min(amount, self.capacity) + self.rate * NEAR_S - self.level
        return 0.0 if need <= 0 else need / max(self.rate, 1e-9)

    def correct(self, limit: int | None, remaining: int | None, reset_s: float | None, taken_after: int,
                now: float, counted_at: float | None = None, near: int = 0, before: int = 0,
                unit: float = 1.0) -> None:
        """Correct from a reply's headers. ``near``: how many other requests went out so close to this one
        that either may have reached the provider first (then the reading may be off by that many);
        ``before``: what was taken before the request, which the provider may not have counted yet either;
        ``unit``: what one request takes (1 request; its tokens), the margin a clean reading keeps."""
        learning = self.capacity <= 0
        if limit is not None and limit > 0:
            if limit != self.capacity:
                self._readings.clear()  # a new limit: the old readings measured another bucket
            self.capacity = float(limit)
            if remaining is not None and reset_s is not None and reset_s > 0 and limit > remaining:
                self._readings.append((limit - remaining) / reset_s)
        if remaining is None or self.capacity <= 0:
            return
        self.refill(now)
        # The provider floors what remains; the reset (time to full) says the fraction too: its level is
        # capacity - reset * rate, within [remaining, remaining + 1).
        level = float(remaining)
        if reset_s is not None and self.rate > 0:
            level = min(max(level, self.capacity - reset_s * self.rate), level + 1.0)
        # What this process reserved after the request is not in that count yet; and the provider counted
        # when the request arrived (about when it was sent, ``counted_at``), so it has refilled since.
        level -= taken_after
        if counted_at is not None and now > counted_at:
            # Less NEAR_S of it: the request reached the provider somewhat after it left, and a count taken
            # later than thought would make the bucket fuller than it is.
            level += max(0.0, now - counted_at - NEAR_S) * self.rate
        if learning:
            # Every other request sent so far may not be counted yet (they reach the provider in any order).
            self.level = min(self.capacity, level - before)
        elif level < self.level:
            self.level = level  # the provider has less than this process thought: another client, or drift
        elif near == 0:
            # A clean reading brings back what noisy ones took, one request short of it: a reply whose
            # request reached the provider late (a busy loop) reads fuller than the bucket is.
            self.level = min(self.capacity, max(self.level, level - unit))


@dataclass(frozen=True, slots=True)
class Hold:
    """One reservation: how long its request must wait before it goes out, and which limit made it wait
    (``"requests"``, ``"tokens"`` or ``"429"``: the provider said to back off). ``wait_s`` 0 is no hold."""

    provider: str
    wait_s: float
    reason: str
    tokens: int
    _requests_seq: int
    _tokens_seq: int
    _sent_at: float = 0.0
    """The limiter's clock when the request goes out (planned: reserved plus the wait; ``sent`` makes it
    the actual moment)."""

    def describe(self) -> str:
        """``client rate limit 1.2 s (requests)``: the status line and the bus event's text."""
        return f"client rate limit {self.wait_s:.1f} s ({self.reason})"


class ProviderLimiter:
    """The two buckets of one provider. Cheap when it knows no limit: ``reserve`` is then a few comparisons."""

    def __init__(self, provider: str, *, rpm: int = 0, tpm: int = 0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.provider = provider
        self._clock = clock
        now = clock()
        self.requests = _Bucket(rpm, now)
        self.tokens = _Bucket(tpm, now)
        self._blocked_until = 0.0
        self._observed = 0  # the reservation whose reply last corrected the buckets: older replies are stale
        self._sends: deque[float] = deque(maxlen=_SENDS)  # when the last reservations go out, by sequence
        self.holds = 0
        """How many reservations had to wait."""
        self.held_s = 0.0
        """Their planned waits, summed."""

    @property
    def active(self) -> bool:
        """Whether any limit is known (configured or learnt), so a reservation can wait."""
        return self.requests.capacity > 0 or self.tokens.capacity > 0 or self._blocked_until > 0

    def reserve(self, tokens: int = 0) -> Hold:
        """Take one request and ``tokens`` from the buckets now; the hold says how long to wait before
        sending. Never fails; a request the buckets cannot hold at all waits for full buckets."""
        now = self._clock()
        wait, reason = 0.0, "requests"
        if self.active:
            r, t = self.requests, self.tokens
            r.refill(now)
            t.refill(now)
            wait_r, wait_t = r.wait_s(1), t.wait_s(tokens)
            wait, reason = (wait_r, "requests") if wait_r >= wait_t else (wait_t, "tokens")
            blocked = self._blocked_until - now
            if blocked > wait:
                wait, reason = blocked, "429"
            if r.capacity > 0:
                r.level -= 1
            if t.capacity > 0:
                t.level -= tokens
        self.requests.taken += 1
        self.tokens.taken += tokens
        self._sends.append(now + wait)
        if wait > 0:
            self.holds += 1
            self.held_s += wait
        return Hold(self.provider, wait, reason, tokens, self.requests.taken, self.tokens.taken, now + wait)

    def sent(self, hold: Hold) -> Hold:
        """``hold`` as its request actually goes out (after its wait, which a busy loop can overrun): the
        moment its reply's count is reckoned from."""
        return dataclasses.replace(hold, _sent_at=self._clock())

    def release(self, hold: Hold) -> None:
        """Give back a reservation whose request never went out (cancelled during its hold)."""
        if self.requests.capacity > 0:
            self.requests.level = min(self.requests.capacity, self.requests.level + 1)
        if self.tokens.capacity > 0:
            self.tokens.level = min(self.tokens.capacity, self.tokens.level + hold.tokens)

    def observe(self, hold: Hold | None, headroom: Headroom) -> None:
        """Correct the buckets from a reply's headroom. ``hold`` is the reservation of the request the reply
        answers: what was reserved after it is not in the provider's count yet."""
        if hold is not None:
            if hold._requests_seq < self._observed:
                return  # a reply to an older request, overtaken by a newer one's count
            self._observed = hold._requests_seq
        now = self._clock()
        after_r = 0 if hold is None else self.requests.taken - hold._requests_seq
        after_t = 0 if hold is None else self.tokens.taken - hold._tokens_seq
        sent = None if hold is None else hold._sent_at
        near = 0 if hold is None else self._near(hold)
        before_r = 0 if hold is None else hold._requests_seq - 1
        before_t = 0 if hold is None else hold._tokens_seq - hold.tokens
        self.requests.correct(headroom.limit_requests, headroom.remaining_requests, headroom.reset_requests_s,
                              after_r, now, sent, near, before_r)
        self.tokens.correct(headroom.limit_tokens, headroom.remaining_tokens, headroom.reset_tokens_s,
                            after_t, now, sent, near, before_t, float(max(1, hold.tokens if hold else 1)))

    def _near(self, hold: Hold) -> int:
        """How many other kept reservations go out within NEAR_S of ``hold`` (many, when it is too old to tell)."""
        index = len(self._sends) - 1 - (self.requests.taken - hold._requests_seq)
        if index < 0:
            return _SENDS
        return sum(1 for i, t in enumerate(self._sends) if i != index and abs(t - hold._sent_at) < NEAR_S)

    def throttled(self, headers: Mapping[str, str]) -> None:
        """The provider answered 429: nothing is left, and nothing goes out before its Retry-After."""
        now = self._clock()
        for bucket in (self.requests, self.tokens):
            if bucket.capacity > 0:
                bucket.refill(now)
                bucket.level = min(bucket.level, 0.0)
        wait = _retry_after_s(headers)
        if wait is not None:
            self._blocked_until = max(self._blocked_until, now + wait)


def _retry_after_s(headers: Mapping[str, str]) -> float | None:
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            value = float(raw) * scale
        except ValueError:
            continue  # an HTTP date: the retry loop reads those; the bucket's drain is enough here
        if 0 <= value < 3600:
            return value
    return None


class RateLimits:
    """The limiters of one process (the app, a batch run, a bench), one per provider name, so every client of
    a provider shares its buckets. Sized from ``settings.providers.NAME.rate_limit_rpm`` / ``_tpm``."""

    def __init__(self, per_provider: Mapping[str, tuple[int, int]] | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._sizes = dict(per_provider or {})
        self._clock = clock
        self._limiters: dict[str, ProviderLimiter] = {}

    @classmethod
    def from_settings(cls, providers: Mapping[str, object]) -> RateLimits:
        """From ``Settings.providers``: each provider's (rate_limit_rpm, rate_limit_tpm)."""
        return cls({name: (int(getattr(p, "rate_limit_rpm", 0)), int(getattr(p, "rate_limit_tpm", 0)))
                    for name, p in providers.items()})

    def get(self, provider: str) -> ProviderLimiter:
        """The provider's limiter, made on first use (a provider not configured learns from headers alone)."""
        limiter = self._limiters.get(provider)
        if limiter is None:
            rpm, tpm = self._sizes.get(provider, (0, 0))
            limiter = self._limiters[provider] = ProviderLimiter(provider, rpm=rpm, tpm=tpm, clock=self._clock)
        return limiter

    def __iter__(self) -> Iterator[ProviderLimiter]:
        return iter(tuple(self._limiters.values()))
