"""The bounded battery: the steps in order, each within the request and time budget, safe to interrupt.

``estimate`` says what a battery will send before anything is; ``run_battery`` runs it and returns a
``Report`` whose findings ``_prescribe`` wrote. A step the budget cannot afford is skipped and named in
``Report.skipped``; a step that fails is recorded as that step's error and the battery goes on; a cancel
(Ctrl-C) ends the battery at once with what was measured so far, ``interrupted`` set.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from llmchat.core.client import ServerSignals
from llmchat.core.config import mask_url
from llmchat.core.diagnose import _connection, _limits, _path, _server, _streaming
from llmchat.core.diagnose._budget import PROMPT_TOKENS, Context, OutOfBudget
from llmchat.core.diagnose._consistency import contradictions
from llmchat.core.diagnose._findings import Estimate, Report
from llmchat.core.diagnose._prescribe import h2_setting, prescribe
from llmchat.core.errors import APIError
from llmchat.core.observe import prices_from_settings

DEFAULT_BUDGET_REQUESTS = 30
DEFAULT_BUDGET_S = 120.0


def plan(ctx: Context) -> list[tuple[str, int, int]]:
    """(step, requests, chat requests) in the order they run; the HTTPS-only and http-only probes are both
    listed (one of them does not apply and sends nothing)."""
    steps = [
        ("dns+tcp", 0, 0),
        ("h2c", 1, 0),
        ("new vs reused", 2 * _connection.REUSE_PROBES + 1, 0),
        ("burst h1 vs h2", 2 * _connection.BURST, 0),
        ("streams", _streaming.STREAMS, _streaming.STREAMS),
        ("parallel burst", _server.BURST, _server.BURST),
        ("headers", 1, 1),
    ]
    if ctx.idle_s > 0:
        steps.insert(5, ("after idle", 1, 1))
    return steps


def estimate(ctx: Context, model: str | None = None) -> Estimate:
    """What the battery will send at most, within ``ctx.budget_requests``: requests, tokens and the cost from
    ``ui.prices`` for ``model`` (None when it has no price)."""
    requests = chat = 0
    for step, n, c in plan(ctx):
        left = ctx.budget_requests - requests
        if step == "streams":  # the one step that runs in part: as many streams as the budget leaves
            n = c = min(n, left)
        if n > left:
            continue  # skipped, as run_battery skips it; the later steps may still fit
        requests, chat = requests + n, chat + c
    prompt, output = chat * PROMPT_TOKENS, chat * ctx.max_tokens
    prices = prices_from_settings(ctx.settings.ui.prices)
    price = prices.get(model or ctx.model or "")
    cost = None if price is None else (prompt * price[0] + output * price[1]) / 1e6
    return Estimate(requests, chat, prompt, output, cost, ctx.budget_s + ctx.idle_s)


async def run_battery(ctx: Context) -> Report:
    """Run every step the budget allows and prescribe. Never raises for what the server does (each failure is
    a measurement); a cancel returns the partial report with ``interrupted`` set."""
    ctx.planned = min(ctx.budget_requests, estimate(ctx).requests)
    probe = ctx.client()
    ctx.describe(probe)
    report = Report(target=mask_url(ctx.resolved_url), provider=probe.endpoint.name, model=ctx.model or "")
    t0 = time.monotonic()
    signals = await ServerSignals(ctx.settings, per_request=True).open()
    try:
        await _steps(ctx, report, signals)
    except asyncio.CancelledError:
        report.interrupted = True
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
    finally:
        with contextlib.suppress(Exception):
            await signals.aclose()
    report.requests_sent = ctx.sent
    report.elapsed_s = time.monotonic() - t0
    report.findings = prescribe(report, ctx.settings, scheme=ctx.scheme, http2_setting=ctx.http2_setting,
                                http=ctx.http)
    report.contradictions = contradictions(report, ctx.settings, ctx.http)
    return report


async def _step(ctx: Context, report: Report, name: str, section: str, requests: int,
                work: Callable[[], Awaitable[dict[str, Any]]], *, take: bool = True) -> dict[str, Any] | None:
    """Run one step within the budget: its result merged into ``section``'s measurements, or None when it was
    skipped (budget) or failed (its error is recorded)."""
    try:
        if take and requests:
            ctx.take(requests, name)
        elif ctx.remaining_s() <= 0:
            raise OutOfBudget(f"{name}: the battery's {ctx.budget_s:g} s were spent")
        async with asyncio.timeout(max(1.0, ctx.remaining_s())):
            result = await work()
    except OutOfBudget as exc:
        report.skipped.append(str(exc))
        return None
    except (APIError, TimeoutError) as exc:
        report.measurements[section].setdefault("errors", {})[name] = str(exc) or "timed out"
        return None
    finally:
        ctx.tick(name)
    report.measurements[section].update(result)
    return result


async def _steps(ctx: Context, report: Report, signals: ServerSignals) -> None:
    m = report.measurements
    await _step(ctx, report, "dns+tcp", "path", 0, lambda: _path.probe_dns_tcp(ctx))
    m["path"]["proxy"] = _path.proxy_route(ctx)
    if ctx.scheme == "https":
        await _step(ctx, report, "tls", "path", 0, lambda: _path.probe_tls(ctx))
    else:
        await _step(ctx, report, "h2c", "path", 1, lambda: _path.probe_h2c(ctx))
        if ctx.http2_setting == "h2c" and not m["path"].get("h2c"):
            # The config asks for h2c and the server does not speak it: every later probe would fail the
            # same way. Go on over HTTP/1.1 (the finding says to change the setting) and measure the rest.
            ctx.http2_fallback = False
    await _step(ctx, report, "new vs reused", "connection", 2 * _connection.REUSE_PROBES + 1,
                lambda: _connection.new_vs_reused(ctx))
    h2 = h2_setting(report)
    await _step(ctx, report, "burst h1 vs h2", "connection", _connection.BURST * (2 if h2 is not None else 1),
                lambda: _burst(ctx, h2))
    new_cost = float(m["connection"].get("new_connection_cost_ms") or 0.0)

    records: list[Any] = []
    streams = await _step(ctx, report, "streams", "streaming", 0, lambda: _streams(ctx, records), take=False)
    all_records = list(records)
    if streams is not None and records:
        m["connection"]["after_streams"] = _connection.keepalive_after_streams(records)
        attributions = [await signals.attribute(r) for r in records]
        m["server"]["cold_start"] = _server.cold_start(records, attributions, new_cost)
        shares_from = attributions[1:] or attributions
        m["server"]["shares"] = _server.shares(shares_from)
        ctx.model = ctx.model or records[0].model
        report.model = ctx.model or ""
    if ctx.idle_s > 0:
        warm = m["server"].get("cold_start", {}).get("later_ttft_ms_median")
        idle = await _step(ctx, report, "after idle", "server", 0,
                           lambda: _idle(ctx, warm, new_cost), take=False)
        if idle is not None:
            all_records.append(m["server"]["after_idle"].pop("record"))
    burst = await _step(ctx, report, "parallel burst", "server", 0,
                        lambda: _saturation(ctx, signals), take=False)
    if burst is not None:
        all_records += m["server"]["burst"].pop("records")
        m["server"]["burst"].pop("attributions")
    if ctx.model:
        await _step(ctx, report, "headers", "limits", 0, lambda: _limits.probe_headers(ctx, ctx.model or ""),
                    take=False)
    m["limits"]["retries_and_errors"] = _limits.retries_and_errors(all_records)
    # The transport's own verdict, beside what the steps measured: the keep-alive finding says it once.
    m["connection"]["closes_after_response"] = _connection.closes_after_response(all_records)


async def _burst(ctx: Context, h2: Any) -> dict[str, Any]:
    return {"burst": await _connection.burst_h1_vs_h2(ctx, h2)}


async def _streams(ctx: Context, sink: list[Any]) -> dict[str, Any]:
    async with _streaming.watching() as watch:
        records, _ = await _streaming.run_streams_into(ctx, sink)
    return _streaming.summarize(records, watch)


async def _idle(ctx: Context, warm: float | None, new_cost: float) -> dict[str, Any]:
    return {"after_idle": await _server.after_idle(ctx, warm, new_cost)}


async def _saturation(ctx: Context, signals: ServerSignals) -> dict[str, Any]:
    return {"burst": await _server.saturation_burst(ctx, signals)}
