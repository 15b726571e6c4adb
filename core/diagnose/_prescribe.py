"""From measurements to findings: each with its evidence (the numbers), its effect on what the user waits for,
and the config change that addresses it, in real config keys (``core/config/_settings.py``).

Pure: a ``Report``'s measurements and the user's settings in, findings out; no I/O. Thresholds are named
below so a reader can see why a number was called a problem.
"""

from __future__ import annotations

import math
from typing import Any

from llmchat.core.config import Http2Mode, HttpSettings, Settings
from llmchat.core.config._toml import dotted_key, toml_value
from llmchat.core.diagnose._connection import STALE_REASONS
from llmchat.core.diagnose._consistency import reconcile
from llmchat.core.diagnose._findings import Changes, Finding, Report, shown
from llmchat.core.diagnose._findings import fmt_ms as _fmt
from llmchat.core.diagnose._streaming import BUNCHED_MIN_MS, STALL_MIN_MS

CONNECT_COST_WARN_MS = 20.0
"""A new connection that costs this much more than a reused one is worth avoiding (warm-up, HTTP/2)."""
HTTP2_SAVING_WARN_MS = 10.0
"""HTTP/2 is recommended only when the same parallel burst, measured, finished at least this much sooner on
one HTTP/2 connection than on an HTTP/1.1 pool: a saving the report's own figures show."""
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


def prescribe(report: Report, settings: Settings, *, scheme: str, http2_setting: Http2Mode,
              http: HttpSettings | None = None) -> list[Finding]:
    """Every finding the measurements support, section by section, then reconciled
    (``_consistency.reconcile``): no change to a key already at that value in ``http`` (the provider's
    effective [http], default ``settings.http``) or ``settings``, none made unneeded by another."""
    http = settings.http if http is None else http
    table = http_table(report, settings)
    out: list[Finding] = []
    out += _path(report, table, http2_setting)
    out += _connection(report, http, table, scheme, http2_setting)
    out += _streaming(report, settings, http, table)
    out += _server(report, settings, http, table)
    out += _limits(report, settings)
    return reconcile(out, settings, http)


def _path(report: Report, table: tuple[str, ...], http2_setting: Http2Mode) -> list[Finding]:
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
    if "h2c" in m and not m["h2c"] and http2_setting == "h2c":
        # The config asks for what the server does not speak: every request would fail the way the probe did.
        out.append(Finding("path", "path.h2c", "fail", "http2 = \"h2c\" is set but this server does not speak h2c",
                           m.get("h2c_version") or m.get("h2c_error", ""), changes={table: {"http2": False}},
                           advice="speak HTTP/1.1 to it; the rest of this report was measured so",
                           figures={"h2c": 0.0}))
    elif "h2c" in m:
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


