"""The figures of a load test: percentile tables, error rates by class, throughput and goodput.

Definitions (the engine's, see ``_timing.py``; they follow vLLM's ``benchmark_serving`` and genai-perf):

- Latency percentiles (TTFB, TTFT, ITL, TPOT, end-to-end) cover the requests that succeeded, as vLLM's do;
  failures are counted apart, by class. Percentiles interpolate linearly between closest ranks (numpy's
  default, which vLLM uses). TTFT exists in stream mode only; a cache hit has no TTFB.
- pool wait (not a vLLM figure): the last attempt's wait for a free pooled connection, which is where a pool
  too small for the load shows.
- ITL pools every gap between consecutive content chunks of every request, vLLM's chunk-gap definition;
  genai-perf divides each request's decode time by its tokens instead (that figure is TPOT here).
- TPOT is per request, (last token - first token) / (output tokens - 1), then taken across requests.
- requests/s: successful requests / wall time (vLLM's "request throughput" counts completed requests only);
  output tokens/s: output tokens of successful requests / wall time. Wall time is the sum of the
  configuration's slices, each from its first request sent to its last one finished.
- goodput: requests/s of the successful requests that met every SLO given (TTFT and end-to-end), vLLM's
  ``--goodput``. With no SLO given there is no goodput figure.
- error rate: failed requests / all requests, overall and per class (``record.error_kind``: http_429,
  http_503, stream_cut, timeout_read, connect ...), and split by side: the client's own failures
  (``CLIENT_ERRORS``: a pool timeout, the request never left the client; a cancel) apart from the server's and
  the network's (everything else), so a pool too small for the load is never blamed on the server.
- where the time went: per attribution part (``_attribution.PARTS``: server_queue, network_first_token,
  decode ...), p50/p90/p99 over the successful requests that have the part (``n`` of them: a reused
  connection has no connect part), and each group's share of their summed totals.

Memory: a ``Tally`` takes each request as it finishes and keeps counters and, per metric and per part, a
``Distribution``: the values themselves while there are at most ``EXACT_LIMIT`` (percentiles exact, as above),
then a log-bucketed histogram (DDSketch's mapping) whose percentiles are within ``RELATIVE_ERROR`` of the
exact ones. A run of any length then holds at most ``EXACT_LIMIT`` values per metric; past that, a p99's own
sampling error is far wider than 0.1 %.
"""

from __future__ import annotations

import math
import sys
from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from llmchat.core.load._schedule import LagTrend, ScheduleFigures, from_schedule, schedule_lag_ms
from llmchat.core.load._tokens import RequestTokens, TokenFigures, TokenTally
from llmchat.core.observe import GROUPS, PARTS, Attribution, TimingRecord, attribute, percentile, round_ms

QUANTILES = (50, 90, 99)
METRICS = ("pool_wait", "ttfb", "ttft", "itl", "tpot", "e2e")
METRIC_NAMES = {"pool_wait": "pool wait", "ttfb": "TTFB", "ttft": "TTFT", "itl": "ITL", "tpot": "TPOT",
                "e2e": "end-to-end"}

CLIENT_ERRORS = frozenset({"timeout_pool", "cancelled"})
"""Error kinds that are the client's own doing: no free connection in its own pool in time (the request never
left the client), or the client stopping the request. Every other kind is the server's or the network's."""

EXACT_LIMIT = 10_000
"""Values of one metric a Tally keeps as they are (8 bytes each); past this many, a histogram."""
RELATIVE_ERROR = 0.001
"""The histogram's bound: the value it gives for each rank is within 0.1 % of the exact one."""

# DDSketch's mapping (Masson, Rim and Lee, VLDB 2019): bucket i holds the magnitudes in
# (gamma^(i-1), gamma^i], and 2 gamma^i / (gamma + 1) is within RELATIVE_ERROR of every one of them.
_GAMMA = (1 + RELATIVE_ERROR) / (1 - RELATIVE_ERROR)
_LOG_GAMMA = math.log(_GAMMA)
# Milliseconds here come from integer nanoseconds: a magnitude below 1e-9 ms is a zero (float rounding), and
# one above 1e12 ms (31 years) is clamped, so no value can stretch a bucket array past ~20,000 entries a sign.
_TINY_MS = 1e-9
_HUGE_MS = 1e12


