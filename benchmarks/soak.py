"""A soak of `llmchat bench`: does the bench process hold its memory and file descriptors flat over a long
run?

Starts `llmchat serve --profile chat` (a hosted API's timings: ~250 ms to first token, ~70 tokens/s) in a
child process, then `llmchat bench` in another, ``--users N`` for ``--minutes M`` with ``--json`` to a
temporary file. Every ``--interval`` seconds it reads, from /proc (Linux), the bench process's resident memory
and open file descriptors, the requests it has finished (the request lines of its --json file, read as they
are written) and the CPU each process used since the last row (1.00 is a whole core: the side near it is the
bottleneck).

At the end: RSS and fds after the first minute and at the end, with the same-run ratio end / first minute;
the RSS growth per 1,000 requests (least squares over the rows after the first minute, and over the second
half of the run, once the allocator's high-water mark has settled); and from the run's summary line the
requests, the server's and the network's errors apart from the client's own, and end-to-end p50/p99 against
one user alone on the same server in the same run (a 10-request bench first), which shows whether the
machine kept up.

Run: ``/work/venv/bin/python benchmarks/soak.py`` (10 minutes, 100 users) or ``--users 20 --minutes 1``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmchat.core.server import start_subprocess

MODEL = "llmchat-local"
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Row:
    t: float
    requests: int
    rss_mb: float
    fds: int
    bench_cpu: float
    server_cpu: float


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def cpu_s(pid: int) -> float:
    # Fields 14 and 15 of /proc/PID/stat (user and system time, in clock ticks); the name in field 2 may hold
    # spaces, so count from its closing parenthesis.
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


class RequestLines:
    """Counts the request lines of a --json file as it grows, reading only what is new."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.count = 0
        self.partial = b""

    def poll(self) -> int:
        if self.path.exists():
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
            self.offset += len(data)
            lines = (self.partial + data).split(b"\n")
            self.partial = lines.pop()
            self.count += sum(1 for line in lines if line.startswith(b'{"type": "request"'))
        return self.count


def bench_command(base_url: str, users: int, max_tokens: int, json_path: Path, *budget: str) -> list[str]:
    return [sys.executable, "-m", "llmchat.tui", "bench", "--quiet", "--base-url", base_url, "--model", MODEL,
            "--users", str(users), "--max-tokens", str(max_tokens), "--json", str(json_path), *budget]


def summary(json_path: Path) -> dict[str, Any]:
    with json_path.open("rb") as f:
        f.seek(max(0, json_path.stat().st_size - 200_000))
        last = f.read().rstrip(b"\n").rsplit(b"\n", 1)[-1]
    data: dict[str, Any] = json.loads(last)
    if data.get("type") != "summary":
        raise SystemExit(f"soak: {json_path} has no summary line: the bench did not finish")
    return data


def slope_per_1000(rows: list[Row]) -> float | None:
    """Least-squares MB of RSS per 1,000 requests over ``rows``; None with too few rows or no requests."""
    if len(rows) < 3:
        return None
    xs = [r.requests for r in rows]
    ys = [r.rss_mb for r in rows]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var * 1000


def soak(base_url: str, server_pid: int, users: int, minutes: float, interval: float, max_tokens: int,
         folder: Path) -> tuple[list[Row], dict[str, Any], int]:
    json_path = folder / "soak.jsonl"
    out = (folder / "bench.out").open("w")
    err = (folder / "bench.err").open("w")
    command = bench_command(base_url, users, max_tokens, json_path, "--duration", f"{minutes * 60:g}")
    bench = subprocess.Popen(command, stdout=out, stderr=err)
    lines = RequestLines(json_path)
    rows: list[Row] = []
    start = time.monotonic()
    last_t, last_bench, last_server = start, cpu_s(bench.pid), cpu_s(server_pid)
    print(f"{'t s':>6}{'requests':>10}{'req/s':>8}{'RSS MB':>9}{'fds':>6}{'bench cpu':>11}{'server cpu':>12}")
    try:
        while bench.poll() is None:
            time.sleep(interval)
            try:
                now, b, s = time.monotonic(), cpu_s(bench.pid), cpu_s(server_pid)
                row = Row(now - start, lines.poll(), rss_mb(bench.pid), fds(bench.pid),
                          (b - last_bench) / (now - last_t), (s - last_server) / (now - last_t))
            except (FileNotFoundError, ProcessLookupError, IndexError):
                break  # the bench ended between poll() and the read
            if row.t > minutes * 60 + 1:
                break  # past the duration: in-flight requests finishing and the tables, not the soak
            rate = (row.requests - (rows[-1].requests if rows else 0)) / (now - last_t)
            rows.append(row)
            last_t, last_bench, last_server = now, b, s
            print(f"{row.t:>6.0f}{row.requests:>10}{rate:>8.1f}{row.rss_mb:>9.1f}{row.fds:>6}"
                  f"{row.bench_cpu:>11.2f}{row.server_cpu:>12.2f}", flush=True)
        code = bench.wait()
    finally:
        if bench.poll() is None:
            bench.terminate()
            bench.wait()
        out.close()
        err.close()
    if code != 0:
        raise SystemExit(f"soak: llmchat bench exited {code}: {(folder / 'bench.err').read_text().strip()}")
    return rows, summary(json_path), lines.poll()


