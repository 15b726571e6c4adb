"""From measurements to findings: each with its evidence (the numbers), its effect on what the user waits for,
and the config change that addresses it, in real config keys (``core/config/_settings.py``).

Pure: a ``Report``'s measurements and the user's settings in, findings out; no I/O. Thresholds are named
below so a reader can see why a number was called a problem.
"""

from __future__ import annotations

import math
from typing import Any

from llmchat.core.config import Http2Mode, Settings
from llmchat.core.config._toml import dotted_key, toml_value
from llmchat.core.diagnose._findings import Changes, Finding, Report
from llmchat.core.diagnose._streaming import BUNCHED_MIN_MS, STALL_MIN_MS

CONNECT_COST_WARN_MS = 20.0
"""A new connection that costs this much more than a reused one is worth avoiding (warm-up, HTTP/2)."""
CLOCK_SKEW_WARN_S = 5.0
DNS_WARN_MS = 100.0
HEADROOM_SHARE = 0.1
"""Rate-limit headroom below this share of the limit is "near exhaustion"."""
HEADROOM_MIN = 2
"""...or this few left, whatever the limit."""
READ_TIMEOUT_FACTOR = 3.0
"""read_timeout_s should outlast the slowest first token (p99) or longest gap seen by at least this factor."""


def http_table(report: Report, settings: Settings) -> tuple[str, ...]:
    """Where [http] keys go: the provider's own overrides when it has a table in the config, else [http]."""
    if report.provider and report.provider in settings.providers:
        return ("providers", report.provider, "http")
    return ("http",)


def toml_snippet(changes: Changes) -> str:
    """``changes`` as TOML tables, ready to paste: ``[http]\\nhttp2 = "h2c"``."""
    blocks = []
    for path, keys in changes.items():
        lines = [f"[{dotted_key(path)}]"] + [f"{dotted_key((k,))} = {toml_value(v)}" for k, v in keys.items()]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _fmt(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms:.0f} ms" if ms >= 10 else f"{ms:.1f} ms"


def h2_setting(report: Report) -> Http2Mode | None:
    """The http2 value that reaches HTTP/2 on this server, from what the path probes saw; None for none."""
    path = report.measurements["path"]
    if path.get("alpn") == "h2":
        return True
    if path.get("h2c"):
        return "h2c"
    return None


def _uses_h2(setting: Http2Mode, scheme: str) -> bool:
    return setting == "h2c" if scheme == "http" else bool(setting)


def prescribe(report: Report, settings: Settings, *, scheme: str, http2_setting: Http2Mode) -> list[Finding]:
    """Every finding the measurements support, section by section."""
    table = http_table(report, settings)
    out: list[Finding] = []
    out += _path(report)
    out += _connection(report, settings, table, scheme, http2_setting)
    out += _streaming(report, settings, table)
    out += _server(report, settings, table)
    out += _limits(report, settings)
    return out