class _Buckets:
    """One sign's bucket counts: one array over the indices seen so far (a metric's values span a few decades,
    so a few thousand 8-byte counts)."""

    __slots__ = ("base", "counts")

    def __init__(self) -> None:
        self.base = 0
        self.counts = array("q")

    def add(self, index: int) -> None:
        counts = self.counts
        if not counts:
            self.base = index
            counts.append(0)
        elif index < self.base:
            counts[0:0] = array("q", bytes(8 * (self.base - index)))
            self.base = index
        elif index >= self.base + len(counts):
            counts.extend(array("q", bytes(8 * (index - self.base - len(counts) + 1))))
        counts[index - self.base] += 1


def _bucket_value(index: int) -> float:
    return 2.0 * _GAMMA**index / (_GAMMA + 1.0)


class Distribution:
    """The values of one metric, for its percentiles and mean.

    Exact while at most ``limit`` values have come (None: always): ``percentile`` is then
    ``_timing.percentile`` of the values. Past that the values are folded into log buckets
    (``RELATIVE_ERROR``) and dropped: the percentile interpolates between the same closest ranks, each rank's
    value its bucket's, within the exact minimum and maximum (kept). The count, mean, minimum and maximum stay
    exact either way.
    """

    __slots__ = ("limit", "count", "total", "low", "high", "_exact", "_pos", "_neg", "_zeros")

    def __init__(self, limit: int | None = EXACT_LIMIT) -> None:
        self.limit = limit
        self.count = 0
        self.total = 0.0
        self.low = math.inf
        self.high = -math.inf
        self._exact: array[float] | None = array("d")
        self._pos: _Buckets | None = None
        self._neg: _Buckets | None = None
        self._zeros = 0

    @property
    def exact(self) -> bool:
        """Whether every value is still held, so the percentiles are exact."""
        return self._exact is not None

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        if value < self.low:
            self.low = value
        if value > self.high:
            self.high = value
        exact = self._exact
        if exact is None:
            self._bucket(value)
            return
        exact.append(value)
        if self.limit is not None and len(exact) > self.limit:
            self._fold()

    def extend(self, values: Sequence[float]) -> None:
        if not values:
            return
        self.count += len(values)
        self.total = sum(values, self.total)
        self.low = min(self.low, min(values))
        self.high = max(self.high, max(values))
        exact = self._exact
        if exact is None:
            bucket = self._bucket
            for v in values:
                bucket(v)
            return
        exact.extend(values)
        if self.limit is not None and len(exact) > self.limit:
            self._fold()

    def _fold(self) -> None:
        exact, self._exact = self._exact, None
        for v in exact or ():
            self._bucket(v)

    def _bucket(self, value: float) -> None:
        magnitude = value if value > 0 else -value
        if magnitude < _TINY_MS:
            self._zeros += 1
            return
        index = math.ceil(math.log(magnitude if magnitude < _HUGE_MS else _HUGE_MS) / _LOG_GAMMA)
        side = self._pos if value > 0 else self._neg
        if side is None:
            side = _Buckets()
            if value > 0:
                self._pos = side
            else:
                self._neg = side
        i = index - side.base
        if 0 <= i < len(side.counts):
            side.counts[i] += 1
        else:
            side.add(index)

    def percentile(self, q: float) -> float | None:
        """The q-th percentile (0..100), linear between closest ranks as ``_timing.percentile``; None for no
        values."""
        if not self.count:
            return None
        if self._exact is not None:
            return percentile(self._exact.tolist(), q)
        pos = (self.count - 1) * q / 100.0
        lo = int(pos)
        hi = min(lo + 1, self.count - 1)
        a, b = self._ranked(lo), self._ranked(hi)
        return a + (b - a) * (pos - lo)

    def _ranked(self, k: int) -> float:
        """The k-th smallest value (0-based) as its bucket gives it, within the exact minimum and maximum."""
        if k <= 0:
            return self.low
        if k >= self.count - 1:
            return self.high
        seen = 0
        value: float | None = None
        if self._neg is not None:  # the most negative first: the largest magnitude
            counts, base = self._neg.counts, self._neg.base
            for j in range(len(counts) - 1, -1, -1):
                seen += counts[j]
                if k < seen:
                    value = -_bucket_value(base + j)
                    break
        if value is None:
            seen += self._zeros
            if k < seen:
                value = 0.0
        if value is None and self._pos is not None:
            counts, base = self._pos.counts, self._pos.base
            for j in range(len(counts)):
                seen += counts[j]
                if k < seen:
                    value = _bucket_value(base + j)
                    break
        if value is None:
            value = self.high
        return min(max(value, self.low), self.high)

    def nbytes(self) -> int:
        """The bytes its arrays hold (allocated, so over-allocation counts)."""
        arrays = [self._exact, None if self._pos is None else self._pos.counts,
                  None if self._neg is None else self._neg.counts]
        return sum(sys.getsizeof(a) for a in arrays if a is not None)


