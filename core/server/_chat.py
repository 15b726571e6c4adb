"""Chat completions, whole and streamed, paced by the latency profile and broken by the fault profile.

Pacing: token ``k`` is due at ``started + ttft_ms + k / tokens_per_s`` (plus up to ``jitter_ms``), on a fixed
schedule that never drifts; in the middle of a stream ``stall_ms`` separates two tokens, counted from the
moment the token before the stall was actually sent. Whenever the loop wakes it sends every token already
due in one write (up to 16 KiB), so a server that falls behind catches up in bigger writes instead of falling
further behind, and with ``tokens_per_s`` 0 (unlimited) a whole reply goes out in a few writes: the server
is not the bottleneck of a client benchmark.

Bunching: with ``bunch`` N the paced events are held until N are due and go out in one write, as llama-server
over loopback often delivers several events in one read (``timings`` adds llama.cpp's self-report, so a client
can tell its own measure of such a stream from the server's).

Buffering: with ``buffer_stream`` the headers go out at once but every chunk is held until the last, as behind
a buffering proxy (nginx's ``proxy_buffering``): the pacing still runs, the client sees it all at the end.

Queueing: with ``max_concurrency`` N > 0 at most N replies are generated at once; the rest wait for a slot in
arrival order, and their pacing starts when they get one (the wait shows as ``started_ns - received_ns``).

``server_timing`` (``time.monotonic_ns()`` stamps: request received, work started after any queueing, first
content token sent, last token sent) rides on the final chunk before ``[DONE]`` (the usage chunk when
``include_usage`` is set) and on every whole reply; there, "first token" is when the first token would have
been ready. After a cold start (``cold_start_ms``) it also carries ``model_load_ns``: how long this request
waited for its model to load, which the client attributes as the server's model load, not its prefill.

Shapes: a plain reply (one choice, no logprobs, no thinking or tool call) goes out through the byte templates
of ``_encode`` on the paths above, which nothing else slows; a ``response_format`` changes only its text
(``_structured``). Thinking, a tool call, ``logprobs`` or ``n`` > 1 take ``ChatResponder._rich`` instead: each
choice's events built once per request (``_thinking``), interleaved (``_choices``), paced like tokens; the
faults (stall, drop) are the plain path's alone.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from typing import Any

from llmchat.core.config import ServerSettings
from llmchat.core.server import _encode as _wire
from llmchat.core.server._choices import choice_stream, whole_choices
from llmchat.core.server._connections import ConnectionRegistry
from llmchat.core.server._faults import ColdStarts, FaultDice
from llmchat.core.server._http import Exchange, HTTPFailure
from llmchat.core.server._replies import (
    Reply,
    build_json_reply,
    build_reply,
    count_prompt_tokens,
    split_surrogates,
)
from llmchat.core.server._requests import ChatRequest
from llmchat.core.server._thinking import Events, Plan, plan

MAX_WRITE = 16 * 1024
DROP_GRACE_S = 0.05
"""How long a connection lives after its last bytes before a drop cuts it: long enough for the event loop to
put them on the wire (HTTP/2 writes from its own task), so the client always sees a partial reply."""

_ERROR_MESSAGES = {
    500: "The server had an error while processing your request. Sorry about that!",
    502: "Bad gateway.",
    503: "The engine is currently overloaded, please try again later.",
}


class ChatResponder:
    """Answers checked chat requests; holds the server-wide dice, cold-start state and reply ids."""

    def __init__(self, settings: ServerSettings, registry: ConnectionRegistry, dice: FaultDice) -> None:
        self.settings = settings
        self.registry = registry
        self.dice = dice
        self.cold = ColdStarts(settings.cold_start_ms / 1000.0, settings.idle_unload_s)
        self._ids = itertools.count(1)
        self._id_prefix = os.urandom(6).hex()
        self._interval = 1.0 / settings.tokens_per_s if settings.tokens_per_s > 0 else 0.0
        self._stall = settings.stall_ms / 1000.0
        self._slots = asyncio.Semaphore(settings.max_concurrency) if settings.max_concurrency > 0 else None
        self.running = 0
        """Chat replies being generated now (``/metrics``)."""
        self.waiting = 0
        """Chat requests queued for a slot (``/metrics``)."""

    def next_id(self) -> str:
        return f"chatcmpl-{self._id_prefix}{next(self._ids):08x}"

    def inject_error(self) -> None:
        """Raise an HTTPFailure 500/502/503 with probability ``error_rate``."""
        status = self.dice.error_status()
        if status is not None:
            raise HTTPFailure(status, _ERROR_MESSAGES[status], type_="server_error")

    async def reply(self, ex: Exchange, req: ChatRequest) -> None:
        """Send the reply to ``req``, streamed or whole, once a slot is free when ``max_concurrency`` is
        set. Never raises for a client that went away."""
        self.inject_error()
        if self._slots is None:
            await self._run(ex, req, ex.received_at)
            return
        started_at = ex.received_at
        if self._slots.locked():
            # Only a request that found no free slot has queued: the others start when they arrived, exactly
            # as without a limit, so reading the body is never reported as queueing.
            self.waiting += 1
            try:
                await self._slots.acquire()
            finally:
                self.waiting -= 1
            ex.started_ns = time.monotonic_ns()
            started_at = asyncio.get_running_loop().time()
        else:
            await self._slots.acquire()
        try:
            await self._run(ex, req, started_at)
        finally:
            self._slots.release()

    async def _run(self, ex: Exchange, req: ChatRequest, started_at: float) -> None:
        self.running += 1
        try:
            await self._generate(ex, req, started_at)
        finally:
            self.running -= 1

    async def _generate(self, ex: Exchange, req: ChatRequest, started_at: float) -> None:
        loop = asyncio.get_running_loop()
        cold = self.cold.delay(req.model, loop.time())
        ex.model_load_ns = round(cold * 1e9)
        reply = self._build(req, req.messages_key)
        if req.stream and self.settings.split_surrogates:
            reply = split_surrogates(reply)
        prompt_tokens = count_prompt_tokens(req.messages, self.settings.template_overhead)
        rate = self.settings.prefill_tokens_per_s
        prefill = prompt_tokens / rate if rate else 0.0
        first_due = started_at + cold + self.settings.ttft_ms / 1000.0 + prefill + self.dice.jitter()
        usage = _wire.usage(prompt_tokens, len(reply.tokens))
        try:
            if self.settings.reasoning_tokens > 0 or self.settings.tool_call or self.settings.refuse or not req.plain:
                await self._rich(ex, req, reply, first_due)
            elif req.stream:
                await self._stream(ex, req, reply, usage, first_due)
            else:
                await self._whole(ex, req, reply, usage, first_due)
        finally:
            self.cold.touch(req.model, loop.time())

    def _build(self, req: ChatRequest, messages_key: str) -> Reply:
        """The reply to ``req`` (``messages_key`` stands for its messages: another key, another choice)."""
        seed = req.seed if req.seed is not None else self.settings.seed
        if req.response_format is not None:
            return build_json_reply(
                req.model, messages_key, req.response_format.key, seed, req.max_tokens, req.stop
            )
        limit = req.max_tokens if req.max_tokens is not None else self.settings.default_max_tokens
        return build_reply(
            req.model, messages_key, req.last_user_text, seed, limit, req.max_tokens is not None, req.stop
        )

    async def _whole(
        self, ex: Exchange, req: ChatRequest, reply: Reply, usage: dict[str, Any], first_due: float
    ) -> None:
        loop = asyncio.get_running_loop()
        if not await ex.pause(first_due - loop.time()):
            return
        first_ns = time.monotonic_ns()
        last_due = first_due + max(0, len(reply.tokens) - 1) * self._interval
        if not await ex.pause(last_due - loop.time()):
            return
        extra = self._extra(ex, req, first_ns, time.monotonic_ns(), usage)
        body = _wire.completion(
            self.next_id(), int(time.time()), req.model, reply.text, reply.finish_reason, usage, extra
        )
        await ex.respond(200, body)

    async def _stream(
        self, ex: Exchange, req: ChatRequest, reply: Reply, usage: dict[str, Any], first_due: float
    ) -> None:
        loop = asyncio.get_running_loop()
        template = _wire.ChunkTemplate(self.next_id(), int(time.time()), req.model, req.include_usage)
        headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
        h11 = ex.scope.get("http_version") == "1.1"
        if self.settings.close_after_stream and h11:
            # llama.cpp promises keep-alive like this, then closes anyway.
            headers.append((b"keep-alive", b"timeout=5, max=100"))
        await ex.start(200, headers)
        ex.hold = self.settings.buffer_stream
        await ex.write(template.role())

        escaped, n = reply.escaped, len(reply.tokens)
        drop_after = self.dice.drop_after(n)
        stall_at = n // 2 if self._stall > 0 and n > 1 else -1
        if n == 0:  # a stop sequence at the very start: an empty reply still ends like any other
            if await ex.pause(first_due - loop.time()):
                await self._finish(ex, h11, self._final_empty(ex, req, template, reply, usage))
            return
        if self._interval == 0 and self.dice.jitter_s == 0 and stall_at < 0 and drop_after is None:
            await self._unpaced(ex, h11, req, template, reply, usage, first_due)
            return
        # Token k is due at origin + (k - origin_k) * interval + jitter; the stall moves the origin.
        origin, origin_k = first_due, 0
        first_ns = last_ns = 0
        due = first_due
        i = 0
        # With --bunch N the events wait until N are due and go out in one write (a flush also before a
        # drop or a stall, so those still cut and pause where they would).
        bunch = self.settings.bunch
        parts: list[bytes] = []
        size = 0
        while i < n:
            if not await ex.pause(due - loop.time()):
                return
            now = loop.time()
            ready = now if not ex.hurrying else float("inf")
            while (
                i < n
                and due <= ready
                and size < MAX_WRITE
                and i != drop_after
                and not (i == stall_at and parts)
            ):
                if i == 0:
                    first_ns = time.monotonic_ns()
                if i < n - 1:
                    part = template.content(escaped[i])
                else:
                    last_ns = time.monotonic_ns()
                    part = self._final(ex, req, template, reply, usage, first_ns, last_ns)
                parts.append(part)
                size += len(part)
                i += 1
                if i < n:
                    due = max(due, origin + (i - origin_k) * self._interval + self.dice.jitter())
            if ex.disconnected:
                return
            if i == n:
                await self._finish(ex, h11, b"".join(parts))
                return
            stalling = i == stall_at and bool(parts)
            if parts and (len(parts) >= bunch or size >= MAX_WRITE or i == drop_after or stalling):
                await ex.write(b"".join(parts))
                parts, size = [], 0
            if i == drop_after:
                await asyncio.sleep(DROP_GRACE_S)
                self.registry.cut(ex.scope.get("client"))
                return
            if stalling:
                # The stall is a gap of at least stall_ms after the last token actually sent, however late.
                origin, origin_k = loop.time() + self._stall, stall_at
                due = max(due, origin + self.dice.jitter())

    async def _rich(self, ex: Exchange, req: ChatRequest, reply: Reply, first_due: float) -> None:
        """A reply with a thinking phase, a tool call, logprobs and/or ``n`` choices (see ``_thinking`` and
        ``_choices``): step k due at ``first_due + k / tokens_per_s``; the faults (stall, drop) are the plain
        replies' alone. Choice 0 is the reply a plain request gets; choice i another, as if sampled again."""
        loop = asyncio.get_running_loop()
        template = _wire.ChunkTemplate(self.next_id(), int(time.time()), req.model, req.include_usage)
        top = req.top_logprobs if req.logprobs else None
        choices: list[tuple[Events, Plan]] = []
        for i in range(req.n):
            key = req.messages_key if i == 0 else f"{req.messages_key}\x00choice {i}"
            events = Events(template.head, req.include_usage, i)
            choice_plan = plan(
                reply if i == 0 else self._build(req, key), reasoning_tokens=self.settings.reasoning_tokens,
                inline=self.settings.reasoning_inline, tool_call=self.settings.tool_call, tools=req.tools,
                seed_text=key, last_user_text=req.last_user_text, events=events, top_logprobs=top,
                open_in_prompt=self.settings.reasoning_open_in_prompt, refuse=self.settings.refuse,
            )
            choices.append((events, choice_plan))
        plans = [p for _, p in choices]
        reasoning = sum(p.reasoning_tokens for p in plans) if self.settings.reasoning_tokens > 0 else None
        usage = _wire.usage(
            count_prompt_tokens(req.messages, self.settings.template_overhead),
            sum(p.completion_tokens for p in plans), reasoning,
        )
        if not req.stream:
            longest = max(p.completion_tokens for p in plans)  # the choices are generated side by side
            if not await ex.pause(first_due - loop.time()):
                return
            first_ns = time.monotonic_ns()
            if not await ex.pause(first_due + max(0, longest - 1) * self._interval - loop.time()):
                return
            extra = self._extra(ex, req, first_ns, time.monotonic_ns(), usage)
            await ex.respond(200, _wire.completion(self.next_id(), int(time.time()), req.model, "", "stop",
                                                   usage, extra, whole_choices(plans, req.logprobs)))
            return
        stream = choice_stream(template, choices, req.logprobs)
        h11 = ex.scope.get("http_version") == "1.1"
        await ex.start(200, [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")])
        ex.hold = self.settings.buffer_stream
        await ex.write(stream.roles)
        steps, total = stream.steps, len(stream.steps) + 1  # the final step is the last
        i, due, first_ns = 0, first_due, 0
        while i < total:
            if not await ex.pause(due - loop.time()):
                return
            ready = loop.time() if not ex.hurrying else float("inf")
            parts: list[bytes] = []
            size = 0
            while i < total and due <= ready and size < MAX_WRITE:
                if i == 0:
                    first_ns = time.monotonic_ns()
                part = steps[i] if i < total - 1 else stream.final(
                    usage, self._extra(ex, req, first_ns, time.monotonic_ns(), usage))
                parts.append(part)
                size += len(part)
                i += 1
                due = max(due, first_due + i * self._interval + self.dice.jitter())
            if ex.disconnected:
                return
            if i == total:
                await self._finish(ex, h11, b"".join(parts))
                return
            if parts:
                await ex.write(b"".join(parts))

    async def _unpaced(
        self,
        ex: Exchange,
        h11: bool,
        req: ChatRequest,
        template: _wire.ChunkTemplate,
        reply: Reply,
        usage: dict[str, Any],
        first_due: float,
    ) -> None:
        """The whole reply at once, in MAX_WRITE slices cut wherever they fall (inside events, characters)."""
        if not await ex.pause(first_due - asyncio.get_running_loop().time()):
            return
        first_ns = time.monotonic_ns()
        body = template.contents(reply.escaped[:-1])
        sent = 0
        while len(body) - sent > MAX_WRITE:
            await ex.write(body[sent : sent + MAX_WRITE], split_utf8=False)
            sent += MAX_WRITE
            if ex.disconnected:
                return
        final = self._final(ex, req, template, reply, usage, first_ns, time.monotonic_ns())
        await self._finish(ex, h11, body[sent:] + final)

    async def _finish(self, ex: Exchange, h11: bool, data: bytes) -> None:
        """Send the last bytes of a stream; with close_after_stream, doom its HTTP/1.1 connection first (the
        next request may arrive the moment these bytes do)."""
        if self.settings.close_after_stream and h11:
            self.registry.doom(ex.scope.get("client"))
        await ex.write(data, more=False)

    def _final(
        self,
        ex: Exchange,
        req: ChatRequest,
        template: _wire.ChunkTemplate,
        reply: Reply,
        usage: dict[str, Any],
        first_ns: int,
        last_ns: int,
    ) -> bytes:
        extra = self._extra(ex, req, first_ns, last_ns, usage)
        if req.include_usage:
            return (
                template.last(reply.escaped[-1], reply.finish_reason, None)
                + template.usage(usage, extra)
                + _wire.DONE
            )
        return template.last(reply.escaped[-1], reply.finish_reason, extra) + _wire.DONE

    def _final_empty(
        self,
        ex: Exchange,
        req: ChatRequest,
        template: _wire.ChunkTemplate,
        reply: Reply,
        usage: dict[str, Any],
    ) -> bytes:
        now = time.monotonic_ns()
        extra = self._extra(ex, req, now, now, usage)
        if req.include_usage:
            return template.last(b"", reply.finish_reason, None) + template.usage(usage, extra) + _wire.DONE
        return template.last(b"", reply.finish_reason, extra) + _wire.DONE

    def _extra(self, ex: Exchange, req: ChatRequest, first_ns: int, last_ns: int,
               usage: dict[str, int]) -> dict[str, Any]:
        timing = _wire.timing(ex.received_ns, first_ns, last_ns, ex.started_ns, ex.model_load_ns)
        extra: dict[str, Any] = {"server_timing": timing}
        if self.settings.timings:
            extra["timings"] = _wire.llama_timings(timing, usage)
        if req.params:
            extra["request_params"] = req.params
        return extra