def _path(report: Report) -> list[Finding]:
    m = report.measurements["path"]
    out: list[Finding] = []
    if m.get("dns_error"):
        out.append(Finding("path", "path.dns", "fail", "the server's name does not resolve", m["dns_error"]))
    elif m.get("dns_ms") is not None:
        slow = m["dns_ms"] >= DNS_WARN_MS
        out.append(Finding("path", "path.dns", "warn" if slow else "pass",
                           f"DNS {_fmt(m['dns_ms'])}" + (" (slow; the resolver is far or cold)" if slow else ""),
                           f"resolved to {', '.join(m.get('addresses', []))}"))
    rtt = report.measurements["connection"].get("rtt_estimate_ms")
    if m.get("tcp_connect_ms_min") is not None:
        out.append(Finding("path", "path.rtt", "info",
                           f"round trip about {_fmt(rtt if rtt is not None else m['tcp_connect_ms_min'])}",
                           f"TCP connect min {_fmt(m['tcp_connect_ms_min'])}, median "
                           f"{_fmt(m['tcp_connect_ms_median'])}; a GET on an open connection "
                           f"{_fmt(rtt)}"))
    if m.get("tls_error"):
        out.append(Finding("path", "path.tls", "fail", "the TLS handshake failed", m["tls_error"],
                           advice="check http.verify (a CA bundle path) or SSL_CERT_FILE"))
    elif m.get("tls_version"):
        old = m["tls_version"] in ("TLSv1", "TLSv1.1")
        alpn = m.get("alpn") or "none"
        out.append(Finding("path", "path.tls", "warn" if old else "pass",
                           f"{m['tls_version']}, ALPN {alpn}" + (" (HTTP/2 offered)" if alpn == "h2" else ""),
                           f"connect + handshake {_fmt(m.get('tls_connect_and_handshake_ms'))}"))
    if "h2c" in m:
        out.append(Finding("path", "path.h2c", "info",
                           "h2c (HTTP/2 over plain http) " + ("works" if m["h2c"] else "is not spoken here"),
                           m.get("h2c_version") or m.get("h2c_error", "")))
    route = m.get("proxy") or {}
    if route.get("proxy"):
        out.append(Finding("path", "path.proxy", "info",
                           f"requests go through the proxy {route['proxy']} ({route['source']})",
                           "CONNECT tunnels for https://, forwarded HTTP/1.1 for http://; the bare TCP and TLS "
                           "probes above go direct"))
    elif route.get("bypassed_by"):
        out.append(Finding("path", "path.proxy", "info", "requests go direct, past the proxy that is set",
                           f"NO_PROXY has {route['bypassed_by']}"))
    elif route.get("proxy_error"):
        out.append(Finding("path", "path.proxy", "fail", "the proxy configured cannot be used",
                           route["proxy_error"]))
    proxies = dict(report.measurements["limits"].get("proxy_headers", {}))
    if proxies:
        out.append(Finding("path", "path.proxy", "info", "something sits between you and the server",
                           "; ".join(f"{k}: {v}" for k, v in proxies.items())))
    skew = report.measurements["limits"].get("clock_skew_s")
    if skew is not None:
        bad = abs(skew) >= CLOCK_SKEW_WARN_S
        out.append(Finding("path", "path.clock", "warn" if bad else "pass",
                           f"server clock {'ahead' if skew > 0 else 'behind'} by {abs(skew):.1f} s",
                           "from its Date header (1 s resolution)",
                           advice="sync this machine's clock (NTP): Retry-After dates and TLS checks "
                           "use it" if bad else ""))
    return out


