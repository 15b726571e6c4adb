"""The local server's misbehaviour, on purpose: rate limits, cold starts, errors, drops and jitter.

Every die is a ``random.Random`` seeded from ``ServerSettings.seed``, so a sequence of requests meets the same
faults on every run (concurrent requests draw in arrival order, which the OS decides).
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RateDecision:
    """What the limiter said about one request; the numbers feed the x-ratelimit-* headers."""

    allowed: bool
    limit: int
    remaining: int
    reset_s: float
    """Seconds until the requests bucket is full again (OpenAI's x-ratelimit-reset-requests)."""
    token_limit: int = 0
    tokens_remaining: int = 0
    tokens_reset_s: float = 0.0
    """Seconds until the tokens bucket is full again (x-ratelimit-reset-tokens)."""
    retry_s: float = 0.0
    """Refused: seconds until this request would pass (Retry-After)."""
    exceeded: str = ""
    """Refused: which limit, "requests" or "tokens"."""


class RateLimiter:
    """Per key, ``limit`` requests and ``token_limit`` tokens per ``window_s``, as buckets that refill
    continuously (OpenAI's limits behave so: its reset headers are the time until the bucket is full again);
    0 is no limit of that kind. A request is charged its tokens (prompt plus max_tokens) as it arrives.

    Keys are digests of the bearer token (so no key is ever held in the clear); requests without a token share
    the bucket ``anonymous``.
    """

    def __init__(self, limit: int, window_s: float = 60.0, token_limit: int = 0) -> None:
        self.limit = limit
        self.token_limit = token_limit
        self.window_s = window_s
        # bucket -> [requests left, tokens left, when last refilled]
        self._state: dict[str, list[float]] = {}

    @property
    def active(self) -> bool:
        return self.limit > 0 or self.token_limit > 0

    @staticmethod
    def bucket(token: str | None) -> str:
        """The bucket name for a bearer token; never the token itself."""
        if not token:
            return "anonymous"
        return hashlib.sha256(token.encode()).hexdigest()[:16]

    def check(self, bucket: str, now: float, tokens: int = 0) -> RateDecision:
        """Count a request of ``tokens`` at ``now`` (seconds, monotonic) unless a bucket lacks room. Never
        fails; a request larger than the whole tokens bucket is let through a full one."""
        if not self.active:
            return RateDecision(True, 0, 0, 0.0)
        state = self._state.get(bucket)
        if state is None:
            state = self._state[bucket] = [float(self.limit), float(self.token_limit), now]
        elapsed = max(0.0, now - state[2])
        state[2] = max(state[2], now)
        per_s_r = self.limit / self.window_s
        per_s_t = self.token_limit / self.window_s
        state[0] = min(float(self.limit), state[0] + elapsed * per_s_r)
        state[1] = min(float(self.token_limit), state[1] + elapsed * per_s_t)
        need_t = min(tokens, self.token_limit)
        short_r = 1.0 - state[0] if self.limit > 0 else 0.0
        short_t = need_t - state[1] if self.token_limit > 0 else 0.0
        allowed = short_r <= 1e-9 and short_t <= 1e-9
        retry, exceeded = 0.0, ""
        if allowed:
            state[0] -= 1 if self.limit > 0 else 0
            state[1] -= need_t
        else:
            wait_r = short_r / per_s_r if short_r > 0 else 0.0
            wait_t = short_t / per_s_t if short_t > 0 else 0.0
            retry, exceeded = (wait_r, "requests") if wait_r >= wait_t else (wait_t, "tokens")
        return RateDecision(
            allowed,
            self.limit,
            max(0, math.floor(state[0] + 1e-9)),
            (self.limit - state[0]) / per_s_r if self.limit > 0 else 0.0,
            self.token_limit,
            max(0, math.floor(state[1] + 1e-9)),
            (self.token_limit - state[1]) / per_s_t if self.token_limit > 0 else 0.0,
            retry,
            exceeded,
        )


def format_reset(seconds: float) -> str:
    """A duration as OpenAI writes x-ratelimit-reset-*: ``120ms``, ``1.5s``, ``6m0s``."""
    if seconds < 1.0:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < 60.0:
        return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"
    minutes, rest = divmod(int(math.ceil(seconds)), 60)
    return f"{minutes}m{rest}s"


class ColdStarts:
    """Which models are "loaded": the first request after start, or after ``idle_unload_s`` unused, waits.

    Requests that arrive while a model loads wait for the same load to finish, as on a real server.
    ``idle_unload_s`` 0 never unloads.
    """

    def __init__(self, cold_start_s: float, idle_unload_s: float) -> None:
        self.cold_start_s = cold_start_s
        self.idle_unload_s = idle_unload_s
        self._ready_at: dict[str, float] = {}
        self._last_used: dict[str, float] = {}

    def delay(self, model: str, now: float) -> float:
        """Seconds this request must wait for ``model`` to be loaded (0 when warm); marks the model used."""
        if self.cold_start_s <= 0:
            return 0.0
        ready_at = self._ready_at.get(model)
        last = self._last_used.get(model, -math.inf)
        unloaded = (
            self.idle_unload_s > 0 and ready_at is not None and now - max(last, ready_at) > self.idle_unload_s
        )
        if ready_at is None or unloaded:
            ready_at = now + self.cold_start_s
            self._ready_at[model] = ready_at
        self._last_used[model] = max(now, last)
        return max(0.0, ready_at - now)

    def touch(self, model: str, now: float) -> None:
        """Mark ``model`` used at ``now`` (the end of a long reply keeps it loaded)."""
        if self.cold_start_s > 0:
            self._last_used[model] = max(now, self._last_used.get(model, now))


class FaultDice:
    """Seeded dice for error replies, dropped streams and jitter (jitter has its own stream of numbers)."""

    def __init__(self, seed: int, error_rate: float, drop_rate: float, jitter_ms: float) -> None:
        self.error_rate = error_rate
        self.drop_rate = drop_rate
        self.jitter_s = jitter_ms / 1000.0
        self._faults = random.Random(seed)
        self._jitter = random.Random(seed ^ 0x5EED)

    def error_status(self) -> int | None:
        """500, 502 or 503 with probability ``error_rate``, else None."""
        if self.error_rate > 0 and self._faults.random() < self.error_rate:
            return self._faults.choice((500, 502, 503))
        return None

    def drop_after(self, n_tokens: int) -> int | None:
        """With probability ``drop_rate``, how many content tokens to send before cutting the connection.

        At least one token goes out and the last one (which carries finish_reason) never does, so a client
        always sees a partial reply.
        """
        if self.drop_rate > 0 and self._faults.random() < self.drop_rate:
            return self._faults.randint(1, max(1, n_tokens - 1))
        return None

    def jitter(self) -> float:
        """A random extra delay in seconds, uniform in [0, jitter_ms]."""
        return self._jitter.random() * self.jitter_s if self.jitter_s > 0 else 0.0
