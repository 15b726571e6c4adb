"""Finished ``TimingRecord``s built by hand, every stamp chosen, for the metrics and HUD tests."""

from __future__ import annotations

from typing import Any

from llmchat.core.observe._timing import Phases, TimingRecord

MS = 1_000_000
T0 = 10**12  # any fixed perf_counter_ns value: the records never meet the real clock unless a test says so


def record(
    *,
    ttft_ms: float | None = 45.0,
    total_ms: float = 345.0,
    ttfb_ms: float = 20.0,
    reused: bool = False,
    tls: bool = True,
    mode: str = "stream",
    t0_ns: int = T0,
    model: str = "llmchat-local",
    output_tokens: int = 50,
    **fields: Any,
) -> TimingRecord:
    """A finished request: pool wait 0.2 ms, then (new connection) connect 1.3 ms and TLS 4.5 ms, send 0.3 ms,
    headers at ``ttfb_ms``, first token at ``ttft_ms`` (stream mode), end at ``total_ms``; ``fields`` set the
    rest (error, cache_hit, cancelled, prompt_tokens, usage_from_server ...)."""
    r = TimingRecord(mode=mode, provider="local", model=model, host="127.0.0.1:8000", t0_ns=t0_ns)
    p = Phases(start_ns=t0_ns)
    at = t0_ns + int(0.2 * MS)
    if not reused:
        p.connect_start_ns, p.connect_end_ns = at, at + int(1.3 * MS)
        at = p.connect_end_ns
        if tls:
            p.tls_start_ns, p.tls_end_ns = at, at + int(4.5 * MS)
            at = p.tls_end_ns
    p.send_start_ns, p.send_end_ns = at, at + int(0.3 * MS)
    p.headers_ns = t0_ns + int(ttfb_ms * MS)
    r.phases = p
    r.http_version = "HTTP/2"
    r.status = 200
    if mode == "stream" and ttft_ms is not None:
        r.first_token_ns = t0_ns + int(ttft_ms * MS)
        r.last_token_ns = t0_ns + int((total_ms - 1) * MS)
    r.end_ns = t0_ns + int(total_ms * MS)
    r.output_tokens = output_tokens
    for name, value in fields.items():
        setattr(r, name, value)
    return r
