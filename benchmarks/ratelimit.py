"""The client-side rate limiter against today's retry path, in the same run, under `llmchat serve --rate-limit`.

    .venv/bin/python benchmarks/ratelimit.py [--limit 30] [--window-s 5] [--times 4] [--rounds 2]

A batch of ``--times`` x ``--limit`` jobs (``max_tokens`` 16, 10 in flight, the MicroBatcher as `llmchat batch`
runs it) against a fresh ``serve --profile chat --rate-limit LIMIT --rate-limit-window-s WINDOW`` per path and
round (so each starts with a full bucket), the two paths alternating first:

- retry: no client limiter, the default RetrySettings (4 attempts, the server's Retry-After): what happens
  today, 429s and their waits, and the jobs that run out of attempts;
- retry-all: the same with attempts enough for every job to get through (30, a 10-minute budget): what
  today's path takes to finish the batch;
- limiter: ``RateLimits()`` learning the limit from the x-ratelimit-* headers alone (nothing configured).

Prints per path the 429s met (retried or final), the jobs that failed, the wall time, jobs done per second,
the requests held by the limiter, medians over the rounds, and each wall time as a ratio of retry-all's (the
baseline that finishes the batch). The window is shorter than a minute only to bound the run: the bucket
behaves the same at any scale.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import statistics
import time
from dataclasses import dataclass

from llmchat.core import ChatClient, RetrySettings, Settings
from llmchat.core.config import BatchSettings, CacheSettings
from llmchat.core.load import read_jobs, run_jobs
from llmchat.core.observe import RequestDone
from llmchat.core.policy import RateLimits
from llmchat.core.server import start_subprocess

MODEL = "llmchat-local"


@dataclass
class Outcome:
    path: str
    wall_s: float
    rate_limited: int
    failed: int
    held: int
    held_s: float
    ok: int


PATHS = ("retry", "retry-all", "limiter")


async def one_batch(base_url: str, jobs_n: int, path: str) -> Outcome:
    settings = Settings(cache=CacheSettings(policy="off"), batch=BatchSettings(concurrency=10, window_ms=5.0))
    jobs, _ = read_jobs([f'{{"id": {i}, "prompt": "job {i}", "max_tokens": 16}}' for i in range(jobs_n)])
    limits = RateLimits() if path == "limiter" else None
    retry = RetrySettings(max_attempts=30, total_budget_s=600.0) if path == "retry-all" else RetrySettings()
    statuses: list[int | None] = []
    async with ChatClient(settings, base_url=base_url, model=MODEL, http2="h2c", retry=retry,
                          limits=limits) as client:

        def done(event: RequestDone) -> None:
            statuses.extend(e.status for e in event.record.retries)
            if event.record.error_kind is not None:
                statuses.append(event.record.status)

        client.bus.subscribe(RequestDone, done)
        t = time.perf_counter()
        summary = await run_jobs(client, jobs, io.StringIO())
        wall = time.perf_counter() - t
        limiter = client.limiter
    return Outcome(path, wall, statuses.count(429), summary.failed, limiter.holds if limiter else 0,
                   limiter.held_s if limiter else 0.0, summary.ok)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=30, help="the server's requests per window (default 30)")
    ap.add_argument("--window-s", type=float, default=5.0, help="its window in seconds (default 5)")
    ap.add_argument("--times", type=int, default=4, help="jobs as a multiple of the limit (default 4)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds, the paths alternating first (default 2)")
    args = ap.parse_args()
    jobs_n = args.limit * args.times
    flags = ["--profile", "chat", "--rate-limit", str(args.limit), "--rate-limit-window-s", str(args.window_s),
             "--max-requests-per-connection", "0"]
    print(f"{jobs_n} jobs, 10 in flight, against serve --profile chat --rate-limit {args.limit} "
          f"--rate-limit-window-s {args.window_s:g} (a fresh server per path and round)")
    results: dict[str, list[Outcome]] = {p: [] for p in PATHS}
    for r in range(args.rounds):
        order = PATHS if r % 2 == 0 else tuple(reversed(PATHS))
        for path in order:
            with start_subprocess(flags) as child:
                outcome = asyncio.run(one_batch(child.base_url, jobs_n, path))
            results[outcome.path].append(outcome)
            print(f"  round {r + 1} {outcome.path:<9} {outcome.wall_s:6.1f} s  429s {outcome.rate_limited:4d}  "
                  f"failed {outcome.failed:3d}  held {outcome.held:4d} ({outcome.held_s:.1f} s planned)")
    print()
    print(f"{'path':<11}{'429s':>7}{'failed':>8}{'wall s':>9}{'jobs/s':>8}{'held':>7}{'ratio':>8}"
          "   (medians over rounds; ratio of wall time to retry-all's)")
    base = statistics.median(o.wall_s for o in results["retry-all"])
    for path in PATHS:
        rows = results[path]
        wall = statistics.median(o.wall_s for o in rows)
        print(f"{path:<11}{statistics.median(o.rate_limited for o in rows):>7.0f}"
              f"{statistics.median(o.failed for o in rows):>8.0f}{wall:>9.1f}"
              f"{statistics.median(o.ok / o.wall_s for o in rows):>8.2f}"
              f"{statistics.median(o.held for o in rows):>7.0f}{wall / base:>7.2f}x")
    ideal = max(0.0, jobs_n - args.limit) * args.window_s / args.limit
    print(f"\nthe limit alone allows this batch in no less than {ideal:.1f} s (burst of {args.limit}, then "
          f"{args.limit / args.window_s:g}/s)")


if __name__ == "__main__":
    main()
