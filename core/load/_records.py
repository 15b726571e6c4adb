"""A load run's requests one by one: the flat row per request (``llmchat bench --csv``) and the time series of
the run (``--report``'s charts: TTFT and end-to-end per request against when it started, requests in flight).

Rows are made from each ``Sample`` as it finishes, figures rounded by ``round_ms`` as ``--json``'s
(``TimingRecord.summary``) are, so a CSV cell and the JSON line of the same request hold the same number.
Times in the run (``start_s``, ``scheduled_s``) are seconds since ``origin_ns``, a ``perf_counter_ns`` stamp
taken once the clients are built.

The timeline keeps memory bounded however long the run, as the bench's tallies do:

- points (one per request: start, TTFT, end-to-end, configuration, success) for up to ``POINTS`` requests,
  then a uniform sample of them (Algorithm R, seeded), so a chart of a long run is a fair picture of it and says
  how many of how many it shows;
- requests in flight as a difference array over time bins: +1 in the bin a request started in, -1 in the bin
  it ended in. Their running sum is the exact count in flight at each bin's left edge. When the run outgrows
  ``BINS`` bins, the bins double in width (neighbours summed), which keeps that count exact at the coarser
  edges.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from llmchat.core.load._run import Sample
from llmchat.core.load._schedule import from_schedule
from llmchat.core.load._stats import CLIENT_ERRORS
from llmchat.core.observe import percentile, round_ms

#: The columns of ``--csv``, in order (``record_row``'s keys).
RECORD_FIELDS: tuple[str, ...] = (
    "config", "slice", "index", "request_id", "scheduled_s", "start_s", "lag_ms", "pool_wait_ms", "connect_ms",
    "tls_ms", "ttfb_ms", "ttft_ms", "e2e_ms", "scheduled_ttft_ms", "scheduled_e2e_ms", "itl_mean_ms",
    "itl_ms_p50", "itl_ms_p99", "tpot_ms", "chunks", "output_tokens", "prompt_tokens", "status", "error_kind",
    "error_side", "retries", "attempts", "cache_hit", "http_version", "connection_reused", "long_prompt",
)
POINTS = 5_000
BINS = 1_000
FIRST_BIN_S = 0.01



def record_row(sample: Sample, origin_ns: int) -> dict[str, Any]:
    """One request as a flat row (``RECORD_FIELDS``): its place in the run, its latencies (from the actual
    start, and in an open loop from the scheduled one), its tokens and how it ended. No text, no secrets."""
    record = sample.record
    itl = record.itl_ms
    kind = record.error_kind
    scheduled_ttft = scheduled_e2e = None
    if sample.due_ns is not None:
        scheduled_ttft, scheduled_e2e = from_schedule(record, sample.due_ns)
    # The record's properties one by one, not its summary(): a third of the cost, on the event loop, and the
    # same values (summary rounds each with round_ms too and takes ITL's percentiles with the same function).
    return {
        "config": sample.config,
        "slice": sample.slice,
        "index": sample.index,
        "request_id": record.request_id,
        "scheduled_s": None if sample.due_ns is None else round((sample.due_ns - origin_ns) / 1e9, 6),
        "start_s": round((record.t0_ns - origin_ns) / 1e9, 6),
        "lag_ms": round(sample.lag_ms, 3),
        "pool_wait_ms": round_ms(record.pool_wait_ms),
        "connect_ms": round_ms(record.connect_ms),
        "tls_ms": round_ms(record.tls_ms),
        "ttfb_ms": round_ms(record.ttfb_ms),
        "ttft_ms": round_ms(record.ttft_ms),
        "e2e_ms": round_ms(record.total_ms),
        "scheduled_ttft_ms": round_ms(scheduled_ttft),
        "scheduled_e2e_ms": round_ms(scheduled_e2e),
        "itl_mean_ms": round(sum(itl) / len(itl), 3) if itl else None,
        "itl_ms_p50": round_ms(percentile(itl, 50)),
        "itl_ms_p99": round_ms(percentile(itl, 99)),
        "tpot_ms": round_ms(record.tpot_ms),
        "chunks": len(record.chunk_ns),
        "output_tokens": record.output_tokens,
        "prompt_tokens": record.prompt_tokens,
        "status": record.status,
        "error_kind": kind,
        "error_side": None if kind is None else "client" if kind in CLIENT_ERRORS else "server",
        "retries": len(record.retries),
        "attempts": record.attempts,
        "cache_hit": record.cache_hit,
        "http_version": record.http_version,
        "connection_reused": record.connection_reused,
        "long_prompt": sample.long,
    }


@dataclass(frozen=True, slots=True)
class Point:
    """One request on the run's time axis: when it started (s since the origin), its TTFT and end-to-end
    (ms, None where it has none), the index of its configuration in ``Timeline.configs``, and whether it
    succeeded."""

    start_s: float
    ttft_ms: float | None
    e2e_ms: float | None
    config: int
    ok: bool


class Timeline:
    """The run's time series, bounded (see the module docstring): ``add`` each finished request."""

    def __init__(self, origin_ns: int, *, points: int = POINTS, bins: int = BINS, seed: int = 0) -> None:
        self.origin_ns = origin_ns
        self.capacity = points
        self.bins = bins
        self.width_s = FIRST_BIN_S
        self.seen = 0
        """Requests added, every one (``points`` holds at most ``capacity`` of them)."""
        self.points: list[Point] = []
        self.configs: list[str] = []
        self._config_index: dict[str, int] = {}
        self._deltas: dict[int, int] = {}
        self._last_bin = 0
        self._rng = random.Random(f"llmchat-bench-timeline:{seed}")

    def add(self, sample: Sample) -> None:
        record = sample.record
        start_s = (record.t0_ns - self.origin_ns) / 1e9
        end_s = start_s if record.end_ns is None else (record.end_ns - self.origin_ns) / 1e9
        index = self._config_index.get(sample.config)
        if index is None:
            index = self._config_index[sample.config] = len(self.configs)
            self.configs.append(sample.config)
        ok = record.error_kind is None
        point = Point(start_s, record.ttft_ms if ok else None, record.total_ms, index, ok)
        self.seen += 1
        if len(self.points) < self.capacity:
            self.points.append(point)
        else:
            j = self._rng.randrange(self.seen)
            if j < self.capacity:
                self.points[j] = point
        self._delta(start_s, +1)
        self._delta(end_s, -1)

    def _delta(self, t_s: float, d: int) -> None:
        k = max(0, math.floor(t_s / self.width_s))
        while k >= self.bins:
            self._coarsen()
            k = max(0, math.floor(t_s / self.width_s))
        self._deltas[k] = self._deltas.get(k, 0) + d
        self._last_bin = max(self._last_bin, k)

    def _coarsen(self) -> None:
        merged: dict[int, int] = {}
        for k, d in self._deltas.items():
            merged[k // 2] = merged.get(k // 2, 0) + d
        self._deltas = merged
        self._last_bin //= 2
        self.width_s *= 2

    def in_flight(self) -> list[tuple[float, int]]:
        """``(t_s, requests in flight at t_s)`` at each bin edge from 0 to one past the last request's end;
        the count is exact at those instants (a request in flight from its start to its end)."""
        out = [(0.0, 0)]
        running = 0
        for k in range(self._last_bin + 1):
            running += self._deltas.get(k, 0)
            out.append(((k + 1) * self.width_s, running))
        return out

    @property
    def sampled(self) -> bool:
        """Whether ``points`` is a sample of the requests rather than every one."""
        return self.seen > len(self.points)
