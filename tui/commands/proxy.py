"""`llmchat proxy`: a network round trip in front of any server, so local benchmarks pay what remote ones do.

A TCP proxy on 127.0.0.1 that delays every byte by half of ``--rtt-ms`` in each direction (see
``llmchat.core.server._proxy``). It does not parse what it carries: HTTP/1.1, h2c and TLS pass through alike, so a
client pointed at it pays the connect, TLS and request round trips of a server that far away. Exit status 0
after SIGINT or SIGTERM, 2 for a bad flag, 1 when the port cannot be bound.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from llmchat.core.server import DelayProxy, Target, run_proxy


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "proxy",
        help="delay bytes between a client and a server to emulate a network round trip",
        description="Listen on 127.0.0.1 and forward every connection to --to, delaying the bytes in each "
        "direction by half of --rtt-ms (the TCP handshake's round trip is charged to a connection's first "
        "bytes). Point a client at the printed URL.",
    )
    p.add_argument("--to", required=True, metavar="URL", help="the server, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--rtt-ms", type=float, required=True, metavar="MS", help="the round trip to add")
    p.add_argument("--port", type=int, default=0, help="the port to listen on (default 0: a free one)")
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    p.set_defaults(func=run)


def ready_line(proxy: DelayProxy) -> str:
    """``llmchat proxy listening on http://127.0.0.1:PORT/v1 -> http://127.0.0.1:8000/v1 (rtt 50 ms)``."""
    t = proxy.target
    host = f"[{t.host}]" if ":" in t.host else t.host
    to = f"{t.scheme}://{host}:{t.port}{t.path}"
    return f"llmchat proxy listening on {proxy.url()} -> {to} (rtt {proxy.rtt_ms:g} ms)"


def run(args: argparse.Namespace) -> int:
    target = Target.from_url(args.to)
    return asyncio.run(_main(target, args.rtt_ms, args.host, args.port))


async def _main(target: Target, rtt_ms: float, host: str, port: int) -> int:
    loop = asyncio.get_running_loop()
    shutdown = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, shutdown.set)
    try:
        await run_proxy(target, rtt_ms, shutdown=shutdown, host=host, port=port,
                        announce=lambda proxy: print(ready_line(proxy), flush=True))
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    return 0
