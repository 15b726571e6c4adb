"""The ``x-ratelimit-*`` headers OpenAI (and Groq, Together, vLLM's router, llmchat serve) send on every reply.

``x-ratelimit-limit-requests`` / ``-tokens``: the limit; ``x-ratelimit-remaining-requests`` / ``-tokens``: what
is left of it; ``x-ratelimit-reset-requests`` / ``-tokens``: the time until it is back to full, in Go's
duration format (``6m0s``, ``1.5s``, ``20ms``, ``1h2m3.5s``; a bare number is seconds). A header that is
missing or unreadable is None: a provider's odd header is never a reason to fail a reply.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from llmchat.core.observe import Headroom

__all__ = ["parse_reset", "read_headroom"]

_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|us|µs|ns|h|m|s)")


def parse_reset(text: str | None) -> float | None:
    """Seconds from a reset duration: ``"6m0s"`` is 360.0, ``"1.5s"`` 1.5, ``"20ms"`` 0.02, ``"2"`` 2.0.

    None for None, empty, negative or unreadable text."""
    if not text:
        return None
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        return value if value >= 0 and value == value and value != float("inf") else None
    pos, total = 0, 0.0
    for match in _PART.finditer(text):
        if match.start() != pos:
            return None
        total += float(match.group(1)) * _UNIT_S[match.group(2)]
        pos = match.end()
    return total if pos == len(text) and pos > 0 else None


def _count(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    if text.isdigit():
        return int(text)
    try:
        value = float(text)
    except ValueError:
        return None
    return int(value) if 0 <= value < float("inf") else None


def read_headroom(headers: Mapping[str, str]) -> Headroom | None:
    """The headroom ``headers`` (lower-case names, as httpx gives them) tell; None when they carry none."""
    limit_r = headers.get("x-ratelimit-limit-requests")
    limit_t = headers.get("x-ratelimit-limit-tokens")
    remaining_r = headers.get("x-ratelimit-remaining-requests")
    remaining_t = headers.get("x-ratelimit-remaining-tokens")
    if limit_r is None and limit_t is None and remaining_r is None and remaining_t is None:
        return None
    return Headroom(
        limit_requests=_count(limit_r),
        remaining_requests=_count(remaining_r),
        reset_requests_s=parse_reset(headers.get("x-ratelimit-reset-requests")),
        limit_tokens=_count(limit_t),
        remaining_tokens=_count(remaining_t),
        reset_tokens_s=parse_reset(headers.get("x-ratelimit-reset-tokens")),
    )
