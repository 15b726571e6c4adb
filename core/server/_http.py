"""One HTTP exchange over ASGI: read the body under a size cap, answer with JSON or start a stream.

An ``HTTPFailure`` raised anywhere while handling a request becomes its OpenAI-shaped error reply (if nothing
was sent yet), so handlers state what is wrong and never build error responses themselves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from llmchat.core.server._encode import error_body

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

MAX_BODY = 1024 * 1024
MAX_DRAIN = 32 * MAX_BODY


class HTTPFailure(Exception):
    """A request that gets an error reply: the status, the OpenAI-shaped body and extra headers."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: Sequence[tuple[bytes, bytes]] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = error_body(message, type_, code, param)
        self.headers = list(headers)

    @classmethod
    def missing(cls, param: str) -> HTTPFailure:
        """OpenAI's 400 for a required parameter the request left out (or sent empty)."""
        return cls(400, f"Missing required parameter: '{param}'.", code="missing_required_parameter",
                   param=param)


class ClientGone(Exception):
    """The client disconnected before its request was read; there is nobody to answer."""


class Exchange:
    """The request's scope and channels, the stamp of its arrival, and what was sent so far."""

    def __init__(
        self, scope: Scope, receive: Receive, send: Send, received_ns: int, received_at: float
    ) -> None:
        self.scope = scope
        self.receive = receive
        self._send = send
        self.received_ns = received_ns
        """``time.monotonic_ns()`` when the request reached the app (for server_timing)."""
        self.received_at = received_at
        """The event loop's clock at the same moment (for pacing)."""
        self.started_ns = received_ns
        """``time.monotonic_ns()`` when work on the reply began: later than ``received_ns`` when the request
        queued for a slot (``max_concurrency``)."""
        self.model_load_ns = 0
        """How long the reply waited for its model to load (a cold start), reported in server_timing."""
        self.body = b""
        """The request body, once read."""
        self.started = False
        self.disconnected = False
        """The client went away: stop working on its reply."""
        self.hurrying = False
        """The server is shutting down: finish this reply now, without the pauses of the latency profile."""
        self._wake = asyncio.Event()
        self.hold = False
        """Hold body bytes until the last write (``buffer_stream``: a buffering proxy's view of a stream)."""
        self._held: list[bytes] = []
        self.extra_headers: Headers = []
        """Headers every reply to this request carries (rate-limit state, request id)."""

    @property
    def method(self) -> str:
        return str(self.scope["method"])

    @property
    def path(self) -> str:
        return str(self.scope["path"])

    def header(self, name: bytes) -> bytes | None:
        """The first value of a request header (``name`` lower-case), or None."""
        for key, value in self.scope["headers"]:
            if key == name:
                return bytes(value)
        return None

    async def read_body(self, limit: int = MAX_BODY) -> bytes:
        """The whole request body; HTTPFailure 413 past ``limit`` (MAX_BODY unless the route takes uploads).

        A body over the limit is still read to its end (up to MAX_DRAIN) and dropped, so the client, which is
        busy sending, gets to read the 413: an HTTP/2 client blocked on flow control would see a reset stream
        instead, and an HTTP/1.1 one a closed connection.
        """
        drain = max(MAX_DRAIN, limit)
        length = self.header(b"content-length")
        declared = int(length) if length is not None and length.strip().isdigit() else None
        if declared is not None and declared > drain:
            raise _too_large(limit)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                self.disconnected = True
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size <= limit:
                chunks.append(chunk)
            elif size > drain:
                raise _too_large(limit)
            if not message.get("more_body", False):
                if size > limit:
                    raise _too_large(limit)
                return b"".join(chunks)

    async def watch_disconnect(self) -> None:
        """Set ``disconnected`` when the client goes away; run as a task once the body has been read."""
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                self.disconnected = True
                self._wake.set()
                return

    def hurry(self) -> None:
        """Cut every pause short from now on (the server is stopping and wants this reply finished)."""
        self.hurrying = True
        self._wake.set()

    async def pause(self, seconds: float) -> bool:
        """Wait ``seconds``, less if the client leaves or the server hurries; True if the client is there."""
        if seconds > 0 and not self._wake.is_set():
            try:
                await asyncio.wait_for(self._wake.wait(), seconds)
            except TimeoutError:
                pass
        return not self.disconnected

    async def respond(
        self,
        status: int,
        body: bytes,
        headers: Sequence[tuple[bytes, bytes]] = (),
        content_type: bytes = b"application/json",
    ) -> None:
        """Send a whole response."""
        await self.start(status, [(b"content-type", content_type), *headers])
        await self._send({"type": "http.response.body", "body": body, "more_body": False})

    async def start(self, status: int, headers: Sequence[tuple[bytes, bytes]]) -> None:
        """Send the status line and headers (plus ``extra_headers``)."""
        self.started = True
        headers = [*headers, *self.extra_headers]
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def write(self, data: bytes, more: bool = True, split_utf8: bool = True) -> None:
        """Send body bytes. With ``split_utf8``, bytes holding non-ASCII text go out in two sends cut inside
        their first multi-byte character: clients meet a character split across reads, as TCP may cut it.
        With ``hold`` every write but the last is kept, and the last sends them all at once."""
        if self.hold:
            self._held.append(data)
            if more:
                return
            data, self._held, split_utf8 = b"".join(self._held), [], False
        if split_utf8 and not data.isascii():
            try:
                data.decode("ascii")
            except UnicodeDecodeError as exc:  # the C-speed way to find the first byte over 0x7f
                cut = exc.start + 1
                await self._send({"type": "http.response.body", "body": data[:cut], "more_body": True})
                data = data[cut:]
        await self._send({"type": "http.response.body", "body": data, "more_body": more})

    async def fail(self, failure: HTTPFailure) -> None:
        """Send ``failure`` as the reply, if no reply was started."""
        if not self.started:
            await self.respond(failure.status, failure.body, failure.headers)


def _too_large(limit: int = MAX_BODY) -> HTTPFailure:
    if limit == MAX_BODY:
        advice = f"the limit is {MAX_BODY} bytes (1 MiB). Send a shorter prompt."
    else:
        advice = f"the limit is {limit} bytes ({limit // 2**20} MiB). Split the file."
    return HTTPFailure(413, f"Request body too large: {advice}", code="request_too_large")
