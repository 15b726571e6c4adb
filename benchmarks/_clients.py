"""The request loops `client_overhead.py` times: one streamed chat request per call, four clients, same work.

Every loop sends the same JSON body (64 tokens, ``stream_options.include_usage`` so the stream has the same
shape for all: the usage chunk carries the server's ``server_timing``), reads the whole stream, and returns
one ``Sample``. Every client gets a pool of ``POOL`` connections (HTTP/1.1) or one multiplexed connection
(HTTP/2, which every client here opens only one of per origin).

* ``llmchat``: ``ChatClient(...).stream(...)``, iterated to the end: the real engine, with its timing record,
  bus events (nobody subscribed), retry wrapper (default settings), SSE decoder and chunk parser; no cache.
  Over HTTP/1.1 its transport queues requests itself, one httpx client per connection (core/http/_transport.py).
* ``openai``: ``AsyncOpenAI.chat.completions.create(stream=True)`` iterated to the end, default retries. The
  installed openai-python sits on httpx2 (pydantic's fork of httpx), not httpx; it is given its own
  ``DefaultAsyncHttpxClient`` (an ``httpx2.AsyncClient`` with openai's defaults) with the pool limit set, and
  ``http1=False, http2=True`` for HTTP/2. Each chunk becomes a pydantic ``ChatCompletionChunk``.
* ``httpx``: ``httpx.AsyncClient.stream("POST", ...)`` over ``aiter_raw()``, then ``sse_payloads`` below.
* ``httpx2``: the same loop on ``httpx2.AsyncClient`` (pydantic's fork, on httpcore2): the HTTP stack llmchat's
  transport could move to, measured against httpx 0.28.1, the one it is on.
* ``aiohttp``: ``ClientSession.post`` over ``resp.content.iter_any()``, then ``sse_payloads`` (HTTP/1.1 only).

``sse_payloads`` is what a hand-written client needs at least: buffer bytes, split lines at LF, keep the
``data:`` lines, skip ``[DONE]``, decode each payload (``orjson.loads`` when installed, as llmchat's parser
does, else ``json.loads``) and pull ``choices[0].delta.content``. It does no UTF-8 repair, CR handling or
multi-line events (llmchat's decoder does), so it flatters the raw loops. Both raw loops read the body to its
end: stopping at ``[DONE]`` would leave the HTTP/1.1 connection unusable and cost a reconnect per request.

Stamps: ``caller_ns`` is ``time.monotonic_ns()`` when the first non-empty content delta reaches the caller's
loop, for every client. ``record_ns`` is llmchat's own first-token stamp mapped to the monotonic clock
(``record.to_mono_ns(record.first_token_ns)``), taken when the chunk's bytes arrived; None for the others.
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

loads: Callable[[bytes], Any]
try:
    from orjson import loads
except ImportError:  # llmchat falls back to the stdlib then too
    loads = json.loads

#: The JSON decoder the raw loops use: orjson when installed, as llmchat's parser does, so the comparison
#: measures the clients' machinery and not two JSON libraries.
JSON_DECODER = "orjson.loads" if loads is not json.loads else "json.loads"

MODEL = "llmchat-local"
MAX_TOKENS = 64
MESSAGES: list[dict[str, str]] = [{"role": "user", "content": "Explain HTTP/2 multiplexing in a few lines."}]
POOL = 100
BODY: dict[str, Any] = {
    "model": MODEL,
    "messages": MESSAGES,
    "max_tokens": MAX_TOKENS,
    "stream": True,
    "stream_options": {"include_usage": True},
}
BODY_BYTES = json.dumps(BODY, separators=(",", ":")).encode()
HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream", "Authorization": "Bearer bench"}
CLIENTS = ("llmchat", "openai", "httpx", "httpx2", "aiohttp")
PROTOCOLS = ("h2", "h1")


@dataclass(slots=True)
class Sample:
    """One finished stream: where its first token was seen, the server's stamp, and how much text came."""

    caller_ns: int
    server_first_ns: int
    record_ns: int | None
    chars: int
    http_version: str