def _connection(report: Report, settings: Settings, table: tuple[str, ...], scheme: str,
                http2_setting: Http2Mode) -> list[Finding]:
    m = report.measurements["connection"]
    out: list[Finding] = []
    cost = m.get("new_connection_cost_ms")
    h2 = h2_setting(report)
    if "keepalive_between_requests" in m:
        kept = m["keepalive_between_requests"]
        out.append(Finding("connection", "connection.keepalive", "pass" if kept else "warn",
                           "keep-alive honoured between requests" if kept
                           else "the server closes the connection after each request",
                           f"new {', '.join(_fmt(v) for v in m['new_ms'])}; reused "
                           f"{', '.join(_fmt(v) for v in m['reused_ms'])}",
                           effect_ms=None if kept else cost))
    streams = m.get("after_streams", {})
    if streams.get("closed_after_stream"):
        changes: Changes = {table: {"max_requests_per_connection": 1}}
        alt = f"; or http2 = {toml_value(h2)}: HTTP/2 keeps its connection" if h2 is not None else ""
        out.append(Finding(
            "connection", "connection.close_after_stream", "fail",
            "the server closes the connection after every stream (as llama.cpp does)",
            f"{streams['streams'] - 1} of {streams['streams'] - 1} streams after the first found their "
            f"connection gone ({streams['stale_retries']} retried on a dead one) over {streams['http_version']}",
            effect_ms=cost, changes=changes,
            advice="open a fresh connection per request instead of trying the dead one first" + alt))
    elif streams.get("streams", 0) > 1:
        out.append(Finding("connection", "connection.close_after_stream", "pass",
                           "the connection survives a stream", f"{streams['streams']} streams, one connection"))
    if cost is not None:
        high = cost >= CONNECT_COST_WARN_MS
        changes = {table: {"warmup": True, "keepalive_ping_s": min(settings.http.keepalive_ping_s,
                                                                   settings.http.keepalive_expiry_s / 2)}}
        out.append(Finding(
            "connection", "connection.new_cost", "warn" if high else "pass",
            f"a new connection costs {_fmt(cost)} more than a reused one",
            f"fastest {_fmt(min(m['new_ms']))} new vs {_fmt(min(m['reused_ms']))} reused "
            f"(GET /models, {len(m['new_ms'])} each)",
            effect_ms=cost if high else None, changes=changes if high else {},
            advice="keep connections open and warm: warm-up opens one before the first prompt, pings keep it"
            if high else ""))
    burst = m.get("burst", {})
    h1b, h2b = burst.get("http1"), burst.get("http2")
    if h1b and h2b:
        # What the burst's extra connections cost, each at the measured new-connection price (a proxy or the
        # WAN charges part of it to the first bytes, where the connect stamps do not see it).
        saved = (cost or 0.0) * (h1b["connections_opened"] - h2b["connections_opened"])
        in_use = _uses_h2(http2_setting, scheme)
        evidence = (f"{burst['parallel']} parallel requests: HTTP/1.1 opened {h1b['connections_opened']} "
                    f"connections ({_fmt(h1b['setup_ms_total'])} setup, {_fmt(h1b['wall_ms'])} wall), "
                    f"HTTP/2 {h2b['connections_opened']} ({_fmt(h2b['setup_ms_total'])}, {_fmt(h2b['wall_ms'])})")
        worth = (cost or 0.0) >= CONNECT_COST_WARN_MS and saved > 0
        if in_use:
            out.append(Finding("connection", "connection.http2", "pass", "HTTP/2 is in use", evidence))
        else:
            out.append(Finding(
                "connection", "connection.http2", "warn" if worth else "info",
                "HTTP/2 recommended: one multiplexed connection instead of a pool" if worth
                else "HTTP/2 is available but saves little here",
                evidence, effect_ms=saved if worth else None, effect_per="parallel burst",
                changes={table: {"http2": h2}} if worth and h2 is not None else {},
                advice="each new HTTP/1.1 connection pays the round trips again; HTTP/2 pays them once"
                if worth else ""))
    elif h1b:
        out.append(Finding("connection", "connection.http2", "info", "the server offers no HTTP/2",
                           f"{burst['parallel']} parallel requests opened {h1b['connections_opened']} HTTP/1.1 "
                           f"connections ({_fmt(h1b['setup_ms_total'])} setup)"))
    return out


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _streaming(report: Report, settings: Settings, table: tuple[str, ...]) -> list[Finding]:
    m = report.measurements["streaming"]
    out: list[Finding] = []
    if not m.get("succeeded"):
        return out
    arrivals: list[dict[str, Any]] = m["arrivals"]
    n = len(arrivals)
    if m["bunched_streams"] * 2 >= n and m["bunched_streams"]:
        spans = [a for a in arrivals if a["span_share"] is not None]
        worst = min(spans, key=lambda a: a["span_share"])
        server_span = worst.get("server_span_ms")
        told = f"; the server spread them over {_fmt(server_span)}" if server_span else ""
        out.append(Finding(
            "streaming", "streaming.buffered", "fail",
            "streams arrive bunched at the end: something buffers them",
            f"{m['bunched_streams']} of {n} streams: {worst['chunks']} chunks within {_fmt(worst['chunk_span_ms'])} "
            f"of a {_fmt(worst['total_ms'])} reply ({worst['span_share'] * 100:.0f}%){told}",
            effect_ms=server_span if server_span else worst["total_ms"], effect_per="request (to first token)",
            changes={("ui",): {"stream": False}},
            advice="turn buffering off in the proxy (nginx: proxy_buffering off, or X-Accel-Buffering: no); "
            "until then streaming buys nothing, and batch mode's replies are cacheable"))
    elif n and all((a["total_ms"] or 0.0) < BUNCHED_MIN_MS
                   or (a["server_span_ms"] is not None and a["server_span_ms"] < BUNCHED_MIN_MS) for a in arrivals):
        out.append(Finding("streaming", "streaming.buffered", "info", "replies came too fast to judge how "
                           "chunks arrive", f"{n} streams, each sent in under {_fmt(BUNCHED_MIN_MS)}"))
    elif n:
        shares = ", ".join("-" if a["span_share"] is None else f"{a['span_share'] * 100:.0f}%" for a in arrivals)
        out.append(Finding("streaming", "streaming.buffered", "pass", "chunks arrive spread over each reply",
                           f"{n} streams; chunks spanned {shares} of each reply"))
    gap, own_gap = m["longest_gap_ms"], m.get("longest_own_gap_ms") or 0.0
    # A pause while this process was not running (a busy machine) is told, never blamed on the server.
    own = f"; a pause of {_fmt(own_gap)} was this machine's own (llmchat was not running)" \
        if own_gap >= STALL_MIN_MS else ""
    if m["stalled_streams"]:
        need = math.ceil(READ_TIMEOUT_FACTOR * gap / 1000)
        changes: Changes = {}
        if settings.http.read_timeout_s < need:
            changes[table] = {"read_timeout_s": float(max(60, need))}
        if settings.ui.stall_s * 1000 > gap:  # the HUD's stall badge would never show this one
            changes[("ui",)] = {"stall_s": max(0.5, math.floor(gap / 200) / 10)}
        out.append(Finding(
            "streaming", "streaming.stall", "warn", f"streams stall mid-reply for up to {_fmt(gap)}",
            f"{m['stalled_streams']} of {n} streams had a gap of {_fmt(gap)} between chunks (median gap "
            f"{_fmt(_median([a['median_gap_ms'] for a in arrivals if a['median_gap_ms'] is not None]))}){own}",
            effect_ms=gap, changes=changes,
            advice=("raise read_timeout_s above it" if table in changes else
                    f"read_timeout_s ({settings.http.read_timeout_s:g} s) outlasts it; the pause is the "
                    "server's or a proxy's: look at its logs, its load, its batch scheduler")))
    elif n:
        out.append(Finding("streaming", "streaming.stall", "pass", "no stalls",
                           f"longest gap between chunks {_fmt(gap)}{own}"))
    ttft = m["ttft_ms"]
    slowest = max(ttft.get("p99") or 0.0, gap)
    need_s = math.ceil(READ_TIMEOUT_FACTOR * slowest / 1000)
    short = settings.http.read_timeout_s < need_s
    out.append(Finding(
        "streaming", "streaming.timing", "warn" if short else "pass",
        f"TTFT p50 {_fmt(ttft['p50'])} p99 {_fmt(ttft['p99'])}; ITL p50 {_fmt(m['itl_ms']['p50'])} "
        f"p99 {_fmt(m['itl_ms']['p99'])}; TPOT p50 {_fmt(m['tpot_ms']['p50'])}",
        f"{m['succeeded']} streams" + (f"; read_timeout_s {settings.http.read_timeout_s:g} s is under "
                                       f"{READ_TIMEOUT_FACTOR:g}x the slowest wait seen" if short else ""),
        effect_ms=None, changes={table: {"read_timeout_s": float(max(60, need_s))}} if short else {}))
    return out


