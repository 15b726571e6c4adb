"""How much latency and CPU llmchat's client adds, against openai-python, raw httpx, httpx2 and aiohttp, in one
run; and httpx2 against httpx 0.28.1, the HTTP stack under llmchat's transport.

    /work/venv/bin/python benchmarks/client_overhead.py [--quick] [--rounds N] [--json PATH]
    /work/venv/bin/python benchmarks/client_overhead.py --profile llmchat:h1:100   # cProfile one client

The server is `llmchat serve --profile instant` in its own process (no delay; a whole 64-token reply goes out
in a few writes), on 127.0.0.1. Each client runs in a worker process of its own (this script with
``--worker``), one at a time: for each protocol and concurrency the clients take turns, and every round
rotates their order (A B C D, then B C D A, ...) so machine noise hits them alike. A cell is a new client, a
warm-up at the cell's concurrency (one request per task, so HTTP/1.1 has its connections open), then up to N
requests, or the cell's time cap, from ``c`` tasks, each streaming one 64-token reply to its end. What each
client's loop does exactly is in ``benchmarks/_clients.py``; every pool holds 100 connections. Failed
requests, warm-up included, are counted in "err" (the first message is in the JSON).

Figures per cell: medians over rounds for rates and CPU, percentiles over all rounds' samples pooled.

* req/s: requests finished / wall time of the cell;
* CPU ms/req: the worker's ``time.process_time()`` (user + system, all threads) / requests, with the range
  over rounds: on a shared or virtual machine the spread says how far to trust a ratio;
* overhead: the client's first-token time minus the server's ``server_timing.first_token_ns`` for the same
  request, both ``time.monotonic_ns`` (on Linux ``perf_counter`` reads the same clock). llmchat's is its
  record's stamp, taken as the chunk's bytes arrive (``record.to_mono_ns(record.first_token_ns)``); the
  others' is taken when the first content delta reaches the caller. "caller p50" takes the caller-side stamp
  for every client, llmchat included: the like-for-like column;
* srv CPU ms/req and srv busy: the server process's CPU per request and as a share of one core over the cell
  (from /proc, 10 ms ticks). Near 100 % busy the server, not the client, sets req/s.

The HTTP stack (issue 13): the ``httpx2`` loop is the ``httpx`` loop on pydantic's fork, and each table says
httpx2's req/s and CPU per request as a ratio of httpx's; before the rounds, one h2c request on each stack with
the ``trace`` extension says whether it speaks HTTP/2 and fires the phase events the transport stamps
(``connection.connect_tcp.*``, ``http2.send_request_headers.started``, ``http2.receive_response_headers.complete``).

Goals (from the issue): llmchat overhead p50 <= 1 ms at 1 stream; llmchat CPU/req <= 1.25x aiohttp's
(aiohttp speaks HTTP/1.1 only, so the HTTP/2 tables compare with its HTTP/1.1 figure at the same concurrency);
llmchat req/s >= 5x openai-python's at 100 streams, per protocol. The run exits 1 if any client got a reply
of another length than the others (a loop that drops text would look fast).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import json
import os
import pstats
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _clients import CLIENTS, JSON_DECODER, MAX_TOKENS, POOL, Sample, make_client, trace_check  # noqa: E402

from llmchat.core.observe import percentile  # noqa: E402

LEVELS = (1, 10, 100)
PROTO_NAMES = {"h2": "HTTP/2 (h2c, prior knowledge)", "h1": "HTTP/1.1"}
GOAL_OVERHEAD_MS = 1.0
GOAL_CPU_RATIO = 1.25
GOAL_RATE_RATIO = 5.0


@dataclass(frozen=True)
class Plan:
    """How much to run: rounds, the most requests per cell by concurrency, and each cell's time cap."""

    rounds: int
    n: dict[int, int]
    cap_s: float

    @staticmethod
    def warmup(c: int, proto: str) -> int:
        """Requests before a cell's clock starts: one per task, so HTTP/1.1 has its c connections open (idle
        ones that expired since the client's last cell are replaced); HTTP/2 needs its one connection."""
        return max(5, c if proto == "h1" else min(c, 10))