class BenchClient(Protocol):
    """What the worker drives: ``open``, then ``one`` as often as it likes (concurrently), then ``close``.

    ``one`` streams one reply to its end and returns its Sample; a failed request raises what the client
    raises, and a stream without content or without ``server_timing`` raises RuntimeError.
    """

    async def open(self) -> None: ...

    async def one(self) -> Sample: ...

    async def close(self) -> None: ...


def sse_payloads(buffer: bytearray, chunk: bytes) -> Iterator[bytes]:
    """The ``data:`` payloads completed by ``chunk`` (``buffer`` keeps the unfinished line between calls)."""
    buffer += chunk
    end = buffer.rfind(b"\n")
    if end < 0:
        return
    lines = bytes(buffer[:end]).split(b"\n")
    del buffer[: end + 1]
    for line in lines:
        if line.startswith(b"data:"):
            yield line[5:].lstrip(b" ")


def _consume(payloads: Iterator[bytes], state: dict[str, Any]) -> None:
    """json.loads each payload; fold content into ``state``. ``[DONE]`` is skipped, not a reason to stop: the
    loops read on to the end of the body, or the HTTP/1.1 connection could not go back to the pool."""
    for payload in payloads:
        if payload == b"[DONE]":
            continue
        obj = loads(payload)
        choices = obj.get("choices")
        if choices:
            content = (choices[0].get("delta") or {}).get("content")
            if content:
                if state["caller_ns"] is None:
                    state["caller_ns"] = time.monotonic_ns()
                state["chars"] += len(content)
        timing = obj.get("server_timing")
        if timing:
            state["server_first_ns"] = timing["first_token_ns"]


def _sample(state: dict[str, Any], version: str) -> Sample:
    if state["caller_ns"] is None or state["server_first_ns"] is None:
        raise RuntimeError("the stream ended without content or without server_timing")
    return Sample(state["caller_ns"], state["server_first_ns"], None, state["chars"], version)


class LLMChatClient:
    def __init__(self, base_url: str, proto: str) -> None:
        from llmchat.core import ChatClient, HttpSettings, Settings

        http = HttpSettings(http2="h2c" if proto == "h2" else False, max_connections=POOL,
                            max_keepalive_connections=POOL, warmup=False, trust_env=False)
        self._client = ChatClient(Settings(http=http), base_url=base_url, api_key="bench", model=MODEL,
                                  use_cache=False)

    async def open(self) -> None:
        await self._client.__aenter__()

    async def one(self) -> Sample:
        stream = self._client.stream(MESSAGES, max_tokens=MAX_TOKENS)
        caller_ns = None
        chars = 0
        async for piece in stream:
            if caller_ns is None:
                caller_ns = time.monotonic_ns()
            chars += len(piece)
        rec = stream.record
        if caller_ns is None or rec.first_token_ns is None or not rec.server_timing:
            raise RuntimeError("the stream ended without content or without server_timing")
        record_ns = rec.to_mono_ns(rec.first_token_ns)
        return Sample(caller_ns, rec.server_timing["first_token_ns"], record_ns, chars, rec.http_version)

    async def close(self) -> None:
        await self._client.aclose()


class OpenAIClient:
    def __init__(self, base_url: str, proto: str) -> None:
        import httpx2
        import openai

        limits = httpx2.Limits(max_connections=POOL, max_keepalive_connections=POOL)
        kwargs: dict[str, Any] = {"limits": limits, "trust_env": False}
        if proto == "h2":
            kwargs.update(http1=False, http2=True)
        self._http = openai.DefaultAsyncHttpxClient(**kwargs)
        self._client = openai.AsyncOpenAI(base_url=base_url, api_key="bench",
                                          http_client=self._http)

    async def open(self) -> None:
        pass

    async def one(self) -> Sample:
        stream = await self._client.chat.completions.create(  # type: ignore[call-overload]
            model=MODEL, messages=MESSAGES, max_tokens=MAX_TOKENS, stream=True,
            stream_options={"include_usage": True},
        )
        state: dict[str, Any] = {"caller_ns": None, "server_first_ns": None, "chars": 0}
        version = ""
        async for chunk in stream:
            if chunk.choices:
                content = chunk.choices[0].delta.content
                if content:
                    if state["caller_ns"] is None:
                        state["caller_ns"] = time.monotonic_ns()
                    state["chars"] += len(content)
            timing = (chunk.model_extra or {}).get("server_timing")
            if timing:
                state["server_first_ns"] = timing["first_token_ns"]
        version = stream.response.http_version
        return _sample(state, version)

    async def close(self) -> None:
        await self._client.close()


