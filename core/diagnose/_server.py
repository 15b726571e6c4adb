"""The server's side: cold start (the first request against later ones, and one after ``--idle-s`` of
silence), queueing and saturation under a parallel burst (from attribution, and the provider's /metrics where
``metrics_url`` is set), and where each request's time went (client / network / server shares).

Attribution and the metrics poller are the engine's (``ServerSignals``); this module only runs the requests
and reads their results.
"""

from __future__ import annotations

import asyncio
import statistics
from typing import Any

from llmchat.core.client import ServerSignals
from llmchat.core.diagnose._budget import PROMPT, Context
from llmchat.core.diagnose._streaming import one_stream
from llmchat.core.observe import Attribution, TimingRecord, shares_over

COLD_FACTOR = 3.0
COLD_MIN_MS = 200.0
"""The first request is a cold start when its extra time to first token is at least COLD_MIN_MS and
COLD_FACTOR times the later requests' median (or the server reported a model load)."""
BURST = 4


def _first_token_ms(record: TimingRecord, new_connection_cost_ms: float) -> float | None:
    # Without the connection it opened (measured apart, by GETs on new and reused connections): the cold
    # start is the server's, the new connection is the path's.
    ttft = record.ttft_ms
    if ttft is None:
        return None
    return max(0.0, ttft - (0.0 if record.connection_reused else new_connection_cost_ms))


def cold_start(records: list[TimingRecord], attributions: list[Attribution],
               new_connection_cost_ms: float) -> dict[str, Any]:
    """The first stream against the later ones: its extra time to first token, and whether the server said
    it loaded the model (``server model load``)."""
    ok = [(r, a) for r, a in zip(records, attributions, strict=True) if r.error is None]
    if len(ok) < 2:
        return {"judged": False}
    first_r, first_a = ok[0]
    later = [t for t in (_first_token_ms(r, new_connection_cost_ms) for r, _ in ok[1:]) if t is not None]
    first = _first_token_ms(first_r, new_connection_cost_ms)
    if first is None or not later:
        return {"judged": False}
    median = statistics.median(later)
    extra = max(0.0, first - median)
    load = first_a.ms("server_model_load")
    cold = load > 0 or (extra >= COLD_MIN_MS and first >= COLD_FACTOR * max(median, 1.0))
    return {"judged": True, "first_ttft_ms": round(first, 3), "later_ttft_ms_median": round(median, 3),
            "extra_ms": round(max(extra, load), 3), "server_model_load_ms": round(load, 3), "cold": cold}


async def after_idle(ctx: Context, later_median_ms: float | None, new_connection_cost_ms: float) -> dict[str, Any]:
    """Sleep ``ctx.idle_s`` (never past the time budget), then one stream: slower than the warm median?"""
    wait = min(ctx.idle_s, max(0.0, ctx.remaining_s() - 10.0))
    ctx.tick(f"idle {wait:.0f} s")
    await asyncio.sleep(wait)
    ctx.take(1, "after idle")
    async with ctx.client() as client:
        record, error = await one_stream(client, ctx)
    ctx.tick("after idle")
    first = _first_token_ms(record, new_connection_cost_ms)
    out: dict[str, Any] = {"idle_s": round(wait, 3), "ttft_ms": None if first is None else round(first, 3),
                           "error": error, "record": record}
    if first is not None and later_median_ms is not None:
        extra = first - later_median_ms
        out["extra_ms"] = round(max(0.0, extra), 3)
        out["cold"] = extra >= COLD_MIN_MS and first >= COLD_FACTOR * max(later_median_ms, 1.0)
    return out


async def saturation_burst(ctx: Context, signals: ServerSignals) -> dict[str, Any]:
    """``BURST`` streams at once: how many the server queued and for how long, from each reply's attribution
    (and the /metrics snapshot taken beside it when the provider names a metrics_url)."""
    n = BURST
    ctx.take(n, "parallel burst")
    async with ctx.client(max_connections=max(n, ctx.http.max_connections)) as client:
        signals.follow(client)
        results = await asyncio.gather(*(one_stream(client, ctx, prompt=f"{PROMPT} [{i}]") for i in range(n)))
    ctx.tick("parallel burst")
    records = [r for r, _ in results]
    attributions = [await signals.attribute(r) for r in records]
    queue = [a.ms("server_queue") for a in attributions]
    saturated = [a for a in attributions if "saturation" in a.flags]
    waiting = [(a.server_metrics or {}).get("requests_waiting") for a in attributions]
    return {
        "parallel": n,
        "errors": [e for _, e in results if e],
        "queue_ms": [round(q, 3) for q in queue],
        "queue_ms_max": round(max(queue), 3),
        "saturated_requests": len(saturated),
        "served_at_once": sum(1 for q in queue if q < 20.0),
        "metrics_requests_waiting_max": max((w for w in waiting if w is not None), default=None),
        "ttft_ms": [None if r.ttft_ms is None else round(r.ttft_ms, 3) for r in records],
        "records": records,
        "attributions": attributions,
    }


def shares(attributions: list[Attribution]) -> dict[str, float]:
    """Each group's share of the time, summed over ``attributions`` (client, network, server...)."""
    return {g: round(s, 4) for g, s in shares_over(attributions).items()}