FULL = Plan(rounds=3, n={1: 200, 10: 500, 100: 500}, cap_s=0.6)
QUICK = Plan(rounds=1, n={1: 80, 10: 200, 100: 300}, cap_s=0.4)


# -- the worker: one client in one process; commands on stdin, one JSON line of results per command ---------
async def _batch(client: Any, c: int, n: int, deadline: float | None) -> tuple[list[Sample], list[str]]:
    samples: list[Sample] = []
    errors: list[str] = []
    issued = 0

    async def task() -> None:
        nonlocal issued
        while issued < n and (deadline is None or time.perf_counter() < deadline):
            issued += 1
            try:
                samples.append(await client.one())
            except Exception as exc:  # counted and reported: one failed request must not end the cell
                errors.append(f"{type(exc).__name__}: {exc}"[:200])

    await asyncio.gather(*(task() for _ in range(c)))
    return samples, errors


async def _cell(client: Any, cmd: dict[str, Any]) -> dict[str, Any]:
    c, n = int(cmd["c"]), int(cmd["n"])
    _, warmup_errors = await _batch(client, c, int(cmd["warmup"]), None)
    gc.collect()
    profiler = cProfile.Profile() if cmd.get("profile") else None
    cpu0, wall0 = time.process_time(), time.perf_counter()
    if profiler is not None:
        profiler.enable()
    samples, errors = await _batch(client, c, n, wall0 + float(cmd["cap_s"]))
    if profiler is not None:
        profiler.disable()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    out: dict[str, Any] = {
        "requests": len(samples),
        "errors": len(errors) + len(warmup_errors),
        "first_error": (errors + warmup_errors)[0] if errors or warmup_errors else None,
        "wall_s": wall,
        "cpu_s": cpu,
        "overhead_ms": [((s.record_ns if s.record_ns is not None else s.caller_ns) - s.server_first_ns) / 1e6
                        for s in samples],
        "caller_ms": [(s.caller_ns - s.server_first_ns) / 1e6 for s in samples],
        "http_versions": sorted({s.http_version for s in samples}),
        "chars": sorted({s.chars for s in samples}),
    }
    if profiler is not None:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(int(cmd["profile"]))
        out["profile"] = text.getvalue()
    return out


async def _worker(name: str, proto: str, url: str) -> None:
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line or line.strip() == "quit":
            return
        # A new client (and connections) per cell: hypercorn ends an HTTP/2 connection after 1000 requests
        # and drops the streams still on it, which would hit whichever client crossed that line mid-cell.
        client = make_client(name, url, proto)
        await client.open()
        try:
            result = await _cell(client, json.loads(line))
        finally:
            await client.close()
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()