def _server(report: Report, settings: Settings, table: tuple[str, ...]) -> list[Finding]:
    m = report.measurements["server"]
    out: list[Finding] = []
    cold = m.get("cold_start", {})
    if cold.get("judged"):
        if cold["cold"]:
            load = cold.get("server_model_load_ms") or 0.0
            said = f"; the server reported a model load of {_fmt(load)}" if load else ""
            out.append(Finding(
                "server", "server.cold_start", "warn", "cold start: the first request waits for the model",
                f"first token {_fmt(cold['first_ttft_ms'])} on the first request against a median "
                f"{_fmt(cold['later_ttft_ms_median'])} after it{said}",
                effect_ms=cold["extra_ms"], effect_per="conversation (its first request)",
                changes={table: {"warmup": True}},
                advice="keep the model loaded on the server (llama.cpp and Ollama: keep_alive; vLLM stays "
                "loaded), or send one tiny request when it starts; warm-up keeps the connection, not the model"))
        else:
            out.append(Finding("server", "server.cold_start", "pass", "no cold start on the first request",
                               f"first token {_fmt(cold['first_ttft_ms'])} vs median "
                               f"{_fmt(cold['later_ttft_ms_median'])}"))
    idle = m.get("after_idle")
    if idle and "cold" in idle:
        if idle["cold"]:
            ping = max(1.0, math.floor(idle["idle_s"] / 2))
            out.append(Finding(
                "server", "server.idle", "warn", f"after {idle['idle_s']:.0f} s idle the model is cold again",
                f"first token {_fmt(idle['ttft_ms'])}, {_fmt(idle['extra_ms'])} over the warm median",
                effect_ms=idle["extra_ms"], effect_per="request after an idle spell",
                changes={table: {"keepalive_ping_s": ping}},
                advice="ping more often than the server unloads (if its pings reach the model); better, "
                "raise the server's idle unload time"))
        else:
            out.append(Finding("server", "server.idle", "pass", f"still warm after {idle['idle_s']:.0f} s idle",
                               f"first token {_fmt(idle['ttft_ms'])}"))
    burst = m.get("burst")
    if burst:
        waiting = burst.get("metrics_requests_waiting_max")
        if burst["saturated_requests"] or (waiting or 0) > 0:
            served = max(1, burst["served_at_once"])
            mean_q = sum(burst["queue_ms"]) / len(burst["queue_ms"])
            metrics = f"; /metrics showed {waiting:g} waiting" if waiting else ""
            out.append(Finding(
                "server", "server.saturation", "warn", f"the server queues: about {served} served at once",
                f"{burst['parallel']} parallel requests: {burst['saturated_requests']} queued, up to "
                f"{_fmt(burst['queue_ms_max'])} before work began{metrics}",
                effect_ms=mean_q, effect_per="request under parallel load",
                changes={("batch",): {"concurrency": served}},
                advice="send no more at once than it serves; for bulk work use the provider's Batch API "
                "(llmchat batch --via batch-api): it queues on the server's side, not in your latency"))
        else:
            out.append(Finding("server", "server.saturation", "pass",
                               f"{burst['parallel']} parallel requests served without queueing",
                               f"longest queue {_fmt(burst['queue_ms_max'])}"))
    shares = m.get("shares")
    if shares:
        text = " · ".join(f"{g} {s * 100:.0f}%" for g, s in sorted(shares.items(), key=lambda kv: -abs(kv[1])))
        out.append(Finding("server", "server.shares", "info", "where the time went", text))
    return out


