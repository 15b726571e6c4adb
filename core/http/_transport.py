"""The default transport (``Transport``): connection pools on httpx, the trace hook that stamps phases, and
the mapping of the HTTP stack's exceptions to llmchat's errors.

This is the only module that imports the HTTP stack (httpx, httpcore, h2, h11; tests/test_layout.py says
so): everything above sees the ``HTTPTransport`` protocol (``_interface``), ``WireResponse`` and llmchat's own
errors, never httpx types, so a fork or another client replaces this module and nothing else. The stack stays
httpx 0.28.1. httpx2 (pydantic's API-compatible fork, on httpcore2) was tried here: with these two imports
swapped the whole suite passes, and this transport on it spends ~16 % less CPU per request; but at 100
concurrent HTTP/2 streams it holds each reply's first token back twice as long after it arrives (p50 78 ms
against 38 ms, 10 streams 5.3 against 4.0 ms, benchmarks/client_overhead.py), which is the figure `llmchat
bench` exists to report truly. The httpcore private names the classes below use are pinned by
tests/test_transport_lifecycle.py, which says which one moved if a stack release (or the fork) drops one.

HTTP versions: ``http2 = true`` offers h2 by ALPN over https and stays on HTTP/1.1 over plain http (Ollama,
llama.cpp and vLLM speak no h2c); ``"h2c"`` speaks HTTP/2 with prior knowledge over plain http (llmchat's own
server does); ``false`` is HTTP/1.1 only. The version actually used is read from each response.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import importlib
import os
import re
import socket
import ssl
import time
from collections.abc import AsyncIterator, Coroutine, Iterable, Iterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h11
import h11._readers
import httpcore
import httpx

import llmchat.core.errors as errors
from llmchat.core.config import HttpSettings
from llmchat.core.http._interface import Endpoint
from llmchat.core.http._proxy_route import ProxyRoute, resolve_proxy
from llmchat.core.http._urls import has_userinfo, join_url, userinfo_error
from llmchat.core.observe import Phases

_VERSIONS = {"HTTP/1.1": "HTTP/1.1", "HTTP/2": "HTTP/2", "HTTP/1.0": "HTTP/1.0"}

#: What can come out of httpx: its own errors, and what it lets through unmapped (h2's and h11's protocol
#: errors, httpcore's ConnectionNotAvailable) from a response body or an odd path. All become llmchat errors.
_WIRE_ERRORS = (httpx.HTTPError, h2.exceptions.H2Error, h11.ProtocolError, httpcore.ConnectionNotAvailable)


class WireResponse:
    """An open response: status, headers, the HTTP version, and the body as raw byte chunks.

    Iterating the body raises llmchat errors (``StreamCutError``, ``TimeoutError``), never httpx ones.
    """

    __slots__ = ("_resp", "_endpoint", "status", "headers", "http_version")

    def __init__(self, resp: httpx.Response, endpoint: Endpoint) -> None:
        self._resp = resp
        self._endpoint = endpoint
        self.status = resp.status_code
        self.headers: Mapping[str, str] = resp.headers
        self.http_version = _VERSIONS.get(resp.http_version, resp.http_version)

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._resp.aiter_raw():
                yield chunk
        except _WIRE_ERRORS as exc:
            raise _body_error(exc, self._endpoint) from None

    async def aread(self) -> bytes:
        try:
            return await self._resp.aread()
        except _WIRE_ERRORS as exc:
            raise _body_error(exc, self._endpoint) from None


def _ssl_context(http: HttpSettings) -> ssl.SSLContext | bool:
    if http.verify is False:
        return False
    if isinstance(http.verify, str):
        # httpx 0.28 deprecates verify=<path>; a context built here also makes a bad path a clear error.
        path = os.path.expanduser(http.verify)
        try:
            if os.path.isdir(path):
                return ssl.create_default_context(capath=path)
            return ssl.create_default_context(cafile=path)
        except (OSError, ssl.SSLError) as exc:
            raise errors.ConfigError(
                f"http.verify: cannot load the CA bundle {path} ({exc.__class__.__name__}: "
                f"{getattr(exc, 'strerror', None) or exc}); point it at a PEM file or set it to true"
            ) from None
    file, folder = _cert_env(http)
    try:
        return _default_context(bool(http.http2), http.trust_env, file, folder)
    except (OSError, ssl.SSLError) as exc:
        where = f"SSL_CERT_FILE={file}" if file else f"SSL_CERT_DIR={folder}" if folder else "the system's CAs"
        raise errors.ConfigError(
            f"cannot load the CA certificates from {where} ({exc.__class__.__name__}: "
            f"{getattr(exc, 'strerror', None) or exc}); point it at a PEM file, unset it, or set "
            "http.trust_env to false"
        ) from None


def _cert_env(http: HttpSettings) -> tuple[str | None, str | None]:
    """SSL_CERT_FILE and SSL_CERT_DIR, when http.trust_env lets the environment in."""
    if not http.trust_env:
        return None, None
    return os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")


def _first_use(http: HttpSettings) -> ssl.SSLContext | bool:
    """The SSL context, and the import that httpcore leaves to its first request: anyio's asyncio backend,
    ~30 ms that would show in that request's pool wait. Runs in a worker thread."""
    importlib.import_module("anyio._backends._asyncio")
    return _ssl_context(http)


@functools.lru_cache(maxsize=8)
def _default_context(
    http2: bool, trust_env: bool, cert_file: str | None, cert_dir: str | None
) -> ssl.SSLContext:
    # Left to itself httpx builds a context per client and loads every CA certificate into it: ~50 ms of CPU
    # on the event loop in the first request of each new pool, http:// ones included. One per process instead.
    # Keyed by what makes two contexts differ: the ALPN list httpcore sets on it per connection (http2), and
    # the variables httpx reads (SSL_CERT_FILE / SSL_CERT_DIR, only when trust_env is on).
    return httpx.create_ssl_context(verify=True, trust_env=trust_env)


def _build_client(
    endpoint: Endpoint, verify: ssl.SSLContext | bool, *, connections: int, keepalive: int,
    route: ProxyRoute | None = None,
) -> httpx.AsyncClient:
    http = endpoint.http
    h2c = http.http2 == "h2c"
    headers = {"Accept-Encoding": "identity", "User-Agent": "llmchat"}
    headers.update(endpoint.headers)
    if endpoint.api_key:
        headers["Authorization"] = f"Bearer {endpoint.api_key}"
    context = verify if isinstance(verify, ssl.SSLContext) else httpx.create_ssl_context(verify=False)
    limits = httpx.Limits(
        max_connections=connections,
        max_keepalive_connections=keepalive,
        keepalive_expiry=http.keepalive_expiry_s,
    )
    # h2c: HTTP/2 only, which httpx speaks with prior knowledge on http:// URLs.
    http1, http2 = not h2c, bool(http.http2)
    return httpx.AsyncClient(
        # Requests go out as whole URLs (``join_url``: a query in base_url stays after the path); this one is
        # the base without its query, so httpx never appends a path after it.
        base_url=endpoint.base_url.partition("?")[0].rstrip("/") + "/",
        headers=headers,
        # httpx mounts no proxy when given a transport: the transport's pool goes through route's itself.
        transport=_transport(http, context, limits, http1=http1, http2=http2, route=route),
        http1=http1,
        http2=http2,
        verify=context,
        trust_env=http.trust_env,
        limits=limits,
        timeout=httpx.Timeout(
            connect=http.connect_timeout_s,
            read=http.read_timeout_s,
            write=http.write_timeout_s,
            pool=http.pool_timeout_s,
        ),
        follow_redirects=False,
    )


def _http11_only(endpoint: Endpoint) -> bool:
    # httpx speaks h2 only by ALPN over https or with prior knowledge (h2c): http2 = true over http:// is 1.1.
    http2 = endpoint.http.http2
    return http2 is False or (http2 is True and urlsplit(endpoint.base_url).scheme == "http")


# -- Connections with a life cycle ----------------------------------------------------------------------
# A server retires a connection after so many requests (nginx's keepalive_requests, 1,000 by default, for
# HTTP/1.1 and HTTP/2 alike): over HTTP/1.1 with "Connection: close" on the last response, which httpcore
# honours; over HTTP/2 with a GOAWAY naming the last stream it took, after which it finishes the streams up to
# that one and closes. httpcore and h2 treat that GOAWAY as the death of every stream on the connection: h2's
# state machine closes on it (python-hyper/h2#1181) and every later frame, the replies in flight included,
# raises "Invalid input RECV_DATA in state CLOSED", which httpcore lets escape unmapped from a body. The
# classes below keep httpcore's pool and connections and change only that: a connection that got a GOAWAY, or
# that reached http.max_requests_per_connection, takes no new stream, lets the ones in flight finish, and
# closes when the last one ends; a stream the server never took fails with ``_NotProcessed``, which the retry
# layer sends again at once on a fresh connection. They touch httpcore's and h2's private names, each pinned
# by tests/test_transport_lifecycle.py.

class _NotHTTP2(httpcore.RemoteProtocolError):
    """The server's first bytes are not an HTTP/2 SETTINGS frame (an HTTP/1.1-only server answering the h2c
    preface with ``HTTP/1.1 400``): ``first_line`` is what it sent, cut to its first line.

    A ``RemoteProtocolError`` so that httpx maps it as it maps httpcore's own, with this as the cause."""

    def __init__(self, first_line: str) -> None:
        super().__init__(f"not HTTP/2: {first_line!r}")
        self.first_line = first_line


