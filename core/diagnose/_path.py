"""The path to the server: DNS, TCP connect (an RTT estimate), TLS version and ALPN, h2c, proxies, clock skew.

The TCP and TLS probes open bare sockets (no HTTP request is sent, so they cost no budget); the h2c probe is a
GET /models through the engine's own client with prior-knowledge HTTP/2, bounded by a short timeout of its own
(a server that answers the preface in HTTP/1.1, as llama-server does, must not hold the battery), and any
failure of it means "no h2c". Every probe uses the provider's effective [http] settings (``Context.http``):
its CA bundle, its timeouts, its trust_env. The proxy is the one the client's transport resolves for the target
(``proxy_route``: http.proxy, the environment with ``http.trust_env``, NO_PROXY); the headers a reply carries
(``_limits`` reads them) show others. The bare TCP and TLS probes go direct, past any proxy.
"""

from __future__ import annotations

import asyncio
import ssl
import statistics
import time
from email.utils import parsedate_to_datetime
from typing import Any

from llmchat.core.diagnose._budget import Context
from llmchat.core.errors import ConfigError
from llmchat.core.http import resolve_proxy
from llmchat.core.observe import Phases

TCP_PROBES = 3
H2C_TIMEOUT_S = 3.0
"""The h2c probe's own bound, connect and read: an h2c server answers a GET /models within a round trip or
two; one that does not in this long is not one to recommend h2c for."""
#: Reply headers that name something between the client and the server.
PROXY_HEADERS = ("via", "x-cache", "x-served-by", "cf-ray", "x-amz-cf-id", "x-forwarded-for", "forwarded")


def _ms(ns: int) -> float:
    return ns / 1_000_000


async def probe_dns_tcp(ctx: Context) -> dict[str, Any]:
    """How long the name takes to resolve and a bare TCP connect takes, ``TCP_PROBES`` times."""
    loop = asyncio.get_running_loop()
    t = time.perf_counter_ns()
    try:
        infos = await asyncio.wait_for(loop.getaddrinfo(ctx.host, ctx.port, type=0), ctx.http.connect_timeout_s)
    except (OSError, TimeoutError) as exc:
        return {"dns_ms": None, "dns_error": str(exc) or exc.__class__.__name__}
    out: dict[str, Any] = {"dns_ms": round(_ms(time.perf_counter_ns() - t), 3),
                           "addresses": sorted({str(i[4][0]) for i in infos})}
    times: list[float] = []
    for _ in range(TCP_PROBES):
        t = time.perf_counter_ns()
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(ctx.host, ctx.port),
                                               ctx.http.connect_timeout_s)
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
    """An https server's TLS: the handshake's time, the version and what ALPN picked (h2 or http/1.1), with
    the trust the client itself would use for this provider (its own http.verify, else [http]'s). A failed
    handshake is a measurement (``tls_error``); a CA bundle that cannot be loaded raises ConfigError."""
    from llmchat.core.http._transport import _ssl_context  # the client's own trust settings, shared

    verify = _ssl_context(ctx.http)
    if isinstance(verify, ssl.SSLContext):
        context = verify
    else:  # http.verify = false: the handshake is still worth timing
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    context.set_alpn_protocols(["h2", "http/1.1"])
    t = time.perf_counter_ns()
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(ctx.host, ctx.port, ssl=context, server_hostname=ctx.host),
            ctx.http.connect_timeout_s)
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
    """Does a plain-http server speak HTTP/2 with prior knowledge? One GET /models with http2 = "h2c", within
    ``H2C_TIMEOUT_S`` (connect and read, and the whole probe). Never raises for what the server does: any
    failure, a timeout included, is ``{"h2c": False, "h2c_error": ...}``."""
    phases = Phases()
    bound = min(H2C_TIMEOUT_S, ctx.http.connect_timeout_s, ctx.http.read_timeout_s)
    try:
        async with asyncio.timeout(2 * bound):  # the client's own timeouts first; this one if they miss
            async with ctx.client(http2="h2c", connect_timeout_s=bound, read_timeout_s=bound) as client:
                async with client.transport.request("GET", "models", phases=phases) as resp:
                    await resp.aread()
                    version = resp.http_version
    except TimeoutError:
        return {"h2c": False, "h2c_error": f"no answer in HTTP/2 within {bound:g} s"}
    except Exception as exc:  # whatever went wrong, the answer is "no h2c" and the battery goes on
        return {"h2c": False, "h2c_error": str(exc) or exc.__class__.__name__}
    return {"h2c": version == "HTTP/2", "h2c_version": version}


def proxy_route(ctx: Context) -> dict[str, Any]:
    """The proxy the client's transport connects to the target through, as the transport resolves it
    (``resolve_proxy``: http.proxy, the environment's variables with http.trust_env, NO_PROXY), URL masked:
    ``proxy`` (None when direct), ``source`` (the setting or variable), ``bypassed_by`` (the NO_PROXY entry
    that sends the target past a proxy that is set), or ``proxy_error`` for a proxy the client cannot use."""
    http = ctx.http
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