def _limits(report: Report, settings: Settings) -> list[Finding]:
    m = report.measurements["limits"]
    out: list[Finding] = []
    limits = m.get("rate_limits") or {}
    for kind, entry in limits.items():
        limit, left = entry["limit"], entry["remaining"]
        reset = entry.get("reset_s")
        resets = f", resets in {reset:.0f} s" if reset is not None else ""
        if left <= max(HEADROOM_SHARE * limit, HEADROOM_MIN):
            changes: Changes = {("batch",): {"concurrency": max(1, min(settings.batch.concurrency, int(left) // 2))}}
            if reset is not None and reset > settings.retry.max_delay_s:
                changes[("retry",)] = {"max_delay_s": float(math.ceil(reset))}
            out.append(Finding(
                "limits", f"limits.{kind}", "fail" if left <= 0 else "warn",
                f"rate limit near exhaustion: {left:g} of {limit:g} {kind} left",
                f"x-ratelimit-remaining-{kind}: {left:g} of {limit:g}{resets}",
                effect_ms=None if reset is None else reset * 1000, effect_per="request once it runs out (429)",
                changes=changes,
                advice="spread bursts (fewer at once) and let retries wait the reset; bulk work belongs in the "
                "provider's Batch API (llmchat batch --via batch-api), which has its own, larger limits"))
        else:
            out.append(Finding("limits", f"limits.{kind}", "pass",
                               f"rate-limit headroom: {left:g} of {limit:g} {kind}{resets}"))
    if "rate_limits" in m and not limits:
        out.append(Finding("limits", "limits.requests", "info", "no rate-limit headers sent"))
    seen = m.get("retries_and_errors") or {}
    if seen.get("retries"):
        reasons = ", ".join(f"{k} x{v}" for k, v in seen["retry_reasons"].items())
        out.append(Finding("limits", "limits.retries", "warn", f"{seen['retries']} retries were needed",
                           f"causes: {reasons}", advice="see the finding each cause belongs to above"))
    elif seen.get("requests"):
        out.append(Finding("limits", "limits.retries", "pass", "no retries", f"{seen['requests']} requests"))
    if seen.get("errors"):
        kinds = ", ".join(f"{k} x{v}" for k, v in seen["errors"].items())
        example = next(iter(seen["error_examples"].values()))
        out.append(Finding("limits", "limits.errors", "fail", f"requests failed: {kinds}", example))
    return out
