"""``ChatClient``: stream, complete and embed, each producing a timing record on the bus.

The client puts the layers together: settings resolve to an ``Endpoint``; a transport (``HTTPTransport``: the
given one, else one from the caller's ``Pools``) sends;
the retry loop wraps everything up to the response headers (never past the first byte the caller sees); the
SSE decoder and the wire parser turn bytes into deltas; the cache answers batch requests and embeddings.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, TypeVar

import llmchat.core.errors as errors
import llmchat.core.http._openai as wire
from llmchat.core.client._count import estimate_prompt
from llmchat.core.config import Http2Mode, HttpSettings, RetrySettings, Settings
from llmchat.core.config._secrets import mask_url
from llmchat.core.http import (
    Endpoint,
    HTTPResponse,
    HTTPTransport,
    Pools,
    SSEDecoder,
    ToolCall,
    read_headroom,
)
from llmchat.core.http._reasoning import ThinkSplitter
from llmchat.core.http._toolcalls import ToolCallAssembler
from llmchat.core.http._urls import has_userinfo, join_url, userinfo_error
from llmchat.core.observe import (
    Bus,
    Chunk,
    FirstToken,
    Phases,
    RateLimitHeld,
    RequestDone,
    RequestStarted,
    RetryPlanned,
    TimingRecord,
)
from llmchat.core.policy import (
    Hold,
    ProviderLimiter,
    RateLimits,
    ReplyCache,
    RetryEvent,
    call_with_retries,
    replay_chunks,
    request_charge,
)
from llmchat.core.text import SurrogateJoiner

Message = Mapping[str, Any]

_Hit = TypeVar("_Hit")

#: The ``finish_reason`` of a reply the model refused (OpenAI says "stop" and puts the words in ``refusal``).
REFUSAL = "refusal"

#: How long a finished stream may take to deliver the rest of its body before its connection is dropped.
_DRAIN_S = 1.0


@dataclass(slots=True)
class ChatReply:
    """A whole reply: its text, the reasoning kept apart, the tool calls it asked for (never executed), and
    the request's timing record."""

    text: str
    record: TimingRecord
    reasoning: str = ""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    refusal: str = ""
    """The model's refusal, in its words ("" when it did not refuse); ``finish_reason`` is then "refusal"."""