@dataclass(frozen=True, slots=True)
class SLO:
    """Service-level objectives a request must all meet to count towards goodput; None is no objective."""

    ttft_ms: float | None = None
    e2e_ms: float | None = None

    @property
    def given(self) -> bool:
        return self.ttft_ms is not None or self.e2e_ms is not None

    def met(self, record: TimingRecord) -> bool:
        """True when ``record`` succeeded and met every objective given. A TTFT objective is missed by a
        request that has no TTFT (batch mode, a reply with no content)."""
        if record.error_kind is not None:
            return False
        if self.ttft_ms is not None:
            ttft = record.ttft_ms
            if ttft is None or ttft > self.ttft_ms:
                return False
        if self.e2e_ms is not None:
            total = record.total_ms
            if total is None or total > self.e2e_ms:
                return False
        return True

    def describe(self) -> str:
        parts = []
        if self.ttft_ms is not None:
            parts.append(f"TTFT <= {self.ttft_ms:g} ms")
        if self.e2e_ms is not None:
            parts.append(f"end-to-end <= {self.e2e_ms:g} ms")
        return " and ".join(parts)


@dataclass(slots=True)
class ConfigStats:
    """Every figure of one configuration's run. ``latency[metric][q]`` in ms, q in "p50", "p90", "p99",
    "mean"; a metric with no values holds None."""

    name: str
    requests: int
    ok: int
    wall_s: float
    errors: dict[str, int]
    """Failed requests by class, every side (``client_errors`` and ``server_errors`` split them)."""
    latency: dict[str, dict[str, float | None]]
    output_tokens: int
    http_versions: dict[str, int]
    reused: int
    on_wire: int
    """Requests that reached the server (not cache hits, not failed before a response)."""
    setup_ms: float
    """Time spent opening connections, all requests together: TCP connect plus TLS handshake."""
    retries: int
    cache_hits: int
    long_prompts: int
    slo: SLO = field(default_factory=SLO)
    good: int = 0
    attribution: dict[str, dict[str, float | None]] = field(default_factory=dict)
    """Per part key present, in ``PARTS`` order: p50, p90, p99 (ms) and n (requests with the part)."""
    attribution_shares: dict[str, float] = field(default_factory=dict)
    """Each group's share of the successful requests' summed totals, in bar order."""
    approximate: tuple[str, ...] = ()
    """Metrics (``METRICS``) whose percentiles came from the histogram (more than EXACT_LIMIT values)."""
    approximate_parts: tuple[str, ...] = ()
    """Attribution parts whose percentiles came from the histogram."""
    schedule: ScheduleFigures | None = None
    """Open loop: lag and latencies from each request's scheduled start (``_schedule``); None in a closed one."""
    tokens: TokenFigures | None = None
    """Prompt and output lengths, ITL per token, TTFT by turn (``_tokens``)."""

    @property
    def failed(self) -> int:
        return self.requests - self.ok

    @property
    def client_errors(self) -> dict[str, int]:
        """The client's own failures by class (``CLIENT_ERRORS``): never the server's."""
        return {k: n for k, n in self.errors.items() if k in CLIENT_ERRORS}

    @property
    def server_errors(self) -> dict[str, int]:
        """The server's and the network's failures by class."""
        return {k: n for k, n in self.errors.items() if k not in CLIENT_ERRORS}

    @property
    def client_failed(self) -> int:
        return sum(self.client_errors.values())

    @property
    def server_failed(self) -> int:
        return self.failed - self.client_failed

    @property
    def error_rate(self) -> float:
        return self.failed / self.requests if self.requests else 0.0

    @property
    def server_error_rate(self) -> float:
        return self.server_failed / self.requests if self.requests else 0.0

    @property
    def client_error_rate(self) -> float:
        return self.client_failed / self.requests if self.requests else 0.0

    @property
    def rps(self) -> float:
        return self.ok / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def goodput_rps(self) -> float | None:
        if not self.slo.given:
            return None
        return self.good / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def reused_ratio(self) -> float | None:
        return self.reused / self.on_wire if self.on_wire else None

    @property
    def http_version(self) -> str:
        """The HTTP version the requests used: ``HTTP/2``, or each with its share when they were mixed."""
        total = sum(self.http_versions.values())
        if not total:
            return "-"
        ranked = sorted(self.http_versions.items(), key=lambda kv: -kv[1])
        if len(ranked) == 1:
            return ranked[0][0]
        return ", ".join(f"{v} {n * 100 / total:.0f}%" for v, n in ranked)

    def to_json(self) -> dict[str, Any]:
        """Every figure, JSON-ready (ms rounded to the microsecond)."""
        return {
            "config": self.name,
            "requests": self.requests,
            "ok": self.ok,
            "failed": self.failed,
            "error_rate": round(self.error_rate, 6),
            "errors": dict(self.errors),
            "error_rates": {k: round(n / self.requests, 6) for k, n in self.errors.items()},
            "server_failed": self.server_failed,
            "server_error_rate": round(self.server_error_rate, 6),
            "server_errors": self.server_errors,
            "client_failed": self.client_failed,
            "client_error_rate": round(self.client_error_rate, 6),
            "client_errors": self.client_errors,
            "wall_s": round(self.wall_s, 6),
            "requests_per_s": round(self.rps, 3),
            "output_tokens": self.output_tokens,
            "output_tokens_per_s": round(self.output_tokens_per_s, 3),
            "goodput_requests_per_s": None if self.goodput_rps is None else round(self.goodput_rps, 3),
            "slo": {"ttft_ms": self.slo.ttft_ms, "e2e_ms": self.slo.e2e_ms},
            "met_slo": self.good if self.slo.given else None,
            "latency_ms": {m: {q: round_ms(v) for q, v in qs.items()} for m, qs in self.latency.items()},
            "percentiles_approximate": {"latency": list(self.approximate),
                                        "attribution": list(self.approximate_parts)},
            "http_versions": dict(self.http_versions),
            "http_version": self.http_version,
            "connections_reused": self.reused,
            "connections_opened": self.on_wire - self.reused,
            "connection_setup_ms_total": round(self.setup_ms, 3),
            "requests_on_wire": self.on_wire,
            "retries": self.retries,
            "cache_hits": self.cache_hits,
            "long_prompts": self.long_prompts,
            "attribution": {k: {q: (round_ms(v) if q != "n" else v) for q, v in row.items()}
                            for k, row in self.attribution.items()},
            "attribution_shares": {g: round(v, 4) for g, v in self.attribution_shares.items()},
            "schedule": None if self.schedule is None else self.schedule.to_json(),
            "tokens": None if self.tokens is None else self.tokens.to_json(),
        }


