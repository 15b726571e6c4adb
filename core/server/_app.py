"""The local server's ASGI app: routes, API-key check, rate limit, and the small endpoints.

Routes: ``GET /health``, ``GET /metrics`` (Prometheus text, like vLLM's and llama.cpp's), ``GET /v1/models``,
``GET /v1/models/{id}``, ``POST /v1/chat/completions``, ``POST /v1/embeddings``, ``POST /tokenize`` and, with
a context window, ``GET /props`` (see ``_tokenize``), and the Batch API's ``/v1/files`` and ``/v1/batches``
(``_batches``). Checks run in the order OpenAI's own API runs them: the body is read (413 past 1 MiB), then
the key (401), the rate limit (429), the body's fields (400) and model (404), then the error dice (5xx).
Nothing a client sends can produce a traceback: an unexpected exception is one line on stderr and a 500.
"""

from __future__ import annotations

import asyncio
import hmac
import math
import os
import sys
import time
from collections.abc import Awaitable, Callable

from llmchat.core.config import ServerSettings
from llmchat.core.server._batches import FILE_MAX_BODY, BatchEmulator
from llmchat.core.server._chat import ChatResponder
from llmchat.core.server._connections import ConnectionRegistry
from llmchat.core.server._embeddings import embed, encode_base64
from llmchat.core.server._encode import dumps, timing
from llmchat.core.server._faults import FaultDice, RateLimiter, format_reset
from llmchat.core.server._http import MAX_BODY, ClientGone, Exchange, HTTPFailure, Receive, Scope, Send
from llmchat.core.server._replies import chat_charge, count_tokens
from llmchat.core.server._requests import parse_chat, parse_embeddings, parse_json
from llmchat.core.server._tokenize import check_request, model_meta, props_body, tokenize_body

Handler = Callable[[Exchange], Awaitable[None]]