def endpoint_from_settings(
    settings: Settings,
    provider: str | None = None,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    api_key_env: str | None = None,
    http2: Http2Mode | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[Endpoint, str | None]:
    """Resolve the endpoint and the default model. An explicit ``base_url`` bypasses the providers table.

    ``api_key`` (library use) or ``api_key_env``, the name of an environment variable holding one
    (``--api-key-env``), beat the provider's own key. Raises ``ConfigError`` (via the config layer) for an
    unknown provider, and ``UsageError`` when nothing is configured and no base URL is given (callers that
    want the offline default start the local server first) or when ``api_key_env`` names an unset variable.
    """
    from llmchat.core.config._load import resolve_provider

    env = os.environ if env is None else env
    source = "the api_key argument" if api_key else ""
    if api_key is None and api_key_env:
        api_key = env.get(api_key_env) or None
        if api_key is None:
            raise errors.UsageError(
                f"--api-key-env {api_key_env}: that environment variable is not set or is empty; export "
                f"{api_key_env} with the key first, or drop the flag"
            )
        source = f"env {api_key_env} (--api-key-env)"
    if base_url:
        if has_userinfo(base_url):
            raise userinfo_error(base_url, "--base-url")
        http = settings.http
        if http2 is not None:
            http = _replace_http(http, http2=http2)
        ep = Endpoint(
            name=provider or "custom",
            base_url=base_url.rstrip("/"),
            api_key=api_key,
            api_key_source=source or "none (no key is sent with --base-url unless --api-key-env names one)",
            api_key_hint="" if api_key else "pass --api-key-env VAR, VAR being the environment variable that "
            "holds the key",
            http=http,
        )
        return ep, None
    resolved = resolve_provider(settings, provider, env=env)
    if resolved is None:
        raise errors.UsageError(
            "no provider is configured; set OPENAI_API_KEY (and OPENAI_BASE_URL), add [providers.NAME] to the "
            "config, or pass --base-url"
        )
    http = resolved.http if http2 is None else _replace_http(resolved.http, http2=http2)
    ep = Endpoint(
        name=resolved.name,
        base_url=resolved.base_url,
        api_key=api_key or resolved.api_key,
        api_key_source=source or resolved.api_key_source,
        api_key_hint="" if api_key else resolved.api_key_hint,
        headers=dict(resolved.headers),
        http=http,
    )
    return ep, resolved.model


def _replace_http(http: HttpSettings, **changes: Any) -> HttpSettings:
    from dataclasses import replace

    return replace(http, **changes)


class ChatClient:
    """An async context manager that talks to one OpenAI-compatible provider.

    Build it from ``Settings`` (``ChatClient(settings, provider="groq")``) or from keywords
    (``ChatClient(base_url="http://127.0.0.1:8000/v1", http2="h2c")``). Every request makes a
    ``TimingRecord`` and publishes it on ``bus``. Errors are llmchat's typed ``APIError`` family, each with a
    one-line message; a reply cut short keeps its text in the error's ``partial_text``.

    Connections: ``pools`` (a ``Pools`` the caller holds and closes) gives the client the endpoint's shared
    transport, so every client of one face reuses the same warm connections; without it the client has pools
    of its own. ``transport`` sends through that transport instead (``MockTransport`` in unit tests, a bench
    configuration's own pool): the endpoint is then the transport's, ``provider``, ``base_url``, ``api_key``,
    ``api_key_env`` and ``http2`` must not be given (UsageError), and the caller closes it.

    With ``limits`` (the process's ``RateLimits``) each attempt first takes its share of the provider's buckets,
    and waits there when they are empty (a ``RateLimitHeld`` on the bus, ``record.limit_wait_ns``); without,
    nothing waits.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        provider: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        api_key_env: str | None = None,
        model: str | None = None,
        http2: Http2Mode | None = None,
        bus: Bus | None = None,
        cache: ReplyCache | None = None,
        use_cache: bool = True,
        retry: RetrySettings | None = None,
        env: Mapping[str, str] | None = None,
        pools: Pools | None = None,
        transport: HTTPTransport | None = None,
        limits: RateLimits | None = None,
    ) -> None:
        self.settings = settings or Settings()
        default_model: str | None = None
        if transport is not None:
            if provider or base_url or api_key or api_key_env or http2 is not None or pools is not None:
                raise errors.UsageError(
                    "ChatClient: a transport says where requests go; pass transport= or provider / base_url / "
                    "api_key / api_key_env / http2 / pools, not both"
                )
            self.endpoint = transport.endpoint
        else:
            self.endpoint, default_model = endpoint_from_settings(
                self.settings, provider, base_url=base_url, api_key=api_key, api_key_env=api_key_env,
                http2=http2, env=env,
            )
        self.pools: Pools | None = None if transport is not None else pools or Pools()
        """Where the client takes its transport from (None when it was given one)."""
        self.model = model or default_model or ""
        self.bus = bus or Bus()
        self.retry = retry or self.settings.retry
        self._own_cache = cache is None and use_cache and self.settings.cache.policy != "off"
        self.cache: ReplyCache | None = cache if cache is not None else (
            ReplyCache(self.settings.cache) if self._own_cache else None
        )
        self._given = transport
        self._transport: HTTPTransport | None = transport
        self.limits = limits
        self.limiter: ProviderLimiter | None = None if limits is None else limits.get(self.endpoint.name)

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def __aenter__(self) -> ChatClient:
        # Built now, not inside the first request's timings: that request's pool wait is then a pool wait.
        await self.transport.prepare()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Let go of the transport (a given one stays open: its caller closes it) and close an own cache."""
        transport, self._transport = self._transport, self._given
        if transport is not None and transport is not self._given and self.pools is not None:
            await self.pools.release(transport)
        if self._own_cache and self.cache is not None:
            await self.cache.aclose()

    @property
    def transport(self) -> HTTPTransport:
        """The transport requests go through: the given one, else the endpoint's from ``pools`` (taken on
        first use, let go by ``aclose``)."""
        if self._transport is None:
            assert self.pools is not None  # only a client given a transport has no pools, and it keeps it
            self._transport = self.pools.acquire(self.endpoint)
        return self._transport

    def _record(self, mode: str, model: str) -> TimingRecord:
        return TimingRecord(mode=mode, provider=self.endpoint.name, model=model, host=self.endpoint.hostport)

    async def _model(self, model: str | None, record: TimingRecord | None = None) -> str:
        """``model``, else the client's, else the first one GET /models lists (once; then it is the client's).

        The lookup is part of the request it serves: with ``record`` its phases and end are stamped there
        (the connection it opens is the request's, and attribution shows the lookup as a part of its own).
        Raises the lookup's own APIError when listing fails (refused, 401, an HTML page...), and UsageError
        only when the list really is empty.
        """
        m = model or self.model
        if m:
            return m
        # No model named anywhere: a local server (llama.cpp, Ollama, ours) usually serves one; take the first
        # it lists, once, rather than make the user look it up.
        phases = Phases()
        try:
            offered = await self.models(phases=phases)
        finally:
            if record is not None:
                record.discovery = phases
                record.discovery_end_ns = time.perf_counter_ns()
        if not offered:
            raise errors.UsageError(
                f"no model chosen for provider {self.endpoint.name!r} and its /models lists none; pass --model "
                f"or set providers.{self.endpoint.name}.model"
            )
        self.model = offered[0]
        if record is not None:
            record.model = self.model
        if self.cache is not None:
            # So that a later request naming no model (this process or the next) can look in the cache
            # without asking again (_cached_model).
            await self.cache.remember_server_model(self.endpoint.base_url, self.model)
        return self.model

    async def _cached_model(
        self, model: str | None, record: TimingRecord, lookup: Callable[[str], Awaitable[_Hit | None]]
    ) -> tuple[str, _Hit | None]:
        """The model a cacheable request uses, and what ``lookup(model)`` found for it in the cache (None: a miss).

        A cache hit sends nothing: the lookup keys on the model named, else the client's, else the one the
        server named the last time a request had to ask it (remembered in the cache). Only on a miss with no
        model named does it ask the server (``_model``, stamped on ``record``), and looks again when the
        server now names another. Raises what ``_model`` raises. The client must have a cache.
        """
        assert self.cache is not None
        named = model or self.model
        guess = named or await self.cache.server_model(self.endpoint.base_url) or ""
        if guess:
            record.model = guess
            hit = await lookup(guess)
            if hit is not None or named:
                return guess, hit
        real = await self._model(None, record)
        return real, None if real == guess else await lookup(real)

    # -- requests --------------------------------------------------------------------------------------------
    async def _open(
        self, method: str, path: str, body: bytes | None, record: TimingRecord, *, stream: bool, model: str,
        max_tokens: int | None = None,
    ) -> tuple[AsyncExitStack, HTTPResponse]:
        """Send with retries until a response with a success status is open; returns it with its closer."""
        limiter = self.limiter

        async def send(attempt: int) -> tuple[AsyncExitStack, HTTPResponse]:
            record.attempts = attempt
            hold = None
            if limiter is not None:
                hold = limiter.reserve(request_charge(body, max_tokens))
                if hold.wait_s > 0:
                    await self._hold(limiter, hold, record)
                hold = limiter.sent(hold)
            record.phases = Phases()
            record.proxy = self.transport.proxy
            stack = AsyncExitStack()
            try:
                resp = await stack.enter_async_context(
                    self.transport.request(method, path, body=body, phases=record.phases, stream=stream)
                )
                record.status = resp.status
                record.http_version = resp.http_version
                headroom = read_headroom(resp.headers)
                if headroom is not None:
                    record.headroom = headroom
                    if limiter is not None:
                        limiter.observe(hold, headroom)
                if resp.status == 429 and limiter is not None:
                    limiter.throttled(resp.headers)
                if resp.status >= 400:
                    data = await resp.aread()
                    raise await self._status_error(resp, data, model)
            except BaseException:
                await stack.aclose()
                raise
            return stack, resp

        def on_retry(event: RetryEvent) -> None:
            record.retries.append(event)
            self.bus.publish(RetryPlanned(record, event))

        # The first attempt goes out bare: tenacity's setup was 4 % of a streamed request's CPU, and only a
        # failure needs it. The failure is then handed to the retry loop as its attempt 1, so what it decides
        # (retry or not, the wait, "after N attempts") is what it would have decided on its own.
        try:
            return await send(1)
        except Exception as exc:
            first = exc

        async def resend(attempt: int) -> tuple[AsyncExitStack, HTTPResponse]:
            if attempt == 1:
                raise first
            return await send(attempt)

        return await call_with_retries(resend, self.retry, on_retry=on_retry)

    async def _hold(self, limiter: ProviderLimiter, hold: Hold, record: TimingRecord) -> None:
        """Wait out the limiter's hold before an attempt, said on the bus first; the time it took is the
        record's ``limit_wait_ns`` (attribution's "client rate limit", never TTFB)."""
        self.bus.publish(RateLimitHeld(record, hold))
        t = time.perf_counter_ns()
        try:
            await asyncio.sleep(hold.wait_s)
        except BaseException:
            limiter.release(hold)
            raise
        finally:
            record.limit_wait_ns += time.perf_counter_ns() - t

    async def _status_error(
        self, resp: HTTPResponse, data: bytes, model: str, *, listing: bool = False
    ) -> errors.APIError:
        """The typed error for an error status. A 404 on a request lists the models (bounded) for its message;
        a 404 on the listing itself (``listing``) says the path is wrong, and never asks again."""
        if listing and resp.status == 404 and not wire.looks_html(data, resp.headers.get("content-type", "")):
            return errors.NotFoundError(
                f"{self.endpoint.hostport} has no {mask_url(join_url(self.endpoint.base_url, 'models'))} (HTTP 404); "
                "base_url is "
                "probably missing its /v1 (e.g. http://127.0.0.1:8000/v1): fix base_url",
                status=404,
                headers=resp.headers,
            )
        models: list[str] | None = None
        if resp.status == 404 and not listing:
            models = await self._models_quietly()
        return wire.status_error(
            resp.status,
            data,
            content_type=resp.headers.get("content-type", ""),
            headers=resp.headers,
            where=self.endpoint.hostport,
            key_source=self.endpoint.api_key_source,
            key_hint=None if self.endpoint.api_key else self.endpoint.api_key_hint,
            model=model,
            models=models,
        )

    async def _models_quietly(self) -> list[str] | None:
        try:
            return await asyncio.wait_for(self.models(), timeout=3.0)
        except (TimeoutError, errors.APIError):
            return None

    async def models(self, *, phases: Phases | None = None) -> list[str]:
        """The model ids GET /models offers, in its order; ``phases`` receives the request's stamps.

        Raises the usual APIError family; a 404 (a base_url without /v1) says so at once.
        """
        async with self.transport.request("GET", "models", phases=phases or Phases()) as resp:
            data = await resp.aread()
        if resp.status >= 400:
            raise await self._status_error(resp, data, self.model, listing=True)
        return wire.parse_models(data)

    def stream(self, messages: Sequence[Message], *, model: str | None = None, **params: Any) -> ChatStream:
        """Stream a reply: an async iterator of answer text deltas; ``.record`` is final once it ends.

        Reasoning deltas are collected in ``.reasoning``, apart from the answer. Breaking out of the loop or
        cancelling the task marks the record cancelled. Errors raise after the text that arrived was yielded;
        the error's ``partial_text`` holds it too.
        """
        return ChatStream(self, list(messages), model, params)

    async def complete(self, messages: Sequence[Message], *, model: str | None = None, **params: Any) -> ChatReply:
        """One whole reply (batch mode), answered from the cache when the cache policy allows."""
        record = self._record("batch", model or self.model)
        self.bus.publish(RequestStarted(record, messages))
        key = None
        answer: str | None = None
        try:
            cache = self.cache
            if cache is not None and cache.policy_allows(params):

                async def lookup(candidate: str) -> dict[str, object] | None:
                    nonlocal key
                    assert cache is not None
                    key = ReplyCache.chat_key(
                        base_url=self.endpoint.base_url, model=candidate, messages=list(messages), params=params
                    )
                    record.cache_lookup = True
                    return await cache.get_chat(key)

                m, hit = await self._cached_model(model, record, lookup)
                if hit is not None:
                    cached = self._from_cache(hit, record)
                    answer = cached.text
                    return cached
            else:
                m = await self._model(model, record)
            t = time.perf_counter_ns()
            body = wire.chat_body(m, messages, params, stream=False)
            record.encode_ns = time.perf_counter_ns() - t
            stack, resp = await self._open("POST", "chat/completions", body, record, stream=False, model=m,
                                           max_tokens=_max_tokens(params))
            async with stack:
                data = await resp.aread()
            t = time.perf_counter_ns()
            reply = wire.parse_reply(
                data, status=resp.status, content_type=resp.headers.get("content-type", ""),
                where=self.endpoint.hostport,
            )
            record.end_ns = time.perf_counter_ns()
            record.decode_ns = record.end_ns - t
            _server_reports(record, resp, reply.timings)
            record.replaced_chars = reply.replaced
            record.server_timing = reply.server_timing
            record.finish_reason = reply.finish_reason
            if reply.refusal:
                record.finish_reason = REFUSAL
            calls = reply.tool_calls or []
            record.tool_calls = len(calls)
            _apply_usage(record, reply.usage, fallback_tokens=0)
            # A refusal is not kept: asked again, the model may answer.
            if key is not None and self.cache is not None and not reply.refusal:
                await self.cache.put_chat(key, {
                    "text": reply.content, "reasoning": reply.reasoning, "finish_reason": reply.finish_reason,
                    "usage": reply.usage, "model": reply.model or m,
                    "tool_calls": [c.to_dict() for c in calls],
                })
            answer = reply.content
            return ChatReply(reply.content, record, reply.reasoning, record.finish_reason, reply.usage, calls,
                             reply.refusal)
        except errors.APIError as exc:
            _fail(record, exc)
            raise
        except asyncio.CancelledError:
            record.cancelled = True
            record.error_kind = "cancelled"
            raise
        finally:
            if record.end_ns is None:
                record.end_ns = time.perf_counter_ns()
            _count_sent(record, messages)
            self.bus.publish(RequestDone(record, answer))

    def _from_cache(self, hit: Mapping[str, Any], record: TimingRecord) -> ChatReply:
        record.cache_hit = True
        record.attempts = 0
        record.end_ns = time.perf_counter_ns()
        record.finish_reason = hit.get("finish_reason")
        usage = hit.get("usage") if isinstance(hit.get("usage"), dict) else None
        _apply_usage(record, usage, fallback_tokens=0)
        raw_calls = hit.get("tool_calls")
        calls = [ToolCall.from_dict(c, i) for i, c in enumerate(raw_calls) if isinstance(c, Mapping)] \
            if isinstance(raw_calls, list) else []
        record.tool_calls = len(calls)
        return ChatReply(str(hit.get("text", "")), record, str(hit.get("reasoning") or ""),
                         record.finish_reason, usage, calls)

    async def embed(self, texts: Sequence[str], *, model: str | None = None) -> list[list[float]]:
        """Vectors for ``texts``, in order. Cached per text; the texts not cached go out as one request."""
        record = self._record("embed", model or self.model)
        self.bus.publish(RequestStarted(record))
        try:
            cache = self.cache if self.settings.cache.policy != "off" else None
            keys: list[str] = []
            cached: list[list[float] | None] = [None] * len(texts)
            if cache is not None:

                async def lookup(candidate: str) -> list[list[float] | None] | None:
                    # A hit when every text is cached; the partial list is kept either way.
                    nonlocal keys, cached
                    assert cache is not None
                    keys = [ReplyCache.embedding_key(base_url=self.endpoint.base_url, model=candidate, text=t)
                            for t in texts]
                    record.cache_lookup = True
                    cached = await cache.get_embeddings(keys)
                    return cached if all(v is not None for v in cached) else None

                # The keys are then the model's: the last lookup was made with the model returned.
                m, _ = await self._cached_model(model, record, lookup)
            else:
                m = await self._model(model, record)
            record.model = m
            missing = [i for i, v in enumerate(cached) if v is None]
            record.cache_hit = not missing and bool(texts)
            if missing:
                body = json.dumps({"model": m, "input": [texts[i] for i in missing]}, ensure_ascii=False).encode()
                stack, resp = await self._open("POST", "embeddings", body, record, stream=False, model=m)
                async with stack:
                    data = await resp.aread()
                vectors = wire.parse_embeddings(
                    data, status=resp.status, content_type=resp.headers.get("content-type", ""),
                    where=self.endpoint.hostport,
                )
                if len(vectors) != len(missing):
                    raise errors.ProtocolError(
                        f"{self.endpoint.hostport} returned {len(vectors)} embeddings for {len(missing)} texts; "
                        "the server is not OpenAI-compatible here"
                    )
                for i, vec in zip(missing, vectors, strict=True):
                    cached[i] = vec
                if cache is not None:
                    await cache.put_embeddings([(keys[i], cached[i]) for i in missing])  # type: ignore[misc]
            return [v for v in cached if v is not None]
        except errors.APIError as exc:
            _fail(record, exc)
            raise
        finally:
            record.end_ns = time.perf_counter_ns()
            self.bus.publish(RequestDone(record))


class ChatStream:
    """The async iterator ``ChatClient.stream`` returns. ``text``, ``reasoning`` and ``record`` fill as it runs."""

    def __init__(self, client: ChatClient, messages: list[Message], model: str | None,
                 params: dict[str, Any]) -> None:
        self._client = client
        self.messages = messages
        self.model = model or client.model
        self.params = params
        self.record = client._record("stream", self.model)
        self._parts: list[str] = []
        self._reasoning: list[str] = []
        self._refusal: list[str] = []
        self._tools = ToolCallAssembler()
        self.on_reasoning: Callable[[str, int], object] | None = None
        """Called with each reasoning delta and its arrival (``perf_counter_ns``) as it comes, before the
        answer's deltas of the same chunk are yielded; set it before iterating (the app streams thinking)."""
        self.on_reclaim: Callable[[str], object] | None = None
        """Called once, with the text, when what was yielded as answer turns out to be thinking: a reply
        whose template opened ``<think>`` in the prompt streams ``thinking</think>answer``, and nothing tells
        it from an answer until the tag comes. ``text`` and ``reasoning`` are already corrected; a caller
        that showed the text moves it to the thinking. Set it before iterating."""
        self.on_usage: Callable[[dict[str, Any]], object] | None = None
        """Called with each usage object the stream carries, as it comes (``record.content_chunks`` then
        counts the content chunks so far): a server that sends usage on every chunk (vLLM's continuous usage
        stats) says how many tokens each chunk held. Set it before iterating (``llmchat bench`` does)."""
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self._gen = self._run()

    @property
    def text(self) -> str:
        return "".join(self._parts)

    @property
    def reasoning(self) -> str:
        return "".join(self._reasoning)

    @property
    def refusal(self) -> str:
        """The model's refusal so far, in its words, kept apart from ``text`` ("" when it did not refuse);
        ``finish_reason`` is "refusal" once the stream ends."""
        return "".join(self._refusal)

    @property
    def tool_calls(self) -> list[ToolCall]:
        """The tool calls the reply asked for, assembled from its deltas so far (none is executed)."""
        return self._tools.calls

    def __aiter__(self) -> AsyncIterator[str]:
        return self._gen

    async def aclose(self) -> None:
        await self._gen.aclose()

    async def __aenter__(self) -> ChatStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _run(self) -> AsyncGenerator[str, None]:
        client, record = self._client, self.record
        bus = client.bus
        try:
            # t0 is when the request starts, not when the stream object was made. A model lookup the request
            # needs is part of it: the user waits for it, and the connection it opens is this request's.
            record.t0_ns, record.t0_mono_ns = time.perf_counter_ns(), time.monotonic_ns()
            record.wall_start = time.time()
            bus.publish(RequestStarted(record, self.messages))
            async for piece in self._replay_or_stream():
                yield piece
        except errors.APIError as exc:
            exc.partial_text = self.text
            exc.tokens_received = record.output_tokens or record.content_chunks
            if isinstance(exc, errors.StreamCutError | errors.TimeoutError) and self._parts:
                n = exc.tokens_received
                kept = "1 token arrived and is kept" if n == 1 else f"{n} tokens arrived and are kept"
                exc.args = (f"{exc} ({kept})",)
            _fail(record, exc)
            raise
        except (asyncio.CancelledError, GeneratorExit):
            record.cancelled = True
            record.error_kind = "cancelled"
            raise
        finally:
            if record.end_ns is None:
                record.end_ns = time.perf_counter_ns()
            if not record.usage_from_server:
                record.output_tokens = record.content_chunks
            _count_sent(record, self.messages)
            bus.publish(RequestDone(record, self.text))

    async def _replay_or_stream(self) -> AsyncIterator[str]:
        client, record = self._client, self.record
        cache = client.cache
        if cache is not None and client.settings.cache.replay_streams and cache.policy_allows(self.params):

            async def lookup(candidate: str) -> dict[str, object] | None:
                assert cache is not None
                key = ReplyCache.chat_key(
                    base_url=client.endpoint.base_url, model=candidate, messages=self.messages, params=self.params
                )
                record.cache_lookup = True
                return await cache.get_chat(key)

            # A replay asks the server nothing, not even its model, when the cache knows which one it names.
            self.model, hit = await client._cached_model(self.model, record, lookup)
            if hit is not None:
                record.cache_hit = True
                record.attempts = 0
                for piece in replay_chunks(str(hit.get("text", ""))):
                    self._on_content(piece, time.perf_counter_ns())
                    yield piece
                reason = hit.get("finish_reason")
                record.finish_reason = self.finish_reason = reason if isinstance(reason, str) else None
                usage = hit.get("usage")
                _apply_usage(record, usage if isinstance(usage, dict) else None, fallback_tokens=0)
                return
        elif not self.model:
            self.model = await client._model(None, record)
        async for piece in self._stream():
            yield piece

    def _on_content(self, text: str, now: int) -> None:
        record = self.record
        if record.first_token_ns is None:
            record.first_token_ns = now
            self._client.bus.publish(FirstToken(record))
        record.last_token_ns = now
        record.chunk_ns.append(now)
        record.content_chunks += 1
        self._parts.append(text)
        if self._client.bus.wants(Chunk):
            self._client.bus.publish(Chunk(record, text, now))

    def _on_reasoning(self, text: str, now: int) -> None:
        record = self.record
        if record.first_reasoning_ns is None:
            record.first_reasoning_ns = now
        record.last_reasoning_ns = now
        record.reasoning_chunks += 1
        self._reasoning.append(text)
        if self.on_reasoning is not None:
            self.on_reasoning(text, now)

    def _reclaim(self) -> None:
        """The answer so far was thinking (a bare ``</think>`` came: the template opened the tag in the
        prompt). It becomes reasoning, timed as such: the first reasoning token is when it began, and TTFT
        waits for the answer after the tag. ``on_reclaim`` tells a caller that showed it as answer."""
        record = self.record
        moved = "".join(self._parts)
        self._parts.clear()
        if record.first_token_ns is not None:
            if record.first_reasoning_ns is None or record.first_token_ns < record.first_reasoning_ns:
                record.first_reasoning_ns = record.first_token_ns
            record.last_reasoning_ns = max(record.last_reasoning_ns or 0, record.last_token_ns or 0)
        record.reasoning_chunks += record.content_chunks
        record.content_chunks = 0
        record.chunk_ns.clear()
        record.first_token_ns = record.last_token_ns = None
        if moved:
            self._reasoning.append(moved)
        if self.on_reclaim is not None:
            self.on_reclaim(moved)

    def _on_tool_calls(self, deltas: list[Any]) -> None:
        self._tools.feed(deltas)
        self.record.tool_calls = len(self._tools.calls)

    async def _stream(self) -> AsyncIterator[str]:
        client, record = self._client, self.record
        t = time.perf_counter_ns()
        body = wire.chat_body(self.model, self.messages, self.params, stream=True)
        record.encode_ns = time.perf_counter_ns() - t
        stack, resp = await client._open("POST", "chat/completions", body, record, stream=True, model=self.model,
                                         max_tokens=_max_tokens(self.params))
        _server_reports(record, resp, None)
        async with stack:
            ctype = resp.headers.get("content-type", "")
            if "text/event-stream" not in ctype:
                # Some servers ignore stream=true and send the whole reply; a proxy may send HTML.
                whole = await resp.aread()
                reply = wire.parse_reply(whole, status=resp.status, content_type=ctype,
                                         where=client.endpoint.hostport)
                now = time.perf_counter_ns()
                if reply.reasoning:
                    self._on_reasoning(reply.reasoning, now)
                if reply.tool_calls:
                    self._on_tool_calls([c.to_dict() | {"index": c.index} for c in reply.tool_calls])
                if reply.content:
                    self._on_content(reply.content, now)
                    yield reply.content
                if reply.refusal:
                    self._refusal.append(reply.refusal)
                self.finish_reason = record.finish_reason = REFUSAL if reply.refusal else reply.finish_reason
                record.server_timing = reply.server_timing
                _apply_usage(record, reply.usage, fallback_tokens=record.content_chunks)
                return
            decoder = SSEDecoder(extra_fields=("error",))
            # A surrogate pair split across two chunks is joined; lone ones become U+FFFD (see _text).
            answer_joiner, reasoning_joiner = SurrogateJoiner(), SurrogateJoiner()
            # Inline <think> blocks: dropped (None) as soon as the answer has begun, so a reply without one
            # pays for it only until its first visible character.
            splitter: ThinkSplitter | None = ThinkSplitter()
            done = False
            chunks = resp.aiter_bytes()
            async for raw in chunks:
                now = time.perf_counter_ns()
                if record.first_token_ns is None:
                    record.decode_before_first_ns = record.decode_ns
                    if record.first_reasoning_ns is None:
                        record.decode_before_reasoning_ns = record.decode_ns
                events = decoder.feed(raw)
                record.decode_ns += time.perf_counter_ns() - now
                # Per read, not per event: whether this read carried content (``record.bunched`` reads it).
                seen = record.content_chunks
                for event in events:
                    data = event.data
                    if event.event == "error":
                        raise errors.ProtocolError(
                            f"{client.endpoint.hostport} reported an error mid-stream: {_error_line(data)}; "
                            "the partial reply is kept"
                        )
                    if data == "[DONE]":
                        done = True
                        break
                    if not data:
                        continue
                    t = time.perf_counter_ns()
                    try:
                        delta = wire.parse_chunk(data)
                    except wire.StreamError as exc:
                        where = client.endpoint.hostport
                        raise errors.ProtocolError(f"{where}: {exc}; the partial reply is kept") from None
                    record.decode_ns += time.perf_counter_ns() - t
                    content, reasoning = delta.content, delta.reasoning
                    if delta.suspect or answer_joiner.holding or reasoning_joiner.holding:
                        content = answer_joiner.feed(content)
                        reasoning = reasoning_joiner.feed(reasoning)
                        record.replaced_chars = answer_joiner.replaced + reasoning_joiner.replaced
                    if splitter is not None and content:
                        content, inline = splitter.feed(content)
                        if splitter.reclaimed:
                            # The reply started inside reasoning: what went out as answer was thinking.
                            self._reclaim()
                            splitter.reclaimed = False
                        reasoning += inline
                        if splitter.answering:
                            splitter = None
                    if reasoning:
                        self._on_reasoning(reasoning, now)
                    if content:
                        self._on_content(content, now)
                        yield content
                    if delta.tool_calls is not None:
                        self._on_tool_calls(delta.tool_calls)
                    if delta.refusal:
                        self._refusal.append(delta.refusal)
                    if delta.finish_reason:
                        self.finish_reason = record.finish_reason = delta.finish_reason
                    if delta.usage is not None:
                        self.usage = delta.usage
                        _apply_usage(record, delta.usage, fallback_tokens=record.content_chunks)
                        if self.on_usage is not None:
                            self.on_usage(delta.usage)
                    if delta.server_timing:
                        record.server_timing = delta.server_timing
                    if delta.timings:
                        record.server_reported = delta.timings
                if record.content_chunks != seen:
                    record.content_reads += 1
                if done:
                    break
            tail, reasoning_tail = answer_joiner.flush(), reasoning_joiner.flush()
            if splitter is not None:
                held_answer, held_reasoning = splitter.feed(tail) if tail else ("", "")
                flushed_answer, flushed_reasoning = splitter.flush()
                tail, reasoning_tail = held_answer + flushed_answer, reasoning_tail + held_reasoning + \
                    flushed_reasoning
            if reasoning_tail:
                self._on_reasoning(reasoning_tail, time.perf_counter_ns())
            if tail:
                self._on_content(tail, time.perf_counter_ns())
                yield tail
            record.replaced_chars = answer_joiner.replaced + reasoning_joiner.replaced
            record.end_ns = time.perf_counter_ns()
            if self._refusal and self.finish_reason is not None:
                self.finish_reason = record.finish_reason = REFUSAL
            if not done and self.finish_reason is None:
                raise errors.StreamCutError(
                    f"the stream from {client.endpoint.hostport} ended without [DONE] or a finish_reason "
                    "(the connection closed early); try again"
                )
            if done:
                await _drain(chunks)


async def _drain(chunks: AsyncIterator[bytes]) -> None:
    # The end of the body (HTTP/1.1's last chunk) follows [DONE]; a response closed before it is read makes
    # httpcore drop the connection, so every stream would cost the next request a reconnect. Bounded: a server
    # that holds the body open after [DONE] loses its connection instead of stalling the caller.
    with contextlib.suppress(errors.APIError, TimeoutError):
        async with asyncio.timeout(_DRAIN_S):
            async for _ in chunks:
                pass


def _server_reports(record: TimingRecord, resp: HTTPResponse, timings: dict[str, float] | None) -> None:
    """Keep what the server says about its own time: OpenAI's processing header, llama.cpp's timings."""
    header = resp.headers.get("openai-processing-ms")
    if header:
        try:
            record.server_processing_ms = float(header)
        except ValueError:
            pass  # a malformed header is no reason to fail a reply
    if timings:
        record.server_reported = timings


def _max_tokens(params: Mapping[str, Any]) -> int | None:
    value = params.get("max_completion_tokens", params.get("max_tokens"))
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _error_line(data: str) -> str:
    try:
        return wire.error_text(json.loads(data))
    except (ValueError, AttributeError):
        return data.strip()[:120] or "no detail"


def _apply_usage(record: TimingRecord, usage: Mapping[str, Any] | None, *, fallback_tokens: int) -> None:
    if usage and isinstance(usage.get("completion_tokens"), int):
        record.output_tokens = usage["completion_tokens"]
        record.usage_from_server = True
        if isinstance(usage.get("prompt_tokens"), int):
            record.prompt_tokens = usage["prompt_tokens"]
    elif not record.usage_from_server:
        record.output_tokens = fallback_tokens


def _count_sent(record: TimingRecord, messages: Sequence[Message]) -> None:
    """The prompt's estimate beside the server's count, once the server gave one and nobody counted better
    (a ``ContextBudget`` sets it when the request starts): ``record.prompt_truncated`` compares the two."""
    if record.prompt_tokens is not None and record.prompt_sent_tokens is None and not record.cache_hit:
        record.prompt_sent_tokens = estimate_prompt(messages)


def _fail(record: TimingRecord, exc: errors.APIError) -> None:
    exc.record = record
    record.error = str(exc)
    record.error_kind = exc.kind
    if exc.status is not None:
        record.status = exc.status