class _GracefulH2State(h2.connection.H2Connection):
    """h2's connection state, for which a GOAWAY received ends nothing by itself (python-hyper/h2#1181), and
    whose first bytes received must start a SETTINGS frame (``_NotHTTP2`` else)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._head = b""
        # Only the first reads pay for the check: the instance attribute goes once the first frame's header
        # (9 bytes) is in.
        self.receive_data = self._receive_first  # type: ignore[method-assign]

    def _receive_first(self, data: Any) -> list[h2.events.Event]:
        # A server's connection preface is a SETTINGS frame (RFC 9113 3.4). h2 would read "HTTP/1.1 400 ..."
        # as the header of a 4.7 MB frame and wait for its body until the read timeout.
        head = self._head + bytes(data[:9 - len(self._head)])
        bad = (head[:1] not in (b"", b"\0")  # a frame length >= 64 KiB: past any SETTINGS, past max frame size
               or head[3:4] not in (b"", b"\x04")  # not SETTINGS
               or (len(head) == 9 and (head[4] & 1 or head[5:9] != bytes(4))))  # an ACK, or not stream 0
        if bad:
            del self.receive_data
            first = bytes(data[:200]).split(b"\r\n", 1)[0].split(b"\n", 1)[0]
            raise _NotHTTP2(first.decode("ascii", "replace"))
        self._head = head
        if len(head) == 9:
            del self.receive_data
        return h2.connection.H2Connection.receive_data(self, data)

    def _receive_goaway_frame(self, frame: Any) -> tuple[list[Any], list[h2.events.Event]]:
        # h2's own, less what makes a GOAWAY the end of every stream at once: its state machine's move to
        # CLOSED, after which every frame raises "Invalid input ... in state CLOSED", and dropping the frames
        # queued to send, another request's HEADERS among them (the server then gets DATA on a stream it never
        # saw opened, and fails the whole connection).
        event = h2.events.ConnectionTerminated()
        try:
            event.error_code = h2.errors.ErrorCodes(frame.error_code)
        except ValueError:
            event.error_code = frame.error_code
        event.last_stream_id = frame.last_stream_id
        event.additional_data = frame.additional_data or None
        return [], [event]


class _NotProcessed(httpcore.RemoteProtocolError):
    """The server never took this request: its stream is above the last stream id of the server's GOAWAY.

    A ``RemoteProtocolError`` so that httpx maps it as it maps httpcore's own, with this as the cause."""

    def __init__(self, goaway: h2.events.ConnectionTerminated, stream_id: int | None) -> None:
        before = f"stream {stream_id}" if stream_id is not None else "this stream"
        super().__init__(f"GOAWAY with last stream {goaway.last_stream_id}, before {before}")
        self.error_code = goaway.error_code


class _CutAfterGoaway(httpcore.RemoteProtocolError):
    """The server closed the connection after its GOAWAY before it finished a stream it had taken (at or below
    the GOAWAY's last stream id): the server's cut, not the client's."""

    def __init__(self, goaway: h2.events.ConnectionTerminated, stream_id: int) -> None:
        super().__init__(f"closed after GOAWAY with last stream {goaway.last_stream_id}, during stream {stream_id}")
        self.error_code = goaway.error_code
        self.stream_id = stream_id


class _Origins:
    """What a ``Transport``'s pools have learnt about each origin, shared by all of them for the transport's
    lifetime: the ones that close a connection after each response without saying so (no ``Connection:
    close``; llama.cpp's server), so that no idle connection to them is tried again."""

    __slots__ = ("closing", "news")

    def __init__(self) -> None:
        self.closing: set[tuple[bytes, bytes, int]] = set()  # (scheme, host, port): httpcore's Origin has no hash
        self.news = False
        """Set when an origin joins ``closing``, until a request's phases say so (``closes_after_response``)."""

    def closes(self, origin: httpcore.Origin) -> None:
        key = _key(origin)
        if key not in self.closing:
            self.closing.add(key)
            self.news = True


def _key(origin: httpcore.Origin) -> tuple[bytes, bytes, int]:
    return origin.scheme, origin.host, origin.port


class _Retiring:
    """What both kinds of connection add to httpcore's: once ``_draining()`` (by default: ``max_requests``
    requests started, 0 never; or one request, to an origin known to close after each response) a connection
    is not available and refuses a request assigned to it before, with ConnectionNotAvailable, which the pool
    reassigns (nothing was sent)."""

    def __init__(
        self, *, origin: httpcore.Origin, stream: httpcore.AsyncNetworkStream, keepalive_expiry: float | None,
        max_requests: int, origins: _Origins | None = None,
    ) -> None:
        super().__init__(origin=origin, stream=stream, keepalive_expiry=keepalive_expiry)  # type: ignore[call-arg]
        self._max_requests = max_requests
        self._started = 0
        self._origins = origins if origins is not None else _Origins()
        self._origin_key = _key(origin)
        self._idle_ns: int | None = None  # when its last response ended (perf_counter_ns)

    def _went_idle(self) -> None:
        self._idle_ns = time.perf_counter_ns()

    def _closed_after_response(self) -> bool:
        """Whether the server closed this connection right after a response ended (within
        ``_CLOSE_AFTER_RESPONSE_NS``): its habit, as against closing a connection idle for its keep-alive time."""
        eof = self._network_stream.get_extra_info("eof_ns")  # type: ignore[attr-defined]
        idle = self._idle_ns
        return idle is not None and eof is not None and eof - idle < _CLOSE_AFTER_RESPONSE_NS

    def _draining(self) -> bool:
        return 0 < self._max_requests <= self._started or (
            self._started > 0 and self._origin_key in self._origins.closing
        )

    def is_available(self) -> bool:
        return not self._draining() and super().is_available()  # type: ignore[misc]

    def handle_async_request(
        self, request: httpcore.Request
    ) -> Coroutine[Any, Any, httpcore.Response]:
        # Not a coroutine itself but httpcore's, returned: one await less per request. The pool calls this
        # inside the try that catches ConnectionNotAvailable.
        if self._draining():
            raise httpcore.ConnectionNotAvailable()
        self._started += 1
        return super().handle_async_request(request)  # type: ignore[misc, no-any-return]


