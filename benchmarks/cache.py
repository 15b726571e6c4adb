"""Cache-hit latency against a cache miss that goes to `llmchat serve --profile instant`, in the same run.

    /work/venv/bin/python benchmarks/cache.py [--hits 2000] [--misses 300] [--in-process]

Prints p50/p99 of: a chat hit (ReplyCache.get_chat of a stored key, through its executor, from an asyncio
loop), a cache lookup that misses (what every cacheable request pays before going out), a 64-text embeddings
hit, and the baseline: a plain non-stream httpx POST /v1/chat/completions to the local server (a child process;
``--in-process`` runs it on a thread of this process instead, sharing the GIL, so the miss reads a bit slower).
Then the ratio miss/hit. Goal: hit p99 <= 1 ms. Takes well under 20 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator

import httpx

from llmchat.core.config import CacheSettings
from llmchat.core.errors import LLMChatError
from llmchat.core.policy import ReplyCache
from llmchat.core.server import resolve_settings, start_in_thread, start_subprocess

BASE_MODEL = "llmchat-local"
MESSAGES: list[dict[str, object]] = [{"role": "user", "content": "Name three prime numbers."}]
PARAMS: dict[str, object] = {"temperature": 0, "max_tokens": 64}


def percentile(samples_ns: list[int], q: float) -> float:
    """The q-quantile (nearest rank) in milliseconds."""
    ordered = sorted(samples_ns)
    rank = min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))
    return ordered[rank] / 1e6


async def timed(n: int, call: Callable[[], Awaitable[object]], warmup: int) -> list[int]:
    for _ in range(warmup):
        await call()
    out: list[int] = []
    for _ in range(n):
        start = time.perf_counter_ns()
        await call()
        out.append(time.perf_counter_ns() - start)
    return out


def line(name: str, samples: list[int]) -> str:
    p50, p99 = percentile(samples, 0.50), percentile(samples, 0.99)
    return f"{name:<44} p50 {p50:8.3f} ms   p99 {p99:8.3f} ms   n={len(samples)}"


async def bench_cache(folder: str, hits: int) -> tuple[list[int], list[int], list[int]]:
    cache = ReplyCache(CacheSettings(path=folder, policy="always"))
    try:
        key = ReplyCache.chat_key(base_url="http://127.0.0.1:1/v1", model=BASE_MODEL, messages=MESSAGES,
                                  params=PARAMS)
        reply: dict[str, object] = {"text": "2, 3 and 5. " * 20, "finish_reason": "stop", "model": BASE_MODEL,
                                    "usage": {"prompt_tokens": 12, "completion_tokens": 120, "total_tokens": 132}}
        await cache.put_chat(key, reply)
        assert await cache.get_chat(key) == reply
        hit = await timed(hits, lambda: cache.get_chat(key), warmup=100)
        absent = "0" * 64
        lookup_miss = await timed(hits, lambda: cache.get_chat(absent), warmup=100)
        texts = [f"text number {i}" for i in range(64)]
        ekeys = [ReplyCache.embedding_key(base_url="http://127.0.0.1:1/v1", model="e", text=t) for t in texts]
        await cache.put_embeddings([(k, [0.001 * i] * 256) for i, k in enumerate(ekeys)])
        emb = await timed(max(hits // 10, 50), lambda: cache.get_embeddings(ekeys), warmup=10)
        return hit, lookup_miss, emb
    finally:
        await cache.aclose()


async def bench_server(url: str, n: int) -> list[int]:
    body = {"model": BASE_MODEL, "messages": MESSAGES, **PARAMS}
    async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
        async def post() -> None:
            r = await client.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer bench"})
            r.raise_for_status()
            r.json()

        return await timed(n, post, warmup=20)


@contextlib.contextmanager
def local_server(in_process: bool) -> Iterator[str]:
    """The root URL of `llmchat serve --profile instant`, stopped on exit."""
    if in_process:
        with start_in_thread(resolve_settings({"profile": "instant", "port": 0})) as running:
            yield running.url
    else:
        with start_subprocess(["--profile", "instant"]) as child:
            yield child.url


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hits", type=int, default=2000)
    ap.add_argument("--misses", type=int, default=300)
    ap.add_argument("--in-process", action="store_true", help="run the server on a thread, not a child process")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="llmchat-bench-cache-") as folder:
        hit, lookup_miss, emb = asyncio.run(bench_cache(folder, args.hits))
    print(line("cache hit (get_chat)", hit))
    print(line("cache lookup, absent key", lookup_miss))
    print(line("cache hit, 64 embeddings at once", emb))
    goal = percentile(hit, 0.99) <= 1.0
    print(f"goal hit p99 <= 1 ms: {'met' if goal else 'NOT met'}")

    try:
        with local_server(args.in_process) as url:
            miss = asyncio.run(bench_server(url, args.misses))
    except LLMChatError as exc:
        print(f"baseline unavailable: {exc}")
        return 1
    print(line(f"miss: POST to serve --profile instant{' (thread)' if args.in_process else ''}", miss))
    print(f"ratio miss/hit: p50 {percentile(miss, 0.5) / percentile(hit, 0.5):.1f}x   "
          f"p99 {percentile(miss, 0.99) / percentile(hit, 0.99):.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
