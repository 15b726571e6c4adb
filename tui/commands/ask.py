"""`llmchat ask PROMPT`: one answer for scripts, streamed to stdout as it arrives.

Exit status: 0 on success, 1 on an API or network failure (one line on stderr; what arrived stays on stdout)
or a refusal (its words on stdout, marked, and one line on stderr), 2 on a usage or config error. With no
provider configured, the local server answers, and stderr says so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TextIO

from llmchat.core import (
    ChatClient,
    Pools,
    RequestDone,
    RetryPlanned,
    ServerSignals,
    Settings,
    format_shares,
    load_settings,
    record_notes,
)
from llmchat.core import text as _text
from llmchat.core.errors import APIError, UsageError
from llmchat.core.http import Attachment, ToolCall, message_content, read_attachment
from llmchat.core.observe import TimingRecord, attach_observers
from llmchat.tui.commands import _options
from llmchat.tui.commands._provider import offline_default


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("ask", help="one answer for scripts: stream a reply to stdout",
                       description="Ask once and print the reply as it arrives.")
    p.add_argument("prompt", help="the prompt; - reads it from stdin")
    p.add_argument("--batch", action="store_true", help="ask for one whole reply instead of a stream (cacheable)")
    _options.add(p, "endpoint")
    p.add_argument("--system", help="a system prompt")
    p.add_argument("-f", "--file", action="append", default=[], metavar="FILE",
                   help="attach a file: text as a fenced block under its name, an image for a vision model; "
                   "repeat for more (ui.attachment_max_kb is the limit)")
    p.add_argument("--max-tokens", type=_options.number(1, integer=True), help="the longest reply, in tokens")
    p.add_argument("--temperature", type=_options.number(0, 2),
                   help="sampling temperature, 0 to 2 (0 makes batch replies cacheable)")
    p.add_argument("--seed", type=_options.number(integer=True), help="a fixed seed (makes batch replies cacheable)")
    p.add_argument("--http1", action="store_true", help="use HTTP/1.1 only (no HTTP/2)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: the reply, its timing record and where the time went "
                   "(attribution)")
    p.add_argument("--stats", action="store_true",
                   help="print a timing summary and where the time went (network, server, client) to stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    prompt = _prompt_text(args.prompt)
    if not prompt.strip():
        raise UsageError("the prompt is empty; pass text, or - with text on stdin")
    settings = load_settings(args.config)
    # Read before anything is sent: a file that cannot go is one line and exit status 2.
    args.attachments = [read_attachment(f, max_bytes=settings.ui.attachment_max_kb * 1024) for f in args.file]
    with offline_default(settings, args.provider, args.base_url) as (base_url, http2, model):
        args.model = args.model or model
        return asyncio.run(_ask(args, settings, prompt, base_url, http2))


def _prompt_text(arg: str) -> str:
    """The prompt as text: bytes that are not UTF-8 (from stdin or argv) become U+FFFD, said once on stderr."""
    if arg != "-":
        text, bad = _text.from_os(arg)
    elif hasattr(sys.stdin, "buffer"):
        text, bad = _text.decode(sys.stdin.buffer.read())
    else:  # a text stream put in place of stdin (an embedding program, a test)
        text, bad = _text.clean(sys.stdin.read())
    if bad:
        where = "stdin" if arg == "-" else "the prompt"
        bytes_are = "1 byte that is" if bad == 1 else f"{bad} bytes that are"
        print(f"llmchat: {where} had {bytes_are} not UTF-8; sent as U+FFFD", file=sys.stderr)
    return text


async def _ask(args: argparse.Namespace, settings: Settings, prompt: str, base_url: str | None,
               http2: Any) -> int:
    if args.http1:
        http2 = False
    messages: list[dict[str, Any]] = []
    if args.system:
        messages.append({"role": "system", "content": _text.from_os(args.system)[0]})
    attachments: list[Attachment] = getattr(args, "attachments", [])
    messages.append({"role": "user", "content": message_content(prompt, attachments)})
    params: dict[str, Any] = {}
    if args.max_tokens is not None:
        params["max_tokens"] = args.max_tokens
    if args.temperature is not None:
        params["temperature"] = args.temperature
    if args.seed is not None:
        params["seed"] = args.seed
    out = _Out(sys.stdout, enabled=not args.json)
    text = reasoning = refusal = ""
    calls: list[ToolCall] = []
    record: TimingRecord | None = None
    error: APIError | None = None
    cancelled = False
    pools = Pools()  # this command's connections: the request's, the model lookup's, the metrics snapshot's
    client = ChatClient(settings, provider=args.provider, base_url=base_url, model=args.model, http2=http2,
                        api_key_env=args.api_key_env, pools=pools)
    async with pools, client, _observed(client, settings) as signals:
        client.bus.subscribe(RetryPlanned, _announce_retry)
        finished: list[TimingRecord] = []  # the record of a request cut before it returned one (Ctrl-C)
        client.bus.subscribe(RequestDone, lambda done: finished.append(done.record))
        try:
            if args.batch:
                reply = await client.complete(messages, **params)
                text, record = reply.text, reply.record
                reasoning, calls, refusal = reply.reasoning, reply.tool_calls, reply.refusal
                if text or not refusal:
                    out.write(text + "\n")
            else:
                stream = client.stream(messages, **params)
                stream.on_reclaim = lambda moved: _reclaimed(out, moved)
                record = stream.record
                try:
                    async for piece in stream:
                        out.write(piece)
                finally:
                    # Closed here, whatever stopped the loop (a closed pipe, Ctrl-C): never left to the GC.
                    await stream.aclose()
                    text, reasoning, calls = stream.text, stream.reasoning, stream.tool_calls
                    refusal = stream.refusal
        except APIError as exc:
            error = exc
        except asyncio.CancelledError:
            # Ctrl-C: what arrived stays (on stdout already, or in the JSON below), marked cancelled.
            cancelled = True
        if text and not args.batch:
            out.write("\n")  # the streamed text ends its line, whatever ended the stream
        if refusal:
            out.write(f"[refused: {refusal}]\n")
        for call in calls:
            # Never executed: what the model asked for is shown, one line per call.
            out.write(f"[tool call {call.name}: {call.arguments}]\n")
        if error is not None and record is None:
            record = getattr(error, "record", None)
        if record is None and finished:
            record = finished[-1]
        attribution = None if record is None else await signals.attribute(record)
    if args.json:
        obj: dict[str, Any] = {"reply": text, "reasoning": reasoning, "refusal": refusal or None,
                               "tool_call_list": [c.to_dict() for c in calls]}
        if record is not None and attribution is not None:
            obj.update(record.summary())
            obj["attribution"] = attribution.to_dict()
        obj["error"] = "cancelled (Ctrl-C)" if cancelled else None if error is None else str(error)
        sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
    sys.stdout.flush()
    if args.stats and record is not None and attribution is not None:
        # The notes, then the split: scripts read the timing line as the last one and the split before it.
        for note in record_notes(record):
            # Chunks that arrived together, a prompt the server cut: the figures below need them said.
            print(f"llmchat: {note}", file=sys.stderr)
        split = format_shares(attribution)
        if split:
            print(f"llmchat: {split}", file=sys.stderr)
        print(stats_line(record), file=sys.stderr)
    if record is not None and record.replaced_chars:
        n = record.replaced_chars
        print(f"llmchat: the server sent {n} character{'s' if n != 1 else ''} that {'are' if n != 1 else 'is'} "
              "not valid Unicode (a lone surrogate escape); shown as U+FFFD", file=sys.stderr)
    if cancelled:
        raise KeyboardInterrupt  # exit status 130, as the shell expects of Ctrl-C
    if error is not None:
        print(f"llmchat: {error}", file=sys.stderr)
        return 1
    if refusal:
        print("llmchat: the model refused to answer (finish_reason refusal); rephrase the prompt or ask another "
              "model", file=sys.stderr)
        return 1
    return 0


def _reclaimed(out: _Out, moved: str) -> None:
    # What was printed as the answer was the model's thinking: its template opened <think> in the prompt,
    # and only the bare </think> told. Printed is printed; say which part it was, and where the answer starts.
    if out.enabled and moved:
        out.write("\n")
        print("llmchat: the text above was the model's thinking (it ended with </think>); the answer follows",
              file=sys.stderr, flush=True)


ANNOUNCE_WAIT_S = 1.0
"""A retry wait this long or longer is said on stderr as it starts; shorter ones only show in the record."""


def _announce_retry(event: RetryPlanned) -> None:
    # Before the wait, so a long Retry-After is never a silent minute; a blink of backoff is not worth a line.
    if event.event.wait_s >= ANNOUNCE_WAIT_S:
        print(f"llmchat: {event.event.describe()}; Ctrl-C stops", file=sys.stderr, flush=True)


class _Out:
    """The reply on stdout as it arrives (unless --json), flushed per piece so a pipe sees it at once."""

    def __init__(self, stream: TextIO, *, enabled: bool) -> None:
        self.stream, self.enabled = stream, enabled

    def write(self, text: str) -> None:
        if self.enabled:
            self.stream.write(text)
            self.stream.flush()


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