class _H2Connection(_Retiring, httpcore.AsyncHTTP2Connection):
    """httpcore's HTTP/2 connection: honours a GOAWAY, retires after ``max_requests`` streams (0: never).

    Draining (a GOAWAY received, or the limit reached), it takes no new stream, so the pool opens another
    connection for new requests; the streams in flight go on, and the connection closes when the last of them
    ends.
    """

    def __init__(self, **kw: Any) -> None:
        self._goaway: h2.events.ConnectionTerminated | None = None
        self._last_taken = 0  # the GOAWAY's last stream id: the streams above it the server never took
        self._early: set[int] = set()  # streams the server answered before their request body was all sent
        super().__init__(**kw)
        # Unused so far (httpcore makes it in __init__ and first touches it with the first request).
        self._h2_state = _GracefulH2State(config=self.CONFIG)

    def _draining(self) -> bool:
        return self._goaway is not None or super()._draining()

    def handle_async_request(
        self, request: httpcore.Request
    ) -> Coroutine[Any, Any, httpcore.Response]:
        return self._send_or_reassign(super().handle_async_request(request))

    async def _send_or_reassign(self, sending: Coroutine[Any, Any, httpcore.Response]) -> httpcore.Response:
        try:
            return await sending
        except _NotHTTP2:
            # Nothing on this connection will ever be HTTP/2: no other request may be given it.
            self._connection_error = True
            await self.aclose()
            raise
        except httpcore.LocalProtocolError:
            # A request assigned here before the connection began draining waited for a stream (the server
            # allows one until its SETTINGS say more) while the last stream it took ended and the connection
            # closed: h2 refuses its HEADERS, so nothing of it was sent, and the pool gives it another
            # connection at once.
            if self._draining() and self.is_closed():
                raise httpcore.ConnectionNotAvailable() from None
            raise

    async def _send_request_headers(self, request: httpcore.Request, stream_id: int) -> None:
        if self._goaway is not None:
            # Assigned here before the GOAWAY came (it waited for a stream): its HEADERS would reach a server
            # that may already be closing, whose kernel answers bytes after close() with a TCP reset, which
            # throws away the ends of the replies it still had to send. Nothing is sent; the pool reassigns it.
            raise httpcore.ConnectionNotAvailable()
        await super()._send_request_headers(request, stream_id)

    # -- a server that answers before the request body is all sent (nginx's 413 while the body uploads) --------
    async def _send_request_body(self, request: httpcore.Request, stream_id: int) -> None:
        # An answer that came while the body was still going out is the answer: the rest is not sent, and the
        # response is read. (httpcore would wait for flow control that never comes, or fail on the reset
        # stream with StreamClosedError, which the retry layer would send again, 17 MB at a time.)
        try:
            await super()._send_request_body(request, stream_id)
        except (_AnsweredEarly, h2.exceptions.StreamClosedError):
            if not self._answered(stream_id):
                raise
            self._answered_early(stream_id)

    async def _wait_for_outgoing_flow(self, request: httpcore.Request, stream_id: int) -> int:
        # httpcore's, checking for an answer (or a reset) before each wait and after each read, and waiting on
        # a window below zero as on one at zero. A window goes negative when the server's SETTINGS lower the
        # initial window under what was sent on the default 65,535 before they were read (RFC 9113 6.9.2: a
        # 16 KiB window, 64 KiB sent): httpcore waits only while it is 0, so it would send min(len, -48 KiB)
        # bytes, a slice of nearly all the chunk, which h2 refuses with FlowControlError, a protocol error the
        # retry layer sent again, even when the server's answer was on its way.
        state = self._h2_state
        while True:
            if self._answered(stream_id):
                raise _AnsweredEarly()
            flow = min(state.local_flow_control_window(stream_id), state.max_outbound_frame_size)
            if flow > 0:
                return flow
            await self._receive_events(request)

    def _answered(self, stream_id: int) -> bool:
        """Whether the server has sent this stream's response headers, or reset it."""
        return any(
            isinstance(e, h2.events.ResponseReceived | h2.events.StreamReset)
            for e in self._events.get(stream_id, ())
        )

    def _answered_early(self, stream_id: int) -> None:
        if not any(isinstance(e, h2.events.ResponseReceived) for e in self._events.get(stream_id, ())):
            return  # reset unanswered: httpcore raises the reset, as for any stream
        self._early.add(stream_id)
        # Only a connection that met such an answer pays for the look at each event (an instance attribute).
        self._receive_stream_event = self._receive_early_event  # type: ignore[method-assign]

    async def _receive_early_event(
        self, request: httpcore.Request, stream_id: int
    ) -> h2.events.ResponseReceived | h2.events.DataReceived | h2.events.StreamEnded:
        # An early answer's stream may end with the server's RST_STREAM (NO_ERROR: "stop sending the body",
        # RFC 9113 8.1) rather than END_STREAM: after its response headers that is the end of its body.
        events = self._events
        if stream_id in self._early:
            while not events.get(stream_id):
                await self._receive_events(request, stream_id)
            queue = events[stream_id]
            if isinstance(queue[0], h2.events.StreamReset):
                queue[0] = h2.events.StreamEnded(stream_id=stream_id)
        return await httpcore.AsyncHTTP2Connection._receive_stream_event(self, request, stream_id)

    # httpcore keeps a GOAWAY here and, once it is set, fails every stream on the connection before each
    # read, the server's last one and those before it included. It is kept in _goaway instead.
    @property
    def _connection_terminated(self) -> None:
        return None

    @_connection_terminated.setter
    def _connection_terminated(self, event: h2.events.ConnectionTerminated | None) -> None:
        if event is None:
            return
        last = event.last_stream_id or 0
        if self._goaway is None or last < self._last_taken:
            self._goaway, self._last_taken = event, last
            # httpcore writes ~17 times per request: only a connection that got a GOAWAY pays for this.
            self._write_outgoing_data = self._write_after_goaway  # type: ignore[method-assign]

    # The next two are not coroutines themselves but return httpcore's (an await less, several times a
    # request), or, once a GOAWAY came, the ones below that look at it first.
    def _receive_events(
        self, request: httpcore.Request, stream_id: int | None = None
    ) -> Coroutine[Any, Any, None]:
        if self._goaway is None:
            return super()._receive_events(request, stream_id)
        return self._receive_after_goaway(request, stream_id)

    def _read_incoming_data(
        self, request: httpcore.Request
    ) -> Coroutine[Any, Any, list[h2.events.Event]]:
        if self._goaway is None:
            return super()._read_incoming_data(request)
        return self._read_after_goaway(request)

    async def _read_after_goaway(self, request: httpcore.Request) -> list[h2.events.Event]:
        # Called under the read lock, once httpcore found no event waiting for the caller's stream.
        if self._goaway is not None and self._drained():
            # Every stream the server took has ended, so the caller's is past the GOAWAY (sent before it was
            # known), and nothing more will come: a server that waits for the client to close would leave this
            # read hanging until the read timeout.
            raise _NotProcessed(self._goaway, None)
        return await super()._read_incoming_data(request)

    async def _receive_after_goaway(self, request: httpcore.Request, stream_id: int | None) -> None:
        self._check_taken(stream_id)
        try:
            await super()._receive_events(request, stream_id)
        except (httpcore.RemoteProtocolError, httpcore.ReadError) as exc:
            # A server that drained its streams closes the connection: one it never took is still unprocessed.
            self._check_taken(stream_id)
            goaway = self._goaway
            if (goaway is not None and stream_id is not None and _h2_event_of(exc) is None
                    and not isinstance(exc, _NotProcessed | _CutAfterGoaway)):
                # One it took, and had to finish: the connection ended under it, the server's doing.
                raise _CutAfterGoaway(goaway, stream_id) from exc
            raise

    async def _write_after_goaway(self, request: httpcore.Request) -> None:
        # After a GOAWAY the server may close once its last reply is out, while this side still owes it
        # flow-control frames for replies it has received: those are lost, not the replies. A reply still due
        # fails on the read side instead, where it is told as it is.
        with contextlib.suppress(httpcore.WriteError):
            await httpcore.AsyncHTTP2Connection._write_outgoing_data(self, request)

    def _drained(self) -> bool:
        """Whether each stream in flight is past the GOAWAY or ended (h2 has its END_STREAM, or a reset)."""
        last = self._last_taken
        streams = self._h2_state.streams
        return all(sid > last or sid not in streams or streams[sid].closed for sid in self._events)

    def _check_taken(self, stream_id: int | None) -> None:
        goaway = self._goaway
        if goaway is not None and stream_id is not None and stream_id > self._last_taken:
            raise _NotProcessed(goaway, stream_id)

    async def _response_closed(self, stream_id: int) -> None:
        stream = self._h2_state.streams.get(stream_id)
        if stream is not None and not stream.closed and not self.is_closed() and stream_id <= self._taken():
            await self._cancel_stream(stream_id)
        self._early.discard(stream_id)
        await super()._response_closed(stream_id)
        if not self._events:
            self._went_idle()
        if self._draining() and not self._events and not self.is_closed():
            await self.aclose()

    def _taken(self) -> int:
        """The highest stream id the server may be working on: all of them, until a GOAWAY names its last."""
        return self._last_taken if self._goaway is not None else 1 << 31

    async def _cancel_stream(self, stream_id: int) -> None:
        # A response closed before its end (Esc, a task cancelled, a reply the caller stopped reading) resets
        # its stream with CANCEL at once, so the server stops generating now rather than when the connection
        # closes; the connection goes on for the other streams. Called shielded (httpcore's byte stream closes
        # under AsyncShieldCancellation). A stream above a GOAWAY's last id is left alone: the server never
        # took it and may be closing.
        try:
            self._h2_state.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
        except h2.exceptions.H2Error:
            return  # closed meanwhile (its end or the server's reset came first)
        if self._write_exception is not None:
            return
        async with self._write_lock:
            data = self._h2_state.data_to_send()
            try:
                await self._network_stream.write(data, _RESET_WRITE_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - as httpcore does: the connection is broken for everyone
                self._write_exception = exc
                self._connection_error = True


class _AnsweredEarly(Exception):
    """Raised inside ``_H2Connection._send_request_body``: the server answered before the body was all sent."""


_CLOSE_AFTER_RESPONSE_NS = 1_000_000_000
"""A server that closes a connection within this long of a response's end closes after each response."""

_RESET_WRITE_TIMEOUT_S = 5.0
"""The longest a cancelled stream's RST_STREAM may wait for the socket to take it (it is a few bytes)."""


def _h2_event_of(exc: BaseException) -> h2.events.Event | None:
    return exc.args[0] if exc.args and isinstance(exc.args[0], h2.events.Event) else None


class _H11Connection(_Retiring, httpcore.AsyncHTTP11Connection):
    """httpcore's HTTP/1.1 connection that closes after ``max_requests`` responses (0: never), and reads a
    chunked body itself (see ``_receive_response_body``)."""

    async def _response_closed(self) -> None:
        await super()._response_closed()
        self._went_idle()
        if self._draining() and not self.is_closed():
            await self.aclose()

    def has_expired(self) -> bool:
        # The pool asks this of an idle connection before it reuses it; httpcore's says expired when the
        # server has closed it. Closed right after its last response, it is the origin's habit: remembered, so
        # the next connection to it is not kept for a reuse that would find it closed too late.
        if not super().has_expired():
            return False
        if self._closed_after_response():
            self._origins.closes(self._origin)
        return True

    async def _receive_response_body(self, request: httpcore.Request) -> AsyncIterator[bytes]:
        # A streamed reply is a chunked body of one small chunk per token: h11 spends two events, a state
        # machine step and a regex on each (about a third of the client's CPU per chunk at 100 streams, see
        # benchmarks/paced.py). Here the chunks are cut from the network reads directly and each read's data
        # goes up in one piece. h11 keeps the message's framing: it reads the headers, whatever came with
        # them, and from the last chunk on (the zero-size one, trailers and the end of the message, so the
        # connection is reused exactly as before); anything that is not a plain chunk-size line goes back to
        # h11 too, at a chunk boundary, and fails there with h11's own error.
        state = self._h11_state
        reader = state._reader
        if type(reader) is not _ChunkedReader:
            async for piece in super()._receive_response_body(request):
                yield piece
            return
        while True:  # what h11 already holds, to a chunk boundary
            with _h11_errors():
                event = state.next_event()
            if event is h11.NEED_DATA:
                break
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage) or event is h11.PAUSED:
                return
        if reader._reading_trailer or len(state._receive_buffer):
            async for piece in super()._receive_response_body(request):  # within a size line: h11 goes on
                yield piece
            return
        # Within a chunk (a read that ended inside one), its rest is read here, and h11 resumes at a boundary.
        body = _Chunks(left=reader._bytes_in_chunk, crlf=len(reader._bytes_to_discard))
        reader._bytes_in_chunk, reader._bytes_to_discard = 0, b""
        timeout = request.extensions.get("timeout", {}).get("read")
        while True:
            data = await self._network_stream.read(self.READ_NUM_BYTES, timeout=timeout)
            if not data:
                # h11 says what an early end of the body is, given the start of a size line if one came.
                state.receive_data(body.partial_line())
                state.receive_data(b"")
                break
            piece, rest = body.feed(data)
            if piece:
                yield piece
            if rest is not None:
                reader._bytes_to_discard = body.footer
                state.receive_data(rest)
                break
        async for piece in super()._receive_response_body(request):
            yield piece


