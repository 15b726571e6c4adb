"""``llmchat batch IN.jsonl --estimate``: the cost model's table (tokens, and per path the cost, the duration
and whether it meets ``--sla-s``), the estimate kept beside OUT.jsonl, and after a real run the actual cost
and duration beside the estimate."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
from pathlib import Path

from llmchat.core import ChatClient, Http2Mode, Settings
from llmchat.core.errors import APIError
from llmchat.core.http import parse_reset
from llmchat.core.load import Actuals, Estimate, Job, estimate, measure_sample
from llmchat.core.observe import prices_from_settings
from llmchat.core.policy import RateLimits
from llmchat.tui.numbers import duration, money


def estimate_path(out_path: Path) -> Path:
    """Where ``--estimate`` keeps its figures: ``OUT.jsonl.estimate.json``."""
    return out_path.with_name(out_path.name + ".estimate.json")


def completion_window_s(settings: Settings) -> float | None:
    """``batch.completion_window`` in seconds ("24h", or a number of seconds); None when not configured."""
    raw = getattr(settings.batch, "completion_window", None)
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return float(raw)
    return parse_reset(raw) if isinstance(raw, str) else None


def _discount(settings: Settings, provider: str) -> float:
    p = settings.providers.get(provider)
    return 0.5 if p is None else p.batch_discount


def _seconds(d_s: float | None) -> str:
    """A duration as the HUD spells it up to 100 s; minutes, then hours, past that (a batch may take a day)."""
    if d_s is None:
        return "-"
    if d_s < 100:
        return duration(d_s * 1000)
    if d_s < 6000:
        return f"{d_s / 60:.1f} min"
    return f"{d_s / 3600:.1f} h"


def format_estimate(est: Estimate, *, sla_s: float | None, where: str) -> str:
    """The table: the jobs and their tokens, then one row per path (cost, duration and its basis, and with
    ``sla_s`` whether it meets it), then the notes."""
    lines = [f"estimate for {est.jobs} job{'s' if est.jobs != 1 else ''} to {est.model or '?'} at {where}"]
    if est.sample:
        lines[0] += (f" (measured on a sample of {est.sample['n']}, sent streamed and whole: "
                     f"{2 * est.sample['n']} requests, not written to the output)")
    else:
        lines[0] += " (no requests sent)"
    lines.append(f"tokens in   {est.tokens_in:,} ({est.in_basis})")
    lines.append(f"tokens out  {est.tokens_out:,} ({est.out_basis})")
    head = ["path", "cost", "duration"] + ([f"meets {_seconds(sla_s)}"] if sla_s is not None else []) + ["basis"]
    rows = [head]
    for p in est.paths:
        d = p.duration
        shown = "-" if d.seconds is None else (
            {"about": "≈ ", "at least": "≥ ", "up to": "≤ "}.get(d.bound, "") + _seconds(d.seconds))
        row = [p.name, "-" if p.cost is None else money(p.cost), shown]
        if sla_s is not None:
            verdict = d.meets(sla_s)
            row.append("?" if verdict is None else "yes" if verdict else "no")
        rows.append([*row, d.basis])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head) - 1)]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1])
    lines += [f"note: {n}" for n in est.notes]
    return "\n".join(lines)


def save_estimate(est: Estimate, out_path: Path) -> Path | None:
    """Keep ``est`` beside OUT.jsonl (0600), so the real run's summary can show it; None when it cannot be
    written (the estimate was printed anyway)."""
    path = estimate_path(out_path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(est.to_dict(), f)
    except OSError:
        return None
    return path


def saved_estimate(out_path: Path) -> Estimate | None:
    """The estimate ``--estimate`` kept beside OUT.jsonl; None when there is none or it is not one."""
    try:
        return Estimate.from_dict(json.loads(estimate_path(out_path).read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def beside_actual(est: Estimate, actual: Actuals, *, path: str) -> str:
    """``cost $0.0123 (estimated $0.0150) · duration 41.2 s (estimated ≈ 40.0 s)``: the run against the
    estimate's row for the path it took."""
    row = est.path(path)
    est_cost = "-" if row.cost is None else money(row.cost)
    d = row.duration
    est_time = "-" if d.seconds is None else (
        {"about": "≈ ", "at least": "≥ ", "up to": "≤ "}.get(d.bound, "") + _seconds(d.seconds))
    cost = money(actual.cost) if not actual.unpriced else f"≥ {money(actual.cost)}"
    line = (f"actual vs estimate ({row.name}): cost {cost} (estimated {est_cost}) · tokens "
            f"{actual.tokens_in:,} in, {actual.tokens_out:,} out (estimated {est.tokens_in:,}, {est.tokens_out:,})"
            f" · duration {_seconds(actual.wall_s)} (estimated {est_time})")
    if actual.no_usage:
        line += f"; {actual.no_usage} job{'s' if actual.no_usage != 1 else ''} without usage not counted"
    return line


async def _estimate(args: argparse.Namespace, settings: Settings, jobs: list[Job], base_url: str | None,
                    http2: Http2Mode | None) -> tuple[Estimate, str]:
    limits = RateLimits.from_settings(settings.providers)
    async with ChatClient(settings, provider=args.provider, base_url=base_url, model=args.model, http2=http2,
                          api_key_env=args.api_key_env, limits=limits) as client:
        sample = None
        if args.sample:
            sample = await measure_sample(client, jobs, args.sample)
        model = client.model
        if not model:
            with contextlib.suppress(APIError):
                offered = await client.models()  # one listing, no tokens billed
                model = offered[0] if offered else ""
        est = estimate(
            jobs, model=model, prices=prices_from_settings(settings.ui.prices),
            batch_discount=_discount(settings, client.endpoint.name),
            concurrency=args.concurrency or settings.batch.concurrency, limiter=client.limiter, sample=sample,
            completion_window_s=completion_window_s(settings),
        )
        return est, f"{client.endpoint.name} ({client.endpoint.hostport})"


def run_estimate(args: argparse.Namespace, settings: Settings, jobs: list[Job], out_path: Path,
                 base_url: str | None, http2: Http2Mode | None) -> int:
    """Print the estimate (and keep it beside OUT.jsonl); 0, or 1 when the sample's requests all failed."""
    est, where = asyncio.run(_estimate(args, settings, jobs, base_url, http2))
    print(format_estimate(est, sla_s=args.sla_s, where=where))
    kept = save_estimate(est, out_path)
    if kept is not None:
        print(f"kept in {kept}: a real run's summary shows its actual cost and duration beside it")
    sample = est.sample
    return 1 if sample and sample["n"] and sample["errors"] >= sample["n"] else 0