class HttpxClient:
    module = "httpx"

    def __init__(self, base_url: str, proto: str) -> None:
        httpx = importlib.import_module(self.module)
        self._client = httpx.AsyncClient(
            base_url=base_url.rstrip("/") + "/", http1=proto != "h2", http2=proto == "h2", trust_env=False,
            limits=httpx.Limits(max_connections=POOL, max_keepalive_connections=POOL),
            timeout=httpx.Timeout(60.0),
        )

    async def open(self) -> None:
        pass

    async def one(self) -> Sample:
        state: dict[str, Any] = {"caller_ns": None, "server_first_ns": None, "chars": 0}
        buffer = bytearray()
        request = self._client.stream("POST", "chat/completions", content=BODY_BYTES, headers=HEADERS)
        async with request as resp:
            resp.raise_for_status()
            async for chunk in resp.aiter_raw():
                _consume(sse_payloads(buffer, chunk), state)
            version = resp.http_version
        return _sample(state, version)

    async def close(self) -> None:
        await self._client.aclose()


class Httpx2Client(HttpxClient):
    module = "httpx2"


def trace_check(module: str, base_url: str) -> tuple[str, list[str]]:
    """One h2c request on ``module``'s AsyncClient (httpx or httpx2) with the ``trace`` extension llmchat's
    transport stamps its phases with: the HTTP version it used and the trace events it saw, in order."""
    import asyncio

    httpx = importlib.import_module(module)
    seen: list[str] = []

    async def trace(name: str, info: dict[str, Any]) -> None:
        seen.append(name)

    async def go() -> str:
        async with httpx.AsyncClient(base_url=base_url.rstrip("/") + "/", http1=False, http2=True,
                                     trust_env=False) as client:
            request = client.build_request("POST", "chat/completions", content=BODY_BYTES, headers=HEADERS,
                                           extensions={"trace": trace})
            response = await client.send(request, stream=True)
            try:
                await response.aread()
            finally:
                await response.aclose()
            return str(response.http_version)

    return asyncio.run(go()), seen


class AiohttpClient:
    def __init__(self, base_url: str, proto: str) -> None:
        if proto != "h1":
            raise ValueError("aiohttp speaks HTTP/1.1 only")
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._session: Any = None

    async def open(self) -> None:
        import aiohttp

        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=POOL, limit_per_host=POOL),
            timeout=aiohttp.ClientTimeout(total=60.0), trust_env=False,
        )

    async def one(self) -> Sample:
        state: dict[str, Any] = {"caller_ns": None, "server_first_ns": None, "chars": 0}
        buffer = bytearray()
        async with self._session.post(self._url, data=BODY_BYTES, headers=HEADERS) as resp:
            resp.raise_for_status()
            async for chunk in resp.content.iter_any():
                _consume(sse_payloads(buffer, chunk), state)
            version = f"HTTP/{resp.version.major}.{resp.version.minor}"
        return _sample(state, version)

    async def close(self) -> None:
        await self._session.close()


def make_client(name: str, base_url: str, proto: str) -> BenchClient:
    """The bench client ``name`` (one of CLIENTS) for ``proto`` ("h2": HTTP/2 prior knowledge, "h1")."""
    kinds: dict[str, type[Any]] = {
        "llmchat": LLMChatClient, "openai": OpenAIClient, "httpx": HttpxClient, "httpx2": Httpx2Client,
        "aiohttp": AiohttpClient,
    }
    return kinds[name](base_url, proto)  # type: ignore[no-any-return]