# -- the conductor ------------------------------------------------------------------------------------------
class Worker:
    """A worker child process for one client and protocol."""

    def __init__(self, name: str, proto: str, url: str, env: dict[str, str]) -> None:
        self.name, self.proto = name, proto
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", name, "--proto", proto, "--url", url],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )

    def run(self, cmd: dict[str, Any], timeout: float) -> dict[str, Any]:
        """One cell: its result, or ``{"failed": why}`` when the worker dies or overruns ``timeout``."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if self.proc.poll() is not None:
            return {"failed": f"{self.name} worker is gone (exit status {self.proc.returncode})"}
        try:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return {"failed": f"{self.name} worker is gone (exit status {self.proc.wait(5)})"}
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.proc.kill()
            self.proc.wait(5)
            return {"failed": f"{self.name} worker gave no result within {timeout:.0f} s; killed"}
        line = self.proc.stdout.readline()
        if not line:
            return {"failed": f"{self.name} worker exited (status {self.proc.wait(5)})"}
        result: dict[str, Any] = json.loads(line)
        return result

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
                self.proc.wait(10)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _proc_cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Cell:
    """Every round's result for one client, protocol and concurrency."""

    rounds: list[dict[str, Any]] = field(default_factory=list)

    def figures(self) -> dict[str, Any]:
        ok = [r for r in self.rounds if "failed" not in r and r["requests"]]
        if not ok:
            why = next((r["failed"] for r in self.rounds if "failed" in r), "no request finished")
            return {"failed": why}
        overhead = [x for r in ok for x in r["overhead_ms"]]
        caller = [x for r in ok for x in r["caller_ms"]]
        cpu = [1000 * r["cpu_s"] / r["requests"] for r in ok]
        server = [r for r in ok if r.get("server_cpu_s") is not None]
        return {
            "req_per_s": statistics.median(r["requests"] / r["wall_s"] for r in ok),
            "cpu_ms_per_req": statistics.median(cpu),
            "cpu_ms_per_req_range": [min(cpu), max(cpu)],
            "overhead_p50_ms": percentile(overhead, 50),
            "overhead_p99_ms": percentile(overhead, 99),
            "caller_p50_ms": percentile(caller, 50),
            "caller_p99_ms": percentile(caller, 99),
            "server_cpu_ms_per_req": _median([1000 * r["server_cpu_s"] / r["requests"] for r in server]),
            "server_busy": _median([r["server_cpu_s"] / r["wall_s"] for r in server]),
            "requests_per_round": [r["requests"] for r in ok],
            "rounds_failed": len(self.rounds) - len(ok),
            "errors": sum(r["errors"] for r in ok),
            "first_error": next((r["first_error"] for r in ok if r["first_error"]), None),
            "http_versions": sorted({v for r in ok for v in r["http_versions"]}),
            "reply_chars": sorted({c for r in ok for c in r["chars"]}),
        }


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _clients_for(proto: str, chosen: list[str]) -> list[str]:
    return [c for c in CLIENTS if c in chosen and not (proto == "h2" and c == "aiohttp")]


@contextmanager
def _server() -> Iterator[Any]:
    from llmchat.core.server import start_subprocess

    # Connections kept open for good: raw httpx and openai-python meet a GOAWAY after 1,000 streams as errors
    # (httpcore fails every stream on the connection), and this measures client overhead, not that.
    with start_subprocess(["--profile", "instant", "--max-requests-per-connection", "0"]) as server:
        yield server


def _child_env(home: str) -> dict[str, str]:
    # Workers never see the user's config, cache or keys.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "LLMCHAT_"))}
    for var in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME"):
        env[var] = os.path.join(home, var.lower())
    env["PYTHONUNBUFFERED"] = "1"
    return env


#: The trace events llmchat's transport stamps phases from (core/http/_transport.py's _STAMPS), as one h2c
#: request on a new connection fires them.
TRACE_NEEDED = ("connection.connect_tcp.started", "connection.connect_tcp.complete",
                "http2.send_request_headers.started", "http2.send_request_body.complete",
                "http2.receive_response_headers.complete")


def check_stacks(url: str) -> dict[str, Any]:
    """httpx and httpx2 on one h2c request each: the version used, and the trace events llmchat needs that
    did not fire (printed, and kept in the JSON)."""
    out: dict[str, Any] = {}
    for module in ("httpx", "httpx2"):
        try:
            version, seen = trace_check(module, url)
        except Exception as exc:  # reported, not fatal: the rounds still measure what works
            out[module] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
            print(f"  {module}: the h2c trace check failed: {out[module]['error']}")
            continue
        missing = [name for name in TRACE_NEEDED if name not in seen]
        out[module] = {"http_version": version, "trace_events": seen, "missing": missing}
        print(f"  {module}: one h2c request went out as {version}; {len(seen)} trace events, "
              f"{'all the transport stamps' if not missing else 'MISSING ' + ', '.join(missing)}")
    return out