_ChunkedReader = h11._readers.ChunkedReader
_CHUNK_LINE_MAX = 4096
"""The longest chunk-size line (with extensions) read here; a longer one goes to h11, which has its limit."""
_CHUNK_HEAD = re.compile(rb"([0-9A-Fa-f]{1,16})(?:;[^\n]*)?[ \t]*\r\n")
"""A chunk-size line by h11's own grammar (``h11._abnf.chunk_header``: the extensions right after the digits,
no LF in the line, blanks only before the CRLF), to 16 digits; longer sizes and the zero size go to h11."""


@contextlib.contextmanager
def _h11_errors() -> Iterator[None]:
    # As httpcore maps them around h11 (``map_exceptions``): the transport classifies httpcore's types.
    try:
        yield
    except h11.RemoteProtocolError as exc:
        raise httpcore.RemoteProtocolError(exc) from exc


class _Chunks:
    """A chunked body's data cut from its bytes as they arrive, up to the first line that is not a plain
    non-zero chunk size (the last chunk, or something h11 should judge)."""

    def __init__(self, *, left: int = 0, crlf: int = 0) -> None:
        self._buffer = bytearray()
        self._left = left  # bytes of the current chunk still to come
        self._crlf = crlf  # bytes of the CRLF after it still to come

    def partial_line(self) -> bytes:
        """The start of a size line still buffered at a chunk boundary (b"" inside a chunk or its CRLF)."""
        return b"" if self._left or self._crlf else bytes(self._buffer)

    @property
    def footer(self) -> bytes:
        """What is still due of the CRLF after the current chunk (b"" at a chunk boundary)."""
        return b"\r\n"[2 - self._crlf:] if self._crlf else b""

    def feed(self, data: bytes) -> tuple[bytes, bytes | None]:
        """The data in ``data`` (with what was buffered), and, once a line for h11 is reached, every byte
        from that line on (else None)."""
        buf = self._buffer
        buf += data
        out: list[bytearray] = []
        pos, end = 0, len(buf)
        match = _CHUNK_HEAD.match
        while pos < end:
            if not self._left and not self._crlf:
                # The usual case, a whole chunk in the buffer: its size line, data and CRLF in one step.
                head = match(buf, pos)
                if head is not None:
                    size, start = int(head[1], 16), head.end()
                    stop = start + size
                    if size and stop + 2 <= end and buf[stop:stop + 2] == b"\r\n":
                        out.append(buf[start:stop])
                        pos = stop + 2
                        continue
            if self._left:
                take = min(self._left, end - pos)
                out.append(buf[pos:pos + take])
                pos += take
                self._left -= take
                if not self._left:
                    self._crlf = 2
                continue
            if self._crlf:
                take = min(self._crlf, end - pos)
                if buf[pos:pos + take] != b"\r\n"[2 - self._crlf:2 - self._crlf + take]:
                    # Not the CRLF a chunk ends with: the data before it goes up, and h11 (told what it
                    # expects, ``footer``) fails on these bytes with its own error.
                    return b"".join(out), bytes(buf[pos:])
                pos += take
                self._crlf -= take
                continue
            eol = buf.find(b"\r\n", pos, pos + _CHUNK_LINE_MAX)
            if eol < 0:
                if end - pos >= _CHUNK_LINE_MAX:
                    return b"".join(out), bytes(buf[pos:])
                break
            size = _chunk_size(bytes(buf[pos:eol]))
            if not size:  # the last chunk, or not a size line: from here on h11 reads it
                return b"".join(out), bytes(buf[pos:])
            self._left = size
            pos = eol + 2
        del buf[:pos]
        return b"".join(out), None


def _chunk_size(line: bytes) -> int:
    """A chunk-size line's size (its extensions ignored, as h11 does); 0 for the last chunk or a line that
    h11's grammar would not read as a size of at most 16 digits (h11 then judges it)."""
    head = _CHUNK_HEAD.fullmatch(line + b"\r\n")
    return 0 if head is None else int(head[1], 16)


