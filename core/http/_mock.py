"""``MockTransport``: a transport that answers from a function, for unit tests of the client (as httpx's
``MockTransport`` is for httpx's).

    def handler(request: MockRequest) -> MockResponse:
        return MockResponse.sse([{"choices": [{"delta": {"content": "hi"}}]}])

    async with ChatClient(transport=MockTransport(handler), model="m") as client: ...

The handler (a function or a coroutine function) gets each request and returns a ``MockResponse``, or raises
one of llmchat's errors to fail the request before its headers, as a real transport does. A body chunk that is
an exception is raised while the body is read (a stream cut mid-reply). No socket is opened: the phases get
the stamps of a request on a connection already open (start, send, headers).
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from llmchat.core.http._interface import Endpoint
from llmchat.core.observe import Phases


@dataclass(frozen=True, slots=True)
class MockRequest:
    """One request as the client sent it: the path is relative to the endpoint's base URL."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes | None
    stream: bool

    def json(self) -> Any:
        """The body decoded as JSON; None without a body."""
        return None if self.body is None else json.loads(self.body)


@dataclass(slots=True)
class MockResponse:
    """What the handler answers: a status, headers, and the body as chunks (bytes, or an exception to raise
    at that point of the body)."""

    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    chunks: Sequence[bytes | BaseException] = ()
    http_version: str = "HTTP/2"

    @classmethod
    def json(cls, data: Any, *, status: int = 200, headers: Mapping[str, str] | None = None) -> MockResponse:
        """A JSON body in one chunk."""
        return cls(status, {"content-type": "application/json", **(headers or {})}, [json.dumps(data).encode()])

    @classmethod
    def sse(cls, events: Iterable[Any], *, done: bool = True, status: int = 200) -> MockResponse:
        """A text/event-stream body, one chunk per event: each event a JSON-able object (``data: {...}``) or
        bytes sent as they are; ``done`` ends it with ``data: [DONE]``."""
        chunks: list[bytes | BaseException] = [
            e if isinstance(e, bytes | BaseException) else b"data: " + json.dumps(e).encode() + b"\n\n"
            for e in events
        ]
        if done:
            chunks.append(b"data: [DONE]\n\n")
        return cls(status, {"content-type": "text/event-stream"}, chunks)


Handler = Callable[[MockRequest], MockResponse | Awaitable[MockResponse]]


class _Open:
    """The open response ``MockTransport.request`` yields (satisfies ``HTTPResponse``)."""

    __slots__ = ("_chunks", "status", "headers", "http_version")

    def __init__(self, response: MockResponse) -> None:
        self._chunks = response.chunks
        self.status = response.status
        self.headers: Mapping[str, str] = {k.lower(): v for k, v in response.headers.items()}
        self.http_version = response.http_version

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            if isinstance(chunk, BaseException):
                raise chunk
            yield chunk

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self.aiter_bytes()])


class MockTransport:
    """A transport (``HTTPTransport``) that calls ``handler`` for each request; ``requests`` keeps them in
    the order sent. ``endpoint`` defaults to one named "mock" at http://mock.invalid/v1."""

    def __init__(self, handler: Handler, *, endpoint: Endpoint | None = None) -> None:
        self._handler = handler
        self.endpoint = endpoint or Endpoint(name="mock", base_url="http://mock.invalid/v1")
        self.requests: list[MockRequest] = []
        self.closed = False
        self.proxy: str | None = None  # as a transport through a proxy would say it, if a test sets it

    @property
    def is_open(self) -> bool:
        return not self.closed

    async def prepare(self) -> None:
        self.closed = False

    @asynccontextmanager
    async def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        phases: Phases,
        stream: bool = False,
        extra_headers: Mapping[str, str] | None = None,
    ) -> AsyncIterator[_Open]:
        phases.start_ns = phases.send_start_ns = time.perf_counter_ns()
        headers = {**self.endpoint.headers, **(extra_headers or {})}
        request = MockRequest(method, path.lstrip("/"), headers, body, stream)
        self.requests.append(request)
        phases.send_end_ns = time.perf_counter_ns()
        answer = self._handler(request)
        response = await answer if inspect.isawaitable(answer) else answer
        phases.headers_ns = time.perf_counter_ns()
        yield _Open(response)

    async def aclose(self) -> None:
        self.closed = True
