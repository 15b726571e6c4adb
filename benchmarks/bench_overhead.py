"""What `llmchat bench`'s load generator costs per request, against a bare loop doing the same requests.

Both sides send the same prompts through one ``ChatClient`` (h2c) to `llmchat serve --profile instant` in a
child process, with the same number of concurrent users, and read each stream to its end. The bare loop is
``async for _ in client.stream(...)`` in N tasks; the load generator is ``LoadRun`` (tickets, prompt plan, each
request's attribution and its tally as it ends, the figures afterwards). Rounds alternate between the two so
machine noise hits both alike.

Columns: ``req/s`` requests per second of wall time, ``cpu us/req`` this process's CPU time per request (user
+ system, from ``time.process_time``), and ``vs bare`` the load generator's figure divided by the bare loop's
from the same run (> 1.00 is overhead). The ``figures`` line is the cost of the figures table at the end (the
tally each request feeds is in the load generator's CPU).

Run: ``/work/venv/bin/python benchmarks/bench_overhead.py`` (about 15 s) or ``--quick``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from llmchat.core import ChatClient
from llmchat.core.load import LoadRun, PromptPlan, Scenario, Target
from llmchat.core.server import start_subprocess

MODEL = "llmchat-local"


async def bare(base_url: str, users: int, requests: int, max_tokens: int) -> tuple[float, float]:
    """Wall seconds and CPU seconds of ``requests`` streams sent by ``users`` tasks, no bookkeeping."""
    plan = PromptPlan()
    issued = 0
    async with ChatClient(base_url=base_url, http2="h2c", model=MODEL, use_cache=False) as client:

        async def user() -> None:
            nonlocal issued
            while issued < requests:
                messages, _ = plan.messages(0, issued)
                issued += 1
                async for _ in client.stream(messages, max_tokens=max_tokens):
                    pass

        wall, cpu = time.perf_counter_ns(), time.process_time()
        await asyncio.gather(*(user() for _ in range(users)))
        return (time.perf_counter_ns() - wall) / 1e9, time.process_time() - cpu


async def generator(base_url: str, users: int, requests: int, max_tokens: int) -> tuple[float, float, float]:
    """Wall and CPU seconds of the same load through LoadRun, and the CPU seconds of its figures."""
    scenario = Scenario(users=users, requests=requests, max_tokens=max_tokens, model=MODEL)
    load = LoadRun(scenario, ["base"], Target(base_url=base_url, http2="h2c", model=MODEL))
    wall, cpu = time.perf_counter_ns(), time.process_time()
    await load.run()
    wall_s, cpu_s = (time.perf_counter_ns() - wall) / 1e9, time.process_time() - cpu
    t = time.process_time()
    load.tallies["base"].stats(load.walls_ns["base"])
    return wall_s, cpu_s, time.process_time() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and requests")
    parser.add_argument("--users", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=32)
    opts = parser.parse_args()
    rounds, requests = (2, 200) if opts.quick else (4, 500)
    with start_subprocess(["--profile", "instant"]) as server:
        results: dict[str, list[tuple[float, float]]] = {"bare loop": [], "load generator": []}
        stats_cpu: list[float] = []
        for _ in range(rounds):
            w, c = asyncio.run(bare(server.base_url, opts.users, requests, opts.max_tokens))
            results["bare loop"].append((w, c))
            w, c, s = asyncio.run(generator(server.base_url, opts.users, requests, opts.max_tokens))
            results["load generator"].append((w, c))
            stats_cpu.append(s)
    print(f"{requests} streams x {rounds} rounds, {opts.users} users, max_tokens {opts.max_tokens}, "
          f"h2c to llmchat serve --profile instant (median of rounds)")
    base_rps = base_cpu = 0.0
    print(f"{'':<16}{'req/s':>10}{'vs bare':>9}{'cpu us/req':>12}{'vs bare':>9}")
    for name, runs in results.items():
        rps = statistics.median(requests / w for w, _ in runs)
        cpu = statistics.median(c / requests * 1e6 for _, c in runs)
        if name == "bare loop":
            base_rps, base_cpu = rps, cpu
        print(f"{name:<16}{rps:>10.1f}{rps / base_rps:>9.2f}{cpu:>12.1f}{cpu / base_cpu:>9.2f}")
    print(f"figures: {statistics.median(stats_cpu) / requests * 1e6:.1f} us of CPU per request at the end")


if __name__ == "__main__":
    main()
