"""The path to the server: DNS, TCP connect (an RTT estimate), TLS version and ALPN, h2c, proxies, clock skew.

The TCP and TLS probes open bare sockets (no HTTP request is sent, so they cost no budget); the h2c probe is a
GET /models through the engine's own client with prior-knowledge HTTP/2. The proxy is the one the client's
transport resolves for the target (``proxy_route``: http.proxy, the environment with ``http.trust_env``,
NO_PROXY); the headers a reply carries (``_limits`` reads them) show others. The bare TCP and TLS probes go
direct, past any proxy.
"""

from __future__ import annotations

import asyncio
import ssl
import statistics
import time
from email.utils import parsedate_to_datetime
from typing import Any

from llmchat.core.diagnose._budget import Context
from llmchat.core.errors import APIError, ConfigError
from llmchat.core.http import resolve_proxy
from llmchat.core.observe import Phases

TCP_PROBES = 3
#: Reply headers that name something between the client and the server.
PROXY_HEADERS = ("via", "x-cache", "x-served-by", "cf-ray", "x-amz-cf-id", "x-forwarded-for", "forwarded")


def _ms(ns: int) -> float:
    return ns / 1_000_000


async def probe_dns_tcp(ctx: Context) -> dict[str, Any]:
    """How long the name takes to resolve and a bare TCP connect takes, ``TCP_PROBES`` times."""
    loop = asyncio.get_running_loop()
    t = time.perf_counter_ns()
    try:
        infos = await asyncio.wait_for(loop.getaddrinfo(ctx.host, ctx.port, type=0), 5.0)
    except (OSError, TimeoutError) as exc:
        return {"dns_ms": None, "dns_error": str(exc) or exc.__class__.__name__}
    out: dict[str, Any] = {"dns_ms": round(_ms(time.perf_counter_ns() - t), 3),
                           "addresses": sorted({str(i[4][0]) for i in infos})}
    times: list[float] = []
    for _ in range(TCP_PROBES):
        t = time.perf_counter_ns()
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(ctx.host, ctx.port), 5.0)
        except (OSError, TimeoutError) as exc:
            out["tcp_error"] = str(exc) or exc.__class__.__name__
            break
        times.append(_ms(time.perf_counter_ns() - t))
        writer.close()
    if times:
        out["tcp_connect_ms"] = [round(v, 3) for v in times]
        out["tcp_connect_ms_min"] = round(min(times), 3)
        out["tcp_connect_ms_median"] = round(statistics.median(times), 3)
    return out


async def probe_tls(ctx: Context) -> dict[str, Any]:
    """An https server's TLS: the handshake's time, the version and what ALPN picked (h2 or http/1.1)."""
    from llmchat.core.http._transport import _ssl_context  # the client's own trust settings, shared

    verify = _ssl_context(ctx.settings.http)
    if isinstance(verify, ssl.SSLContext):
        context = verify
    else:  # http.verify = false: the handshake is still worth timing
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    context.set_alpn_protocols(["h2", "http/1.1"])
    t = time.perf_counter_ns()
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(ctx.host, ctx.port, ssl=context, server_hostname=ctx.host), 10.0)
    except (OSError, ssl.SSLError, TimeoutError) as exc:
        return {"tls_error": str(exc) or exc.__class__.__name__}
    handshake = _ms(time.perf_counter_ns() - t)
    sslobj = writer.get_extra_info("ssl_object")
    out = {
        "tls_connect_and_handshake_ms": round(handshake, 3),
        "tls_version": sslobj.version() if sslobj else None,
        "alpn": sslobj.selected_alpn_protocol() if sslobj else None,
    }
    writer.close()
    return out


async def probe_h2c(ctx: Context) -> dict[str, Any]:
    """Does a plain-http server speak HTTP/2 with prior knowledge? One GET /models with http2 = "h2c"."""
    phases = Phases()
    try:
        async with ctx.client(http2="h2c") as client:
            async with client.transport.request("GET", "models", phases=phases) as resp:
                await resp.aread()
                version = resp.http_version
    except APIError as exc:
        return {"h2c": False, "h2c_error": str(exc)}
    return {"h2c": version == "HTTP/2", "h2c_version": version}


def proxy_route(ctx: Context) -> dict[str, Any]:
    """The proxy the client's transport connects to the target through, as the transport resolves it
    (``resolve_proxy``: http.proxy, the environment's variables with http.trust_env, NO_PROXY), URL masked:
    ``proxy`` (None when direct), ``source`` (the setting or variable), ``bypassed_by`` (the NO_PROXY entry
    that sends the target past a proxy that is set), or ``proxy_error`` for a proxy the client cannot use."""
    http = ctx.target_http or ctx.settings.http
    try:
        route = resolve_proxy(http, ctx.resolved_url or ctx.base_url or "")
    except ConfigError as exc:
        return {"proxy": None, "proxy_error": str(exc)}
    return {"proxy": route.shown, "source": route.source or None, "bypassed_by": route.bypassed_by or None}


def clock_skew_s(date_header: str | None, received_wall: float) -> float | None:
    """The server's clock minus ours, in seconds, from a ``Date`` header (1 s resolution); None without one."""
    if not date_header:
        return None
    try:
        server = parsedate_to_datetime(date_header).timestamp()
    except (TypeError, ValueError, IndexError):
        return None
    return round(server - received_wall, 3)
