"""Coordinated omission, counted: an open loop's latencies from each request's scheduled start.

An open loop schedules every arrival ahead (Poisson, seeded). A request that goes out late (the in-flight cap
was full, or the event loop was busy with other streams) would hide that wait if its latency counted from when
it actually started: the queue is then in the client, and the server looks faster than a user would find it
(Gil Tene's coordinated omission; guidellm #1048). So each open-loop request is also timed from its scheduled
start, and its *schedule lag* (actual start less scheduled start) is kept:

- ``lag``: the schedule lag's distribution (p50/p90/p99, max);
- ``ttft`` and ``e2e`` from the scheduled start: the lag plus the record's own TTFT and end-to-end;
- the trend: a least-squares line of lag against the scheduled time since its slice began, kept as six sums
  (no values). The lag *grows* when the fitted line rises by at least ``GROWTH_MS`` over the run and by at
  least ``SIGNIFICANCE`` standard errors of that rise, so a burst of event-loop jitter on a noisy machine is
  not taken for a trend. A lag that grows means arrivals come faster than the client sends them: the client
  (its cap, its CPU), not the server, is the limit of that run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from llmchat.core.observe import TimingRecord

#: The least rise of the fitted lag over a run that counts as growing: below it, lag is the event loop's jitter.
GROWTH_MS = 20.0
#: How many standard errors of the fitted rise it must clear (a t statistic: about 3 sigma).
SIGNIFICANCE = 3.0
_NS_PER_MS = 1e6


@dataclass(slots=True)
class LagTrend:
    """A least-squares line of lag (ms) against scheduled time (s since the slice began), kept as sums."""

    n: int = 0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0
    syy: float = 0.0
    x_min: float = 0.0
    x_max: float = 0.0

    def add(self, x_s: float, lag_ms: float) -> None:
        if not self.n or x_s < self.x_min:
            self.x_min = x_s
        if not self.n or x_s > self.x_max:
            self.x_max = x_s
        self.n += 1
        self.sx += x_s
        self.sy += lag_ms
        self.sxx += x_s * x_s
        self.sxy += x_s * lag_ms
        self.syy += lag_ms * lag_ms

    @property
    def slope_ms_per_s(self) -> float:
        """Lag gained per second of schedule; 0 with fewer than two distinct times."""
        d = self.n * self.sxx - self.sx * self.sx
        if self.n < 2 or d <= 1e-12:
            return 0.0
        return (self.n * self.sxy - self.sx * self.sy) / d

    @property
    def rise_ms(self) -> float:
        """How much the fitted lag grew from the first scheduled arrival to the last."""
        return self.slope_ms_per_s * (self.x_max - self.x_min)

    @property
    def rise_error_ms(self) -> float:
        """The standard error of ``rise_ms`` (the residuals' spread over the times' spread); inf with fewer
        than three points."""
        sxx = self.sxx - self.sx * self.sx / self.n if self.n else 0.0
        if self.n < 3 or sxx <= 1e-12:
            return math.inf
        syy = self.syy - self.sy * self.sy / self.n
        sxy = self.sxy - self.sx * self.sy / self.n
        residual = max(0.0, syy - sxy * sxy / sxx) / (self.n - 2)
        return math.sqrt(residual / sxx) * (self.x_max - self.x_min)

    @property
    def growing(self) -> bool:
        """Whether the lag grew by at least ``GROWTH_MS`` and ``SIGNIFICANCE`` standard errors."""
        rise = self.rise_ms
        return rise >= GROWTH_MS and rise >= SIGNIFICANCE * self.rise_error_ms


def schedule_lag_ms(record: TimingRecord, due_ns: int) -> float:
    """How late the request started after its scheduled arrival (never negative: an early wake-up is 0)."""
    return max(0, record.t0_ns - due_ns) / _NS_PER_MS


def from_schedule(record: TimingRecord, due_ns: int) -> tuple[float | None, float | None]:
    """``(ttft_ms, e2e_ms)`` counted from the scheduled start ``due_ns`` (None where the record has none)."""
    start = min(due_ns, record.t0_ns)
    ttft = None if record.first_token_ns is None else (record.first_token_ns - start) / _NS_PER_MS
    e2e = None if record.end_ns is None else (record.end_ns - start) / _NS_PER_MS
    return ttft, e2e


@dataclass(frozen=True, slots=True)
class ScheduleFigures:
    """An open loop's figures from the schedule: lag and latencies from the scheduled start, p50/p90/p99 and
    max in ms, and the lag's trend."""

    lag: dict[str, float | None]
    ttft: dict[str, float | None]
    e2e: dict[str, float | None]
    slope_ms_per_s: float
    rise_ms: float
    growing: bool
    """Whether the lag grew over the run (``LagTrend.growing``): the client could not keep up."""

    def to_json(self) -> dict[str, Any]:
        def r(qs: dict[str, float | None]) -> dict[str, float | None]:
            return {q: None if v is None else round(v, 3) for q, v in qs.items()}

        return {"lag_ms": r(self.lag), "ttft_ms": r(self.ttft), "e2e_ms": r(self.e2e),
                "lag_slope_ms_per_s": round(self.slope_ms_per_s, 3), "lag_rise_ms": round(self.rise_ms, 3),
                "lag_growing": self.growing}