def _connection(report: Report, http: HttpSettings, table: tuple[str, ...], scheme: str,
                http2_setting: Http2Mode) -> list[Finding]:
    m = report.measurements["connection"]
    out: list[Finding] = []
    cost: float | None = None
    if m.get("new_ms") and m.get("reused_ms"):
        # From the figures as printed ("fastest 85 ms new vs 44 ms reused"), so the title, the effect and the
        # evidence agree to the millisecond a reader can check.
        cost = max(0.0, shown(min(m["new_ms"])) - shown(min(m["reused_ms"])))
    h2 = h2_setting(report)
    keepalive = _keepalive(m, table, cost)
    out += keepalive
    closes = any(f.mark in ("warn", "fail") for f in keepalive)
    if cost is not None:
        high = cost >= CONNECT_COST_WARN_MS
        changes: Changes = {}
        advice = ""
        if high and closes:
            # Warm-up and pings keep a connection open for the next request; this server closes it after each.
            advice = ("the server closes its connections (above), so warm-up and pings cannot keep one open; "
                      "only a server that keeps them (or HTTP/2) saves this")
        elif high:
            changes = {table: {"warmup": True,
                               "keepalive_ping_s": min(http.keepalive_ping_s, http.keepalive_expiry_s / 2)}}
            advice = "keep connections open and warm: warm-up opens one before the first prompt, pings keep it"
        out.append(Finding(
            "connection", "connection.new_cost", "warn" if high else "pass",
            f"a new connection costs {_fmt(cost)} more than a reused one",
            f"fastest {_fmt(min(m['new_ms']))} new vs {_fmt(min(m['reused_ms']))} reused "
            f"(GET /models, {len(m['new_ms'])} each)",
            effect_ms=cost if high else None, changes=changes, advice=advice,
            figures={"new_min_ms": shown(min(m["new_ms"])), "reused_min_ms": shown(min(m["reused_ms"]))}))
    burst = m.get("burst", {})
    h1b, h2b = burst.get("http1"), burst.get("http2")
    if h1b and h2b:
        h1_wall, h2_wall = shown(h1b["wall_ms"]), shown(h2b["wall_ms"])
        saved = h1_wall - h2_wall  # measured, on the figures the evidence prints: never an estimate
        in_use = _uses_h2(http2_setting, scheme)
        evidence = (f"{burst['parallel']} parallel requests: HTTP/1.1 opened {h1b['connections_opened']} "
                    f"connections ({_fmt(h1b['setup_ms_total'])} setup, {_fmt(h1_wall)} wall), "
                    f"HTTP/2 {h2b['connections_opened']} ({_fmt(h2b['setup_ms_total'])}, {_fmt(h2_wall)} wall)")
        figures = {"http1_wall_ms": h1_wall, "http2_wall_ms": h2_wall}
        worth = saved >= HTTP2_SAVING_WARN_MS
        if in_use:
            out.append(Finding("connection", "connection.http2", "pass", "HTTP/2 is in use", evidence,
                               figures=figures))
        elif worth:
            out.append(Finding(
                "connection", "connection.http2", "warn",
                "HTTP/2 recommended: one multiplexed connection instead of a pool", evidence,
                effect_ms=saved, effect_per="parallel burst",
                changes={table: {"http2": h2}} if h2 is not None else {},
                advice="each new HTTP/1.1 connection pays the round trips again; HTTP/2 pays them once",
                figures=figures))
        else:
            slower = "was slower" if saved < 0 else "saved little"
            out.append(Finding(
                "connection", "connection.http2", "info", f"HTTP/2 is available but {slower} here",
                evidence, figures=figures))
    elif h1b:
        out.append(Finding("connection", "connection.http2", "info", "the server offers no HTTP/2",
                           f"{burst['parallel']} parallel requests opened {h1b['connections_opened']} HTTP/1.1 "
                           f"connections ({_fmt(h1b['setup_ms_total'])} setup)"))
    return out