class _Connection(httpcore.AsyncHTTPConnection):
    """httpcore's connection, speaking through ``_H2Connection`` / ``_H11Connection`` once connected."""

    def __init__(self, *, max_requests: int, origins: _Origins | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self._max_requests = max_requests
        self._origins = origins if origins is not None else _Origins()

    async def handle_async_request(self, request: httpcore.Request) -> httpcore.Response:
        # httpcore's own, with the two classes above in place of its own (it names them inside this method).
        if not self.can_handle_request(request.url.origin):
            raise RuntimeError(f"request to {request.url.origin} on a connection to {self._origin}")
        try:
            async with self._request_lock:
                if self._connection is None:
                    stream = await self._open_stream(request)
                    ssl_object = stream.get_extra_info("ssl_object")
                    alpn_h2 = ssl_object is not None and ssl_object.selected_alpn_protocol() == "h2"
                    kind = _H2Connection if alpn_h2 or (self._http2 and not self._http1) else _H11Connection
                    self._connection = kind(
                        origin=self._origin, stream=stream, keepalive_expiry=self._keepalive_expiry,
                        max_requests=self._max_requests, origins=self._origins,
                    )
        except BaseException:
            self._connect_failed = True
            raise
        connection = self._connection
        idle = isinstance(connection, _Retiring) and connection._started > 0 and connection.is_idle()
        try:
            return await connection.handle_async_request(request)
        except (httpcore.RemoteProtocolError, httpcore.ReadError, httpcore.WriteError) as exc:
            # A reused idle connection that the server closed right after its last response, found too late
            # (the request went out before the close arrived): the origin's habit, remembered.
            if idle and _h2_event_of(exc) is None and isinstance(connection, _Retiring) \
                    and connection._closed_after_response():
                self._origins.closes(self._origin)
            raise

    def _open_stream(self, request: httpcore.Request) -> Coroutine[Any, Any, httpcore.AsyncNetworkStream]:
        """The connected stream (TCP, and TLS for https) the HTTP connection speaks on."""
        return self._connect(request)


# -- Through a proxy ------------------------------------------------------------------------------------------
# httpx mounts the environment's proxies only when it builds its own transport, and builds httpcore's proxy
# pool with httpcore's own connections: neither would keep the classes above. So the pool below does what
# httpcore's AsyncHTTPProxy does, with them: an http:// target goes to the proxy as HTTP/1.1 with the
# absolute URL as its target (``_ForwardConnection``); an https:// one through a CONNECT tunnel, TLS with the
# target inside it, h2 by ALPN end to end (``_TunnelConnection``). Which proxy, if any: ``_proxy_route.resolve_proxy``.


def _proxy_headers(route: ProxyRoute) -> list[tuple[bytes, bytes]]:
    credentials = route.credentials
    if credentials is None:
        return []
    token = base64.b64encode(f"{credentials[0]}:{credentials[1]}".encode())
    return [(b"Proxy-Authorization", b"Basic " + token)]


def _proxy_origin(route: ProxyRoute) -> httpcore.Origin:
    return httpcore.Origin(route.scheme.encode("ascii"), route.host.encode("idna"), route.port)


class _ForwardConnection(httpcore.AsyncConnectionInterface):
    """An http:// target's requests, sent to the proxy in absolute form on a ``_Connection`` to it (HTTP/1.1,
    so the fast chunked reader and the retirement after ``max_requests`` hold)."""

    def __init__(self, *, route: ProxyRoute, remote_origin: httpcore.Origin, proxy_ssl_context: ssl.SSLContext,
                 keepalive_expiry: float | None, max_requests: int,
                 network_backend: httpcore.AsyncNetworkBackend | None) -> None:
        self._proxy_origin = _proxy_origin(route)
        self._remote_origin = remote_origin
        self._headers = _proxy_headers(route)
        self._connection = _Connection(
            origin=self._proxy_origin, max_requests=max_requests, keepalive_expiry=keepalive_expiry,
            ssl_context=proxy_ssl_context, http1=True, http2=False, network_backend=network_backend,
        )

    async def handle_async_request(self, request: httpcore.Request) -> httpcore.Response:
        url = httpcore.URL(scheme=self._proxy_origin.scheme, host=self._proxy_origin.host,
                           port=self._proxy_origin.port, target=bytes(request.url))
        proxied = httpcore.Request(method=request.method, url=url, headers=[*self._headers, *request.headers],
                                   content=request.stream, extensions=request.extensions)
        return await self._connection.handle_async_request(proxied)

    def can_handle_request(self, origin: httpcore.Origin) -> bool:
        return origin == self._remote_origin

    async def aclose(self) -> None:
        await self._connection.aclose()

    def info(self) -> str:
        return self._connection.info()

    def is_available(self) -> bool:
        return self._connection.is_available()

    def has_expired(self) -> bool:
        return self._connection.has_expired()

    def is_idle(self) -> bool:
        return self._connection.is_idle()

    def is_closed(self) -> bool:
        return self._connection.is_closed()


class _TunnelConnection(_Connection):
    """An https:// target's connection through a CONNECT tunnel: ``_Connection`` with a stream that is the
    tunnel, TLS with the target inside it (so ALPN picks h2 or HTTP/1.1 with the target itself).

    Its record's connect phase runs from the TCP connect to the proxy to the proxy's 2xx answer (the tunnel
    up); TLS is the handshake with the target. A proxy that answers anything else fails the request with
    httpcore's ProxyError ("407 Proxy Authentication Required"), which the transport names the proxy in."""

    def __init__(self, *, route: ProxyRoute, proxy_ssl_context: ssl.SSLContext, **kw: Any) -> None:
        super().__init__(**kw)
        self._proxy = _proxy_origin(route)
        self._proxy_ssl = proxy_ssl_context
        self._proxy_headers = _proxy_headers(route)
        self._target_ssl: ssl.SSLContext = kw["ssl_context"]
        self._backend: httpcore.AsyncNetworkBackend | None = kw.get("network_backend")

    async def _open_stream(self, request: httpcore.Request) -> httpcore.AsyncNetworkStream:
        origin = self._origin
        timeout = request.extensions.get("timeout", {}).get("connect")
        trace = request.extensions.get("trace")
        hostport = b"%b:%d" % (origin.host, origin.port)
        to_proxy = httpcore.AsyncHTTPConnection(
            origin=self._proxy, ssl_context=self._proxy_ssl, network_backend=self._backend)
        connect = httpcore.Request(
            b"CONNECT",
            httpcore.URL(scheme=self._proxy.scheme, host=self._proxy.host, port=self._proxy.port, target=hostport),
            headers=[(b"Host", hostport), (b"Accept", b"*/*"), *self._proxy_headers],
            # The whole exchange is the connect: the proxy's answer within the connect timeout too.
            extensions={"timeout": dict.fromkeys(("connect", "read", "write", "pool"), timeout),
                        "trace": _tunnel_trace(trace)},
        )
        try:
            response = await to_proxy.handle_async_request(connect)
        except (httpcore.ReadTimeout, httpcore.WriteTimeout) as exc:
            raise httpcore.ConnectTimeout("the proxy did not open the tunnel within the connect timeout") from exc
        except (httpcore.ConnectError, httpcore.ConnectTimeout):
            raise  # the TCP connect to the proxy itself: the transport says which, by the cause's type
        except (httpcore.ProtocolError, httpcore.NetworkError) as exc:
            raise httpcore.ProxyError(f"no answer to CONNECT: {exc}") from exc
        if not 200 <= response.status < 300:
            reason = response.extensions.get("reason_phrase", b"").decode("ascii", errors="replace")
            await to_proxy.aclose()
            raise httpcore.ProxyError(f"{response.status} {reason}".strip())
        if trace is not None:
            await trace("connection.connect_tcp.complete", {})  # the tunnel is up: that is the connect
        stream: httpcore.AsyncNetworkStream = response.extensions["network_stream"]
        context = self._target_ssl
        context.set_alpn_protocols(["http/1.1", "h2"] if self._http2 else ["http/1.1"])
        if trace is not None:
            await trace("connection.start_tls.started", {})
        stream = await stream.start_tls(context, server_hostname=origin.host.decode("ascii"), timeout=timeout)
        if trace is not None:
            await trace("connection.start_tls.complete", {})
        return stream


def _tunnel_trace(trace: Any) -> Any:
    """The record's trace for the CONNECT exchange: its TCP connect's start only (the tunnel's end is the
    connect's end, stamped by ``_TunnelConnection``); the CONNECT's own send and headers are not the
    request's."""
    if trace is None:
        return None

    async def tunnel(name: str, info: Mapping[str, Any]) -> None:
        if name == "connection.connect_tcp.started":
            await trace(name, info)

    return tunnel


class _Pool(httpcore.AsyncConnectionPool):
    """httpcore's pool, making ``_Connection``s: direct, or through ``proxy`` (see above)."""

    def __init__(self, *, max_requests: int, network_backend: httpcore.AsyncNetworkBackend | None = None,
                 proxy: ProxyRoute | None = None, proxy_ssl_context: ssl.SSLContext | None = None,
                 **kw: Any) -> None:
        super().__init__(network_backend=network_backend, **kw)
        self._max_requests = max_requests
        self._origins = _Origins()
        """Replaced by the ``Transport``'s own, which all its pools share (``Transport._client``)."""
        self._kw = dict(
            ssl_context=kw.get("ssl_context"), keepalive_expiry=kw.get("keepalive_expiry"),
            http1=kw.get("http1", True), http2=kw.get("http2", False), network_backend=network_backend,
        )
        self._route = proxy if proxy is not None and proxy.url is not None else None
        self._proxy_ssl = proxy_ssl_context

    def create_connection(self, origin: httpcore.Origin) -> httpcore.AsyncConnectionInterface:
        route = self._route
        if route is None:
            return _Connection(origin=origin, max_requests=self._max_requests, origins=self._origins, **self._kw)
        proxy_ssl = self._proxy_ssl or self._kw["ssl_context"]
        if origin.scheme == b"http":
            return _ForwardConnection(
                route=route, remote_origin=origin, proxy_ssl_context=proxy_ssl,
                keepalive_expiry=self._kw["keepalive_expiry"], max_requests=self._max_requests,
                network_backend=self._kw["network_backend"],
            )
        return _TunnelConnection(route=route, proxy_ssl_context=proxy_ssl, origin=origin,
                                 max_requests=self._max_requests, origins=self._origins, **self._kw)


# -- the network backend: httpcore's connections on asyncio's own transports ---------------------------------
#
# httpcore's network backend on asyncio's own transports: the socket-to-bytes step of every chunk, made cheap.
#
# httpcore's default backend on asyncio is anyio's: every read of a response body enters ``map_exceptions`` (a
# generator context manager), an anyio ``fail_after`` cancel scope and a memory-object receive: with tokens one
# per chunk that was about 65 us of the 166 us llmchat spent per chunk at 100 streams x 70 tokens/s, against
# 75 us for aiohttp's whole loop (benchmarks/paced.py). Here a plain ``asyncio.Protocol`` buffers what the
# socket delivers, and ``read`` returns from that buffer at once when it holds anything; only an empty buffer
# waits, on one future with one timer for the read timeout. Writes go straight to the transport and wait only
# when it asks to pause. TLS upgrades with ``loop.start_tls`` (ALPN as the SSL context sets it).
#
# The public interface is httpcore's ``AsyncNetworkBackend`` / ``AsyncNetworkStream``; failures are httpcore's
# own exceptions (``ConnectError``, ``ConnectTimeout``, ``ReadError``, ``ReadTimeout``, ``WriteError``,
# ``WriteTimeout``), which httpx maps to its own and the transport to llmchat's, as with the anyio backend.
# ``is_readable`` (asked by the pool of an idle connection: has the server closed it or sent something
# unasked?) is the protocol's own state: buffered bytes, or the connection lost.

_HIGH_WATER = 1 << 18
"""Buffered bytes past which reading from the socket pauses until ``read`` drains them (flow control)."""


class _Protocol(asyncio.Protocol):
    __slots__ = ("transport", "buffer", "eof", "eof_ns", "error", "waiter", "paused_reading", "drain")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.eof = False
        self.eof_ns: int | None = None  # when the peer closed (perf_counter_ns)
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.paused_reading = False
        self.drain: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) > _HIGH_WATER and not self.paused_reading and self.transport is not None:
            self.paused_reading = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self.eof_ns = self.eof_ns or time.perf_counter_ns()
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.eof_ns = self.eof_ns or time.perf_counter_ns()
        self.error = exc
        self._wake()
        drain, self.drain = self.drain, None
        if drain is not None and not drain.done():
            drain.set_result(None)

    def pause_writing(self) -> None:
        if self.drain is None:
            self.drain = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        drain, self.drain = self.drain, None
        if drain is not None and not drain.done():
            drain.set_result(None)

    def _wake(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


async def _wait(future: asyncio.Future[None], timeout: float | None, exc: type[Exception]) -> None:
    """Wait for ``future``; past ``timeout`` seconds raise ``exc`` (one timer, cancelled when it is done)."""
    if timeout is None:
        await future
        return
    handle = asyncio.get_running_loop().call_later(timeout, _expire, future, exc)
    try:
        await future
    finally:
        handle.cancel()


def _expire(future: asyncio.Future[None], exc: type[Exception]) -> None:
    if not future.done():
        future.set_exception(exc(f"no data within the timeout ({exc.__name__})"))


class AsyncioStream(httpcore.AsyncNetworkStream):
    """One connection: reads from the protocol's buffer, writes to its transport."""

    def __init__(self, transport: asyncio.Transport, protocol: _Protocol) -> None:
        self._transport = transport
        self._protocol = protocol

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        p = self._protocol
        if not p.buffer and not p.eof:
            p.waiter = asyncio.get_running_loop().create_future()
            await _wait(p.waiter, timeout, httpcore.ReadTimeout)
        buffer = p.buffer
        if buffer:
            if len(buffer) <= max_bytes:
                data = bytes(buffer)
                buffer.clear()
            else:
                data = bytes(buffer[:max_bytes])
                del buffer[:max_bytes]
            if p.paused_reading and len(buffer) <= _HIGH_WATER // 2:
                p.paused_reading = False
                self._transport.resume_reading()
            return data
        if p.error is not None:
            raise httpcore.ReadError(f"{type(p.error).__name__}: {p.error}")
        return b""

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        p = self._protocol
        if self._transport.is_closing():
            raise httpcore.WriteError("the connection is closed")
        self._transport.write(buffer)
        if p.drain is not None:
            await _wait(p.drain, timeout, httpcore.WriteTimeout)
            if p.error is not None:
                raise httpcore.WriteError(f"{type(p.error).__name__}: {p.error}")

    async def aclose(self) -> None:
        # As anyio's does: the socket itself closes in a callback the transport schedules, so give the loop
        # one turn for it (else a loop closed right after leaves the socket open), then make sure.
        transport = self._transport
        if not transport.is_closing():
            transport.close()
        await asyncio.sleep(0)
        transport.abort()

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                transport = await loop.start_tls(self._transport, self._protocol, ssl_context,
                                                 server_hostname=server_hostname)
        except TimeoutError:
            self._transport.close()
            raise httpcore.ConnectTimeout("the TLS handshake took longer than the connect timeout") from None
        except (OSError, ssl.SSLError) as exc:
            self._transport.close()
            raise httpcore.ConnectError(f"{type(exc).__name__}: {exc}") from exc
        if transport is None:
            raise httpcore.ConnectError("the connection closed during the TLS handshake")
        self._protocol.transport = transport
        return AsyncioStream(transport, self._protocol)

    def get_extra_info(self, info: str) -> Any:
        t = self._transport
        if info == "ssl_object":
            return t.get_extra_info("ssl_object")
        if info == "client_addr":
            return t.get_extra_info("sockname")
        if info == "server_addr":
            return t.get_extra_info("peername")
        if info == "socket":
            return t.get_extra_info("socket")
        if info == "is_readable":
            return bool(self._protocol.buffer) or self._protocol.eof
        if info == "eof_ns":  # llmchat's own: when the peer closed, or None
            return self._protocol.eof_ns
        return None


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    """Connections on asyncio transports (see the module docstring)."""

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None
                          ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        local = None if local_address is None else (local_address, 0)
        try:
            async with asyncio.timeout(timeout):
                transport, protocol = await loop.create_connection(_Protocol, host, port, local_addr=local)
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"no TCP connection to {host}:{port} within the timeout") from None
        except OSError as exc:
            raise httpcore.ConnectError(f"{type(exc).__name__}: {exc}") from exc
        sock = transport.get_extra_info("socket")
        if sock is not None:
            for option in socket_options or ():
                sock.setsockopt(*option)
        return AsyncioStream(transport, protocol)

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None
                                  ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                transport, protocol = await loop.create_unix_connection(_Protocol, path)
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"no connection to {path} within the timeout") from None
        except OSError as exc:
            raise httpcore.ConnectError(f"{type(exc).__name__}: {exc}") from exc
        return AsyncioStream(transport, protocol)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)



