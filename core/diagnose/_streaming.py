"""Streaming health: how chunks arrive (spread over the reply, or bunched at its end as behind a buffering
proxy), TTFT / ITL / TPOT distributions over a few streams, and stalls.

The streams go out one after another on one client with the user's own [http] settings, so they also show
whether the connection survives a stream (``_connection.keepalive_after_streams``). Every figure comes from
the engine's timing record, save one: while the streams run, a ``LoopWatch`` ticks on the event loop, so a gap
between chunks during which this process itself was not running (its loop blocked, or the machine busy with
other work) is told apart from a pause of the server or the network, and not blamed on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

from llmchat.core.client import ChatClient
from llmchat.core.diagnose._budget import PROMPT, Context, OutOfBudget
from llmchat.core.errors import APIError
from llmchat.core.observe import TimingRecord, percentile, round_ms

STREAMS = 4
BUNCHED_SHARE = 0.1
"""A stream whose content chunks all arrived within this share of its total time was delivered bunched..."""
BUNCHED_MIN_MS = 50.0
"""...when that total is at least this long (a fast reply comes in one write, which proves nothing)."""
BUNCHED_MIN_TOKENS = 6
STALL_MIN_MS = 500.0
STALL_FACTOR = 8.0
"""A gap between chunks is a stall when it is at least STALL_MIN_MS and STALL_FACTOR times the median gap."""
WATCH_PERIOD_S = 0.02
"""How often the LoopWatch wakes: late wakes mark the spans when this process was not running."""
OWN_SHARE = 0.5
"""A gap is this machine's own when the watch was late for at least this share of it."""


class LoopWatch:
    """Spans (perf_counter_ns start, end) when the event loop woke late: the process was blocked or not
    scheduled, so anything it stamped in that span (a chunk's arrival) was stamped late."""

    def __init__(self, period_s: float = WATCH_PERIOD_S) -> None:
        self._period_ns = int(period_s * 1e9)
        self.late: list[tuple[int, int]] = []

    async def run(self) -> None:
        due = time.perf_counter_ns() + self._period_ns
        while True:
            await asyncio.sleep(self._period_ns / 1e9)
            now = time.perf_counter_ns()
            if now - due > self._period_ns:  # a wake later than one period is lost time, not timer jitter
                self.late.append((due, now))
            due = now + self._period_ns

    def own_ns(self, start_ns: int, end_ns: int) -> int:
        """How much of [start_ns, end_ns] this process spent not running."""
        return sum(max(0, min(end_ns, b) - max(start_ns, a)) for a, b in self.late)


@contextlib.asynccontextmanager
async def watching() -> AsyncIterator[LoopWatch]:
    watch = LoopWatch()
    task = asyncio.create_task(watch.run())
    try:
        yield watch
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def one_stream(client: ChatClient, ctx: Context, *, prompt: str = PROMPT) -> tuple[TimingRecord, str | None]:
    """One short stream; its record and the error's line when it failed (the record holds what arrived)."""
    stream = client.stream([{"role": "user", "content": prompt}], max_tokens=ctx.max_tokens)
    try:
        async for _ in stream:
            pass
    except APIError as exc:
        return stream.record, str(exc)
    finally:
        await stream.aclose()
    return stream.record, None


async def run_streams_into(ctx: Context, records: list[TimingRecord], n: int = STREAMS,
                           ) -> tuple[list[TimingRecord], list[str]]:
    """Up to ``n`` streams one after another on one client, each appended to ``records`` as it ends (so an
    interrupted battery keeps the ones that finished); stops early when the budget runs out."""
    errors: list[str] = []
    async with ctx.client() as client:
        for i in range(n):
            if records:
                try:
                    ctx.take(1, "streams")
                except OutOfBudget:
                    break
            else:
                ctx.take(1, "streams")
            record, error = await one_stream(client, ctx, prompt=f"{PROMPT} ({i + 1})")
            records.append(record)
            if error:
                errors.append(error)
            ctx.tick("streaming")
    return records, errors