def one_user_e2e(base_url: str, max_tokens: int, folder: Path) -> float:
    """End-to-end p50 of 10 requests from one user: what the server gives when nothing else competes."""
    path = folder / "one.jsonl"
    subprocess.run(bench_command(base_url, 1, max_tokens, path, "--requests", "10"), check=True,
                   capture_output=True)
    return float(summary(path)["configs"][0]["latency_ms"]["e2e"]["p50"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between rows (default 5)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--profile", default="chat", help="llmchat serve's profile (default chat)")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="llmchat-soak-") as tmp, \
            start_subprocess(["--profile", opts.profile]) as server:
        folder = Path(tmp)
        alone = one_user_e2e(server.base_url, opts.max_tokens, folder)
        print(f"llmchat bench soak: {opts.users} users for {opts.minutes:g} min, max_tokens "
              f"{opts.max_tokens}, llmchat serve --profile {opts.profile} in its own process; one user "
              f"alone: end-to-end p50 {alone:.0f} ms")
        rows, result, written = soak(server.base_url, server.process.pid, opts.users, opts.minutes,
                                     opts.interval, opts.max_tokens, folder)
    report(rows, result, written, alone)


def report(rows: list[Row], result: dict[str, Any], written: int, alone: float) -> None:
    after = [r for r in rows if r.t >= 60]
    if not after:
        print("soak: shorter than a minute; no first-minute baseline")
        return
    first, end = after[0], after[-1]
    stats = result["configs"][0]
    e2e = stats["latency_ms"]["e2e"]
    growth = slope_per_1000(after)
    print()
    print(f"{'':<28}{'first minute':>14}{'end':>10}{'end / first':>13}")
    print(f"{'bench RSS MB':<28}{first.rss_mb:>14.1f}{end.rss_mb:>10.1f}{end.rss_mb / first.rss_mb:>13.3f}")
    print(f"{'bench open fds':<28}{first.fds:>14}{end.fds:>10}{end.fds / first.fds:>13.3f}")
    print(f"{'requests finished':<28}{first.requests:>14}{end.requests:>10}")
    shown = "-" if growth is None else f"{growth * 1024:+.1f}"
    low, high = min(r.fds for r in after), max(r.fds for r in after)
    print(f"RSS growth after the first minute: {shown} KB per 1,000 requests (least squares over "
          f"{len(after)} rows); peak RSS {max(r.rss_mb for r in rows):.1f} MB; fds {low}..{high} after the "
          "first minute")
    # The allocator keeps what it freed until its high-water mark settles (a minute or three under 100
    # streams): the second half of the run says whether anything still grows once it has.
    second = [r for r in rows if r.t >= rows[-1].t / 2]
    late = slope_per_1000(second)
    if late is not None:
        print(f"second half ({second[0].t:.0f} s on): {late * 1024:+.1f} KB per 1,000 requests, RSS "
              f"{min(r.rss_mb for r in second):.1f}..{max(r.rss_mb for r in second):.1f} MB")
    bench_cpu = sum(r.bench_cpu for r in rows) / len(rows)
    server_cpu = sum(r.server_cpu for r in rows) / len(rows)
    print(f"run: {stats['requests']} requests ({written} request lines), {stats['requests_per_s']:.1f} "
          "req/s; "
          f"server/network errors {stats['server_failed']} {stats['server_errors']}, client errors "
          f"{stats['client_failed']} {stats['client_errors']}; end-to-end p50 {e2e['p50']:.0f} ms, p99 "
          f"{e2e['p99']:.0f} ms ({e2e['p50'] / alone:.2f}x one user alone); CPU on average: bench "
          f"{bench_cpu:.2f}, server {server_cpu:.2f} of a core")
    approximate = stats["percentiles_approximate"]
    if approximate["latency"] or approximate["attribution"]:
        print(f"percentiles from the 0.1% histogram (more than 10,000 values): "
              f"{', '.join(approximate['latency'])}; parts {', '.join(approximate['attribution']) or '-'}")


if __name__ == "__main__":
    main()
