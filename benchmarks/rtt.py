"""Round-trip emulation, measured: how true the delay is, what it costs, and what pooling saves behind it.

    /work/venv/bin/python benchmarks/rtt.py [--rtt-ms 50] [--requests 100]

Servers are `llmchat serve --profile instant` child processes (no think time, so the network is all there is),
one direct and one with ``--rtt-ms``; every figure comes from ChatClient's timing records.

(a) Accuracy. Sequential requests on a new connection each (HTTP/1.1, no keep-alive) and on one reused
    connection, direct and through the emulation: median TTFB, and what the emulation adds beyond the round
    trips it promises (2 for a new connection: handshake, then request; 1 for a reused one), against the same
    request made directly. That remainder is the emulation's own cost.
(b) Throughput. One long stream (5,000 tokens, unpaced) on a warm h2c connection, direct and through the
    emulation: the decode rate in tokens/s, and their ratio. A delay that serialized chunks would divide the
    rate by the number of reads; a pipelined one leaves it alone.
(c) Pooling and HTTP/2 at the emulated RTT: ``--requests`` streamed requests from 10 concurrent users, each
    configuration with a fresh client, over plain http and TLS: h2 (one multiplexed connection), h1 (a pool of
    keep-alive connections), nopool (a connection per request, the naive baseline). Wall time, TTFB p50,
    connections opened and their setup time, and each configuration's ratio against nopool.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager

from llmchat.core import ChatClient, HttpSettings, Settings, TimingRecord, percentile
from llmchat.core.server import SubprocessServer, start_subprocess

MODEL = "llmchat-local"
PROMPT = [{"role": "user", "content": "How far away is the server?"}]


@contextmanager
def server(*flags: str) -> Iterator[SubprocessServer]:
    with start_subprocess(["--profile", "instant", *flags]) as child:
        yield child


def client(base_url: str, http: HttpSettings) -> ChatClient:
    """A ChatClient with a pool of its own (ChatClients given no ``pools`` have their own)."""
    return ChatClient(Settings(http=http), base_url=base_url, model=MODEL, use_cache=False)


async def stream(c: ChatClient, max_tokens: int) -> TimingRecord:
    s = c.stream(PROMPT, max_tokens=max_tokens)
    async for _ in s:
        pass
    return s.record


def ms(values: list[float]) -> str:
    return f"{statistics.median(values):8.1f} ms"


# -- (a) accuracy --------------------------------------------------------------------------------------------


async def accuracy(direct: str, delayed: str, rtt_ms: float, n: int) -> None:
    print(f"(a) accuracy at rtt {rtt_ms:g} ms, {n} sequential requests each; median TTFB")
    fresh = HttpSettings(http2=False, max_keepalive_connections=0)
    rows = []
    for label, http, trips in (("new connection", fresh, 2), ("reused h2c", HttpSettings(http2="h2c"), 1)):
        ttfb: dict[str, list[float]] = {"direct": [], "rtt": []}
        clients = {"direct": client(direct, http), "rtt": client(delayed, http)}
        try:
            for name in ("direct", "rtt"):  # warm each pool (and its TLS context) before measuring
                await stream(clients[name], 1)
            for _ in range(n):
                for name, c in clients.items():  # alternate, so drift hits both
                    r = await stream(c, 1)
                    assert r.ttfb_ms is not None and r.connection_reused == (trips == 1)
                    ttfb[name].append(r.ttfb_ms)
        finally:
            for c in clients.values():
                await c.aclose()
        extra = statistics.median(ttfb["rtt"]) - statistics.median(ttfb["direct"]) - trips * rtt_ms
        rows.append((label, ttfb, trips, extra))
    for label, ttfb, trips, extra in rows:
        print(f"  {label:<15} direct {ms(ttfb['direct'])}   through the emulation {ms(ttfb['rtt'])}"
              f"   promised +{trips * rtt_ms:g} ms, added beyond that {extra:+.1f} ms")


# -- (b) throughput ------------------------------------------------------------------------------------------


async def throughput(direct: str, delayed: str, rounds: int) -> None:
    print("(b) throughput: one 5,000-token unpaced stream on a warm h2c connection, decode rate (median)")
    rates: dict[str, list[float]] = {"direct": [], "rtt": []}
    clients = {"direct": client(direct, HttpSettings(http2="h2c")),
               "rtt": client(delayed, HttpSettings(http2="h2c"))}
    try:
        for c in clients.values():
            await stream(c, 1)
        for _ in range(rounds):
            for name, c in clients.items():
                r = await stream(c, 5000)
                assert r.output_tokens == 5000
                if r.tokens_per_s:
                    rates[name].append(r.tokens_per_s)
    finally:
        for c in clients.values():
            await c.aclose()
    d, e = statistics.median(rates["direct"]), statistics.median(rates["rtt"])
    print(f"  direct {d:12,.0f} tokens/s   through the emulation {e:12,.0f} tokens/s   ratio {e / d:.2f}")


# -- (c) pooling and HTTP/2 ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Run:
    name: str
    wall_s: float
    records: list[TimingRecord]

    @property
    def opened(self) -> int:
        return sum(not r.connection_reused for r in self.records)

    @property
    def setup_ms(self) -> float:
        return sum((r.connect_ms or 0.0) + (r.tls_ms or 0.0) for r in self.records)

    @property
    def ttfb_p50(self) -> float:
        return percentile([r.ttfb_ms for r in self.records if r.ttfb_ms is not None], 50) or 0.0


async def load(base_url: str, name: str, http: HttpSettings, requests: int, users: int = 10) -> Run:
    c = client(base_url, http)
    records: list[TimingRecord] = []
    per_user = [requests // users + (1 if u < requests % users else 0) for u in range(users)]

    async def user(n: int) -> None:
        for _ in range(n):
            records.append(await stream(c, 16))

    start = time.perf_counter_ns()
    try:
        await asyncio.gather(*(user(n) for n in per_user))
    finally:
        await c.aclose()
    return Run(name, (time.perf_counter_ns() - start) / 1e9, records)


async def pooling(base_url: str, tls: bool, cert: str | None, requests: int, rounds: int) -> None:
    verify: bool | str = cert if cert else True
    h2: bool | str = True if tls else "h2c"
    configs = {
        "h2": HttpSettings(http2=h2, verify=verify),
        "h1": HttpSettings(http2=False, verify=verify),
        "nopool": HttpSettings(http2=False, max_keepalive_connections=0, max_connections=100, verify=verify),
    }
    runs: dict[str, list[Run]] = {name: [] for name in configs}
    for _ in range(rounds):  # interleaved rounds, so drift hits every configuration alike
        for name, http in configs.items():
            runs[name].append(await load(base_url, name, http, requests))
    base = statistics.median(r.wall_s for r in runs["nopool"])
    print(f"  {'':8}{'wall s':>9}{'vs nopool':>11}{'TTFB p50':>11}{'opened':>8}{'setup ms':>10}")
    for name, rs in runs.items():
        wall = statistics.median(r.wall_s for r in rs)
        ttfb = statistics.median(r.ttfb_p50 for r in rs)
        opened = statistics.median(r.opened for r in rs)
        setup = statistics.median(r.setup_ms for r in rs)
        print(f"  {name:<8}{wall:9.2f}{wall / base:10.2f}x{ttfb:9.1f} ms{opened:8.0f}{setup:10.1f}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rtt-ms", type=float, default=50.0)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rtt = str(args.rtt_ms)
    with server() as direct, server("--rtt-ms", rtt) as delayed:
        await accuracy(direct.base_url, delayed.base_url, args.rtt_ms, 15)
        await throughput(direct.base_url, delayed.base_url, args.rounds)
    print(f"(c) {args.requests} streamed requests (16 tokens) from 10 users at rtt {args.rtt_ms:g} ms, "
          f"median of {args.rounds} interleaved rounds")
    with server("--rtt-ms", rtt) as plain:
        print("  plain http")
        await pooling(plain.base_url, False, None, args.requests, args.rounds)
    with server("--rtt-ms", rtt, "--tls") as tls:
        print("  TLS")
        await pooling(tls.base_url, True, tls.cert_path, args.requests, args.rounds)


if __name__ == "__main__":
    asyncio.run(main())
