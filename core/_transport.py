"""The transport: one shared connection pool per provider on httpx, and the trace hook that stamps phases.

This is the only module that imports httpx (httpx has had no release since 0.28.1; keeping it behind one seam
means a fork or another client can replace it). Everything above sees ``WireResponse`` and llmchat's own
errors, never httpx types.

HTTP versions: ``http2 = true`` offers h2 by ALPN over https and stays on HTTP/1.1 over plain http (Ollama,
llama.cpp and vLLM speak no h2c); ``"h2c"`` speaks HTTP/2 with prior knowledge over plain http (llmchat's own
server does); ``false`` is HTTP/1.1 only. The version actually used is read from each response.
"""

from __future__ import annotations

import asyncio
import functools
import os
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from llmchat.core import _errors as errors
from llmchat.core._config_secrets import mask_url
from llmchat.core._settings import HttpSettings
from llmchat.core._timing import Phases

_VERSIONS = {"HTTP/1.1": "HTTP/1.1", "HTTP/2": "HTTP/2", "HTTP/1.0": "HTTP/1.0"}


@dataclass(frozen=True, kw_only=True)
class Endpoint:
    """Where and how to talk to one provider. ``api_key`` is masked in repr."""

    name: str
    base_url: str
    api_key: str | None = None
    api_key_source: str = "none"
    api_key_hint: str = ""
    """With no key: which flag or config key would send one (for a 401's message)."""
    headers: Mapping[str, str] = field(default_factory=dict)
    http: HttpSettings = field(default_factory=HttpSettings)

    def __repr__(self) -> str:
        key = "None" if self.api_key is None else "'***'"
        return (f"Endpoint(name={self.name!r}, base_url={mask_url(self.base_url)!r}, api_key={key}, "
                f"http={self.http!r})")

    @property
    def hostport(self) -> str:
        parts = urlsplit(self.base_url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return f"{parts.hostname}:{port}"


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
        except httpx.HTTPError as exc:
            raise _body_error(exc, self._endpoint) from None

    async def aread(self) -> bytes:
        try:
            return await self._resp.aread()
        except httpx.HTTPError as exc:
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
    file = os.environ.get("SSL_CERT_FILE") if http.trust_env else None
    folder = os.environ.get("SSL_CERT_DIR") if http.trust_env else None
    try:
        return _default_context(bool(http.http2), http.trust_env, file, folder)
    except (OSError, ssl.SSLError) as exc:
        where = f"SSL_CERT_FILE={file}" if file else f"SSL_CERT_DIR={folder}" if folder else "certifi's CAs"
        raise errors.ConfigError(
            f"cannot load the CA certificates from {where} ({exc.__class__.__name__}: "
            f"{getattr(exc, 'strerror', None) or exc}); point it at a PEM file, unset it, or set "
            "http.trust_env to false"
        ) from None


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
    endpoint: Endpoint, verify: ssl.SSLContext | bool, *, connections: int, keepalive: int
) -> httpx.AsyncClient:
    http = endpoint.http
    h2c = http.http2 == "h2c"
    headers = {"Accept-Encoding": "identity", "User-Agent": "llmchat"}
    headers.update(endpoint.headers)
    if endpoint.api_key:
        headers["Authorization"] = f"Bearer {endpoint.api_key}"
    return httpx.AsyncClient(
        base_url=endpoint.base_url.rstrip("/") + "/",
        headers=headers,
        # h2c: HTTP/2 only, which httpx speaks with prior knowledge on http:// URLs.
        http1=not h2c,
        http2=bool(http.http2),
        verify=verify,
        trust_env=http.trust_env,
        limits=httpx.Limits(
            max_connections=connections,
            max_keepalive_connections=keepalive,
            keepalive_expiry=http.keepalive_expiry_s,
        ),
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


class Transport:
    """One provider's connection pool. Opened lazily on first request; ``aclose()`` closes it.

    A pool that may speak HTTP/2 is one httpx client: its requests share a multiplexed connection. An
    HTTP/1.1-only pool queues here instead: a semaphore of ``max_connections`` slots, each slot a
    one-connection httpx client, taken lowest first, so a lone request always finds the warm connection and
    the slots past ``max_keepalive_connections`` are the ones that close when idle. httpcore's own pool scans
    every connection several times per request, with a poll() on each idle one: at 100 streams in flight
    that cost more CPU than the streams themselves (benchmarks/client_overhead.py).
    """

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._verify: ssl.SSLContext | bool | None = None
        self._clients: list[httpx.AsyncClient | None] = []
        # HTTP/1.1-only pools: which slots have a request in flight, and the queue for a free one.
        self._busy: list[bool] = []
        self._slots: asyncio.Semaphore | None = None

    @property
    def is_open(self) -> bool:
        return any(c is not None for c in self._clients)

    def _open(self) -> None:
        http = self.endpoint.http
        per_slot = _http11_only(self.endpoint) and http.max_connections > 1
        self._clients = [None] * (http.max_connections if per_slot else 1)
        if per_slot:
            self._busy = [False] * http.max_connections
            self._slots = asyncio.Semaphore(http.max_connections)

    def _client(self, slot: int) -> httpx.AsyncClient:
        client = self._clients[slot]
        if client is None:
            http = self.endpoint.http
            if self._verify is None:
                self._verify = _ssl_context(http)
            if self._slots is None:
                connections, keepalive = http.max_connections, http.max_keepalive_connections
            else:
                connections, keepalive = 1, int(slot < http.max_keepalive_connections)
            client = self._clients[slot] = _build_client(
                self.endpoint, self._verify, connections=connections, keepalive=keepalive
            )
        return client

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

        ``phases`` receives the stamps of this attempt; the wait for a free connection is in its pool wait.
        Failures before the headers raise ``ConnectError``, ``TLSError``, ``TimeoutError`` (``phase="pool"``
        when no connection came free in time) or ``DisconnectedError``; the body's own failures surface while
        iterating.
        """
        phases.start_ns = time.perf_counter_ns()
        slot = await self._acquire()
        try:
            client = self._client(slot)
            headers = {"Content-Type": "application/json"} if body is not None else {}
            if stream:
                headers["Accept"] = "text/event-stream"
            if extra_headers:
                headers.update(extra_headers)
            req = client.build_request(method, path.lstrip("/"), content=body, headers=headers)
            req.extensions["trace"] = _tracer(phases)
            try:
                resp = await client.send(req, stream=True)
            except httpx.HTTPError as exc:
                raise _send_error(exc, self.endpoint, phases) from None
            phases.headers_ns = phases.headers_ns or time.perf_counter_ns()
            try:
                yield WireResponse(resp, self.endpoint)
            finally:
                # Cancellation (Esc) lands here too: closing releases or drops the connection at once.
                await asyncio.shield(resp.aclose())
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


def _refused(exc: BaseException) -> bool:
    # anyio wraps a refusal as OSError("All connection attempts failed") from ConnectionRefusedError, whose
    # text ("Connect call failed") never says "refused"; with several addresses the causes are in a group.
    for e in _cause_chain(exc):
        if isinstance(e, ConnectionRefusedError):
            return True
        if isinstance(e, BaseExceptionGroup) and any(_refused(sub) for sub in e.exceptions):
            return True
    return False


def _pool_timeout(ep: Endpoint) -> errors.TimeoutError:
    http = ep.http
    return errors.TimeoutError(
        f"no free connection to {ep.hostport} within {http.pool_timeout_s:g} s (http.pool_timeout_s); "
        f"too many requests in flight for http.max_connections = {http.max_connections}",
        phase="pool",
    )


def _send_error(exc: httpx.HTTPError, ep: Endpoint, phases: Phases) -> errors.APIError:
    where = ep.hostport
    text = " ".join(str(e) for e in _cause_chain(exc)).lower()
    http = ep.http
    if isinstance(exc, httpx.PoolTimeout):
        return _pool_timeout(ep)
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
    if any(isinstance(e, ssl.SSLError) for e in _cause_chain(exc)) or "ssl" in text or "certificate" in text:
        reason = next((str(e) for e in _cause_chain(exc) if isinstance(e, ssl.SSLError)), str(exc))
        return errors.TLSError(
            f"TLS handshake with {where} failed ({_short(reason)}); for a self-signed server set "
            "http.verify to its CA file (or false for a local test server); check base_url's scheme"
        )
    if isinstance(exc, httpx.ConnectError):
        if any(s in text for s in ("name or service not known", "nodename nor servname", "temporary failure in "
                                   "name resolution", "no address associated", "name resolution", "getaddrinfo")):
            host = urlsplit(ep.base_url).hostname
            return errors.ConnectError(
                f"cannot resolve host {host} (DNS lookup failed); check the spelling of base_url for "
                f"provider {ep.name!r} and your network"
            )
        if "refused" in text or _refused(exc):
            return errors.ConnectError(
                f"connection refused by {where}: nothing is listening there; start a local server with "
                f"`llmchat serve` or check base_url for provider {ep.name!r}"
            )
        return errors.ConnectError(f"cannot connect to {where} ({_short(str(exc))}); check base_url and the network")
    # Closed (FIN) or reset (RST: a TLS port given plain http, a crashed server) before any response byte:
    # httpcore says RemoteProtocolError for the one and ReadError/WriteError for the other; it is one event.
    if isinstance(exc, httpx.ReadError | httpx.WriteError) or (
        isinstance(exc, httpx.RemoteProtocolError) and "without sending a response" in text
    ):
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
    if isinstance(exc, httpx.UnsupportedProtocol):
        return errors.ConfigError(
            f"base_url {ep.base_url!r} for provider {ep.name!r} is not an http:// or https:// URL; fix base_url"
        )
    return errors.ConnectError(
        f"request to {where} failed before a response ({exc.__class__.__name__}: {_short(str(exc))}); try again"
    )


def _body_error(exc: httpx.HTTPError, ep: Endpoint) -> errors.APIError:
    if isinstance(exc, httpx.ReadTimeout):
        return errors.TimeoutError(
            f"{ep.hostport} stopped sending for {ep.http.read_timeout_s:g} s (http.read_timeout_s) mid-reply; "
            "the server stalled: try again or raise http.read_timeout_s",
            phase="read",
        )
    return errors.StreamCutError(
        f"the connection to {ep.hostport} dropped mid-reply ({_short(str(exc)) or exc.__class__.__name__}); "
        "try again"
    )


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 120 else text[:117] + "..."