class Tally:
    """One configuration's figures in the making: ``add`` each request as it finishes, ``stats`` at the end.

    Keeps counters, a ``Distribution`` per metric and per attribution part, and each group's summed time;
    never the record or the attribution, so a run of any length holds at most ``limit`` values per metric
    (None: every value, exact however many).
    """

    def __init__(self, name: str, *, slo: SLO | None = None, limit: int | None = EXACT_LIMIT) -> None:
        self.name = name
        self.slo = slo or SLO()
        self.limit = limit
        self.requests = 0
        self.ok = 0
        self.good = 0
        self.output_tokens = 0
        self.reused = 0
        self.on_wire = 0
        self.setup_ms = 0.0
        self.retries = 0
        self.cache_hits = 0
        self.long_prompts = 0
        self.errors: Counter[str] = Counter()
        self.http_versions: Counter[str] = Counter()
        self.latency = {m: Distribution(limit) for m in METRICS}
        self.parts: dict[str, Distribution] = {}
        self.group_ms: dict[str, float] = {}
        self.total_ms = 0.0
        """The summed totals of the successful requests' attributions (the shares' denominator)."""
        self.scheduled: dict[str, Distribution] | None = None
        """Open loop: "lag" of every request, "ttft" and "e2e" from the scheduled start of the successful."""
        self.trend = LagTrend()
        self.tokens = TokenTally(lambda: Distribution(limit), self.latency["itl"])

    def add(self, record: TimingRecord, attribution: Attribution | None = None, *,
            long: bool = False, due_ns: int | None = None, since_s: float = 0.0,
            tokens: RequestTokens | None = None) -> None:
        """Count one finished request; ``attribution`` is ``attribute(record)`` (made here when not given).
        ``due_ns``: an open loop's scheduled start, ``since_s`` seconds after its slice began; ``tokens``: its
        turn, counted prompt and per-chunk tokens (``_tokens``)."""
        self.requests += 1
        if due_ns is not None:
            self._schedule(record, due_ns, since_s)
        self.long_prompts += long
        self.retries += len(record.retries)
        self.cache_hits += record.cache_hit
        if record.http_version and not record.cache_hit:
            self.on_wire += 1
            self.http_versions[record.http_version] += 1
            self.reused += record.connection_reused
            self.setup_ms += (record.connect_ms or 0.0) + (record.tls_ms or 0.0)
        if record.error_kind is not None:
            self.errors[record.error_kind or "unknown"] += 1
            return
        self.ok += 1
        self.output_tokens += record.output_tokens
        self.good += self.slo.met(record)
        latency = self.latency
        for name, v in (("pool_wait", record.pool_wait_ms), ("ttfb", record.ttfb_ms),
                        ("ttft", record.ttft_ms), ("tpot", record.tpot_ms), ("e2e", record.total_ms)):
            if v is not None:
                latency[name].add(v)
        gaps = record.itl_ms
        self.tokens.add(record, tokens, gaps)  # before the gaps join ITL: it may copy ITL so far
        latency["itl"].extend(gaps)
        if attribution is None:
            attribution = attribute(record)
        parts = self.parts
        for p in attribution.parts:
            found = parts.get(p.key)
            if found is None:
                found = parts[p.key] = Distribution(self.limit)
            found.add(p.ms)
        for group, ms in attribution.group_ms().items():
            self.group_ms[group] = self.group_ms.get(group, 0.0) + ms
        self.total_ms += attribution.total_ms

    def _schedule(self, record: TimingRecord, due_ns: int, since_s: float) -> None:
        scheduled = self.scheduled
        if scheduled is None:
            scheduled = self.scheduled = {k: Distribution(self.limit) for k in ("lag", "ttft", "e2e")}
        lag = schedule_lag_ms(record, due_ns)
        scheduled["lag"].add(lag)
        self.trend.add(since_s, lag)
        if record.error_kind is None:
            ttft, e2e = from_schedule(record, due_ns)
            if ttft is not None:
                scheduled["ttft"].add(ttft)
            if e2e is not None:
                scheduled["e2e"].add(e2e)

    def schedule_figures(self) -> ScheduleFigures | None:
        """The open loop's figures from the schedule so far; None when no request had a scheduled start."""
        if self.scheduled is None:
            return None

        def qs(d: Distribution) -> dict[str, float | None]:
            return {**{f"p{q}": d.percentile(q) for q in QUANTILES}, "max": d.high if d.count else None}

        s = self.scheduled
        return ScheduleFigures(lag=qs(s["lag"]), ttft=qs(s["ttft"]), e2e=qs(s["e2e"]),
                               slope_ms_per_s=self.trend.slope_ms_per_s, rise_ms=self.trend.rise_ms,
                               growing=self.trend.growing)

    def nbytes(self) -> int:
        """The bytes the kept values take (every Distribution's arrays): bounded by ``limit`` per metric."""
        return sum(d.nbytes() for d in [*self.latency.values(), *self.parts.values(),
                                        *(self.scheduled or {}).values()]) + self.tokens.nbytes()

    def stats(self, wall_ns: int) -> ConfigStats:
        """Every figure so far, over ``wall_ns`` of wall time."""
        shares: dict[str, float] = {}
        if self.total_ms > 0:
            shares = {g: self.group_ms[g] / self.total_ms for g in GROUPS if g in self.group_ms}
        keys = [*(k for k in PARTS if k in self.parts), *(k for k in self.parts if k not in PARTS)]
        attribution: dict[str, dict[str, float | None]] = {}
        for key in keys:
            d = self.parts[key]
            row: dict[str, float | None] = {f"p{q}": d.percentile(q) for q in QUANTILES}
            row["n"] = d.count
            attribution[key] = row
        return ConfigStats(
            name=self.name,
            requests=self.requests,
            ok=self.ok,
            wall_s=wall_ns / 1e9,
            errors=dict(self.errors.most_common()),
            latency={m: {**{f"p{q}": d.percentile(q) for q in QUANTILES}, "mean": d.mean}
                     for m, d in self.latency.items()},
            output_tokens=self.output_tokens,
            http_versions=dict(self.http_versions.most_common()),
            reused=self.reused,
            on_wire=self.on_wire,
            setup_ms=self.setup_ms,
            retries=self.retries,
            cache_hits=self.cache_hits,
            long_prompts=self.long_prompts,
            slo=self.slo,
            good=self.good,
            attribution=attribution,
            attribution_shares=shares,
            approximate=tuple(m for m, d in self.latency.items() if not d.exact),
            approximate_parts=tuple(k for k in keys if not self.parts[k].exact),
            schedule=self.schedule_figures(),
            tokens=self.tokens.figures(),
        )


