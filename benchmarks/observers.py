"""What watching costs a request: the Prometheus exporter and the request log, on the publisher's event loop.

    /work/venv/bin/python benchmarks/observers.py [--requests 5000]

Real timing records (from streams against an in-process `llmchat serve --profile instant`) are published as
RequestStarted + RequestDone pairs, as the engine publishes them, on a bus with nobody listening (the
baseline), with the exporter (``start_exporter``), with the request log (``log.requests_path``, its writer
thread appending to a real file), and with both. Printed: microseconds per request on the publishing loop,
the ratio against the baseline, and that cost as a share of one real request to the local server measured in
the same run. The request log's file writes happen on its own thread; they are counted at the end (the time to
flush what was queued), not per request.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from llmchat.core import Bus, ChatClient, LogSettings, RequestDone, RequestStarted, TimingRecord
from llmchat.core.observe import RequestLog, start_exporter
from llmchat.core.server import resolve_settings, start_in_thread

MODEL = "llmchat-local"


async def real_records(base_url: str, n: int) -> tuple[list[TimingRecord], float]:
    """``n`` records of real streams, and the median end-to-end time of one request (ms)."""
    records = []
    async with ChatClient(base_url=base_url, model=MODEL, http2="h2c", use_cache=False) as c:
        for i in range(n):
            s = c.stream([{"role": "user", "content": f"record {i}"}], max_tokens=32)
            async for _ in s:
                pass
            records.append(s.record)
    totals = [r.total_ms for r in records if r.total_ms is not None]
    return records, statistics.median(totals)


def publish_all(bus: Bus, records: list[TimingRecord], requests: int) -> float:
    """Microseconds per request to publish a start and a done for ``requests`` requests."""
    start = time.perf_counter_ns()
    for i in range(requests):
        record = records[i % len(records)]
        bus.publish(RequestStarted(record))
        bus.publish(RequestDone(record))
    return (time.perf_counter_ns() - start) / 1e3 / requests


def measure(setup: Callable[[Bus], Callable[[], None]], records: list[TimingRecord], requests: int,
            rounds: int) -> float:
    times = []
    for _ in range(rounds):
        bus = Bus()
        close = setup(bus)
        try:
            times.append(publish_all(bus, records, requests))
        finally:
            close()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=5_000)  # a burst the log's queue holds
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with start_in_thread(resolve_settings({"port": 0, "profile": "instant"})) as server:
        records, request_ms = asyncio.run(real_records(server.base_url, 200))
    folder = Path(tempfile.mkdtemp(prefix="llmchat-observers-"))
    flushes: list[float] = []

    def nothing(bus: Bus) -> Callable[[], None]:
        return lambda: None

    def exporter(bus: Bus) -> Callable[[], None]:
        return start_exporter(bus, 0).close

    def request_log(bus: Bus) -> Callable[[], None]:
        path = folder / f"requests-{len(flushes)}-{time.perf_counter_ns()}.jsonl"
        log = RequestLog(LogSettings(requests_path=str(path)))
        log.subscribe(bus)

        def close() -> None:
            t = time.perf_counter_ns()
            log.flush(60)
            flushes.append((time.perf_counter_ns() - t) / 1e6)
            log.close()
            assert log.dropped == 0, "the log dropped lines: raise its queue or lower --requests"

        return close

    def both(bus: Bus) -> Callable[[], None]:
        closers = [exporter(bus), request_log(bus)]
        return lambda: [c() for c in closers] and None

    print(f"{args.requests:,} requests per round, median of {args.rounds} rounds; one real request to the "
          f"local server took {request_ms:.2f} ms (median)")
    base = measure(nothing, records, args.requests, args.rounds)
    print(f"  {'observers':<24}{'us/request':>11}{'vs none':>9}{'of a request':>14}")
    for name, setup in (("none (baseline)", nothing), ("prometheus exporter", exporter),
                        ("request log", request_log), ("exporter + request log", both)):
        us = base if setup is nothing else measure(setup, records, args.requests, args.rounds)
        print(f"  {name:<24}{us:11.2f}{us / base:8.1f}x{us / 1000 / request_ms:13.2%}")
    print(f"  request log: its thread had written every line {statistics.median(flushes):.0f} ms after the "
          f"last publish (median), {args.requests:,} lines a round")


if __name__ == "__main__":
    main()
