"""What saving a reply as it streams costs: ReplyWriter.append per delta, and flushing a 4,000-token reply.

    /work/venv/bin/python benchmarks/history.py [--tokens 4000] [--reps 30] [--flushes 200]

Prints, each against a baseline measured in the same run on the same machine:

- append: ns per delta of ``ReplyWriter.append`` (what the chat app calls per token, on the event loop)
  against ``list.append`` of the same strings. Goal: well under a microsecond.
- flush of a reply of ``--tokens`` deltas (the whole text so far is written each time):
  the event-loop part of a timed flush (join + hand-off to the store's thread), the flush end to end
  (``await writer.flush()``: loop -> thread -> UPDATE + commit -> loop), and the baseline: the same UPDATE on
  a plain sqlite3 connection in this thread (same file settings: WAL, synchronous=NORMAL).
- what that adds up to for a reply of ``--tokens`` at 70 tokens/s with the default flush every second:
  event-loop time and store-thread time, as a share of one core.
Takes a few seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sqlite3
import statistics
import tempfile
import time
from contextlib import closing
from pathlib import Path

from llmchat.core.history import HistoryStore, ReplyWriter

RATE_TOK_S = 70.0


def deltas(n: int) -> list[str]:
    """Token-sized deltas, about 5 characters each as in English text."""
    words = ("the", " pool", " keeps", " one", " connection", " warm", ",", " so", " every", " request")
    return [words[i % len(words)] + ("" if i % 7 else " ") for i in range(n)]


def pct(samples: list[int], q: float) -> float:
    ordered = sorted(samples)
    return float(ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))])


def row(name: str, samples_ns: list[int], unit: str = "us") -> str:
    scale = {"ns": 1.0, "us": 1e3, "ms": 1e6}[unit]
    return (f"  {name:<53} p50 {pct(samples_ns, 0.5) / scale:9.3f} {unit}   "
            f"p99 {pct(samples_ns, 0.99) / scale:9.3f} {unit}   n={len(samples_ns)}")


async def bench_append(store: HistoryStore, conv: int, tokens: int, reps: int) -> tuple[float, float]:
    """Median ns per delta: (list.append, ReplyWriter.append)."""
    ds = deltas(tokens)
    base: list[int] = []
    mine: list[int] = []
    for _ in range(reps):
        parts: list[str] = []
        start = time.perf_counter_ns()
        for d in ds:
            parts.append(d)
        base.append(time.perf_counter_ns() - start)
        writer = store.reply_writer(await store.start_reply(conv, provider="bench", model="m", mode="stream"))
        start = time.perf_counter_ns()
        for d in ds:
            writer.append(d)
        mine.append(time.perf_counter_ns() - start)
        assert writer.text == "".join(parts)
        await writer.finish(status="done")
    return statistics.median(base) / tokens, statistics.median(mine) / tokens


async def _drain(store: HistoryStore) -> None:
    # Waits until the store's thread has done everything handed to it before (calls run in order).
    await store._run(lambda: None)


async def bench_flush(store: HistoryStore, conv: int, tokens: int,
                      n: int) -> tuple[list[int], list[int], int]:
    """(event-loop part of a timed flush, flush end to end, reply length in characters)."""
    writer: ReplyWriter = store.reply_writer(
        await store.start_reply(conv, provider="bench", model="m", mode="stream"), flush_s=3600.0)
    for d in deltas(tokens):
        writer.append(d)
    await writer.flush()
    loop_side: list[int] = []
    end_to_end: list[int] = []
    for _ in range(n):
        writer.append(" more")
        start = time.perf_counter_ns()
        writer._flush_in_background()  # what the timer runs, on the loop
        loop_side.append(time.perf_counter_ns() - start)
        await _drain(store)
    for _ in range(n):
        writer.append(" more")
        start = time.perf_counter_ns()
        await writer.flush()
        end_to_end.append(time.perf_counter_ns() - start)
    length = len(writer.text)
    await writer.finish(status="done", record={"model": "m", "ttft_ms": 200.0})
    return loop_side, end_to_end, length


def bench_raw_update(folder: Path, text: str, n: int) -> list[int]:
    """The baseline: the same UPDATE and commit on a plain connection in this thread."""
    with closing(sqlite3.connect(folder / "raw.sqlite3", isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, content TEXT NOT NULL)")
        conn.execute("INSERT INTO messages (id, content) VALUES (1, '')")
        out: list[int] = []
        for i in range(n):
            body = text + " more" * (i + 1)
            start = time.perf_counter_ns()
            conn.execute("UPDATE messages SET content = ? WHERE id = 1", (body,))
            out.append(time.perf_counter_ns() - start)
        return out


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="llmchat-bench-history-") as tmp:
        folder = Path(tmp)
        async with HistoryStore(folder / "history.sqlite3") as store:
            conv = await store.new_conversation(title="bench")
            base_ns, append_ns = await bench_append(store, conv, args.tokens, args.reps)
            loop_side, end_to_end, length = await bench_flush(store, conv, args.tokens, args.flushes)
        raw = bench_raw_update(folder, "".join(deltas(args.tokens)), args.flushes)

    print(f"ReplyWriter.append, {args.tokens} deltas x {args.reps} replies (median per delta)")
    print(f"  {'baseline: list.append':<53} {base_ns:8.1f} ns")
    print(f"  {'ReplyWriter.append':<53} {append_ns:8.1f} ns   "
          f"ratio {append_ns / base_ns:.1f}x the baseline")
    print(f"flush of a {args.tokens}-token reply ({length / 1024:.1f} KiB, the whole text each time)")
    print(row("baseline: plain sqlite3 UPDATE + commit, this thread", raw))
    print(row("event-loop part of a timed flush (join + hand-off)", loop_side))
    print(row("flush end to end (await writer.flush())", end_to_end))
    print(f"  ratios at p50: end to end / baseline {pct(end_to_end, 0.5) / pct(raw, 0.5):.2f}x, "
          f"event-loop part / baseline {pct(loop_side, 0.5) / pct(raw, 0.5):.2f}x")
    reply_s = args.tokens / RATE_TOK_S
    flushes = math.ceil(reply_s)  # the default flush_s of 1.0
    loop_s = (args.tokens * append_ns + flushes * pct(loop_side, 0.5)) / 1e9
    thread_s = flushes * pct(raw, 0.5) / 1e9
    print(f"a {args.tokens}-token reply at {RATE_TOK_S:.0f} tok/s ({reply_s:.0f} s, "
          f"{flushes} timed flushes):")
    print(f"  event loop {loop_s * 1e3:.2f} ms in all = {100 * loop_s / reply_s:.4f} % of a core; "
          f"store thread ~{thread_s * 1e3:.1f} ms = {100 * thread_s / reply_s:.3f} % of a core")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    p.add_argument("--tokens", type=int, default=4000, help="deltas in the reply (default 4000)")
    p.add_argument("--reps", type=int, default=30, help="replies timed for append (default 30)")
    p.add_argument("--flushes", type=int, default=200, help="flushes timed per kind (default 200)")
    return p.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
