"""What latency attribution costs, and what a fast JSON library saves the client, in one run.

    /work/venv/bin/python benchmarks/attribution.py [--requests N] [--json PATH]

(a) The per-request cost of ``attribute()``: real records from N streamed 64-token replies of the local
    server (profile ``instant``, h2c, in a thread of this process), then ``attribute(record)`` timed on them,
    with and without a ``ColdStartDetector``, against two baselines measured in the same run: the record's own
    ``summary()`` (what ``ask --json`` already builds per request) and the median total of those loopback
    requests (the fastest a real request gets). The ratio to a request is what matters: it should be tiny.
(b) Decoding a 1 MB non-streamed reply (a ``chat.completion`` whose content is 1 MB of prose with some
    non-ASCII text) with the stdlib ``json`` and with ``orjson``, and through ``_wire.parse_reply`` (which
    takes orjson when installed); plus 5,000 small stream chunks, the per-token path.

Every figure is the median of interleaved repetitions. Prints a table; ``--json`` also writes the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson

from llmchat.core import ChatClient, ColdStartDetector, TimingRecord, attribute
from llmchat.core import _wire as wire
from llmchat.core.server import resolve_settings, start_in_thread

REPETITIONS = 5
CHUNKS = 5_000


def _median_time(fn: Callable[[], object], loops: int) -> float:
    """Median over REPETITIONS of the seconds one call of ``fn`` takes (``loops`` calls per repetition)."""
    times = []
    for _ in range(REPETITIONS):
        gc.collect()
        start = time.perf_counter_ns()
        for _ in range(loops):
            fn()
        times.append((time.perf_counter_ns() - start) / loops / 1e9)
    return statistics.median(times)


async def _records(base_url: str, n: int) -> list[TimingRecord]:
    records = []
    async with ChatClient(base_url=base_url, http2="h2c", use_cache=False, model="llmchat-local") as client:
        for i in range(n + 5):
            stream = client.stream([{"role": "user", "content": f"question {i}"}], max_tokens=64)
            async for _ in stream:
                pass
            if i >= 5:  # the first requests pay for imports and the connection: not typical
                records.append(stream.record)
    return records


def bench_attribution(n: int) -> dict[str, float]:
    with start_in_thread(resolve_settings({"port": 0, "profile": "instant"})) as server:
        records = asyncio.run(_records(server.base_url, n))
    totals = [r.total_ms for r in records if r.total_ms is not None]
    request_ms = statistics.median(totals)
    it = itertools.cycle(records)

    def one() -> object:
        return attribute(next(it))

    def summary() -> object:
        return next(it).summary()

    detector = ColdStartDetector()

    def with_detector() -> object:
        return attribute(next(it), detector=detector)

    loops = 1000
    # Interleave the three so machine noise hits them alike.
    a_s, s_s, d_s = [], [], []
    for _ in range(3):
        a_s.append(_median_time(one, loops))
        s_s.append(_median_time(summary, loops))
        d_s.append(_median_time(with_detector, loops))
    attr_us = statistics.median(a_s) * 1e6
    summary_us = statistics.median(s_s) * 1e6
    detector_us = statistics.median(d_s) * 1e6
    return {
        "requests": len(records),
        "request_total_ms_p50": request_ms,
        "attribute_us": attr_us,
        "attribute_with_detector_us": detector_us,
        "summary_us": summary_us,
        "attribute_vs_summary": attr_us / summary_us,
        "attribute_share_of_request": attr_us / 1000.0 / request_ms,
    }


_WORDS = ["the", "stream", "token", "latency", "café", "naïve", "über", "速度", "🚀", "résumé", "of", "and",
          "a", "connection", "server", "client", "is", "to", "time", "first"]


def one_mb_reply() -> bytes:
    rng = random.Random(7)
    words: list[str] = []
    size = 0
    while size < 1_000_000:
        w = rng.choice(_WORDS)
        words.append(w)
        size += len(w.encode()) + 1
    text = " ".join(words)
    body = {
        "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": "bench",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": len(words), "total_tokens": len(words) + 10},
    }
    return json.dumps(body, ensure_ascii=False).encode()


def stream_chunks(n: int) -> list[str]:
    rng = random.Random(11)
    out = []
    for _ in range(n):
        obj = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": "bench",
               "system_fingerprint": "fp_bench",
               "choices": [{"index": 0, "delta": {"content": " " + rng.choice(_WORDS)}, "logprobs": None,
                            "finish_reason": None}]}
        out.append(json.dumps(obj, ensure_ascii=False))
    return out


def bench_json() -> dict[str, Any]:
    body = one_mb_reply()
    assert json.loads(body) == orjson.loads(body), "the two libraries disagree"
    chunks = stream_chunks(CHUNKS)

    def parse_reply() -> object:
        return wire.parse_reply(body, status=200, content_type="application/json", where="bench")

    def all_chunks(loads: Callable[[str], object]) -> Callable[[], object]:
        def run() -> object:
            for c in chunks:
                loads(c)
            return None
        return run

    std, fast, via_wire, c_std, c_fast, c_wire = [], [], [], [], [], []
    for _ in range(3):
        std.append(_median_time(lambda: json.loads(body), 5))
        fast.append(_median_time(lambda: orjson.loads(body), 5))
        via_wire.append(_median_time(parse_reply, 5))
        c_std.append(_median_time(all_chunks(json.loads), 1))
        c_fast.append(_median_time(all_chunks(orjson.loads), 1))
        c_wire.append(_median_time(all_chunks(wire.parse_chunk), 1))
    std_ms, fast_ms, wire_ms = (statistics.median(x) * 1e3 for x in (std, fast, via_wire))
    c_std_us, c_fast_us, c_wire_us = (
        statistics.median(x) * 1e6 / len(chunks) for x in (c_std, c_fast, c_wire)
    )
    return {
        "reply_bytes": len(body),
        "reply_stdlib_ms": std_ms,
        "reply_orjson_ms": fast_ms,
        "reply_parse_reply_ms": wire_ms,
        "reply_speedup": std_ms / fast_ms,
        "chunk_stdlib_us": c_std_us,
        "chunk_orjson_us": c_fast_us,
        "chunk_parse_chunk_us": c_wire_us,
        "chunk_speedup": c_std_us / c_fast_us,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=50,
                        help="loopback requests whose records are attributed")
    parser.add_argument("--json", metavar="PATH", help="also write the figures to this JSON file")
    args = parser.parse_args()

    a = bench_attribution(args.requests)
    print(f"(a) attribute() over {a['requests']} real records (median of interleaved runs)")
    print(f"    attribute(record)              {a['attribute_us']:8.2f} us")
    print(f"    attribute(record, detector=)   {a['attribute_with_detector_us']:8.2f} us")
    print(f"    baseline record.summary()      {a['summary_us']:8.2f} us   "
          f"attribute / summary = {a['attribute_vs_summary']:.2f}x")
    print(f"    baseline loopback request p50  {a['request_total_ms_p50'] * 1000:8.0f} us   "
          f"attribute / request = {a['attribute_share_of_request'] * 100:.3f} %")
    j = bench_json()
    print(f"(b) JSON decoding of a {j['reply_bytes'] / 1e6:.2f} MB non-streamed reply")
    print(f"    stdlib json.loads              {j['reply_stdlib_ms']:8.2f} ms")
    print(f"    orjson.loads                   {j['reply_orjson_ms']:8.2f} ms   "
          f"speed-up = {j['reply_speedup']:.2f}x")
    print(f"    _wire.parse_reply (fast path)  {j['reply_parse_reply_ms']:8.2f} ms")
    print(f"    per stream chunk ({CHUNKS:,} chunks of ~230 B)")
    print(f"    stdlib json.loads              {j['chunk_stdlib_us']:8.2f} us")
    print(f"    orjson.loads                   {j['chunk_orjson_us']:8.2f} us   "
          f"speed-up = {j['chunk_speedup']:.2f}x")
    print(f"    _wire.parse_chunk (fast path)  {j['chunk_parse_chunk_us']:8.2f} us")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"attribution": a, "json": j}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
