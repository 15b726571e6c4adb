"""`llmchat bench --workers`: requests/s of one load test split over 1, 2 and N worker processes.

Each run is ``make_run`` (what `llmchat bench` runs) with the same closed loop of ``--users`` against one
`llmchat serve --profile instant` started here, in a child process; the worker counts alternate over
``--rounds`` rounds so machine noise hits each alike. ``req/s`` is successful requests over the run's wall
time (the slices, not the workers' start-up), the median of the rounds; ``vs 1`` divides it by the one-worker
figure of the same run. The server shares the machine's cores with the workers: once it saturates, more
workers cannot add requests/s, and the table shows where.

A second table runs the same against ``benchmarks/_canned.py``, a target that answers every request with one
canned write and costs next to nothing: what the workers themselves scale to on this machine's cores when
the server is not the limit (on two cores, llmchat serve is).

Run: ``.venv/bin/python benchmarks/bench_workers.py`` (about two minutes) or ``--quick``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from llmchat.core.load import Scenario, Target, available_cores, make_run
from llmchat.core.server import start_subprocess


async def one(base_url: str, workers: int, users: int, requests: int, max_tokens: int) -> float:
    run = make_run(Scenario(users=users, requests=requests, max_tokens=max_tokens, model="llmchat-local"),
                   ["base"], Target(base_url=base_url, model="llmchat-local"), workers=workers)
    await run.run()
    stats = run.tallies["base"].stats(run.walls_ns["base"])
    assert stats.ok == requests, f"{stats.failed} requests failed: {stats.errors}"
    return stats.rps


@contextmanager
def canned(tokens: int) -> Iterator[str]:
    """benchmarks/_canned.py in a child process; its base URL."""
    script = Path(__file__).resolve().parent / "_canned.py"
    child = subprocess.Popen([sys.executable, str(script), "--tokens", str(tokens)], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None
        yield child.stdout.readline().strip()
    finally:
        child.terminate()
        child.wait(10)


def table(title: str, base_url: str, counts: list[int], rounds: int, requests: int, users: int,
          max_tokens: int) -> None:
    rps: dict[int, list[float]] = {n: [] for n in counts}
    for _ in range(rounds):
        for n in counts:
            rps[n].append(asyncio.run(one(base_url, n, users, requests, max_tokens)))
    print(f"{requests} streams x {rounds} rounds, closed loop of {users} users, max_tokens {max_tokens}, "
          f"{title} on the same {available_cores()} cores (median of rounds)")
    print(f"{'workers':<10}{'req/s':>10}{'vs 1':>8}   rounds")
    base = statistics.median(rps[1])
    for n in counts:
        median = statistics.median(rps[n])
        print(f"{n:<10}{median:>10.1f}{median / base:>8.2f}   " + " ".join(f"{v:.0f}" for v in rps[n]))
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and requests")
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--workers", type=int, default=max(4, available_cores()), help="the N of the last column")
    opts = parser.parse_args()
    rounds, requests = (2, 1000) if opts.quick else (3, 3000)
    counts = sorted({1, 2, opts.workers})
    with start_subprocess(["--profile", "instant"]) as server:
        table("llmchat serve --profile instant", server.base_url, counts, rounds, requests, opts.users,
              opts.max_tokens)
    with canned(opts.max_tokens) as url:
        table("benchmarks/_canned.py (one canned write a reply)", url, counts, rounds, requests * 2, opts.users,
              opts.max_tokens)

if __name__ == "__main__":
    main()
