"""What scraping a server's /metrics beside the requests costs them, in one run.

    /work/venv/bin/python benchmarks/server_metrics.py [--requests N]

(a) Requests to ``llmchat serve --ttft-ms 20`` (a child process, h2c) streamed one after the other in
    rounds, each round once per way, in a shuffled order. As the app and ``llmchat bench`` send them (one
    long-lived client): with nobody scraping, and with a ``ServerMetricsPoller`` scraping the server's
    ``/metrics`` every 50 ms (40 times the default cadence, so a scrape lands during most requests). As
    ``llmchat ask`` sends them (a new client, so a new connection, per request): with nobody scraping, and
    with one snapshot beside the request on a connection of its own. Printed: the median TTFT and end-to-end
    of each way and its ratio to the same face without scraping.
(b) What one scrape costs the event loop, the part the requests share it with: ``parse_server_metrics`` of
    a vLLM-sized exposition (about 2,000 lines: the gauges among a dozen histograms), against the same text
    only split into lines.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

from llmchat.core import ChatClient, ServerMetricsPoller, parse_server_metrics
from llmchat.core.server import start_subprocess

MODEL = "llmchat-local"
WAYS = ("app: none", "app: every 50 ms", "ask: none", "ask: beside")


def vllm_like_text() -> str:
    """About 2,000 lines shaped like vLLM's /metrics: a dozen histograms per model, then the gauges."""
    lines = []
    buckets = [f"{b:g}" for b in (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                                  2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)] + ["+Inf"]
    for model in ("Qwen/Qwen2.5-7B-Instruct", "meta-llama/Llama-3.1-8B-Instruct", "mistral-7b"):
        for name in ("time_to_first_token_seconds", "time_per_output_token_seconds",
                     "e2e_request_latency_seconds", "request_queue_time_seconds",
                     "request_inference_time_seconds", "request_prefill_time_seconds",
                     "request_decode_time_seconds", "request_prompt_tokens", "request_generation_tokens",
                     "request_params_n", "request_params_max_tokens", "iteration_tokens_total"):
            lines += [f"# HELP vllm:{name} A histogram.", f"# TYPE vllm:{name} histogram"]
            for i, le in enumerate(buckets):
                lines.append(f'vllm:{name}_bucket{{le="{le}",model_name="{model}"}} {i * 17}.0')
            lines += [f'vllm:{name}_sum{{model_name="{model}"}} 123.4',
                      f'vllm:{name}_count{{model_name="{model}"}} 374.0']
        for name, value in (("num_requests_running", 3), ("num_requests_waiting", 2),
                            ("kv_cache_usage_perc", 0.4)):
            lines.append(f'vllm:{name}{{engine="0",model_name="{model}"}} {value}')
    return "\n".join(lines) + "\n"


def _time_per_call(fn: object, loops: int) -> float:
    times = []
    for _ in range(7):
        start = time.perf_counter_ns()
        for _ in range(loops):
            fn()  # type: ignore[operator]
        times.append((time.perf_counter_ns() - start) / loops)
    return statistics.median(times)


async def _one(
    client: ChatClient, i: int, poller: ServerMetricsPoller | None = None
) -> tuple[float, float]:
    stream = client.stream([{"role": "user", "content": f"question {i}"}], max_tokens=16)
    async for _ in stream:
        pass
    if poller is not None:
        await poller.settle(stream.record)
    record = stream.record
    return record.ttft_ms or 0.0, record.total_ms or 0.0


async def _app_like(client: ChatClient, url: str, way: str, i: int) -> tuple[float, float]:
    """One request on the long-lived client, with or without a poller scraping every 50 ms meanwhile."""
    if way == "none":
        return await _one(client, i)
    poller = ServerMetricsPoller(url, client.endpoint.name, interval_s=0.05)
    poller.watch(client.bus)
    poller.start()
    await asyncio.sleep(0.01)  # its connection is open before the request, as in a running app
    try:
        return await _one(client, i)
    finally:
        await poller.aclose()


async def _ask_like(base_url: str, url: str, way: str, i: int) -> tuple[float, float]:
    """One request on a new client (a new pool, as each ``llmchat ask`` process has), with or without one
    snapshot beside it (a new poller: its own new connection, as in ``llmchat ask``). Pools are shared per
    endpoint in a process: "localhost" keeps this one apart from the long-lived client's 127.0.0.1."""
    ask_url = base_url.replace("127.0.0.1", "localhost")
    async with ChatClient(base_url=ask_url, http2="h2c", use_cache=False, model=MODEL) as client:
        assert not client.transport.is_open  # a new pool: the request opens its own connection
        poller = None
        if way != "none":
            poller = ServerMetricsPoller(url, client.endpoint.name, per_request=True)
            poller.watch(client.bus)
        try:
            return await _one(client, i, poller)
        finally:
            if poller is not None:
                await poller.aclose()


async def requests(base_url: str, n: int) -> dict[str, tuple[float, float]]:
    url = base_url.removesuffix("/v1") + "/metrics"
    figures: dict[str, list[tuple[float, float]]] = {w: [] for w in WAYS}
    rng = random.Random(7)
    async with ChatClient(base_url=base_url, http2="h2c", use_cache=False, model=MODEL) as client:
        for i in range(10):  # warm the pool and the server
            await _one(client, -i)
        for round_no in range(n):
            order = list(WAYS)
            rng.shuffle(order)
            for way in order:
                if way.startswith("app"):
                    figures[way].append(await _app_like(client, url, way.removeprefix("app: "), round_no))
                else:
                    figures[way].append(await _ask_like(base_url, url, way.removeprefix("ask: "), round_no))
    return {w: (statistics.median(t for t, _ in v), statistics.median(e for _, e in v))
            for w, v in figures.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=100, help="requests per way (default 100)")
    args = parser.parse_args()
    with start_subprocess(["--profile", "instant", "--ttft-ms", "20"]) as server:
        figures = asyncio.run(requests(server.base_url, args.requests))
    print(f"(a) {args.requests} streamed requests per way, interleaved (median; ratio to the same face's "
          "none)")
    for way, (ttft, e2e) in figures.items():
        base_ttft, base_e2e = figures[way.split(":")[0] + ": none"]
        print(f"    {way:<17} TTFT {ttft:7.2f} ms ({ttft / base_ttft:5.3f}x)   "
              f"end-to-end {e2e:7.2f} ms ({e2e / base_e2e:5.3f}x)")
    text = vllm_like_text()
    parse_ns = _time_per_call(lambda: parse_server_metrics(text), 50)
    split_ns = _time_per_call(lambda: text.splitlines(), 50)
    lines = len(text.splitlines())
    print(f"(b) one scrape's parse, {lines} lines ({len(text) / 1024:.0f} KiB) of vLLM-shaped text")
    print(f"    parse_server_metrics  {parse_ns / 1e6:7.3f} ms   ({parse_ns / split_ns:.1f}x a bare "
          f"splitlines, {split_ns / 1e6:.3f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