#: Connections on asyncio's transports rather than anyio's streams: a fraction of the CPU per body read
#: (``AsyncioBackend`` above, benchmarks/paced.py). Stateless, so one for every pool.
_BACKEND = AsyncioBackend()


def _transport(http: HttpSettings, verify: ssl.SSLContext, limits: httpx.Limits, *, http1: bool,
               http2: bool, route: ProxyRoute | None = None) -> httpx.AsyncHTTPTransport:
    transport = httpx.AsyncHTTPTransport(verify=verify, http1=http1, http2=http2, limits=limits,
                                         trust_env=http.trust_env)
    proxy_ssl = None
    if route is not None and route.scheme == "https":
        # A TLS proxy gets a context of its own: httpcore sets ALPN on a context per connection, and the
        # proxy's (HTTP/1.1 only) must not change the target's h2 offer under a handshake in flight.
        try:
            proxy_ssl = _default_context(False, http.trust_env, *_cert_env(http))
        except (OSError, ssl.SSLError) as exc:
            raise errors.ConfigError(
                f"cannot load the CA certificates for the proxy {route.shown} ({exc.__class__.__name__}: "
                f"{getattr(exc, 'strerror', None) or exc}); fix SSL_CERT_FILE / SSL_CERT_DIR, or use an "
                "http:// proxy URL"
            ) from None
    # httpx has no hook for the pool it builds; the one it holds (a private name, pinned by a test) is swapped
    # for ours with the same settings.
    transport._pool = _Pool(
        ssl_context=verify, max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections, keepalive_expiry=limits.keepalive_expiry,
        http1=http1, http2=http2, max_requests=http.max_requests_per_connection, network_backend=_BACKEND,
        proxy=route, proxy_ssl_context=proxy_ssl,
    )
    return transport


class Transport:
    """One provider's connection pool. ``prepare()`` builds it ahead of the first request (``ChatClient`` does
    on entering); else the first request does, and its record keeps that apart as setup time. ``aclose()``
    closes it.

    A pool that may speak HTTP/2 is one httpx client: its requests share a multiplexed connection. An
    HTTP/1.1-only pool queues here instead: a semaphore of ``max_connections`` slots, each slot a
    one-connection httpx client, taken lowest first, so a lone request always finds the warm connection and
    the slots past ``max_keepalive_connections`` are the ones that close when idle. httpcore's own pool scans
    every connection several times per request, with a poll() on each idle one: at 100 streams in flight
    that cost more CPU than the streams themselves (benchmarks/client_overhead.py).
    """

    def __init__(self, endpoint: Endpoint) -> None:
        if has_userinfo(endpoint.base_url):  # never sent: httpx would make it Basic auth over the key
            raise userinfo_error(endpoint.base_url, f"base_url of provider {endpoint.name!r}")
        self.endpoint = endpoint
        self._route: ProxyRoute | None = None
        self._verify: ssl.SSLContext | bool | None = None
        self._clients: list[httpx.AsyncClient | None] = []
        # HTTP/1.1-only pools: which slots have a request in flight, and the queue for a free one.
        self._busy: list[bool] = []
        self._slots: asyncio.Semaphore | None = None
        # What the pools learn about the origins (one that closes after each response), shared by every slot.
        self._origins = _Origins()

    @property
    def is_open(self) -> bool:
        return any(c is not None for c in self._clients)

    @property
    def route(self) -> ProxyRoute:
        """How this transport reaches the endpoint: the proxy it connects through and where that came from
        (``resolve_proxy``, read once, when first asked). Raises ConfigError for a proxy it cannot use."""
        if self._route is None:
            self._route = resolve_proxy(self.endpoint.http, self.endpoint.base_url)
        return self._route

    @property
    def proxy(self) -> str | None:
        """The proxy this transport's requests go through, credentials masked; None when they go direct (or
        the proxy configured is unusable, which the first request reports)."""
        try:
            return self.route.shown
        except errors.ConfigError:
            return None

    def _open(self) -> None:
        http = self.endpoint.http
        per_slot = _http11_only(self.endpoint) and http.max_connections > 1
        self._clients = [None] * (http.max_connections if per_slot else 1)
        if per_slot:
            self._busy = [False] * http.max_connections
            self._slots = asyncio.Semaphore(http.max_connections)

    def _client(self, slot: int) -> httpx.AsyncClient:
        """Build slot ``slot``'s client (and the SSL context, if ``prepare`` has not)."""
        http = self.endpoint.http
        if self._verify is None:
            self._verify = _ssl_context(http)
        if self._slots is None:
            connections, keepalive = http.max_connections, http.max_keepalive_connections
        else:
            connections, keepalive = 1, int(slot < http.max_keepalive_connections)
        client = self._clients[slot] = _build_client(
            self.endpoint, self._verify, connections=connections, keepalive=keepalive, route=self.route
        )
        pool = getattr(getattr(client, "_transport", None), "_pool", None)
        if isinstance(pool, _Pool):
            pool._origins = self._origins
        return client

    async def prepare(self) -> None:
        """Build the SSL context and the first slot's client now, so no request waits for them.

        Loading the CA certificates is ~50 ms of CPU: it runs in a worker thread, off the event loop (a chat
        app's), with the import httpcore would make on the first request. Never raises for a bad CA bundle:
        the request that needs it does, as before. Safe to call again, and concurrently.
        """
        if not self._clients:
            self._open()
        if self._verify is None:
            try:
                verify = await asyncio.to_thread(_first_use, self.endpoint.http)
            except errors.ConfigError:
                return  # an unusable CA bundle: the first request meets it and says so, as it always did
            if self._verify is None:
                self._verify = verify
        if self._clients and self._clients[0] is None:
            try:
                self._client(0)
            except errors.ConfigError:
                return  # an unusable proxy: the first request meets it and says so

    async def _acquire(self) -> int:
        """A free slot, waiting up to http.pool_timeout_s for one; always 0 in a one-client pool."""
        if not self._clients:
            self._open()
        slots = self._slots
        if slots is None:
            return 0
        if slots.locked():
            try:
                async with asyncio.timeout(self.endpoint.http.pool_timeout_s):
                    await slots.acquire()
            except TimeoutError:
                raise _pool_timeout(self.endpoint) from None
        else:
            await slots.acquire()  # a slot is free: this returns without yielding
        slot = self._busy.index(False)
        self._busy[slot] = True
        return slot

    def _release(self, slot: int) -> None:
        if self._slots is not None:
            self._busy[slot] = False
            self._slots.release()

    async def aclose(self) -> None:
        clients, self._clients = self._clients, []
        self._busy, self._slots = [], None
        await asyncio.gather(*(c.aclose() for c in clients if c is not None))

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
    ) -> AsyncIterator[WireResponse]:
        """Send one request and yield the open response (headers read, body not yet).

        ``phases`` receives the stamps of this attempt; the wait for a free connection is in its pool wait,
        and building a slot's client on the way (a first request without ``prepare``) in its ``setup_ns``.
        Failures before the headers raise ``ConnectError``, ``TLSError``, ``TimeoutError`` (``phase="pool"``
        when no connection came free in time) or ``DisconnectedError``; the body's own failures surface while
        iterating.
        """
        phases.start_ns = time.perf_counter_ns()
        slot = await self._acquire()
        try:
            client = self._clients[slot]
            if client is None:
                setup = time.perf_counter_ns()
                client = self._client(slot)
                phases.setup_ns = time.perf_counter_ns() - setup
            headers = {"Content-Type": "application/json"} if body is not None else {}
            if stream:
                headers["Accept"] = "text/event-stream"
            if extra_headers:
                headers.update(extra_headers)
            url = join_url(self.endpoint.base_url, path)
            req = client.build_request(method, url, content=body, headers=headers)
            req.extensions["trace"] = _tracer(phases)
            try:
                resp = await client.send(req, stream=True)
            except _WIRE_ERRORS as exc:
                raise _send_error(exc, self.endpoint, phases, self._route) from None
            phases.headers_ns = phases.headers_ns or time.perf_counter_ns()
            if self._origins.news:
                # Said once, on the first attempt that got an answer after the pool learnt it.
                self._origins.news = False
                phases.closes_after_response = True
            if resp.status_code == 407 and self._route is not None and self._route.url is not None:
                # Only a forward proxy answers 407 (a tunnel's comes as CONNECT's answer, a ProxyError).
                await resp.aclose()
                raise _proxy_refused(self.endpoint, self._route, "407 Proxy Authentication Required")
            try:
                yield WireResponse(resp, self.endpoint)
            finally:
                # Cancellation (Esc) lands here too: closing releases or drops the connection at once. A
                # connection that fails to close is gone all the same; the reply (or its own error) stands.
                try:
                    await asyncio.shield(resp.aclose())
                except _WIRE_ERRORS:
                    pass
        finally:
            self._release(slot)