def conduct(plan: Plan, protos: list[str], levels: list[int], clients: list[str],
            stacks: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run every cell ``plan.rounds`` times, interleaved; the figures per protocol, level and client.
    ``stacks``, when given, receives ``check_stacks`` on the benchmark's server first."""
    cells: dict[tuple[str, int, str], Cell] = {}
    with tempfile.TemporaryDirectory(prefix="llmchat-bench-") as home, _server() as server:
        if stacks is not None:
            stacks.update(check_stacks(server.base_url))
        env = _child_env(home)
        workers = {(p, name): Worker(name, p, server.base_url, env)
                   for p in protos for name in _clients_for(p, clients)}
        pid = server.process.pid
        try:
            for rnd in range(plan.rounds):
                for proto in protos:
                    names = _clients_for(proto, clients)
                    shift = rnd % len(names)
                    for c in levels:
                        for name in names[shift:] + names[:shift]:
                            cmd = {"c": c, "n": plan.n[c], "cap_s": plan.cap_s,
                                   "warmup": plan.warmup(c, proto)}
                            result = _timed_cell(workers[(proto, name)], cmd, pid,
                                                 timeout=60 + 10 * plan.cap_s)
                            cells.setdefault((proto, c, name), Cell()).rounds.append(result)
                print(f"  round {rnd + 1}/{plan.rounds} done", file=sys.stderr, flush=True)
        finally:
            for w in workers.values():
                w.close()
    return {f"{p}/{c}/{n}": cell.figures() for (p, c, n), cell in cells.items()}


def _timed_cell(worker: Worker, cmd: dict[str, Any], server_pid: int, timeout: float) -> dict[str, Any]:
    before = _proc_cpu_s(server_pid)
    result = worker.run(cmd, timeout)
    after = _proc_cpu_s(server_pid)
    # The server's CPU over the whole command includes the warm-up; scale it to the measured part by requests.
    if "failed" not in result and before is not None and after is not None:
        share = result["requests"] / max(1, result["requests"] + int(cmd["warmup"]))
        result["server_cpu_s"] = (after - before) * share
    return result


# -- the report ---------------------------------------------------------------------------------------------
def _f(v: float | None, width: int, digits: int = 2) -> str:
    return f"{v:{width}.{digits}f}" if v is not None else f"{'n/a':>{width}}"


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT MET"


def report(figures: dict[str, Any], protos: list[str], levels: list[int]) -> dict[str, Any]:
    """Print one table per protocol and concurrency with its goal lines; return the goals as data."""
    goals: dict[str, Any] = {}
    head = (f"  {'client':<8} {'version':<8} {'req/s':>6} {'CPU ms/req':>10} {'(range)':>13} {'ovh p50':>7} "
            f"{'ovh p99':>8} {'caller p50':>10} {'srv CPU/req':>11} {'srv busy':>8} {'err':>4}")
    for proto in protos:
        for c in levels:
            streams = "stream" if c == 1 else "streams"
            print(f"\n{PROTO_NAMES[proto]}, {c} concurrent {streams}, {MAX_TOKENS}-token replies")
            print(head)
            for name in CLIENTS:
                fig = figures.get(f"{proto}/{c}/{name}")
                if fig is None:
                    continue
                if "failed" in fig:
                    print(f"  {name:<8} FAILED: {fig['failed']}")
                    continue
                lo, hi = fig["cpu_ms_per_req_range"]
                busy = fig["server_busy"]
                print(f"  {name:<8} {','.join(fig['http_versions']):<8} {fig['req_per_s']:6.0f} "
                      f"{fig['cpu_ms_per_req']:10.2f} {f'({lo:.2f}-{hi:.2f})':>13} "
                      f"{_f(fig['overhead_p50_ms'], 7)} {_f(fig['overhead_p99_ms'], 8)} "
                      f"{_f(fig['caller_p50_ms'], 10)} {_f(fig['server_cpu_ms_per_req'], 11)} "
                      f"{'n/a' if busy is None else f'{100 * busy:.0f} %':>8} {fig['errors']:4d}")
            goals.update(_goal_lines(figures, proto, c))
    return goals


def _goal_lines(figures: dict[str, Any], proto: str, c: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ours = figures.get(f"{proto}/{c}/llmchat") or {}
    aio = figures.get(f"h1/{c}/aiohttp") or {}
    oai = figures.get(f"{proto}/{c}/openai") or {}
    if "cpu_ms_per_req" in ours and "cpu_ms_per_req" in aio:
        ratio = ours["cpu_ms_per_req"] / aio["cpu_ms_per_req"]
        met = ratio <= GOAL_CPU_RATIO
        note = "" if proto == "h1" else " (its HTTP/1.1 figure)"
        print(f"  llmchat CPU/req vs aiohttp{note}: {ratio:.2f}x (goal <= {GOAL_CPU_RATIO}x) {_verdict(met)}")
        out[f"{proto}/{c}/cpu_vs_aiohttp"] = {"ratio": ratio, "met": met}
    if "req_per_s" in ours and "req_per_s" in oai:
        ratio = ours["req_per_s"] / oai["req_per_s"]
        cpu = oai["cpu_ms_per_req"] / ours["cpu_ms_per_req"]
        line = f"  llmchat req/s vs openai-python: {ratio:.2f}x"
        if c == max(LEVELS):
            met = ratio >= GOAL_RATE_RATIO
            line += f" (goal >= {GOAL_RATE_RATIO:g}x) {_verdict(met)}"
            out[f"{proto}/{c}/rate_vs_openai"] = {"ratio": ratio, "met": met, "cpu_ratio": cpu}
        print(f"{line}; {cpu:.1f}x less CPU per request")
    mine = figures.get(f"{proto}/{c}/httpx") or {}
    fork = figures.get(f"{proto}/{c}/httpx2") or {}
    if "req_per_s" in mine and "req_per_s" in fork:
        rate = fork["req_per_s"] / mine["req_per_s"]
        cpu = fork["cpu_ms_per_req"] / mine["cpu_ms_per_req"]
        print(f"  httpx2 vs httpx 0.28.1: req/s {rate:.2f}x, CPU/req {cpu:.2f}x (httpx2 is the faster when the "
              "first is above 1 and the second below)")
        out[f"{proto}/{c}/httpx2_vs_httpx"] = {"rate_ratio": rate, "cpu_ratio": cpu}
    if c == 1 and ours.get("overhead_p50_ms") is not None:
        ms = ours["overhead_p50_ms"]
        met = ms <= GOAL_OVERHEAD_MS
        print(f"  llmchat overhead p50 at 1 stream: {ms:.3f} ms (goal <= {GOAL_OVERHEAD_MS:g} ms) "
              f"{_verdict(met)}")
        out[f"{proto}/1/overhead_p50"] = {"ms": ms, "met": met}
    return out


def _mismatches(figures: dict[str, Any]) -> list[str]:
    """Cells whose clients did not all get replies of the same length."""
    by_cell: dict[str, set[int]] = {}
    for key, fig in figures.items():
        proto, c, _ = key.split("/")
        by_cell.setdefault(f"{proto}/{c}", set()).update(fig.get("reply_chars", []))
    return [f"{cell}: reply lengths {sorted(chars)}" for cell, chars in by_cell.items() if len(chars) > 1]


def _environment() -> dict[str, Any]:
    import aiohttp
    import httpx
    import httpx2
    import openai

    return {
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "httpx": httpx.__version__,
        "httpx2": httpx2.__version__,
        "openai": openai.__version__,
        "openai_http": f"httpx2 {httpx2.__version__}",
        "aiohttp": aiohttp.__version__,
        "raw_json_decoder": JSON_DECODER,
        "perf_counter_clock": time.get_clock_info("perf_counter").implementation,
        "monotonic_clock": time.get_clock_info("monotonic").implementation,
        "pool": POOL,
        "load_average_at_start": os.getloadavg(),
    }


def _profile(spec: str) -> int:
    name, proto, c = (spec.split(":") + ["h2", "100"])[:3]
    with tempfile.TemporaryDirectory(prefix="llmchat-bench-") as home, _server() as server:
        worker = Worker(name, proto, server.base_url, _child_env(home))
        try:
            cmd = {"c": int(c), "n": 2000, "cap_s": 3.0, "warmup": Plan.warmup(int(c), proto), "profile": 40}
            result = worker.run(cmd, timeout=120)
        finally:
            worker.close()
    if "failed" in result:
        print(result["failed"], file=sys.stderr)
        return 1
    print(f"{name} over {proto} at {c} streams: {result['requests']} requests, "
          f"{1000 * result['cpu_s'] / max(1, result['requests']):.3f} ms CPU each (under cProfile)")
    print(result["profile"])
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or, with ``--worker``, be one client's worker). Returns the exit status."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one round of shorter cells (about 30 s)")
    ap.add_argument("--rounds", type=int, help="rounds of interleaved cells (default 3; 1 with --quick)")
    ap.add_argument("--json", metavar="PATH", help="write every figure to this JSON file")
    ap.add_argument("--proto", choices=["h2", "h1"], action="append", help="only this protocol (repeatable)")
    ap.add_argument("--clients", help=f"comma-separated subset of {','.join(CLIENTS)}")
    ap.add_argument("--levels", help="comma-separated concurrency levels (default 1,10,100)")
    ap.add_argument("--profile", metavar="CLIENT[:PROTO[:C]]", help="cProfile one client's worker instead")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        asyncio.run(_worker(args.worker, (args.proto or ["h2"])[0], args.url))
        return 0
    if args.profile:
        return _profile(args.profile)
    base = QUICK if args.quick else FULL
    levels = [int(x) for x in args.levels.split(",")] if args.levels else list(LEVELS)
    plan = Plan(args.rounds or base.rounds, {c: base.n.get(c, 500) for c in levels}, base.cap_s)
    protos = args.proto or ["h2", "h1"]
    clients = args.clients.split(",") if args.clients else list(CLIENTS)
    env = _environment()
    print(f"client overhead: llmchat serve --profile instant on 127.0.0.1, {MAX_TOKENS}-token streams, "
          f"pools of {POOL}, {plan.rounds} rounds, up to {plan.cap_s:g} s per cell")
    load = env["load_average_at_start"][0]
    print(f"  python {env['python']} on {env['cpus']} CPUs, load average {load:.2f}; "
          f"httpx {env['httpx']}; httpx2 {env['httpx2']}; openai {env['openai']} on {env['openai_http']} "
          f"(its own client: h2 with http2=True); aiohttp {env['aiohttp']}; raw loops decode with "
          f"{env['raw_json_decoder']}")
    print(f"  clocks: perf_counter = {env['perf_counter_clock']}, monotonic = {env['monotonic_clock']}: "
          "client and server stamps compare directly")
    started = time.perf_counter()
    stacks: dict[str, Any] = {}
    figures = conduct(plan, protos, levels, clients, stacks if "httpx2" in clients else None)
    goals = report(figures, protos, levels)
    elapsed = time.perf_counter() - started
    print(f"\n{len(figures)} cells in {elapsed:.0f} s, load average {os.getloadavg()[0]:.2f} at the end. "
          "Rates and CPU: medians over rounds; percentiles: all rounds' samples. ovh: llmchat's record "
          "stamp (bytes arrived), the caller's for the others; caller: the caller's for all.")
    mismatches = _mismatches(figures)
    for line in mismatches:
        print(f"MISMATCH {line}: a client lost or added text", file=sys.stderr)
    if args.json:
        data = {"environment": env, "plan": {"rounds": plan.rounds, "n": plan.n, "cap_s": plan.cap_s},
                "figures": figures, "goals": goals, "stacks": stacks, "elapsed_s": elapsed}
        Path(args.json).write_text(json.dumps(data, indent=2))
        print(f"figures written to {args.json}")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
