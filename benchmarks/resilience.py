"""Warm-up and retries, measured against `llmchat serve` child processes in the same run.

    /work/venv/bin/python benchmarks/resilience.py [--rounds 12] [--requests 100]

(a) First-request latency of a new ChatClient, cold (nothing open) against warm (``Warmer.warm()`` first, as
    the app does before the first prompt), against ``serve --profile chat``, over h2c and HTTP/1.1. Cold and
    warm alternate within each round so drift hits both alike. Prints medians of TTFB (t0 to the response
    headers: what the connection costs) and TTFT (which adds the server's ~250 ms think time), and the ratio;
    TTFB split into setup (building the pool: the httpx client and its TLS context, paid on first use) and
    the TCP connect. On 127.0.0.1 a connect is cheap; over a real network add one round trip (two with TLS).
(b) ``--requests`` batch requests, 10 at a time through the MicroBatcher, against ``serve --profile flaky``
    with retries (the default RetrySettings, max_delay_s capped at 2 s to bound the run) and without
    (max_attempts = 1): error rate, p50/p99 latency of the requests that succeeded, and successful requests
    per second, as a before/after table. Run twice: with the limiter off (``--rate-limit 0``: the 10 % of
    5xx alone) and with the profile as it is (30 requests a minute per key, a bucket that refills one every
    2 s: past its burst, 429 with a Retry-After of about 2 s). A fresh server per run, so every run meets the same
    seeded fault dice. Bounded: about a minute in all.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from llmchat.core import (
    APIError,
    BatchSettings,
    ChatClient,
    LLMChatError,
    MicroBatcher,
    RetrySettings,
    Warmer,
    percentile,
)
from llmchat.core.server import start_subprocess

MODEL = "llmchat-local"


@contextmanager
def server(*flags: str) -> Iterator[str]:
    """The API root of a `llmchat serve` child with ``flags``, stopped on exit."""
    with start_subprocess(list(flags)) as child:
        yield child.base_url


# -- (a) warm vs cold ------------------------------------------------------------------------------------


@dataclass
class FirstRequest:
    setup_ms: float
    """t0 to the attempt's start: building the pool (httpx client, TLS context) when nothing was open yet."""
    connect_ms: float
    ttfb_ms: float
    ttft_ms: float
    connected: bool


async def first_request(base_url: str, http2: Any, *, warm: bool, n: int) -> FirstRequest:
    """One new client's first stream; warmed first when ``warm``. The pool is closed again on exit."""
    async with ChatClient(base_url=base_url, http2=http2, model=MODEL, use_cache=False) as client:
        if warm:
            warmer = Warmer(client, ping_s=0)
            if not await warmer.warm():
                raise SystemExit(f"warm-up failed: {warmer.error}")
            await warmer.aclose()
        stream = client.stream([{"role": "user", "content": f"Say one word ({n})."}], max_tokens=1)
        async for _ in stream:
            pass
        r = stream.record
        assert r.ttfb_ms is not None and r.ttft_ms is not None
        setup_ms = (r.phases.start_ns - r.t0_ns) / 1e6
        return FirstRequest(setup_ms, r.connect_ms or 0.0, r.ttfb_ms, r.ttft_ms, not r.connection_reused)


HEADER = (f"    {'protocol':<10} {'':<5} {'setup p50':>10} {'connect p50':>12} {'TTFB p50':>10} "
          f"{'TTFT p50':>10} {'new connections':>16}")
PROTOCOLS: dict[str, Any] = {"h2c": "h2c", "HTTP/1.1": False}


def print_pair(label: str, runs: dict[bool, list[FirstRequest]]) -> None:
    med: dict[bool, tuple[float, float]] = {}
    for warm in (False, True):
        rs = runs[warm]
        med[warm] = (statistics.median(r.ttfb_ms for r in rs), statistics.median(r.ttft_ms for r in rs))
        setup = statistics.median(r.setup_ms for r in rs)
        connect = statistics.median(r.connect_ms for r in rs)
        opened = sum(r.connected for r in rs)
        print(f"    {label:<10} {'warm' if warm else 'cold':<5} {setup:>7.2f} ms {connect:>9.2f} ms "
              f"{med[warm][0]:>7.2f} ms {med[warm][1]:>7.1f} ms {opened:>13}/{len(rs)}")
    print(f"    {label:<10} ratio cold/warm TTFB {med[False][0] / med[True][0]:.1f}x, saved "
          f"{med[False][0] - med[True][0]:.2f} ms; TTFT saved {med[False][1] - med[True][1]:.1f} ms "
          "(TTFT carries the server's jitter)")


async def warm_vs_cold(base_url: str, rounds: int) -> None:
    print(f"(a) first request of a new ChatClient in a running process, cold vs warm: serve --profile chat, "
          f"{rounds} interleaved rounds")
    print(HEADER)
    for label, http2 in PROTOCOLS.items():
        runs: dict[bool, list[FirstRequest]] = {False: [], True: []}
        await first_request(base_url, http2, warm=True, n=-1)  # imports, first TCP accept: not measured
        for i in range(rounds):
            order = (False, True) if i % 2 == 0 else (True, False)
            for warm in order:
                runs[warm].append(await first_request(base_url, http2, warm=warm, n=i))
        print_pair(label, runs)