class ServerApp:
    """The ASGI application; one instance per server, holding its rate limiter, dice and model state."""

    def __init__(self, settings: ServerSettings, registry: ConnectionRegistry) -> None:
        self.settings = settings
        self.registry = registry
        self.models = list(settings.models)
        self.limiter = RateLimiter(settings.rate_limit, settings.rate_limit_window_s, settings.rate_limit_tokens)
        self.dice = FaultDice(settings.seed, settings.error_rate, settings.drop_rate, settings.jitter_ms)
        self.chat = ChatResponder(settings, registry, self.dice)
        self.batches = BatchEmulator(settings, self.chat, self.models, self._authorize)
        self.created = int(time.time())
        self._request_prefix = "req_" + os.urandom(4).hex()
        self._requests = 0
        self._active: set[Exchange] = set()
        self._hurrying = False
        self._routes: dict[str, dict[str, Handler]] = {
            "/health": {"GET": self._health},
            "/metrics": {"GET": self._metrics},
            "/v1/models": {"GET": self._list_models},
            "/v1/chat/completions": {"POST": self._chat},
            "/v1/embeddings": {"POST": self._embeddings},
            "/tokenize": {"POST": self._tokenize},
        }
        if settings.context_window:
            # llama.cpp's server properties, where a client learns the real window (n_ctx).
            self._routes["/props"] = {"GET": self._props}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] == "websocket":
            # No websocket API here: closing before accepting is refused as 403, as the ASGI spec says.
            await receive()
            await send({"type": "websocket.close", "code": 1000})
            return
        if scope["type"] != "http":
            return
        loop = asyncio.get_running_loop()
        ex = Exchange(scope, receive, send, time.monotonic_ns(), loop.time())
        if self.settings.close_after_stream and self.registry.is_doomed(scope.get("client")):
            # The previous reply on this connection was a stream: hang up on this request without a word.
            self.registry.cut(scope.get("client"))
            return
        self._requests += 1
        ex.extra_headers.append((b"x-request-id", f"{self._request_prefix}{self._requests:08x}".encode()))
        watcher: asyncio.Task[None] | None = None
        self._active.add(ex)
        if self._hurrying:
            ex.hurry()
        try:
            handler = self._route(ex)
            body = await ex.read_body(FILE_MAX_BODY if ex.path.rstrip("/") == "/v1/files" else MAX_BODY)
            watcher = loop.create_task(ex.watch_disconnect())
            ex.body = body
            await handler(ex)
        except HTTPFailure as failure:
            await ex.fail(failure)
        except ClientGone:
            pass
        except Exception as exc:  # a bug here must not become a traceback or a hung client
            print(
                f"llmchat serve: internal error on {ex.method} {ex.path}: {exc.__class__.__name__}: {exc}",
                file=sys.stderr,
            )
            await ex.fail(
                HTTPFailure(
                    500, "The server had an error while processing your request.", type_="server_error"
                )
            )
        finally:
            self._active.discard(ex)
            if watcher is not None:
                watcher.cancel()

    async def aclose(self) -> None:
        """The server has stopped: stop the batches still running."""
        await self.batches.aclose()

    def hurry(self) -> None:
        """The server is stopping: finish every reply in flight at once, unpaced, so none is cancelled."""
        self._hurrying = True
        for ex in self._active:
            ex.hurry()

    def _route(self, ex: Exchange) -> Handler:
        path = ex.path.rstrip("/") or "/"
        methods = self._routes.get(path)
        if methods is None and path.startswith("/v1/models/"):
            methods = {"GET": self._get_model}
        if methods is None:
            methods = self.batches.routes(path)
        if methods is None:
            raise HTTPFailure(404, f"Invalid URL ({ex.method} {ex.path})", code="unknown_url")
        method = "GET" if ex.method == "HEAD" else ex.method
        handler = methods.get(method)
        if handler is None:
            allowed = ", ".join(sorted(set(methods) | ({"HEAD"} if "GET" in methods else set())))
            raise HTTPFailure(
                405,
                f"Method {ex.method} is not allowed on {path}; use {allowed}.",
                code="method_not_allowed",
                headers=[(b"allow", allowed.encode())],
            )
        return handler

    def _authorize(self, ex: Exchange) -> str | None:
        """The bearer token sent (None without one); HTTPFailure 401 when a key is required and not given."""
        raw = ex.header(b"authorization") or b""
        scheme, _, token_bytes = raw.decode("latin-1").partition(" ")
        token = token_bytes.strip() if scheme.lower() == "bearer" else ""
        required = self.settings.api_key
        if required:
            if not token:
                raise HTTPFailure(
                    401,
                    "You didn't provide an API key. You need to provide your API key in an "
                    "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
                    code="invalid_api_key",
                )
            # Never echo what was sent: a mistyped key is still a secret.
            if not hmac.compare_digest(token.encode(), required.encode()):
                raise HTTPFailure(
                    401,
                    "Incorrect API key provided. Pass the key the server was started with "
                    "(llmchat serve --api-key) as Authorization: Bearer KEY.",
                    code="invalid_api_key",
                )
        return token or None

    def _limit(self, ex: Exchange, token: str | None, *, chat: bool = False) -> None:
        limiter = self.limiter
        if not limiter.active:
            return
        tokens = chat_charge(ex.body, self.settings.default_max_tokens) if limiter.token_limit and chat else 0
        decision = limiter.check(RateLimiter.bucket(token), asyncio.get_running_loop().time(), tokens)
        if limiter.limit:
            ex.extra_headers += [
                (b"x-ratelimit-limit-requests", str(decision.limit).encode()),
                (b"x-ratelimit-remaining-requests", str(decision.remaining).encode()),
                (b"x-ratelimit-reset-requests", format_reset(decision.reset_s).encode()),
            ]
        if limiter.token_limit:
            ex.extra_headers += [
                (b"x-ratelimit-limit-tokens", str(decision.token_limit).encode()),
                (b"x-ratelimit-remaining-tokens", str(decision.tokens_remaining).encode()),
                (b"x-ratelimit-reset-tokens", format_reset(decision.tokens_reset_s).encode()),
            ]
        if not decision.allowed:
            wait = decision.retry_s
            if decision.exceeded == "tokens":
                message = (f"Rate limit reached for tokens per minute (TPM): Limit {decision.token_limit}, "
                           f"Remaining {decision.tokens_remaining}, Requested {tokens}.")
            else:
                message = (f"Rate limit reached for requests per minute (RPM): Limit {decision.limit}, "
                           f"Used {decision.limit}, Requested 1.")
            raise HTTPFailure(
                429,
                f"{message} Please try again in {format_reset(wait)}.",
                type_=decision.exceeded,
                code="rate_limit_exceeded",
                headers=[
                    (b"retry-after", str(max(1, math.ceil(wait))).encode()),
                    (b"retry-after-ms", str(max(1, math.ceil(wait * 1000))).encode()),
                ],
            )

    async def _health(self, ex: Exchange) -> None:
        await ex.respond(200, b'{"status":"ok"}')

    async def _metrics(self, ex: Exchange) -> None:
        # No key needed, as on vLLM and llama.cpp: gauges say nothing about anyone's requests.
        lines = []
        for name, help_text, value in (
            ("requests_running", "Chat replies being generated.", self.chat.running),
            ("requests_waiting", "Chat requests queued for a slot (max_concurrency).", self.chat.waiting),
        ):
            lines += [
                f"# HELP llmchat_local:{name} {help_text}",
                f"# TYPE llmchat_local:{name} gauge",
                f"llmchat_local:{name} {value}",
            ]
        body = ("\n".join(lines) + "\n").encode()
        await ex.respond(200, body, content_type=b"text/plain; version=0.0.4; charset=utf-8")

    async def _list_models(self, ex: Exchange) -> None:
        self._authorize(ex)
        data = [self._model_object(m) for m in self.models]
        await ex.respond(200, dumps({"object": "list", "data": data}))

    async def _get_model(self, ex: Exchange) -> None:
        self._authorize(ex)
        model = ex.path.rstrip("/")[len("/v1/models/") :]
        if model not in self.models:
            raise HTTPFailure(
                404,
                f"The model `{model[:100]}` does not exist or you do not have access to it.",
                code="model_not_found",
                param="model",
            )
        await ex.respond(200, dumps(self._model_object(model)))

    def _model_object(self, model: str) -> dict[str, object]:
        return {"id": model, "object": "model", "created": self.created, "owned_by": "llmchat",
                **model_meta(self.settings)}

    async def _props(self, ex: Exchange) -> None:
        self._authorize(ex)
        await ex.respond(200, dumps(props_body(self.settings)))

    async def _tokenize(self, ex: Exchange) -> None:
        self._authorize(ex)
        await ex.respond(200, dumps(tokenize_body(parse_json(ex.body), self.settings)))

    async def _chat(self, ex: Exchange) -> None:
        token = self._authorize(ex)
        self._limit(ex, token, chat=True)
        request = parse_chat(parse_json(ex.body), self.models)
        check_request(request, self.settings)
        await self.chat.reply(ex, request)

    async def _embeddings(self, ex: Exchange) -> None:
        token = self._authorize(ex)
        self._limit(ex, token)
        request = parse_embeddings(parse_json(ex.body), self.models, self.settings.embedding_dim)
        self.chat.inject_error()
        loop = asyncio.get_running_loop()
        load = self.chat.cold.delay(request.model, loop.time())
        delay = load + self.settings.ttft_ms / 1000.0
        if not await ex.pause(ex.received_at + delay + self.dice.jitter() - loop.time()):
            return
        dim = request.dimensions or self.settings.embedding_dim
        data = []
        tokens = 0
        for index, item in enumerate(request.inputs):
            vector = embed(item, request.model, dim)
            tokens += len(item) if isinstance(item, list) else max(1, count_tokens(item))
            data.append(
                {
                    "object": "embedding",
                    "index": index,
                    "embedding": encode_base64(vector) if request.base64 else vector,
                }
            )
        now = time.monotonic_ns()
        body = {
            "object": "list",
            "data": data,
            "model": request.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "server_timing": timing(ex.received_ns, now, now, model_load_ns=round(load * 1e9)),
        }
        await ex.respond(200, dumps(body))


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