def _keepalive(m: dict[str, Any], table: tuple[str, ...], cost: float | None) -> list[Finding]:
    """One finding, one verdict, for whether a connection outlives what is sent on it: plain requests (the
    GETs), streams (the streaming step's records) and what the transport learnt over the whole battery
    (``closes_after_response``) are three views of the same behaviour, said once."""
    between = m.get("keepalive_between_requests")
    streams = m.get("after_streams", {})
    learnt = m.get("closes_after_response", {})
    pools = int(learnt.get("learnt") or 0)
    gets = (f"GET /models new {', '.join(_fmt(v) for v in m['new_ms'])}; reused "
            f"{', '.join(_fmt(v) for v in m['reused_ms'])}" if "new_ms" in m else "")
    reused_gets = sum(bool(r) for r in m.get("reused", []))
    figures: dict[str, float] = {}
    if cost is not None:
        figures["new_connection_cost_ms"] = cost
    paid = f"; each pays a new connection, {_fmt(cost)} more than a reused one" if cost is not None else ""
    if pools:
        figures["closes_after_response"] = float(pools)
    if streams.get("closed_after_stream"):
        later = streams["streams"] - 1
        stale = streams["stale_retries"]
        gets_note = ("; plain requests kept theirs" if between else
                     "; plain requests lost theirs too" if between is False else "")
        figures.update(reused_after_stream=float(sum(bool(r) for r in streams["reused_after_stream"])),
                       streams_after_first=float(later), stale_retries=float(stale))
        at = streams.get("learnt_at_stream")
        # The transport remembers the host for its pool's lifetime: one retry per pool at most, after which
        # every request opens a fresh connection. Only retries beyond that are worth a setting.
        handled = pools > 0 and stale <= pools
        learnt_note = (f"; llmchat learnt it at stream {at} and opened a fresh connection for each one after"
                       if at else "; llmchat learnt it and opened a fresh connection for each request after"
                       if pools else "")
        changes: Changes = {table: {"max_requests_per_connection": 1}} if stale and not handled else {}
        if handled:
            advice = ("nothing to change: llmchat remembers such a host for as long as it keeps its connections "
                      "(one retry at most, then a fresh connection per request); a server that keeps them saves "
                      "the new connection")
        elif stale:
            advice = "open a fresh connection per request instead of trying the dead one first"
        else:
            advice = "each request opens a new connection; the client saw the close in time, so none was wasted"
        return [Finding(
            "connection", "connection.keepalive", "fail" if stale and not handled else "warn",
            "the server closes the connection after every stream (as llama.cpp does)",
            f"{later} of {later} streams after the first could not reuse its connection ({stale} retried on a dead "
            f"one) over {streams['http_version']}{learnt_note}{gets_note}{paid}",
            effect_ms=cost, changes=changes, advice=advice, figures=figures)]
    if pools:
        # Too few streams to see it (a small budget), but the transport saw the host close right after a
        # response: the same behaviour, from the battery's own requests.
        stale = int(learnt.get("stale_retries") or 0)
        retried = f" ({stale} retried on a dead one)" if stale else ""
        return [Finding(
            "connection", "connection.keepalive", "warn",
            "the server closes the connection after each response (as llama.cpp does)",
            f"llmchat saw it close right after a response{retried} and opened a fresh connection for each request "
            f"after{paid}", effect_ms=cost, figures=figures,
            advice="nothing to change: llmchat remembers such a host (one retry at most, then a fresh connection "
            "per request)")]
    if between is False:
        figures.update(reused_between_requests=float(reused_gets))
        return [Finding("connection", "connection.keepalive", "warn",
                        "the server closes the connection after each request", gets + paid, effect_ms=cost,
                        figures=figures)]
    if between or streams.get("streams", 0) > 1:
        across = f"; {streams['streams']} streams on one connection" if streams.get("streams", 0) > 1 else ""
        what = "between requests and across streams" if across else "between requests"
        return [Finding("connection", "connection.keepalive", "pass", f"keep-alive honoured {what}",
                        gets + across)]
    return []


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _streaming(report: Report, settings: Settings, http: HttpSettings, table: tuple[str, ...]) -> list[Finding]:
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
            figures={"span_share": worst["span_share"], "total_ms": worst["total_ms"],
                     **({"server_span_ms": server_span} if server_span else {})},
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
        if http.read_timeout_s < need:
            changes[table] = {"read_timeout_s": float(max(60, need))}
        if settings.ui.stall_s * 1000 > gap:  # the HUD's stall badge would never show this one
            changes[("ui",)] = {"stall_s": max(0.5, math.floor(gap / 200) / 10)}
        out.append(Finding(
            "streaming", "streaming.stall", "warn", f"streams stall mid-reply for up to {_fmt(gap)}",
            f"{m['stalled_streams']} of {n} streams had a gap of {_fmt(gap)} between chunks (median gap "
            f"{_fmt(_median([a['median_gap_ms'] for a in arrivals if a['median_gap_ms'] is not None]))}){own}",
            effect_ms=gap, changes=changes, figures={"longest_gap_ms": gap},
            advice=("raise read_timeout_s above it" if table in changes else
                    f"read_timeout_s ({http.read_timeout_s:g} s) outlasts it; the pause is the "
                    "server's or a proxy's: look at its logs, its load, its batch scheduler")))
    elif n:
        out.append(Finding("streaming", "streaming.stall", "pass", "no stalls",
                           f"longest gap between chunks {_fmt(gap)}{own}"))
    ttft = m["ttft_ms"]
    slowest = max(ttft.get("p99") or 0.0, gap)
    need_s = math.ceil(READ_TIMEOUT_FACTOR * slowest / 1000)
    short = http.read_timeout_s < need_s
    out.append(Finding(
        "streaming", "streaming.timing", "warn" if short else "pass",
        f"TTFT p50 {_fmt(ttft['p50'])} p99 {_fmt(ttft['p99'])}; ITL p50 {_fmt(m['itl_ms']['p50'])} "
        f"p99 {_fmt(m['itl_ms']['p99'])}; TPOT p50 {_fmt(m['tpot_ms']['p50'])}",
        f"{m['succeeded']} streams" + (f"; read_timeout_s {http.read_timeout_s:g} s is under "
                                       f"{READ_TIMEOUT_FACTOR:g}x the slowest wait seen" if short else ""),
        effect_ms=None, changes={table: {"read_timeout_s": float(max(60, need_s))}} if short else {},
        figures={"read_timeout_s": http.read_timeout_s, "slowest_wait": slowest} if short else {}))
    return out


