"""What `llmchat serve --profile instant` sustains: streamed tokens/s and requests/s at 1, 10 and 100
concurrent streams, over HTTP/1.1 and h2c.

The server runs in its own process (``start_subprocess``), so it has a core to itself on a 2-core machine; the
clients are httpx ``AsyncClient`` pools in this process. HTTP/1.1 uses one connection per concurrent stream,
spread over pools of at most 10 connections: one httpx pool of 100 connections slows to a crawl by itself
(about 24 streams/s here, against 300 with ten pools of 10), and that would measure httpx, not the server.
h2c multiplexes all streams on one connection. Each stream asks for ``--tokens`` tokens (300 by default) and
is read to ``[DONE]``; each cell runs for a fixed time after a short warm-up.

Columns: ``tok/s`` streamed tokens per second, ``req/s`` streams per second, ``srv ms`` the median of the
server's own ``server_timing`` (last token sent minus request received), ``srv cpu`` and ``cli cpu`` the share
of one core the server process and this process used (near 1.00 marks the side that is the bottleneck), and
``srv tok/s/core`` what the server would sustain with a whole core busy (tok/s divided by srv cpu): its
capacity, whichever side limited the run.

Same-run baselines, so figures compare across noisy machines: ``vs 1 stream`` divides each cell's tok/s by the
1-stream tok/s of the same protocol; ``vs plain`` divides each cell's req/s by what a plain HTTP/1.1 loop of
non-streamed one-token requests sustains in this run.

Run: ``/work/venv/bin/python benchmarks/serve.py`` (about 20 s) or ``--quick`` (about 6 s).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import statistics
import sys
import time
from dataclasses import dataclass

import httpx

from llmchat.core.server import SubprocessServer, start_subprocess

CONCURRENCY = (1, 10, 100)
PROTOCOLS = ("http/1.1", "h2c")
MESSAGES = [{"role": "user", "content": "Tell me about connection pools"}]
_TIMING = b'"server_timing":'


@dataclass
class Cell:
    protocol: str
    concurrency: int
    seconds: float
    requests: int
    tokens: int
    server_ms: float
    server_cpu: float
    client_cpu: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process, from /proc (0.0 where there is no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


POOL = 10
_UNUSED_TLS = ssl.create_default_context()  # plain http never uses it; httpx would build one per client


def make_clients(protocol: str, concurrency: int, base_url: str) -> list[httpx.AsyncClient]:
    """One h2c client, or enough HTTP/1.1 clients of at most POOL connections for ``concurrency`` streams."""
    if protocol == "h2c":
        return [httpx.AsyncClient(base_url=base_url, http1=False, http2=True, timeout=30, verify=_UNUSED_TLS)]
    sizes = [min(POOL, concurrency - start) for start in range(0, concurrency, POOL)]
    return [
        httpx.AsyncClient(
            base_url=base_url,
            limits=httpx.Limits(max_connections=n, max_keepalive_connections=n),
            timeout=30,
            verify=_UNUSED_TLS,
        )
        for n in sizes
    ]


async def one_stream(client: httpx.AsyncClient, max_tokens: int) -> tuple[int, int]:
    """Stream one reply to its end; returns (tokens, server ms from received to last token)."""
    body = {"messages": MESSAGES, "stream": True, "max_tokens": max_tokens}
    tail = b""
    async with client.stream("POST", "/chat/completions", json=body) as response:
        response.raise_for_status()
        async for chunk in response.aiter_raw():
            tail = (tail + chunk)[-2048:]
    if not tail.endswith(b"data: [DONE]\n\n"):
        raise RuntimeError("a stream ended without [DONE]")
    timing_at = tail.rindex(_TIMING) + len(_TIMING)
    timing = json.loads(tail[timing_at : tail.index(b"}", timing_at) + 1])
    return max_tokens, (timing["last_token_ns"] - timing["received_ns"]) // 1000


async def run_cell(
    server: SubprocessServer, protocol: str, concurrency: int, seconds: float, max_tokens: int
) -> Cell:
    clients = make_clients(protocol, concurrency, server.base_url)
    # Stream i always goes through the same client, so each HTTP/1.1 pool has as many streams as connections.
    assigned = [clients[i // POOL] if protocol != "h2c" else clients[0] for i in range(concurrency)]
    try:
        # Warm-up: open the connections and fill caches before the clock starts.
        await asyncio.gather(*(one_stream(client, max_tokens) for client in assigned))
        deadline = time.perf_counter() + seconds
        server_us: list[int] = []
        totals = [0, 0]

        async def worker(client: httpx.AsyncClient) -> None:
            while time.perf_counter() < deadline:
                tokens, us = await one_stream(client, max_tokens)
                totals[0] += 1
                totals[1] += tokens
                server_us.append(us)

        server_cpu0, client_cpu0 = cpu_seconds(server.process.pid), time.process_time()
        started = time.perf_counter_ns()
        await asyncio.gather(*(worker(client) for client in assigned))
        elapsed = (time.perf_counter_ns() - started) / 1e9
        server_cpu = cpu_seconds(server.process.pid) - server_cpu0
        client_cpu = time.process_time() - client_cpu0
    finally:
        for client in clients:
            await client.aclose()
    return Cell(
        protocol,
        concurrency,
        elapsed,
        totals[0],
        totals[1],
        statistics.median(server_us) / 1000,
        server_cpu / elapsed,
        client_cpu / elapsed,
    )


async def plain_baseline(server: SubprocessServer, seconds: float) -> float:
    """Requests/s of a plain HTTP/1.1 loop of non-streamed one-token requests, one at a time."""
    (client,) = make_clients("http/1.1", 1, server.base_url)
    async with client:
        body = {"messages": MESSAGES, "max_tokens": 1}
        for _ in range(20):
            (await client.post("/chat/completions", json=body)).raise_for_status()
        count = 0
        started = time.perf_counter_ns()
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            (await client.post("/chat/completions", json=body)).raise_for_status()
            count += 1
        return count / ((time.perf_counter_ns() - started) / 1e9)


async def main_async(seconds: float, max_tokens: int) -> int:
    # Connections kept open for good: the raw httpx clients here would meet the GOAWAY after 1,000 requests.
    with start_subprocess(["--profile", "instant", "--max-requests-per-connection", "0"]) as server:
        baseline = await plain_baseline(server, seconds)
        cells = [await run_cell(server, p, c, seconds, max_tokens) for p in PROTOCOLS for c in CONCURRENCY]
    print(
        f"llmchat serve --profile instant, {max_tokens} tokens per stream, {seconds:g} s per cell, "
        f"{os.cpu_count()} cores, Python {sys.version.split()[0]}"
    )
    print(f"baseline: plain HTTP/1.1 non-streamed 1-token requests, one at a time: {baseline:,.0f} req/s")
    print()
    header = (
        f"{'protocol':<9} {'streams':>7} {'tok/s':>10} {'req/s':>8} {'srv ms':>7} {'srv cpu':>7} "
        f"{'cli cpu':>7} {'srv tok/s/core':>14} {'vs 1 stream':>11} {'vs plain':>8}"
    )
    print(header)
    print("-" * len(header))
    for cell in cells:
        single = next(c for c in cells if c.protocol == cell.protocol and c.concurrency == 1)
        capacity = f"{cell.tokens_per_s / cell.server_cpu:,.0f}" if cell.server_cpu > 0 else "n/a"
        print(
            f"{cell.protocol:<9} {cell.concurrency:>7} "
            f"{cell.tokens_per_s:>10,.0f} {cell.requests_per_s:>8,.1f} "
            f"{cell.server_ms:>7.2f} {cell.server_cpu:>7.2f} {cell.client_cpu:>7.2f} {capacity:>14} "
            f"{cell.tokens_per_s / single.tokens_per_s:>10.2f}x {cell.requests_per_s / baseline:>7.2f}x"
        )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="0.6 s per cell instead of 2.5 s")
    parser.add_argument("--tokens", type=int, default=300, help="tokens per stream (default 300)")
    args = parser.parse_args()
    return asyncio.run(main_async(0.6 if args.quick else 2.5, args.tokens))


if __name__ == "__main__":
    sys.exit(main())
