"""What latency attribution costs, and what a fast JSON library saves the client, in one run.

    /work/venv/bin/python benchmarks/attribution.py [--requests N] [--json PATH]

(a) The per-request cost of ``attribute()``: real records from N streamed 64-token replies of the local
    server (profile ``instant``, h2c, in a thread of this process), then ``attribute(record)`` timed on them,
    with and without a ``ColdStartDetector``, against two baselines measured in the same run: the record's own
    ``summary()`` (what ``ask --json`` already builds per request) and the median total of those loopback
    requests (the fastest a real request gets). The ratio to a request is what matters: it should be tiny.
(b) Decoding a 1 MB non-streamed reply with the stdlib ``json`` and with ``orjson``, in two shapes: "text",
    a ``chat.completion`` whose content is 1 MB of prose with some non-ASCII text (one big string), and
    "logprobs", a shorter reply with ``logprobs`` (top 5 per token) making up 1 MB of small objects; each raw
    and through ``llmchat.core.http.parse_reply`` with its orjson fast path on and off. Plus 5,000 small stream chunks
    through ``llmchat.core.http.parse_chunk``, the per-token path, fast path on and off.

Every figure is the median of interleaved repetitions. Prints a table; ``--json`` also writes the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import itertools
import json
import random
import statistics
import sys
import time
import types
import unittest.mock
from collections.abc import Callable
from typing import Any

import orjson

import llmchat.core
import llmchat.core.http as wire
from llmchat.core import ChatClient, ColdStartDetector, TimingRecord, attribute
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


def one_mb_reply(shape: str) -> bytes:
    """A 1 MB ``chat.completion``: "text" is one long content string, "logprobs" adds OpenAI's logprobs."""
    rng = random.Random(7)
    words: list[str] = []
    logprobs: list[dict[str, Any]] = []
    size = 0
    while size < 1_000_000:
        w = " " + rng.choice(_WORDS)
        words.append(w)
        if shape == "text":
            size += len(w.encode())
            continue
        top = [{"token": " " + rng.choice(_WORDS), "logprob": -rng.random() * 5, "bytes": None}
               for _ in range(5)]
        entry = {"token": w, "logprob": -rng.random(), "bytes": list(w.encode()), "top_logprobs": top}
        logprobs.append(entry)
        size += len(json.dumps(entry, ensure_ascii=False).encode()) + len(w.encode())
    choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": "".join(words)},
                              "finish_reason": "stop"}
    if logprobs:
        choice["logprobs"] = {"content": logprobs}
    body = {
        "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": "bench",
        "choices": [choice],
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


def _without_orjson() -> types.ModuleType:
    """A second copy of ``llmchat.core.http``, imported as it is where orjson is not installed (its decoders
    then use the stdlib); the first copy, and everything else already imported, are left as they were."""
    ours = {name: mod for name, mod in sys.modules.items() if name.startswith("llmchat.core.http")}
    for name in ours:
        del sys.modules[name]
    try:
        with unittest.mock.patch.dict(sys.modules, {"orjson": None}):
            return importlib.import_module("llmchat.core.http")
    finally:
        for name in [n for n in sys.modules if n.startswith("llmchat.core.http")]:
            del sys.modules[name]
        sys.modules.update(ours)
        llmchat.core.http = ours["llmchat.core.http"]  # the import above rebound the parent's attribute


def _interleaved(fns: dict[str, Callable[[], object]], loops: int) -> dict[str, float]:
    """Median seconds per call of each function, rounds interleaved."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(3):
        for name, fn in fns.items():
            samples[name].append(_median_time(fn, loops))
    return {name: statistics.median(v) for name, v in samples.items()}


def bench_json() -> dict[str, Any]:
    out: dict[str, Any] = {}
    plain = _without_orjson()  # ":stdlib" figures: the same decoders, the fast path not installed
    for shape in ("text", "logprobs"):
        body = one_mb_reply(shape)
        assert json.loads(body) == orjson.loads(body), "the two libraries disagree"

        def parse_reply(body: bytes = body) -> object:
            return wire.parse_reply(body, status=200, content_type="application/json", where="bench")

        def parse_reply_stdlib(body: bytes = body) -> object:
            return plain.parse_reply(body, status=200, content_type="application/json", where="bench")

        t = _interleaved({
            "json": lambda body=body: json.loads(body),  # type: ignore[misc]
            "orjson": lambda body=body: orjson.loads(body),  # type: ignore[misc]
            "parse_reply:stdlib": parse_reply_stdlib,
            "parse_reply": parse_reply,
        }, 5)
        out[shape] = {"bytes": len(body), **{k: v * 1e3 for k, v in t.items()},
                      "speedup": t["json"] / t["orjson"], "parse_reply_speedup": t["parse_reply:stdlib"] /
                      t["parse_reply"]}
    chunks = stream_chunks(CHUNKS)

    def all_chunks(loads: Callable[[str], object]) -> Callable[[], object]:
        def run() -> object:
            for c in chunks:
                loads(c)
            return None
        return run

    t = _interleaved({
        "json": all_chunks(json.loads),
        "orjson": all_chunks(orjson.loads),
        "parse_chunk:stdlib": all_chunks(plain.parse_chunk),
        "parse_chunk": all_chunks(wire.parse_chunk),
    }, 1)
    out["chunk"] = {**{k: v * 1e6 / len(chunks) for k, v in t.items()}, "speedup": t["json"] / t["orjson"],
                    "parse_chunk_speedup": t["parse_chunk:stdlib"] / t["parse_chunk"]}
    return out


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
    for shape in ("text", "logprobs"):
        f = j[shape]
        print(f"(b) JSON decoding of a {f['bytes'] / 1e6:.2f} MB non-streamed reply, {shape}")
        print(f"    stdlib json.loads              {f['json']:8.2f} ms")
        print(f"    orjson.loads                   {f['orjson']:8.2f} ms   speed-up = {f['speedup']:.2f}x")
        print(f"    http.parse_reply, stdlib       {f['parse_reply:stdlib']:8.2f} ms")
        print(f"    http.parse_reply, orjson       {f['parse_reply']:8.2f} ms   "
              f"speed-up = {f['parse_reply_speedup']:.2f}x")
    c = j["chunk"]
    print(f"(c) per stream chunk ({CHUNKS:,} chunks of ~230 B)")
    print(f"    stdlib json.loads              {c['json']:8.2f} us")
    print(f"    orjson.loads                   {c['orjson']:8.2f} us   speed-up = {c['speedup']:.2f}x")
    print(f"    http.parse_chunk, stdlib       {c['parse_chunk:stdlib']:8.2f} us")
    print(f"    http.parse_chunk, orjson       {c['parse_chunk']:8.2f} us   "
          f"speed-up = {c['parse_chunk_speedup']:.2f}x")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"attribution": a, "json": j}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