#: httpcore's trace events (after the "connection." / "http11." / "http2." prefix) -> the Phases stamp they set.
_STAMPS = {
    "connect_tcp.started": "connect_start_ns",
    "connect_tcp.complete": "connect_end_ns",
    "start_tls.started": "tls_start_ns",
    "start_tls.complete": "tls_end_ns",
    "send_request_headers.started": "send_start_ns",
    "send_request_body.complete": "send_end_ns",
    "receive_response_headers.complete": "headers_ns",
}


def _tracer(phases: Phases) -> Any:
    # httpcore calls this for each phase with names like "connection.connect_tcp.started",
    # "http11.send_request_headers.started" or "http2.receive_response_headers.complete". A request
    # multiplexed on an open HTTP/2 connection sees no "connection.*" events: that is how reuse shows.
    async def trace(name: str, info: Mapping[str, Any]) -> None:
        now = time.perf_counter_ns()
        stamp = _STAMPS.get(name.partition(".")[2])
        if stamp is not None:
            setattr(phases, stamp, now)

    return trace


def _cause_chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in seen:
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    return seen


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc``'s chain of causes with the members of every exception group in it (anyio puts the failures of
    each address it tried in one), depth first."""
    found: list[BaseException] = []
    for e in _cause_chain(exc):
        found.append(e)
        if isinstance(e, BaseExceptionGroup):
            for sub in e.exceptions:
                found.extend(c for c in _causes(sub) if c not in found)
    return found


#: A failure before the response, named by the type of a cause in its chain: httpcore maps the socket's
#: OSError to ConnectError and keeps it as the cause (``raise ... from exc``), and httpx keeps httpcore's as its
#: own cause. The first kind found wins.
_CAUSE_TYPES: tuple[tuple[type[BaseException], str], ...] = (
    (ssl.SSLError, "tls"),  # ssl.SSLCertVerificationError among them
    (socket.gaierror, "dns"),  # getaddrinfo failed, however the OS words it
    (ConnectionRefusedError, "refused"),  # anyio's text for it ("Connect call failed") never says refused
)

#: The documented fallback, for a chain that lost the types (a network backend or proxy that re-raises with
#: the text only): the words OpenSSL, each OS's resolver (glibc, macOS, Windows) and the socket layer use.
#: Every word has its own case in tests/test_transport_errors.py.
_CAUSE_WORDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("tls", ("ssl", "certificate")),
    ("dns", ("name or service not known", "nodename nor servname", "temporary failure in name resolution",
             "no address associated", "name resolution", "getaddrinfo")),
    ("refused", ("refused",)),
)


def _cause_kind(exc: BaseException) -> str | None:
    """"tls", "dns" or "refused" for what caused ``exc``: by the type of a cause, else (the fallback) by the
    words of the messages in its chain; None when neither says."""
    causes = _causes(exc)
    for kind, name in _CAUSE_TYPES:
        if any(isinstance(e, kind) for e in causes):
            return name
    text = " ".join(str(e) for e in causes).lower()
    for name, words in _CAUSE_WORDS:
        if any(w in text for w in words):
            return name
    return None


def _pool_timeout(ep: Endpoint) -> errors.TimeoutError:
    http = ep.http
    return errors.TimeoutError(
        f"no free connection to {ep.hostport} within {http.pool_timeout_s:g} s (http.pool_timeout_s); "
        f"too many requests in flight for http.max_connections = {http.max_connections}",
        phase="pool",
    )


def _proxy_refused(ep: Endpoint, route: ProxyRoute, reason: str) -> errors.ConnectError:
    """The proxy answered, and not with the tunnel or the reply: one line naming it and what to change."""
    source = route.source
    # 407 is the standard's answer to missing or wrong credentials; tinyproxy answers a CONNECT with 401.
    credentials = reason.startswith(("407", "401"))
    if credentials:
        fix = f"put the proxy's user and password in {source} (http://user:password@host:port)"
    elif reason.startswith("403"):
        fix = (f"the proxy does not allow {ep.hostport} (or this machine): ask its admin, or add the host to "
               "NO_PROXY")
    else:
        fix = f"check {source}, or add {urlsplit(ep.base_url).hostname} to NO_PROXY"
    error = errors.ConnectError(f"the proxy {route.shown} ({source}) refused the request to {ep.hostport} "
                                f"({_short(reason)}); {fix}")
    error.retryable = not (credentials or reason.startswith("403"))  # the same request would get the same
    return error


def _proxy_error(exc: Exception, ep: Endpoint, phases: Phases, route: ProxyRoute) -> errors.APIError | None:
    """A failure before the response that was the proxy's: its answer to CONNECT, or no connection to it
    (the TCP connect, before any byte went to the target: ``phases`` has no connect end). None otherwise."""
    proxy = _find(exc, httpcore.ProxyError)
    if isinstance(exc, httpx.ProxyError) or proxy is not None:
        return _proxy_refused(ep, route, str(proxy or exc))
    if phases.connect_end_ns is not None:
        return None  # the tunnel was up: what failed was the target's TLS or the target itself
    named = f"the proxy {route.shown} ({route.source})"
    fix = f"check {route.source}" + ("" if route.source == "http.proxy" else
                                     ", or set http.trust_env to false to go direct")
    if isinstance(exc, httpx.ConnectTimeout):
        return errors.TimeoutError(
            f"connecting to {named} timed out after {ep.http.connect_timeout_s:g} s; {fix}", phase="connect")
    if not isinstance(exc, httpx.ConnectError):
        return None
    kind = _cause_kind(exc)
    if kind == "dns":
        return errors.ConnectError(f"cannot resolve the host of {named} (DNS lookup failed); {fix}")
    if kind == "refused":
        return errors.ConnectError(f"connection refused by {named}: nothing is listening there; {fix}")
    if kind == "tls":
        return None
    return errors.ConnectError(f"cannot connect to {named} ({_short(str(exc))}); {fix}")


def _send_error(
    exc: Exception, ep: Endpoint, phases: Phases, route: ProxyRoute | None = None
) -> errors.APIError | errors.ConfigError:
    """The llmchat error for a failure before the response headers (``exc`` is one of ``_WIRE_ERRORS``);
    through a proxy (``route``), a failure that was the proxy's names it."""
    where = ep.hostport
    http = ep.http
    if isinstance(exc, httpx.PoolTimeout):
        return _pool_timeout(ep)
    if route is not None and route.url is not None:
        proxied = _proxy_error(exc, ep, phases, route)
        if proxied is not None:
            return proxied
    if isinstance(exc, httpx.ConnectTimeout):
        return errors.TimeoutError(
            f"connecting to {where} timed out after {http.connect_timeout_s:g} s; check the host is up and "
            "reachable, or raise http.connect_timeout_s",
            phase="connect",
        )
    if isinstance(exc, httpx.ReadTimeout):
        return errors.TimeoutError(
            f"{where} sent no response for {http.read_timeout_s:g} s (http.read_timeout_s); the server is "
            "stalled or overloaded: try again or raise http.read_timeout_s",
            phase="read",
        )
    if isinstance(exc, httpx.WriteTimeout):
        return errors.TimeoutError(
            f"sending the request to {where} timed out after {http.write_timeout_s:g} s; "
            "raise http.write_timeout_s",
            phase="write",
        )
    protocol = _protocol_error(exc, ep, phases)
    if protocol is not None:
        return protocol
    kind = _cause_kind(exc)
    if kind == "tls":
        reason = next((str(e) for e in _causes(exc) if isinstance(e, ssl.SSLError)), str(exc))
        return errors.TLSError(
            f"TLS handshake with {where} failed ({_short(reason)}); for a self-signed server set "
            "http.verify to its CA file (or false for a local test server); check base_url's scheme"
        )
    if isinstance(exc, httpx.ConnectError):
        if kind == "dns":
            host = urlsplit(ep.base_url).hostname
            return errors.ConnectError(
                f"cannot resolve host {host} (DNS lookup failed); check the spelling of base_url for "
                f"provider {ep.name!r} and your network"
            )
        if kind == "refused":
            return errors.ConnectError(
                f"connection refused by {where}: nothing is listening there; start a local server with "
                f"`llmchat serve` or check base_url for provider {ep.name!r}"
            )
        return errors.ConnectError(f"cannot connect to {where} ({_short(str(exc))}); check base_url and the network")
    if isinstance(exc, httpx.UnsupportedProtocol):
        return errors.ConfigError(
            f"base_url {ep.base_url!r} for provider {ep.name!r} is not an http:// or https:// URL; fix base_url"
        )
    if isinstance(exc, httpx.ProxyError):
        return errors.ConnectError(
            f"the proxy to {where} failed ({_short(str(exc))}); check HTTPS_PROXY / HTTP_PROXY, or set "
            "http.trust_env to false"
        )
    return errors.ConnectError(
        f"request to {where} failed before a response ({exc.__class__.__name__}: {_short(str(exc))}); try again"
    )


