"""SSE decoding speed: llmchat's decoder against openai-python's and httpx-sse's, in one run.

All three get the same realistic stream: 20,000 OpenAI ``chat.completion.chunk`` events (a few characters of
delta each, some non-ASCII, ending in ``data: [DONE]``) cut into 4 KiB byte chunks, so multi-byte characters
and lines straddle chunk boundaries as they do off the network. Each decoder is driven the way its library
drives it:

* llmchat: ``SSEDecoder.feed`` per chunk, then ``close``;
* openai-python: ``openai._streaming.SSEDecoder.iter_bytes`` over the chunks, as ``openai.Stream`` does over
  ``response.iter_bytes()``;
* httpx-sse: httpx's ``TextDecoder`` and ``TextChunker`` (what ``Response.iter_text`` runs), then
  ``SSELineDecoder`` and ``SSEDecoder.decode`` per line, as ``EventSource.iter_sse`` does.

Runs are interleaved over several repetitions (rotating order) and the median is reported. MB is 10**6 bytes.
The three must produce identical event data, or the script says so and exits 1.

Run: ``/work/venv/bin/python benchmarks/sse_decode.py``
"""

from __future__ import annotations

import gc
import json
import random
import statistics
import sys
import time
from collections.abc import Callable

from httpx._decoders import TextChunker, TextDecoder
from httpx_sse._decoders import SSEDecoder as HttpxSSEDecoder
from httpx_sse._decoders import SSELineDecoder as HttpxSSELineDecoder
from openai._streaming import SSEDecoder as OpenAISSEDecoder

from llmchat.core.http import SSEDecoder

EVENTS = 20_000
CHUNK = 4096
REPETITIONS = 9

_WORDS = [
    " the",
    " of",
    " and",
    " a",
    " to",
    " in",
    " is",
    " you",
    " that",
    " it",
    " stream",
    " token",
    " latency",
    " café",
    " naïve",
    " —",
    " über",
    " 速度",
    " 🚀",
    " résumé",
    ".",
    ",",
    "\n\n",
    " `code`",
    ' "quoted"',
]


def build_stream(events: int, seed: int = 7) -> bytes:
    """A ``text/event-stream`` body shaped like OpenAI's chat completion stream, ``events`` events long."""
    rng = random.Random(seed)
    head = {
        "id": "chatcmpl-9xQvT2aBcDeFgHiJkLmNoPqRsTuV",
        "object": "chat.completion.chunk",
        "created": 1718000000,
        "model": "gpt-4o-mini-2024-07-18",
        "system_fingerprint": "fp_0ba0d124f1",
    }
    lines: list[str] = []
    for index in range(events - 1):
        delta: dict[str, str] = {"content": rng.choice(_WORDS)}
        if index == 0:
            delta = {"role": "assistant", "content": ""}
        finish = "stop" if index == events - 2 else None
        if finish:
            delta = {}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        body = json.dumps({**head, "choices": [choice]}, ensure_ascii=False, separators=(",", ":"))
        lines.append(f"data: {body}\n\n")
    lines.append("data: [DONE]\n\n")
    return "".join(lines).encode()


def run_llmchat(chunks: list[bytes]) -> list[str]:
    decoder = SSEDecoder()
    out: list[str] = []
    for chunk in chunks:
        for event in decoder.feed(chunk):
            out.append(event.data)
    for event in decoder.close():
        out.append(event.data)
    return out


def run_openai(chunks: list[bytes]) -> list[str]:
    return [event.data for event in OpenAISSEDecoder().iter_bytes(iter(chunks))]


def run_httpx_sse(chunks: list[bytes]) -> list[str]:
    text_decoder = TextDecoder(encoding="utf-8")
    chunker = TextChunker()
    lines = HttpxSSELineDecoder()
    decoder = HttpxSSEDecoder()
    out: list[str] = []

    def take(text_pieces: list[str]) -> None:
        for piece in text_pieces:
            for line in lines.decode(piece):
                event = decoder.decode(line.rstrip("\n"))
                if event is not None:
                    out.append(event.data)

    for chunk in chunks:
        take(chunker.decode(text_decoder.decode(chunk)))
    take(chunker.decode(text_decoder.flush()))
    take(chunker.flush())
    for line in lines.flush():
        event = decoder.decode(line.rstrip("\n"))
        if event is not None:
            out.append(event.data)
    return out


def main() -> int:
    stream = build_stream(EVENTS)
    chunks = [stream[i : i + CHUNK] for i in range(0, len(stream), CHUNK)]
    contenders: dict[str, Callable[[list[bytes]], list[str]]] = {
        "llmchat": run_llmchat,
        "openai-python": run_openai,
        "httpx-sse": run_httpx_sse,
    }

    results = {name: run(chunks) for name, run in contenders.items()}
    reference = results["llmchat"]
    ok = len(reference) == EVENTS
    for name, data in results.items():
        if data != reference:
            print(f"MISMATCH: {name} produced {len(data)} events, llmchat {len(reference)}", file=sys.stderr)
            ok = False
    if not ok:
        return 1

    timings: dict[str, list[int]] = {name: [] for name in contenders}
    names = list(contenders)
    for repetition in range(REPETITIONS):
        order = names[repetition % len(names) :] + names[: repetition % len(names)]
        for name in order:
            gc.collect()
            start = time.perf_counter_ns()
            count = len(contenders[name](chunks))
            timings[name].append(time.perf_counter_ns() - start)
            if count != EVENTS:
                print(f"MISMATCH: {name} produced {count} events", file=sys.stderr)
                return 1

    megabytes = len(stream) / 1e6
    print(f"stream: {EVENTS} events, {megabytes:.2f} MB, {len(chunks)} chunks of {CHUNK} B")
    print(f"median of {REPETITIONS} interleaved runs; all three decoders produced identical event data")
    print(f"{'decoder':<14} {'ms':>8} {'MB/s':>8} {'events/s':>11} {'llmchat speed-up':>17}")
    medians = {name: statistics.median(values) / 1e9 for name, values in timings.items()}
    for name, seconds in medians.items():
        ratio = seconds / medians["llmchat"]
        rates = f"{megabytes / seconds:8.1f} {EVENTS / seconds:11,.0f}"
        print(f"{name:<14} {seconds * 1e3:8.1f} {rates} {ratio:16.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
