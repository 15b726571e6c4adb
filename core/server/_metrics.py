"""`llmchat serve --metrics-port`: the server's own Prometheus metrics, from an ASGI wrapper around its app.

The wrapper sees each request's route, its status and the bytes of its body as they are sent; it never
changes them. Exported, with a bounded ``route`` label (the known routes, ``/v1/models/{id}``, else
``other``):

- ``llmchat_server_requests_total{route, method, status}``: answered requests (a connection cut before any
  reply counts with status ``0``).
- ``llmchat_server_requests_in_flight{route}``: requests being answered now.
- ``llmchat_server_request_duration_seconds{route}``: from the request's arrival to the end of its reply.
- ``llmchat_server_tokens_sent_total{model}``: chat completion tokens sent, counted in what actually went
  out: the content events of a stream (so a cut stream counts what got out), ``usage.completion_tokens`` of a
  whole reply.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from llmchat.core.observe import LATENCY_BUCKETS, load_prometheus_client

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_ROUTES = frozenset({"/health", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/embeddings"})
_CHAT = "/v1/chat/completions"
# Every content event of a stream carries this once; the role event and the usage event do not.
_CONTENT = b'"delta":{"content":"'
_EMPTY = _CONTENT + b'"'  # an event whose content is empty (a reply stopped before its first token)
_MAX_MODELS = 50


def route_of(path: str) -> str:
    """The route label of a request path: a known route, ``/v1/models/{id}``, or ``other``."""
    path = path.rstrip("/") or "/"
    if path in _ROUTES:
        return path
    if path.startswith("/v1/models/"):
        return "/v1/models/{id}"
    return "other"


class ServerMetrics:
    """The server's metrics in a registry of their own; ``wrap(app)`` returns the app that feeds them."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        prom = load_prometheus_client()
        self.registry: CollectorRegistry = registry if registry is not None else prom.CollectorRegistry()
        r = self.registry
        self.requests = prom.Counter("llmchat_server_requests", "Requests answered, by route and status.",
                                     ("route", "method", "status"), registry=r)
        self.in_flight = prom.Gauge("llmchat_server_requests_in_flight", "Requests being answered now.",
                                    ("route",), registry=r)
        self.duration = prom.Histogram("llmchat_server_request_duration_seconds",
                                       "From a request's arrival to the end of its reply.", ("route",),
                                       registry=r, buckets=LATENCY_BUCKETS)
        self.tokens = prom.Counter("llmchat_server_tokens_sent", "Chat completion tokens sent.", ("model",),
                                   registry=r)
        self._models: set[str] = set()

    def wrap(self, app: ASGIApp) -> ASGIApp:
        """``app`` with every HTTP request counted; lifespan and websocket scopes pass straight through."""

        async def metered(scope: Scope, receive: Receive, send: Send) -> None:
            if scope.get("type") != "http":
                await app(scope, receive, send)
                return
            await self._serve(app, scope, receive, send)

        return metered

    async def _serve(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        route = route_of(str(scope.get("path", "")))
        method = str(scope.get("method", ""))
        start = time.perf_counter_ns()
        counter = _TokenCounter() if route == _CHAT else None
        status = 0

        async def watched(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                if counter is not None:
                    counter.start(message.get("headers", ()))
            elif counter is not None and message["type"] == "http.response.body" and status == 200:
                counter.feed(message.get("body", b""))
            await send(message)

        if counter is not None:
            receive = counter.watch_request(receive)
        gauge = self.in_flight.labels(route)
        gauge.inc()
        try:
            await app(scope, receive, watched)
        finally:
            gauge.dec()
            self.requests.labels(route, method, str(status)).inc()
            self.duration.labels(route).observe((time.perf_counter_ns() - start) / 1e9)
            if counter is not None and counter.tokens:
                self.tokens.labels(self._model(counter.model)).inc(counter.tokens)

    def _model(self, model: str) -> str:
        if model in self._models or len(self._models) < _MAX_MODELS:
            self._models.add(model)
            return model
        return "other"


class _TokenCounter:
    """Counts the tokens of one chat reply in the bytes sent, and reads the model from the request."""

    __slots__ = ("tokens", "model", "_stream", "_tail", "_whole")

    def __init__(self) -> None:
        self.tokens = 0
        self.model = ""
        self._stream = False
        self._tail = b""
        self._whole: list[bytes] = []

    def watch_request(self, receive: Receive) -> Receive:
        body: list[bytes] = []

        async def watched() -> Message:
            message = await receive()
            if message["type"] == "http.request" and not self.model:
                body.append(message.get("body", b""))
                if not message.get("more_body", False):
                    self.model = _model_of(b"".join(body))
            return message

        return watched

    def start(self, headers: Any) -> None:
        for name, value in headers:
            if bytes(name).lower() == b"content-type":
                self._stream = bytes(value).startswith(b"text/event-stream")

    def feed(self, data: bytes) -> None:
        if self._stream:
            # An event may be cut anywhere between two sends: keep the end of the last send to search across.
            joined = self._tail + data
            self.tokens += joined.count(_CONTENT) - joined.count(_EMPTY)
            self.tokens -= self._tail.count(_CONTENT) - self._tail.count(_EMPTY)
            self._tail = joined[-(len(_EMPTY) - 1):]
        else:
            self._whole.append(data)
            try:
                usage = json.loads(b"".join(self._whole)).get("usage") or {}
            except (ValueError, AttributeError):
                return  # not all of it yet (or not JSON): wait for the rest
            completion = usage.get("completion_tokens")
            if isinstance(completion, int):
                self.tokens = completion


def _model_of(body: bytes) -> str:
    try:
        model = json.loads(body).get("model")
    except (ValueError, AttributeError):
        return ""
    return model if isinstance(model, str) else ""