def _protocol_error(exc: Exception, ep: Endpoint, phases: Phases) -> errors.APIError | None:
    """A failure before the response that the protocol explains, by type: a request the server did not take
    (GOAWAY past it, REFUSED_STREAM, a connection closed unanswered), a reset, a broken HTTP/2 or HTTP/1.1
    exchange. None for the others (timeouts, connect and TLS failures)."""
    where = ep.hostport
    not_h2 = _find(exc, _NotHTTP2)
    if not_h2 is not None:
        said = f" (it answered {_short(not_h2.first_line)!r})" if not_h2.first_line.strip() else ""
        if urlsplit(ep.base_url).scheme == "https":
            return errors.ProtocolError(
                f"{where} chose HTTP/2 by ALPN but does not speak it{said}; set http2 = false"
            )
        return errors.ProtocolError(
            f"{where}: this server does not speak h2c{said}: set http2 = false (or true over https)"
        )
    cut = _find(exc, _CutAfterGoaway)
    if cut is not None:
        return errors.DisconnectedError(
            f"{where} closed its HTTP/2 connection after its GOAWAY ({_code(cut.error_code)}) without answering "
            "this request, which it had taken; the server's doing: try again",
            reused=True, reason="goaway",
        )
    unprocessed = _find(exc, _NotProcessed)
    if unprocessed is not None:
        return errors.DisconnectedError(
            f"{where} retired its HTTP/2 connection (GOAWAY, {_code(unprocessed.error_code)}) before taking "
            "this request, so it was not processed; try again",
            reused=True, reason="goaway",
        )
    event = _h2_event(exc)
    if isinstance(event, h2.events.StreamReset):
        if event.error_code == h2.errors.ErrorCodes.REFUSED_STREAM:
            return errors.DisconnectedError(
                f"{where} refused the request (HTTP/2 REFUSED_STREAM), so it was not processed; try again",
                reused=True, reason="refused stream",
            )
        return errors.ConnectError(
            f"{where} reset the request before answering (HTTP/2 {_code(event.error_code)}); try again"
        )
    if isinstance(event, h2.events.ConnectionTerminated):
        return errors.DisconnectedError(
            f"{where} closed its HTTP/2 connection before answering (GOAWAY, {_code(event.error_code)}); "
            "try again",
            reused=True, reason="goaway",
        )
    h2_error = _find(exc, h2.exceptions.H2Error)
    if h2_error is not None:
        return errors.ConnectError(
            f"the HTTP/2 connection to {where} broke before the response ({_named(h2_error)}); try again"
        )
    h11_error = _find(exc, h11.ProtocolError)
    if isinstance(h11_error, h11.LocalProtocolError):
        return errors.ProtocolError(
            f"the request to {where} is not valid HTTP/1.1 ({_short(str(h11_error))}); check the headers "
            f"configured for provider {ep.name!r}"
        )
    if h11_error is not None:
        return errors.ProtocolError(
            f"{where} sent a response that is not valid HTTP/1.1 ({_short(str(h11_error))}); check that "
            "base_url points at an OpenAI-compatible API"
        )
    if isinstance(exc, httpcore.ConnectionNotAvailable):
        return errors.ConnectError(f"no connection to {where} could take the request; try again")
    # What is left of the protocol errors has no type of its own: httpcore's "Server disconnected" (HTTP/2)
    # and "... without sending a response" (HTTP/1.1). A reset or broken pipe before any response byte is the
    # same case, on a kept-alive connection or a new one (a TLS port given plain http resets or closes,
    # depending on whether it read the request first): the server closed it, unanswered.
    closed = isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError)
    if not closed:
        return None
    if not phases.reused:
        # A fresh connection closed unanswered is most often plain http:// sent to a TLS port.
        return errors.DisconnectedError(
            f"{where} closed a new connection without sending a response; if it serves HTTPS, make "
            "base_url start with https://, else try again",
            reused=False,
        )
    return errors.DisconnectedError(
        f"{where} closed the connection without sending a response; it may have been restarted, or it "
        "closes kept-alive connections: try again",
        reused=True,
    )


def _body_error(exc: Exception, ep: Endpoint) -> errors.APIError:
    """The llmchat error for a failure while reading a response body (``exc`` is one of ``_WIRE_ERRORS``)."""
    where = ep.hostport
    if isinstance(exc, httpx.ReadTimeout):
        return errors.TimeoutError(
            f"{where} stopped sending for {ep.http.read_timeout_s:g} s (http.read_timeout_s) mid-reply; "
            "the server stalled: try again or raise http.read_timeout_s",
            phase="read",
        )
    event = _h2_event(exc)
    if isinstance(event, h2.events.StreamReset):
        return errors.StreamCutError(
            f"{where} reset the stream mid-reply (HTTP/2 {_code(event.error_code)}); try again"
        )
    cut = _find(exc, _CutAfterGoaway)
    if cut is not None:
        return errors.StreamCutError(
            f"{where} closed its HTTP/2 connection after its GOAWAY ({_code(cut.error_code)}) before finishing "
            f"this reply, which it had taken (stream {cut.stream_id}); the server cut it: try again"
        )
    h2_error = _find(exc, h2.exceptions.H2Error)
    h11_error = _find(exc, h11.ProtocolError)
    if isinstance(event, h2.events.ConnectionTerminated):
        detail = f"GOAWAY, {_code(event.error_code)}"
    elif h2_error is not None:
        detail = f"HTTP/2 {_named(h2_error)}"
    elif h11_error is not None:
        detail = f"invalid HTTP/1.1: {_short(str(h11_error))}"
    else:
        detail = _short(str(exc)) or exc.__class__.__name__
    return errors.StreamCutError(f"the connection to {where} dropped mid-reply ({detail}); try again")


_E = TypeVar("_E", bound=BaseException)


def _find(exc: BaseException, kind: type[_E]) -> _E | None:
    """The first exception of ``kind`` in ``exc``'s chain of causes, ``exc`` included."""
    return next((e for e in _cause_chain(exc) if isinstance(e, kind)), None)


def _h2_event(exc: BaseException) -> h2.events.Event | None:
    # httpcore raises RemoteProtocolError(event) for a reset stream and for a GOAWAY: the h2 event is its
    # argument, and httpx keeps that error as the cause of its own.
    for e in _cause_chain(exc):
        if isinstance(e, httpcore.RemoteProtocolError) and e.args and isinstance(e.args[0], h2.events.Event):
            return e.args[0]
    return None


def _code(code: object) -> str:
    """An HTTP/2 error code by its RFC 9113 name: ``NO_ERROR``, ``REFUSED_STREAM`` ..."""
    try:
        return h2.errors.ErrorCodes(cast(int, code)).name
    except ValueError:
        return f"error code {code}"


def _named(exc: BaseException) -> str:
    text = _short(str(exc))
    return f"{exc.__class__.__name__}: {text}" if text else exc.__class__.__name__


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 120 else text[:117] + "..."