def summarize(
    name: str, records: Sequence[TimingRecord], wall_ns: int, *, slo: SLO | None = None,
    long_prompts: int = 0, attributions: Sequence[Attribution] | None = None,
) -> ConfigStats:
    """The figures of one configuration from its records and its wall time, every percentile exact (a Tally
    with no limit). ``attributions``, when given, are ``attribute(r)`` of each record in the same order; else
    they are made here. Pure; never fails on records (no records gives zeros and Nones); ValueError when
    ``attributions`` does not pair with ``records``."""
    tally = Tally(name, slo=slo, limit=None)
    made = attributions if attributions is not None else [attribute(r) for r in records]
    for record, attribution in zip(records, made, strict=True):
        tally.add(record, attribution)
    tally.long_prompts = long_prompts
    return tally.stats(wall_ns)


def change_pct(before: float | None, after: float | None) -> float | None:
    """(after - before) / before in %, or None when either is missing or before is 0."""
    if before is None or after is None or before == 0:
        return None
    return (after - before) * 100.0 / before


def compare_rows(stats: Sequence[ConfigStats]) -> list[dict[str, Any]]:
    """The before/after table: each configuration's p99 end-to-end, error rates and requests/s with the change
    against the first configuration (relative % for p99 and requests/s; percentage points for the error
    rates, which are already shares and often start at 0). ``error_rate`` counts every failure,
    ``server_error_rate`` the server's and the network's, ``client_error_rate`` the client's own."""
    if not stats:
        return []
    first = stats[0]
    rows = []
    for s in stats:
        p99 = s.latency["e2e"]["p99"]
        base_p99 = first.latency["e2e"]["p99"]
        rows.append({
            "config": s.name,
            "http_version": s.http_version,
            "reused_ratio": None if s.reused_ratio is None else round(s.reused_ratio, 4),
            "p99_e2e_ms": round_ms(p99),
            "p99_e2e_change_pct": round_ms(change_pct(base_p99, p99)),
            "error_rate": round(s.error_rate, 6),
            "error_rate_change_pp": round((s.error_rate - first.error_rate) * 100.0, 3),
            "server_error_rate": round(s.server_error_rate, 6),
            "server_error_rate_change_pp": round((s.server_error_rate - first.server_error_rate) * 100.0, 3),
            "client_error_rate": round(s.client_error_rate, 6),
            "requests_per_s": round(s.rps, 3),
            "requests_per_s_change_pct": round_ms(change_pct(first.rps, s.rps)),
        })
    return rows

