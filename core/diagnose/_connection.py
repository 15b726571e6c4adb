"""The connection's life: is keep-alive honoured, what a new connection costs against a reused one, and what
HTTP/2 multiplexing saves over a pool of HTTP/1.1 connections for the same parallel burst.

Every probe is a GET /models (no tokens), timed by the engine's own trace stamps (``Phases``): a request whose
phases saw no connect went out on a pooled connection. Keep-alive across streams (a server that closes after
each stream, as llama.cpp does) is read from the streaming step's records, which are real streams.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from llmchat.core.client import ChatClient
from llmchat.core.config import Http2Mode
from llmchat.core.diagnose._budget import Context
from llmchat.core.observe import Phases, TimingRecord

REUSE_PROBES = 3
BURST = 4


async def _get(client: ChatClient) -> tuple[float, Phases, str]:
    phases = Phases()
    t = time.perf_counter_ns()
    async with client.transport.request("GET", "models", phases=phases) as resp:
        await resp.aread()
        version = resp.http_version
    return (time.perf_counter_ns() - t) / 1e6, phases, version


def _setup_ms(phases: Phases) -> float:
    if phases.connect_start_ns is None:
        return 0.0
    end = phases.tls_end_ns or phases.connect_end_ns or phases.connect_start_ns
    return (end - phases.connect_start_ns) / 1e6


async def new_vs_reused(ctx: Context) -> dict[str, Any]:
    """``REUSE_PROBES`` GETs each on a fresh connection, then as many on one kept open."""
    new: list[float] = []
    setup: list[float] = []
    for _ in range(REUSE_PROBES):
        async with ctx.client() as client:
            ms, phases, version = await _get(client)
        new.append(ms)
        setup.append(_setup_ms(phases))
    reused: list[float] = []
    reused_flags: list[bool] = []
    async with ctx.client() as client:
        await _get(client)  # opens the connection the probes below should find
        for _ in range(REUSE_PROBES):
            ms, phases, version = await _get(client)
            reused.append(ms)
            reused_flags.append(phases.reused)
    # Minimums, not medians: on a busy machine the noise only ever adds time, and the cheapest of each is the
    # closest to what the path itself costs.
    cost = min(new) - min(reused)
    return {
        "http_version": version,
        "new_ms": [round(v, 3) for v in new],
        "new_setup_ms": [round(v, 3) for v in setup],
        "reused_ms": [round(v, 3) for v in reused],
        "reused": reused_flags,
        "keepalive_between_requests": all(reused_flags),
        "new_connection_cost_ms": round(max(0.0, cost), 3),
        "rtt_estimate_ms": round(min(reused), 3),
    }


async def _burst(ctx: Context, http2: Http2Mode, n: int) -> dict[str, Any]:
    async with ctx.client(http2=http2, max_connections=max(n, ctx.http.max_connections),
                          max_keepalive_connections=max(n, ctx.http.max_keepalive_connections)) as client:
        t = time.perf_counter_ns()
        results = await asyncio.gather(*(_get(client) for _ in range(n)))
        wall = (time.perf_counter_ns() - t) / 1e6
    opened = sum(1 for _, p, _ in results if not p.reused)
    return {
        "http_version": results[0][2],
        "wall_ms": round(wall, 3),
        "connections_opened": opened,
        "setup_ms_total": round(sum(_setup_ms(p) for _, p, _ in results), 3),
        "mean_ms": round(statistics.fmean(ms for ms, _, _ in results), 3),
    }


async def burst_h1_vs_h2(ctx: Context, h2: Http2Mode | None) -> dict[str, Any]:
    """The same burst of ``BURST`` parallel GETs on a fresh HTTP/1.1 pool and, when the server speaks it, on one
    fresh HTTP/2 connection. ``h2`` is the http2 setting that reaches HTTP/2 here (True over https by ALPN,
    "h2c" over http), or None when the server offers none."""
    out: dict[str, Any] = {"parallel": BURST, "http1": await _burst(ctx, False, BURST)}
    if h2 is not None:
        out["http2"] = await _burst(ctx, h2, BURST)
        out["http2_setting"] = h2
    return out


def keepalive_after_streams(records: list[TimingRecord]) -> dict[str, Any]:
    """From sequential streams on one client: was each stream after the first sent on the connection the one
    before it used, and which needed a retry to get through (a connection cut under a request)?"""
    later = records[1:]
    reused = [r.connection_reused for r in later]
    stale = [r for r in later if any(getattr(e, "reason", "") in STALE_REASONS for e in r.retries)]
    learnt = [i + 1 for i, r in enumerate(records) if r.closes_after_response]
    return {
        "streams": len(records),
        "http_version": records[0].http_version if records else "",
        "reused_after_stream": reused,
        "closed_after_stream": bool(later) and not any(reused),
        "stale_retries": len(stale),
        "learnt_at_stream": learnt[0] if learnt else None,
    }


def closes_after_response(records: list[TimingRecord]) -> dict[str, Any]:
    """What the transport itself learnt over the battery's requests: how many of them found that the host
    closes the connection after each response (``TimingRecord.closes_after_response``, once per pool: each
    step's client has its own), and how many retries went out because a connection was already closed."""
    return {
        "learnt": sum(1 for r in records if r.closes_after_response),
        "stale_retries": sum(1 for r in records for e in r.retries if getattr(e, "reason", "") in STALE_REASONS),
    }


#: Retry reasons that mean "the pooled connection was dead when the request went out".
STALE_REASONS = ("stale connection", "disconnected", "goaway")
