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
  http_503, stream_cut, timeout_read, connect ...).
- where the time went: per attribution part (``_attribution.PARTS``: server_queue, network_first_token,
  decode ...), p50/p90/p99 over the successful requests that have the part (``n`` of them: a reused
  connection has no connect part), and each group's share of their summed totals.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmchat.core._attribution import PARTS, Attribution, attribute, part_samples, shares_over
from llmchat.core._timing import TimingRecord, percentile

QUANTILES = (50, 90, 99)
METRICS = ("pool_wait", "ttfb", "ttft", "itl", "tpot", "e2e")
METRIC_NAMES = {"pool_wait": "pool wait", "ttfb": "TTFB", "ttft": "TTFT", "itl": "ITL", "tpot": "TPOT",
                "e2e": "end-to-end"}


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

    @property
    def failed(self) -> int:
        return self.requests - self.ok

    @property
    def error_rate(self) -> float:
        return self.failed / self.requests if self.requests else 0.0

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
            "wall_s": round(self.wall_s, 6),
            "requests_per_s": round(self.rps, 3),
            "output_tokens": self.output_tokens,
            "output_tokens_per_s": round(self.output_tokens_per_s, 3),
            "goodput_requests_per_s": None if self.goodput_rps is None else round(self.goodput_rps, 3),
            "slo": {"ttft_ms": self.slo.ttft_ms, "e2e_ms": self.slo.e2e_ms},
            "met_slo": self.good if self.slo.given else None,
            "latency_ms": {m: {q: _r(v) for q, v in qs.items()} for m, qs in self.latency.items()},
            "http_versions": dict(self.http_versions),
            "http_version": self.http_version,
            "connections_reused": self.reused,
            "connections_opened": self.on_wire - self.reused,
            "connection_setup_ms_total": round(self.setup_ms, 3),
            "requests_on_wire": self.on_wire,
            "retries": self.retries,
            "cache_hits": self.cache_hits,
            "long_prompts": self.long_prompts,
            "attribution": {k: {q: (_r(v) if q != "n" else v) for q, v in row.items()}
                            for k, row in self.attribution.items()},
            "attribution_shares": {g: round(v, 4) for g, v in self.attribution_shares.items()},
        }


def metric_values(records: Iterable[TimingRecord]) -> dict[str, list[float]]:
    """The values each metric's percentiles are taken over, from the successful records given."""
    values: dict[str, list[float]] = {m: [] for m in METRICS}
    for r in records:
        if r.error_kind is not None:
            continue
        pairs = (("pool_wait", r.pool_wait_ms), ("ttfb", r.ttfb_ms), ("ttft", r.ttft_ms), ("tpot", r.tpot_ms),
                 ("e2e", r.total_ms))
        for name, v in pairs:
            if v is not None:
                values[name].append(v)
        values["itl"].extend(r.itl_ms)
    return values


def latency_table(values: dict[str, list[float]]) -> dict[str, dict[str, float | None]]:
    """``{metric: {"p50": .., "p90": .., "p99": .., "mean": ..}}`` from metric_values' lists."""
    table: dict[str, dict[str, float | None]] = {}
    for m in METRICS:
        vs = values.get(m, [])
        row: dict[str, float | None] = {f"p{q}": percentile(vs, q) for q in QUANTILES}
        row["mean"] = sum(vs) / len(vs) if vs else None
        table[m] = row
    return table


def part_table(attributions: Iterable[Attribution]) -> dict[str, dict[str, float | None]]:
    """``{part_key: {"p50", "p90", "p99", "n"}}`` over ``attributions``, for the parts present, in ``PARTS``
    order; each part's percentiles cover the attributions that have it (``n`` of them)."""
    samples = part_samples(attributions)
    table: dict[str, dict[str, float | None]] = {}
    for key in [*PARTS, *(k for k in samples if k not in PARTS)]:
        values = samples.get(key)
        if values:
            row: dict[str, float | None] = {f"p{q}": percentile(values, q) for q in QUANTILES}
            row["n"] = len(values)
            table[key] = row
    return table


def summarize(
    name: str, records: Sequence[TimingRecord], wall_ns: int, *, slo: SLO | None = None,
    long_prompts: int = 0, attributions: Sequence[Attribution] | None = None,
) -> ConfigStats:
    """The figures of one configuration from its records and its wall time. ``attributions``, when given,
    are ``attribute(r)`` of each record in the same order (made once by a caller that also writes them out);
    else they are made here. Pure; never fails on records (no records gives zeros and Nones); ValueError when
    ``attributions`` does not pair with ``records``."""
    slo = slo or SLO()
    if attributions is None:
        attributions = [attribute(r) for r in records]
    ok_attributions = [a for r, a in zip(records, attributions, strict=True) if r.error_kind is None]
    ok = [r for r in records if r.error_kind is None]
    errors = Counter(r.error_kind or "unknown" for r in records if r.error_kind is not None)
    wire = [r for r in records if r.http_version and not r.cache_hit]
    return ConfigStats(
        name=name,
        requests=len(records),
        ok=len(ok),
        wall_s=wall_ns / 1e9,
        errors=dict(errors.most_common()),
        latency=latency_table(metric_values(ok)),
        output_tokens=sum(r.output_tokens for r in ok),
        http_versions=dict(Counter(r.http_version for r in wire).most_common()),
        reused=sum(1 for r in wire if r.connection_reused),
        on_wire=len(wire),
        setup_ms=sum((r.connect_ms or 0.0) + (r.tls_ms or 0.0) for r in wire),
        retries=sum(len(r.retries) for r in records),
        cache_hits=sum(1 for r in records if r.cache_hit),
        long_prompts=long_prompts,
        slo=slo,
        good=sum(1 for r in ok if slo.met(r)),
        attribution=part_table(ok_attributions),
        attribution_shares=shares_over(ok_attributions),
    )


def change_pct(before: float | None, after: float | None) -> float | None:
    """(after - before) / before in %, or None when either is missing or before is 0."""
    if before is None or after is None or before == 0:
        return None
    return (after - before) * 100.0 / before


def compare_rows(stats: Sequence[ConfigStats]) -> list[dict[str, Any]]:
    """The before/after table: each configuration's p99 end-to-end, error rate and requests/s with the change
    against the first configuration (relative % for p99 and requests/s; percentage points for the error
    rate, which is already a share and often starts at 0)."""
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
            "p99_e2e_ms": _r(p99),
            "p99_e2e_change_pct": _r(change_pct(base_p99, p99)),
            "error_rate": round(s.error_rate, 6),
            "error_rate_change_pp": round((s.error_rate - first.error_rate) * 100.0, 3),
            "requests_per_s": round(s.rps, 3),
            "requests_per_s_change_pct": _r(change_pct(first.rps, s.rps)),
        })
    return rows


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 3)