def warm_vs_cold_fresh(base_url: str, rounds: int) -> None:
    """The app's case: the first prompt of a process that just started (lazy imports, the TLS context and the
    connection all still to do), each measurement in a new interpreter running this script's worker."""
    print(f"(a') first request of a freshly started process, cold vs warm: serve --profile chat, {rounds} "
          "interleaved rounds")
    print(HEADER)
    for label in PROTOCOLS:
        runs: dict[bool, list[FirstRequest]] = {False: [], True: []}
        for i in range(rounds):
            order = (False, True) if i % 2 == 0 else (True, False)
            for warm in order:
                out = subprocess.run(
                    [sys.executable, __file__, "--worker", "warm" if warm else "cold", label, base_url],
                    capture_output=True, text=True, timeout=60, check=True,
                )
                runs[warm].append(FirstRequest(**json.loads(out.stdout)))
        print_pair(label, runs)


def worker(mode: str, label: str, base_url: str) -> int:
    result = asyncio.run(first_request(base_url, PROTOCOLS[label], warm=mode == "warm", n=0))
    print(json.dumps(dataclasses.asdict(result)))
    return 0


# -- (b) flaky server, with and without retries -------------------------------------------------------------


@dataclass
class FlakyRun:
    requests: int
    failed: int
    retries: int
    latencies_ms: list[float]
    wall_s: float
    kinds: dict[str, int]

    @property
    def error_rate(self) -> float:
        return 100.0 * self.failed / self.requests

    @property
    def ok_per_s(self) -> float:
        return (self.requests - self.failed) / self.wall_s


async def flaky_run(base_url: str, retry: RetrySettings, n: int, key: str) -> FlakyRun:
    latencies: list[float] = []
    kinds: dict[str, int] = {}
    retries = 0

    async with ChatClient(base_url=base_url, http2="h2c", model=MODEL, use_cache=False, retry=retry,
                          api_key=key) as client:

        async def one(i: int) -> None:
            nonlocal retries
            try:
                reply = await client.complete([{"role": "user", "content": f"Question {i}?"}], max_tokens=20)
            except APIError as exc:
                record = exc.record
                kinds[exc.kind] = kinds.get(exc.kind, 0) + 1
            else:
                record = reply.record
                assert record.total_ms is not None
                latencies.append(record.total_ms)
            retries += len(getattr(record, "retries", []))

        start = time.perf_counter_ns()
        async with MicroBatcher(one, BatchSettings(max_size=10, window_ms=100, concurrency=10)) as batcher:
            await asyncio.gather(*(batcher.submit(i) for i in range(n)))
        wall_s = (time.perf_counter_ns() - start) / 1e9
    return FlakyRun(n, sum(kinds.values()), retries, latencies, wall_s, kinds)


def _pct(values: list[float], q: float) -> str:
    v = percentile(values, q)
    return "-" if v is None else f"{v:.0f} ms"


def _change(before: float | None, after: float | None) -> str:
    if before is None or after is None or before == 0:
        return "-"
    return f"{100.0 * (after - before) / before:+.0f} %"


def table(without: FlakyRun, with_: FlakyRun) -> None:
    rows = [
        ("error rate", f"{without.error_rate:.0f} %", f"{with_.error_rate:.0f} %",
         _change(without.error_rate, with_.error_rate)),
        ("p50 latency (ok)", _pct(without.latencies_ms, 50), _pct(with_.latencies_ms, 50),
         _change(percentile(without.latencies_ms, 50), percentile(with_.latencies_ms, 50))),
        ("p99 latency (ok)", _pct(without.latencies_ms, 99), _pct(with_.latencies_ms, 99),
         _change(percentile(without.latencies_ms, 99), percentile(with_.latencies_ms, 99))),
        ("ok requests/s", f"{without.ok_per_s:.1f}", f"{with_.ok_per_s:.1f}",
         _change(without.ok_per_s, with_.ok_per_s)),
        ("retries made", str(without.retries), str(with_.retries), ""),
        ("wall time", f"{without.wall_s:.1f} s", f"{with_.wall_s:.1f} s",
         _change(without.wall_s, with_.wall_s)),
        ("failures by kind", _kinds(without), _kinds(with_), ""),
    ]
    print(f"    {'':<18} {'no retries':>18} {'retries':>18} {'change':>8}")
    for name, a, b, c in rows:
        print(f"    {name:<18} {a:>18} {b:>18} {c:>8}")


def _kinds(run: FlakyRun) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(run.kinds.items())) or "none"


async def flaky(n: int) -> None:
    retrying = RetrySettings(max_delay_s=2.0)
    once = RetrySettings(max_attempts=1)
    for title, flags in (
        ("limiter off (--rate-limit 0): 10 % 5xx", ("--profile", "flaky", "--rate-limit", "0")),
        ("the profile as it is: 10 % 5xx and 30 requests/min per key", ("--profile", "flaky")),
    ):
        print(f"(b) {n} batch requests, 10 at a time, serve --profile flaky, {title}")
        runs = []
        for i, retry in enumerate((once, retrying)):
            with server(*flags) as url:  # a fresh server: the same seeded dice for both runs
                runs.append(await flaky_run(url, retry, n, key=f"bench-{i}"))
        table(*runs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=12, help="cold/warm pairs per protocol in (a)")
    ap.add_argument("--fresh-rounds", type=int, default=4, help="cold/warm pairs per protocol in (a')")
    ap.add_argument("--requests", type=int, default=100, help="requests per run in (b)")
    ap.add_argument("--worker", nargs=3, metavar=("MODE", "PROTOCOL", "URL"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(*args.worker)
    started = time.perf_counter()
    try:
        with server("--profile", "chat") as url:
            asyncio.run(warm_vs_cold(url, args.rounds))
            warm_vs_cold_fresh(url, args.fresh_rounds)
        asyncio.run(flaky(args.requests))
    except LLMChatError as exc:
        print(f"the local server is unavailable: {exc}")
        return 1
    print(f"took {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
