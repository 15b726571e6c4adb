"""Per-chunk client cost when tokens come one at a time: llmchat's ChatClient against raw httpx and aiohttp.

Real servers stream one token per chunk at 50-100 tokens/s a stream; `llmchat serve --profile instant` bunches
a reply into a few writes, which hides what each chunk costs the client. Here `llmchat serve --tokens-per-s R`
(no jitter, no faults, connections kept for good) paces every stream at R tokens/s, one token per write while
it keeps up, and each client follows S streams at once (a closed loop: each stream sends its next request as
soon as its reply ends, ``--max-tokens`` tokens each) for ``--seconds`` in a child process of its own:

* ``llmchat``: ``ChatClient.stream`` iterated to the end (timing record, SSE decoder, chunk parser, bus).
* ``httpx``: ``httpx.AsyncClient.stream`` over ``aiter_raw()`` and the minimal SSE split of ``_clients.py``.
* ``aiohttp``: ``ClientSession.post`` over ``content.iter_any()``, the same split (skipped, with a line, when
  aiohttp is not installed: it is in the bench extra only).

Per cell it prints the child's CPU per content chunk (process CPU over the measured window, warm-up excluded,
divided by the chunks received), tokens per chunk (1.0 when the server kept its pace one token a write; the
server's CPU share beside it says when it did not), chunks/s, and the **arrival lag**: the caller's stamp of
each reply's last token less the server's own stamp of sending it (``server_timing.last_token_ns``, the same
monotonic clock), p50 and p99. A client that cannot follow its streams falls behind: its lag grows with the
load. The ratio per cell is against aiohttp (else httpx) in the same run; cells run interleaved, ``--rounds``
times, medians shown.

``--profile llmchat`` runs one llmchat cell under cProfile and prints where its time went instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _clients import HEADERS, MESSAGES, MODEL, loads, sse_payloads  # noqa: E402

CLIENTS = ("llmchat", "httpx", "aiohttp")


def _body(max_tokens: int) -> bytes:
    return json.dumps({"model": MODEL, "messages": MESSAGES, "max_tokens": max_tokens, "stream": True,
                       "stream_options": {"include_usage": True}}, separators=(",", ":")).encode()


class _Tally:
    def __init__(self) -> None:
        self.requests = self.chunks = self.tokens = self.errors = 0
        self.lag_ms: list[float] = []
        self.first_error = ""

    def done(self, chunks: int, tokens: int, last_ns: int | None, server_last_ns: int | None) -> None:
        self.requests += 1
        self.chunks += chunks
        self.tokens += tokens
        if last_ns is not None and server_last_ns:
            self.lag_ms.append((last_ns - server_last_ns) / 1e6)


def _fold(payload: bytes, state: list[Any]) -> None:
    """One raw-loop payload into ``state``: [chunks, tokens, last content ns, server last_token_ns]."""
    if payload == b"[DONE]":
        return
    obj = loads(payload)
    choices = obj.get("choices")
    if choices and (choices[0].get("delta") or {}).get("content"):
        state[0] += 1
        state[2] = time.monotonic_ns()
    usage = obj.get("usage")
    if usage:
        state[1] = usage.get("completion_tokens", 0)
    timing = obj.get("server_timing")
    if timing:
        state[3] = timing["last_token_ns"]


async def _llmchat(url: str, streams: int, max_tokens: int) -> Any:
    from llmchat.core import ChatClient, HttpSettings, Settings

    http = HttpSettings(http2=False, max_connections=streams, max_keepalive_connections=streams, warmup=False,
                        trust_env=False)
    client = ChatClient(Settings(http=http), base_url=url, api_key="bench", model=MODEL, use_cache=False)

    async def one(t: _Tally) -> None:
        stream = client.stream(MESSAGES, max_tokens=max_tokens)
        last = None
        async for _ in stream:
            last = time.monotonic_ns()
        rec = stream.record
        if rec.error:
            raise RuntimeError(rec.error)
        t.done(rec.content_chunks, rec.output_tokens, last, (rec.server_timing or {}).get("last_token_ns"))

    return one, client.aclose


async def _httpx(url: str, streams: int, max_tokens: int) -> Any:
    import httpx

    client = httpx.AsyncClient(base_url=url.rstrip("/") + "/", http1=True, http2=False, trust_env=False,
                               limits=httpx.Limits(max_connections=streams, max_keepalive_connections=streams),
                               timeout=httpx.Timeout(60.0))
    body = _body(max_tokens)

    async def one(t: _Tally) -> None:
        state: list[Any] = [0, 0, None, None]
        buffer = bytearray()
        async with client.stream("POST", "chat/completions", content=body, headers=HEADERS) as resp:
            resp.raise_for_status()
            async for chunk in resp.aiter_raw():
                for payload in sse_payloads(buffer, chunk):
                    _fold(payload, state)
        t.done(*state)

    return one, client.aclose


async def _aiohttp(url: str, streams: int, max_tokens: int) -> Any:
    import aiohttp

    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=streams, limit_per_host=streams),
                                    timeout=aiohttp.ClientTimeout(total=60.0), trust_env=False)
    endpoint = url.rstrip("/") + "/chat/completions"
    body = _body(max_tokens)

    async def one(t: _Tally) -> None:
        state: list[Any] = [0, 0, None, None]
        buffer = bytearray()
        async with session.post(endpoint, data=body, headers=HEADERS) as resp:
            resp.raise_for_status()
            async for chunk in resp.content.iter_any():
                for payload in sse_payloads(buffer, chunk):
                    _fold(payload, state)
        t.done(*state)

    return one, session.close


async def _cell(name: str, url: str, streams: int, seconds: float, max_tokens: int) -> dict[str, Any]:
    make = {"llmchat": _llmchat, "httpx": _httpx, "aiohttp": _aiohttp}[name]
    one, close = await make(url, streams, max_tokens)
    try:
        warm = _Tally()
        await asyncio.gather(*(one(warm) for _ in range(streams)))  # every connection opened, not measured
        t = _Tally()
        deadline = time.monotonic() + seconds

        async def stream(k: int) -> None:
            await asyncio.sleep(k * (1.0 / streams) * 0.5)  # starts spread over half a second, not in lockstep
            while time.monotonic() < deadline:
                try:
                    await one(t)
                except Exception as exc:  # counted, and the stream goes on: a figure, not a crash
                    t.errors += 1
                    t.first_error = t.first_error or f"{type(exc).__name__}: {exc}"[:200]

        cpu0, wall0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(stream(k) for k in range(streams)))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    finally:
        await close()
    lags = sorted(t.lag_ms)
    return {"requests": t.requests, "chunks": t.chunks, "tokens": t.tokens, "errors": t.errors,
            "first_error": t.first_error, "cpu_s": cpu, "wall_s": wall,
            "lag_p50_ms": _q(lags, 0.5), "lag_p99_ms": _q(lags, 0.99)}


def _q(values: list[float], q: float) -> float | None:
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _run_worker(name: str, url: str, streams: int, seconds: float, max_tokens: int, server_pid: int,
                profile: bool = False) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", name, "--url", url, "--streams", str(streams), "--seconds",
           str(seconds), "--max-tokens", str(max_tokens)] + (["--profile", name] if profile else [])
    before = _proc_cpu_s(server_pid)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds * 4 + 60)
    if done.returncode != 0:
        return {"failed": (done.stderr.strip().splitlines() or ["exit " + str(done.returncode)])[-1]}
    if profile:
        print(done.stdout)
        return {}
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    out["server_busy"] = (_proc_cpu_s(server_pid) - before) / (time.perf_counter() - t0)
    return out


def _have_aiohttp() -> bool:
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", default="10,100,500", help="streams followed at once, per cell (a list)")
    p.add_argument("--tokens-per-s", type=float, default=70.0, help="the server's pace per stream")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--seconds", type=float, default=4.0, help="measured seconds per cell")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--clients", default=",".join(CLIENTS))
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--profile", choices=CLIENTS, help="cProfile one cell of this client and print the top")
    p.add_argument("--worker", choices=CLIENTS, help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    levels = [int(v) for v in args.streams.split(",")]
    if args.worker:
        coro = _cell(args.worker, args.url, levels[0], args.seconds, args.max_tokens)
        if args.profile:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.enable()
            result = asyncio.run(coro)
            prof.disable()
            print(f"{result['chunks']} chunks, {result['cpu_s'] * 1e6 / max(result['chunks'], 1):.1f} us each "
                  "(under cProfile)")
            pstats.Stats(prof).sort_stats("tottime").print_stats(30)
            return 0
        print(json.dumps(asyncio.run(coro)))
        return 0

    from llmchat.core.server import start_subprocess

    clients = [c for c in args.clients.split(",") if c]
    if "aiohttp" in clients and not _have_aiohttp():
        print("aiohttp is not installed (it is in the bench extra: pip install -e '.[bench]'); skipping it")
        clients.remove("aiohttp")
    flags = ["--profile", "instant", "--tokens-per-s", f"{args.tokens_per_s:g}",
             "--max-requests-per-connection", "0"]
    results: dict[tuple[int, str], list[dict[str, Any]]] = {}
    with start_subprocess(flags) as server:
        url, pid = server.base_url, server.process.pid
        print(f"llmchat serve {' '.join(flags)} at {url}; {args.max_tokens} tokens a reply, "
              f"{args.seconds:g} s a cell, {args.rounds} rounds interleaved")
        if args.profile:
            _run_worker(args.profile, url, levels[0], args.seconds, args.max_tokens, pid, profile=True)
            return 0
        for c in levels:
            for r in range(args.rounds):
                order = list(clients)
                random.Random(f"paced:{c}:{r}").shuffle(order)
                for name in order:
                    results.setdefault((c, name), []).append(
                        _run_worker(name, url, c, args.seconds, args.max_tokens, pid))
    return _report(results, levels, clients, args)


def _median_of(rounds: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rounds if "failed" not in r and r.get(key) is not None]
    return statistics.median(values) if values else None


def _report(results: dict[tuple[int, str], list[dict[str, Any]]], levels: list[int], clients: list[str],
            args: argparse.Namespace) -> int:
    base = "aiohttp" if "aiohttp" in clients else "httpx"
    print(f"\n{'streams':>7} {'client':<8} {'CPU us/chunk':>12} {'x ' + base:>10} {'tok/chunk':>9} "
          f"{'chunks/s':>9} {'lag p50':>8} {'lag p99':>8} {'server':>7} {'errors':>6}")
    table: dict[str, Any] = {}
    for c in levels:
        per: dict[str, float | None] = {}
        for name in clients:
            rounds = results[(c, name)]
            for r in rounds:
                if "failed" not in r:
                    r["us_per_chunk"] = r["cpu_s"] * 1e6 / r["chunks"] if r["chunks"] else None
                    r["chunks_per_s"] = r["chunks"] / r["wall_s"]
                    r["tokens_per_chunk"] = r["tokens"] / r["chunks"] if r["chunks"] else None
            per[name] = _median_of(rounds, "us_per_chunk")
        for name in clients:
            rounds = results[(c, name)]
            failed = next((r["failed"] for r in rounds if "failed" in r), None)
            us, ref = per[name], per.get(base)
            ratio = f"{us / ref:.2f}x" if us and ref else "-"

            def f(key: str, fmt: str, rounds: list[dict[str, Any]] = rounds) -> str:
                v = _median_of(rounds, key)
                return "-" if v is None else format(v, fmt)

            errors = sum(r.get("errors", 0) for r in rounds)
            print(f"{c:>7} {name:<8} {f('us_per_chunk', '.1f'):>12} {ratio:>10} {f('tokens_per_chunk', '.2f'):>9} "
                  f"{f('chunks_per_s', '.0f'):>9} {f('lag_p50_ms', '.1f'):>8} {f('lag_p99_ms', '.1f'):>8} "
                  f"{f('server_busy', '.0%'):>7} {errors:>6}" + (f"  FAILED: {failed}" if failed else ""))
            table[f"{c}:{name}"] = rounds
    print("\nCPU us/chunk: the client process's CPU over the cell / content chunks received; lag: the caller's "
          "stamp of a reply's last token less the server's stamp of sending it (ms); server: its CPU share")
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
