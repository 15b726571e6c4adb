"""Limits and errors: rate-limit headroom from the x-ratelimit-* headers, the retries the battery needed and
why, and the shapes of the errors it met.

The timing record keeps only the rate-limit headroom of a reply (``TimingRecord.headroom``), not its other
headers, so the headers are read here from one whole reply sent through the engine's transport (POST
/chat/completions, ``max_tokens`` 1): the same reply gives the proxy headers (``Via`` and kin) and the
server's ``Date`` for ``_path``.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

import llmchat.core.http._openai as wire
from llmchat.core.diagnose._budget import PROMPT, Context
from llmchat.core.diagnose._path import PROXY_HEADERS, clock_skew_s
from llmchat.core.errors import APIError
from llmchat.core.observe import Phases, TimingRecord

_KINDS = ("requests", "tokens")
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?!s))?(?:(\d+(?:\.\d+)?)s)?(?:(\d+(?:\.\d+)?)ms)?$")


def parse_reset(text: str) -> float | None:
    """OpenAI's reset durations (``1s``, ``6m0s``, ``120ms``, ``1h2m3.5s``) or plain seconds, in seconds."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    m = _DURATION.match(text)
    if not m or not any(m.groups()):
        return None
    h, mins, s, ms = (float(g) if g else 0.0 for g in m.groups())
    return h * 3600 + mins * 60 + s + ms / 1000


def rate_limits(headers: Mapping[str, str]) -> dict[str, dict[str, float]]:
    """``{"requests": {"limit", "remaining", "reset_s"}, "tokens": {...}}`` for the kinds the headers give."""
    out: dict[str, dict[str, float]] = {}
    for kind in _KINDS:
        limit, remaining = headers.get(f"x-ratelimit-limit-{kind}"), headers.get(f"x-ratelimit-remaining-{kind}")
        if limit is None or remaining is None:
            continue
        try:
            entry = {"limit": float(limit), "remaining": float(remaining)}
        except ValueError:
            continue
        reset = parse_reset(headers.get(f"x-ratelimit-reset-{kind}", ""))
        if reset is not None:
            entry["reset_s"] = reset
        out[kind] = entry
    return out


async def probe_headers(ctx: Context, model: str) -> dict[str, Any]:
    """One whole reply of one token: its rate-limit headers, proxy headers, server clock and status."""
    ctx.take(1, "headers")
    body = wire.chat_body(model, [{"role": "user", "content": PROMPT}], {"max_tokens": 1}, stream=False)
    out: dict[str, Any] = {}
    try:
        async with ctx.client() as client:
            async with client.transport.request("POST", "chat/completions", body=body, phases=Phases()) as resp:
                await resp.aread()
                received = time.time()
                headers = resp.headers
                out["status"] = resp.status
    except APIError as exc:
        ctx.tick("headers")
        return {"error": str(exc), "error_kind": exc.kind}
    ctx.tick("headers")
    out["rate_limits"] = rate_limits(headers)
    out["proxy_headers"] = {h: headers[h] for h in PROXY_HEADERS if h in headers}
    out["server_header"] = headers.get("server")
    out["clock_skew_s"] = clock_skew_s(headers.get("date"), received)
    retry_after = headers.get("retry-after")
    if retry_after:
        out["retry_after"] = retry_after
    return out


def retries_and_errors(records: list[TimingRecord]) -> dict[str, Any]:
    """Every retry the battery's requests needed, by reason, and the errors that ended requests, by kind."""
    reasons: Counter[str] = Counter()
    for r in records:
        for event in r.retries:
            reasons[str(getattr(event, "reason", "?"))] += 1
    kinds: Counter[str] = Counter(r.error_kind or "error" for r in records if r.error)
    examples: dict[str, str] = {}
    for r in records:
        if r.error and (r.error_kind or "error") not in examples:
            examples[r.error_kind or "error"] = r.error
    return {"requests": len(records), "retries": sum(reasons.values()), "retry_reasons": dict(reasons),
            "errors": dict(kinds), "error_examples": examples}
