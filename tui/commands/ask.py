"""`llmchat ask PROMPT`: one answer for scripts, streamed to stdout as it arrives.

Exit status: 0 on success, 1 on an API or network failure (one line on stderr; what arrived stays on stdout),
2 on a usage or config error. With no provider configured, the local server answers, and stderr says so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from llmchat.core import ChatClient, ServerSignals, Settings, format_shares, load_settings
from llmchat.core._errors import APIError, UsageError
from llmchat.core._requestlog import attach_observers
from llmchat.core._timing import TimingRecord
from llmchat.tui.commands._provider import offline_default


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("ask", help="one answer for scripts: stream a reply to stdout",
                       description="Ask once and print the reply as it arrives.")
    p.add_argument("prompt", help="the prompt; - reads it from stdin")
    p.add_argument("--batch", action="store_true", help="ask for one whole reply instead of a stream (cacheable)")
    p.add_argument("--provider", help="a provider name from the config")
    p.add_argument("--base-url", help="talk to this OpenAI-compatible API root instead (e.g. http://127.0.0.1:8000/v1)")
    p.add_argument("--model", help="the model (default: the provider's)")
    p.add_argument("--system", help="a system prompt")
    p.add_argument("--max-tokens", type=int, help="the longest reply, in tokens")
    p.add_argument("--temperature", type=float, help="sampling temperature (0 makes batch replies cacheable)")
    p.add_argument("--seed", type=int, help="a fixed seed (makes batch replies cacheable)")
    p.add_argument("--http1", action="store_true", help="use HTTP/1.1 only (no HTTP/2)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: the reply, its timing record and where the time went "
                   "(attribution)")
    p.add_argument("--stats", action="store_true",
                   help="print a timing summary and where the time went (network, server, client) to stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise UsageError("the prompt is empty; pass text, or - with text on stdin")
    settings = load_settings(args.config)
    with offline_default(settings, args.provider, args.base_url) as (base_url, http2, model):
        args.model = args.model or model
        return asyncio.run(_ask(args, settings, prompt, base_url, http2))


async def _ask(args: argparse.Namespace, settings: Settings, prompt: str, base_url: str | None,
               http2: Any) -> int:
    if args.http1:
        http2 = False
    messages: list[dict[str, str]] = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    messages.append({"role": "user", "content": prompt})
    params: dict[str, Any] = {}
    if args.max_tokens is not None:
        params["max_tokens"] = args.max_tokens
    if args.temperature is not None:
        params["temperature"] = args.temperature
    if args.seed is not None:
        params["seed"] = args.seed
    out = sys.stdout
    text = ""
    record: TimingRecord | None = None
    error: APIError | None = None
    async with ChatClient(settings, provider=args.provider, base_url=base_url, model=args.model,
                          http2=http2) as client, _observed(client, settings) as signals:
        if args.batch:
            try:
                reply = await client.complete(messages, **params)
                text, record = reply.text, reply.record
                if not args.json:
                    out.write(text + "\n")
            except APIError as exc:
                error = exc
        else:
            stream = client.stream(messages, **params)
            record = stream.record
            try:
                async for piece in stream:
                    if not args.json:
                        out.write(piece)
                        out.flush()
            except APIError as exc:
                error = exc
            text = stream.text
            if not args.json and text:
                out.write("\n")
        if error is not None and record is None:
            record = getattr(error, "record", None)
        attribution = None if record is None else await signals.attribute(record)
    if args.json:
        obj: dict[str, Any] = {"reply": text}
        if record is not None and attribution is not None:
            obj.update(record.summary())
            obj["attribution"] = attribution.to_dict()
        obj["error"] = None if error is None else str(error)
        out.write(json.dumps(obj, ensure_ascii=False) + "\n")
    out.flush()
    if args.stats and record is not None and attribution is not None:
        # The split first: scripts read the timing line as the last one.
        split = format_shares(attribution)
        if split:
            print(f"llmchat: {split}", file=sys.stderr)
        print(stats_line(record), file=sys.stderr)
    if error is not None:
        print(f"llmchat: {error}", file=sys.stderr)
        return 1
    return 0


@asynccontextmanager
async def _observed(client: ChatClient, settings: Settings) -> AsyncIterator[ServerSignals]:
    """For the duration: the cold-start baselines of earlier runs (saved back at the end), one snapshot of the
    provider's metrics_url beside the request, and the request log (log.requests_path), flushed at the end."""
    signals = await ServerSignals(settings, per_request=True).open()
    signals.follow(client)
    observers = attach_observers(client.bus, settings, baselines=signals.baselines)
    try:
        yield signals
    finally:
        await observers.aclose()
        await signals.aclose()


def stats_line(r: TimingRecord) -> str:
    """One line: version, reuse, TTFB, TTFT, total, tokens, tokens/s, retries, cache."""

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f} ms"

    conn = "reused" if r.connection_reused else "new"
    tps = "-" if r.tokens_per_s is None else f"{r.tokens_per_s:.0f}"
    parts = [
        f"{r.http_version or '-'} ({conn} conn)",
        f"ttfb {ms(r.ttfb_ms)}",
        f"ttft {ms(r.ttft_ms)}",
        f"total {ms(r.total_ms)}",
        f"{r.output_tokens} tokens",
        f"{tps} tok/s",
        f"retries {len(r.retries)}",
        "cache hit" if r.cache_hit else "cache miss",
    ]
    return "llmchat: " + " | ".join(parts)