def _server(report: Report, settings: Settings, http: HttpSettings, table: tuple[str, ...]) -> list[Finding]:
    m = report.measurements["server"]
    out: list[Finding] = []
    cold = m.get("cold_start", {})
    if cold.get("judged"):
        if cold["cold"]:
            load = shown(cold.get("server_model_load_ms") or 0.0)
            said = f"; the server reported a model load of {_fmt(load)}" if load else ""
            first, later = shown(cold["first_ttft_ms"]), shown(cold["later_ttft_ms_median"])
            out.append(Finding(
                "server", "server.cold_start", "warn", "cold start: the first request waits for the model",
                f"first token {_fmt(first)} on the first request against a median {_fmt(later)} after it{said}",
                effect_ms=max(first - later, load), effect_per="conversation (its first request)",
                changes={table: {"warmup": True}},
                figures={"first_ttft_ms": first, "later_ttft_median_ms": later, "server_model_load_ms": load},
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
            # Pings already at least that often need no change (0 is off).
            often = 0 < http.keepalive_ping_s <= ping
            extra = shown(idle["extra_ms"])
            out.append(Finding(
                "server", "server.idle", "warn", f"after {idle['idle_s']:.0f} s idle the model is cold again",
                f"first token {_fmt(idle['ttft_ms'])}, {_fmt(extra)} over the warm median",
                effect_ms=extra, effect_per="request after an idle spell",
                changes={} if often else {table: {"keepalive_ping_s": ping}},
                figures={"extra_ms": extra},
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
                figures={"saturated_requests": float(burst["saturated_requests"]),
                         "queue_ms_max": burst["queue_ms_max"]},
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
                figures={"remaining": left, "limit": limit},
                changes=changes,
                advice="spread bursts (fewer at once) and let retries wait the reset; bulk work belongs in the "
                "provider's Batch API (llmchat batch --via batch-api), which has its own, larger limits"))
        else:
            out.append(Finding("limits", f"limits.{kind}", "pass",
                               f"rate-limit headroom: {left:g} of {limit:g} {kind}{resets}"))
    if "rate_limits" in m and not limits:
        out.append(Finding("limits", "limits.requests", "info", "no rate-limit headers sent"))
    seen = m.get("retries_and_errors") or {}
    learnt = report.measurements["connection"].get("closes_after_response", {})
    stale = sum(n for reason, n in seen.get("retry_reasons", {}).items() if reason in STALE_REASONS)
    if seen.get("retries") and stale == seen["retries"] and 0 < stale <= int(learnt.get("learnt") or 0):
        # Every retry was the one a pool pays to learn that the host closes after each response: the
        # keep-alive finding says so, and this one does not say it again as a warning.
        out.append(Finding("limits", "limits.retries", "info",
                           f"{stale} {'retry' if stale == 1 else 'retries'} on a connection the server had closed",
                           "the server closes its connections: see the connection's life above"))
    elif seen.get("retries"):
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