def _arrival(record: TimingRecord, watch: LoopWatch | None) -> dict[str, Any]:
    total, chunks = record.total_ms, record.chunk_ns
    span = (chunks[-1] - chunks[0]) / 1e6 if len(chunks) > 1 else 0.0
    gaps: list[float] = []
    own: list[float] = []
    for a, b in itertools.pairwise(chunks):
        # A gap the process spent mostly not running was this machine's: the chunk may have waited in the socket.
        (own if watch and watch.own_ns(a, b) >= OWN_SHARE * (b - a) else gaps).append((b - a) / 1e6)
    return {
        "chunks": len(chunks),
        "tokens": record.output_tokens,
        "ttft_ms": round_ms(record.ttft_ms),
        "total_ms": round_ms(total),
        "chunk_span_ms": round(span, 3),
        "span_share": None if not total else round(span / total, 4),
        "max_gap_ms": round_ms(max(gaps)) if gaps else None,
        "median_gap_ms": round_ms(statistics.median(gaps)) if gaps else None,
        "own_max_gap_ms": round_ms(max(own)) if own else None,
        "server_span_ms": _server_span(record),
        "headers_to_first_token_ms": None if record.ttfb_ms is None or record.ttft_ms is None
        else round(record.ttft_ms - record.ttfb_ms, 3),
    }


def _server_span(record: TimingRecord) -> float | None:
    # llmchat serve's server_timing stamps first and last token sent: how spread the server meant the reply.
    st = record.server_timing or {}
    first, last = st.get("first_token_ns"), st.get("last_token_ns")
    return None if first is None or last is None else round((last - first) / 1e6, 3)


def bunched(a: dict[str, Any]) -> bool:
    """All chunks at once, late: the server spread them (its own stamps say so) or, when it reports none, the
    content came long after the headers. A server that sends a fast reply in one write is not bunching."""
    if not (a["tokens"] >= BUNCHED_MIN_TOKENS and (a["total_ms"] or 0) >= BUNCHED_MIN_MS
            and a["span_share"] is not None and a["span_share"] < BUNCHED_SHARE):
        return False
    spread = a["server_span_ms"] if a["server_span_ms"] is not None else a["headers_to_first_token_ms"]
    return spread is not None and spread >= BUNCHED_MIN_MS


def stalled(a: dict[str, Any]) -> bool:
    gap, median = a["max_gap_ms"], a["median_gap_ms"]
    return gap is not None and gap >= STALL_MIN_MS and gap >= STALL_FACTOR * max(median or 0.0, 1.0)


def summarize(records: list[TimingRecord], watch: LoopWatch | None = None) -> dict[str, Any]:
    """Distributions and the arrival pattern of each stream, JSON-ready. With the ``watch`` that ran beside
    them, gaps this process spent not running are kept apart (``own_max_gap_ms``), never counted as stalls."""
    ok = [r for r in records if r.error is None and r.first_token_ns is not None]
    ttft = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    itl = [g for r in ok for g in r.itl_ms]
    tpot = [r.tpot_ms for r in ok if r.tpot_ms is not None]
    arrivals = [_arrival(r, watch) for r in ok]
    return {
        "streams": len(records),
        "succeeded": len(ok),
        "ttft_ms": _dist(ttft),
        "itl_ms": _dist(itl),
        "tpot_ms": _dist(tpot),
        "arrivals": arrivals,
        "bunched_streams": sum(bunched(a) for a in arrivals),
        "stalled_streams": sum(stalled(a) for a in arrivals),
        "longest_gap_ms": max((a["max_gap_ms"] or 0.0 for a in arrivals), default=0.0),
        "longest_own_gap_ms": max((a["own_max_gap_ms"] or 0.0 for a in arrivals), default=0.0),
    }


def _dist(values: list[float]) -> dict[str, Any]:
    return {"n": len(values), "p50": round_ms(percentile(values, 50)), "p90": round_ms(percentile(values, 90)),
            "p99": round_ms(percentile(values, 99)), "max": round_ms(max(values)) if values else None}

