"""Every exception that can come out of httpx becomes one llmchat error, chosen by type: httpx's own (mapped
from httpcore's), and what httpx lets through unmapped (h2's and h11's protocol errors, httpcore's
ConnectionNotAvailable). Each case is raised through the real httpx transport and its mapping, from a fake
httpcore pool in place of the transport's own, before the response headers or while reading the body; the
test checks the llmchat class, its one-line message and how the retry layer treats it.
"""

from __future__ import annotations

import random
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import h2.errors
import h2.events
import h2.exceptions
import h11
import httpcore
import pytest

import llmchat.core.errors as errors
import llmchat.core.http._transport as T
from llmchat.core import ChatClient, RetrySettings
from llmchat.core.policy._retry import plan_retry

HP = "127.0.0.1:9"
URL = f"http://{HP}/v1"


def _with_cause(exc: BaseException, cause: BaseException) -> BaseException:
    exc.__cause__ = cause
    return exc


def _reset(code: h2.errors.ErrorCodes) -> h2.events.StreamReset:
    return h2.events.StreamReset(stream_id=1, error_code=code, remote_reset=True)


def _goaway(code: h2.errors.ErrorCodes, last: int = 1) -> h2.events.ConnectionTerminated:
    event = h2.events.ConnectionTerminated()
    event.error_code, event.last_stream_id = code, last
    return event


@dataclass(frozen=True)
class Case:
    id: str
    make: Callable[[], BaseException]
    where: str  # "send": before the response headers; "body": while reading the body
    error: type[errors.LLMChatError]
    message: str
    retry: str | None = (
        None  # the retry layer's reason and wait source, e.g. "goaway/immediate"; None: no retry
    )
    fresh: bool = False  # the attempt opened its connection (else it went out on a reused one)


RH = "request to " + HP + " failed before a response"
STALE = (
    f"{HP} closed the connection without sending a response; it may have been restarted, or it closes "
    "kept-alive connections: try again"
)
CUT = f"the connection to {HP} dropped mid-reply"

CASES = [
    # -- before the response ------------------------------------------------------------------------------
    Case(
        "connect-timeout",
        lambda: httpcore.ConnectTimeout("timed out"),
        "send",
        errors.TimeoutError,
        f"connecting to {HP} timed out after 10 s; check the host is up and reachable, or raise "
        "http.connect_timeout_s",
        "timeout_connect/backoff",
        fresh=True,
    ),
    Case(
        "read-timeout",
        lambda: httpcore.ReadTimeout(""),
        "send",
        errors.TimeoutError,
        f"{HP} sent no response for 120 s (http.read_timeout_s); the server is stalled or overloaded: try "
        "again or raise http.read_timeout_s",
    ),
    Case(
        "write-timeout",
        lambda: httpcore.WriteTimeout(""),
        "send",
        errors.TimeoutError,
        f"sending the request to {HP} timed out after 30 s; raise http.write_timeout_s",
    ),
    Case(
        "pool-timeout",
        lambda: httpcore.PoolTimeout(""),
        "send",
        errors.TimeoutError,
        f"no free connection to {HP} within 10 s (http.pool_timeout_s); too many requests in flight for "
        "http.max_connections = 10",
        "timeout_pool/backoff",
    ),
    Case(
        "refused",
        lambda: _with_cause(
            httpcore.ConnectError("All connection attempts failed"),
            ConnectionRefusedError(111, "Connect call failed"),
        ),
        "send",
        errors.ConnectError,
        f"connection refused by {HP}: nothing is listening there; start a local server "
        "with `llmchat serve` or check base_url for provider 'custom'",
        "connect/backoff",
        fresh=True,
    ),
    Case(
        "dns",
        lambda: httpcore.ConnectError("[Errno -2] Name or service not known"),
        "send",
        errors.ConnectError,
        "cannot resolve host 127.0.0.1 (DNS lookup failed); check the spelling of base_url "
        "for provider 'custom' and your network",
        "connect/backoff",
        fresh=True,
    ),
    # By type: getaddrinfo's own exception, whatever its words (here a German glibc's), and whatever else the
    # text says ("ssl" in a host name is not a TLS failure).
    Case(
        "dns-by-type",
        lambda: _with_cause(
            httpcore.ConnectError("[Errno -2] Der Name oder der Dienst ist nicht bekannt"),
            socket.gaierror(socket.EAI_NONAME, "Der Name oder der Dienst ist nicht bekannt"),
        ),
        "send",
        errors.ConnectError,
        "cannot resolve host 127.0.0.1 (DNS lookup failed); check the spelling of base_url "
        "for provider 'custom' and your network",
        "connect/backoff",
        fresh=True,
    ),
    Case(
        "dns-by-type-over-words",
        lambda: _with_cause(
            httpcore.ConnectError("ssl.example.com: [Errno -2] Name or service not known"),
            socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
        ),
        "send",
        errors.ConnectError,
        "cannot resolve host 127.0.0.1 (DNS lookup failed); check the spelling of base_url "
        "for provider 'custom' and your network",
        "connect/backoff",
        fresh=True,
    ),
    Case(
        "refused-in-a-group",
        lambda: _with_cause(
            httpcore.ConnectError("All connection attempts failed"),
            ExceptionGroup("", [ConnectionRefusedError(111, "Connect call failed ('::1', 9)"),
                                ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 9)")]),
        ),
        "send",
        errors.ConnectError,
        f"connection refused by {HP}: nothing is listening there; start a local server "
        "with `llmchat serve` or check base_url for provider 'custom'",
        "connect/backoff",
        fresh=True,
    ),
    # The fallback, by words, for a chain that lost its causes' types: one case per word of _CAUSE_WORDS.
    *(
        Case(
            f"dns-words-{n}",
            lambda text=text: httpcore.ConnectError(text),  # type: ignore[misc]
            "send",
            errors.ConnectError,
        "cannot resolve host 127.0.0.1 (DNS lookup failed); check the spelling of base_url "
        "for provider 'custom' and your network",
            "connect/backoff",
            fresh=True,
        )
        for n, text in enumerate([
            "[Errno 8] nodename nor servname provided, or not known",  # macOS
            "[Errno -3] Temporary failure in name resolution",  # glibc, EAI_AGAIN
            "[Errno -5] No address associated with hostname",  # glibc, EAI_NODATA
            "[Errno -4] Non-recoverable failure in name resolution",  # glibc, EAI_FAIL
            "[Errno 11001] getaddrinfo failed",  # Windows
        ])
    ),
    Case(
        "refused-words",
        lambda: httpcore.ConnectError("[Errno 111] Connection refused"),
        "send",
        errors.ConnectError,
        f"connection refused by {HP}: nothing is listening there; start a local server "
        "with `llmchat serve` or check base_url for provider 'custom'",
        "connect/backoff",
        fresh=True,
    ),
    Case(
        "tls-words-ssl",
        lambda: httpcore.ConnectError("[SSL: WRONG_VERSION_NUMBER] wrong version number (_ssl.c:1000)"),
        "send",
        errors.TLSError,
        f"TLS handshake with {HP} failed ([SSL: WRONG_VERSION_NUMBER] wrong version number (_ssl.c:1000)); "
        "for a self-signed server set http.verify to its CA file (or false for a local test "
        "server); check base_url's scheme",
        fresh=True,
    ),
    Case(
        "tls-words-certificate",
        lambda: httpcore.ConnectError("hostname mismatch, certificate is not valid for 'example.com'"),
        "send",
        errors.TLSError,
        f"TLS handshake with {HP} failed (hostname mismatch, certificate is not valid for 'example.com'); "
        "for a self-signed server set http.verify to its CA file (or false for a local test "
        "server); check base_url's scheme",
        fresh=True,
    ),
    Case(
        "unreachable",
        lambda: httpcore.ConnectError("[Errno 113] No route to host"),
        "send",
        errors.ConnectError,
        f"cannot connect to {HP} ([Errno 113] No route to host); check base_url and the network",
        "connect/backoff",
        fresh=True,
    ),
    Case(
        "tls",
        lambda: _with_cause(
            httpcore.ConnectError("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed"),
            ssl.SSLCertVerificationError(1, "certificate verify failed: self-signed"),
        ),
        "send",
        errors.TLSError,
        f"TLS handshake with {HP} failed (certificate verify failed: self-signed); "
        "for a self-signed server set http.verify to its CA file (or false for a local test "
        "server); check base_url's scheme",
        fresh=True,
    ),
    Case(
        "reset-on-reused",
        lambda: httpcore.ReadError("[Errno 104] Connection reset by peer"),
        "send",
        errors.DisconnectedError,
        STALE,
        "stale connection/immediate",
    ),
    Case(
        # A reset is a close: a TLS port given plain http resets or closes depending on whether it read the
        # request first, and the same request would meet the same end (tests/test_client_errors.py).
        "reset-on-fresh",
        lambda: httpcore.ReadError("[Errno 104] Connection reset by peer"),
        "send",
        errors.DisconnectedError,
        f"{HP} closed a new connection without sending a response; if it serves "
        "HTTPS, make base_url start with https://, else try again",
        fresh=True,
    ),
    Case(
        "broken-pipe-on-reused",
        lambda: httpcore.WriteError("[Errno 32] Broken pipe"),
        "send",
        errors.DisconnectedError,
        STALE,
        "stale connection/immediate",
    ),
    Case(
        "h2-disconnected-reused",
        lambda: httpcore.RemoteProtocolError("Server disconnected"),
        "send",
        errors.DisconnectedError,
        STALE,
        "stale connection/immediate",
    ),
    Case(
        "h11-disconnected-reused",
        lambda: httpcore.RemoteProtocolError("Server disconnected without sending a response."),
        "send",
        errors.DisconnectedError,
        STALE,
        "stale connection/immediate",
    ),
    Case(
        "disconnected-fresh",
        lambda: httpcore.RemoteProtocolError("Server disconnected"),
        "send",
        errors.DisconnectedError,
        f"{HP} closed a new connection without sending a response; if it serves "
        "HTTPS, make base_url start with https://, else try again",
        fresh=True,
    ),
    Case(
        "goaway-past-the-stream",
        lambda: T._NotProcessed(_goaway(h2.errors.ErrorCodes.NO_ERROR), 3),
        "send",
        errors.DisconnectedError,
        f"{HP} retired its HTTP/2 connection (GOAWAY, NO_ERROR) before taking this "
        "request, so it was not processed; try again",
        "goaway/immediate",
    ),
    Case(
        "refused-stream",
        lambda: httpcore.RemoteProtocolError(_reset(h2.errors.ErrorCodes.REFUSED_STREAM)),
        "send",
        errors.DisconnectedError,
        f"{HP} refused the request (HTTP/2 REFUSED_STREAM), so it was not processed; try again",
        "refused stream/immediate",
    ),
    Case(
        "stream-reset",
        lambda: httpcore.RemoteProtocolError(_reset(h2.errors.ErrorCodes.INTERNAL_ERROR)),
        "send",
        errors.ConnectError,
        f"{HP} reset the request before answering (HTTP/2 INTERNAL_ERROR); try again",
        "connect/backoff",
    ),
    Case(
        "goaway-httpcore",
        lambda: httpcore.RemoteProtocolError(_goaway(h2.errors.ErrorCodes.PROTOCOL_ERROR)),
        "send",
        errors.DisconnectedError,
        f"{HP} closed its HTTP/2 connection before answering (GOAWAY, PROTOCOL_ERROR); try again",
        "goaway/immediate",
    ),
    Case(
        "h11-bad-response",
        lambda: _with_cause(
            httpcore.RemoteProtocolError("illegal status line"),
            h11.RemoteProtocolError("illegal status line: bytearray(b'HTTP/1.1 abc')"),
        ),
        "send",
        errors.ProtocolError,
        f"{HP} sent a response that is not valid HTTP/1.1 (illegal status line: "
        "bytearray(b'HTTP/1.1 abc')); check that base_url points at an OpenAI-compatible API",
    ),
    Case(
        "h11-bad-request",
        lambda: _with_cause(
            httpcore.LocalProtocolError("Illegal header value"),
            h11.LocalProtocolError("Illegal header value b'a\\nb'"),
        ),
        "send",
        errors.ProtocolError,
        f"the request to {HP} is not valid HTTP/1.1 (Illegal header value "
        "b'a\\nb'); check the headers configured for provider 'custom'",
    ),
    Case(
        "h2-local",
        lambda: _with_cause(
            httpcore.LocalProtocolError("Invalid input"),
            h2.exceptions.ProtocolError(
                "Invalid input ConnectionInputs.SEND_HEADERS in state ConnectionState.CLOSED"
            ),
        ),
        "send",
        errors.ConnectError,
        f"the HTTP/2 connection to {HP} broke before the response (ProtocolError: "
        "Invalid input ConnectionInputs.SEND_HEADERS in state ConnectionState.CLOSED); try again",
        "connect/backoff",
    ),
    Case(
        "h2-raw",
        lambda: h2.exceptions.StreamClosedError(5),
        "send",
        errors.ConnectError,
        f"the HTTP/2 connection to {HP} broke before the response (StreamClosedError: 5); try again",
        "connect/backoff",
    ),
    Case(
        "h11-raw",
        lambda: h11.RemoteProtocolError("Receive buffer too long"),
        "send",
        errors.ProtocolError,
        f"{HP} sent a response that is not valid HTTP/1.1 (Receive buffer too long); check that base_url "
        "points at an OpenAI-compatible API",
    ),
    Case(
        "h11-raw-local",
        lambda: h11.LocalProtocolError("Too much data for declared Content-Length"),
        "send",
        errors.ProtocolError,
        f"the request to {HP} is not valid HTTP/1.1 (Too much data for declared "
        "Content-Length); check the headers configured for provider 'custom'",
    ),
    Case(
        "no-connection",
        lambda: httpcore.ConnectionNotAvailable(),
        "send",
        errors.ConnectError,
        f"no connection to {HP} could take the request; try again",
        "connect/backoff",
    ),
    Case(
        "proxy",
        lambda: httpcore.ProxyError("407 Proxy Authentication Required"),
        "send",
        errors.ConnectError,
        f"the proxy to {HP} failed (407 Proxy Authentication Required); check HTTPS_PROXY / HTTP_PROXY, or "
        "set http.trust_env to false",
        "connect/backoff",
    ),
    Case(
        "unsupported",
        lambda: httpcore.UnsupportedProtocol("Request URL has an unsupported protocol 'ftp://'."),
        "send",
        errors.ConfigError,
        f"base_url '{URL}' for provider 'custom' is not an http:// or https:// URL; fix base_url",
    ),
    # -- while reading the body ----------------------------------------------------------------------------
    Case(
        "body-read-timeout",
        lambda: httpcore.ReadTimeout(""),
        "body",
        errors.TimeoutError,
        f"{HP} stopped sending for 120 s (http.read_timeout_s) mid-reply; the server stalled: try again or "
        "raise http.read_timeout_s",
    ),
    Case(
        "body-reset",
        lambda: httpcore.ReadError("[Errno 104] Connection reset by peer"),
        "body",
        errors.StreamCutError,
        f"{CUT} ([Errno 104] Connection reset by peer); try again",
    ),
    Case(
        "body-disconnected",
        lambda: httpcore.RemoteProtocolError("Server disconnected"),
        "body",
        errors.StreamCutError,
        f"{CUT} (Server disconnected); try again",
    ),
    Case(
        "body-write",
        lambda: httpcore.WriteError(""),
        "body",
        errors.StreamCutError,
        f"{CUT} (WriteError); try again",
    ),
    Case(
        "body-stream-reset",
        lambda: httpcore.RemoteProtocolError(_reset(h2.errors.ErrorCodes.CANCEL)),
        "body",
        errors.StreamCutError,
        f"{HP} reset the stream mid-reply (HTTP/2 CANCEL); try again",
    ),
    Case(
        "body-goaway",
        lambda: httpcore.RemoteProtocolError(_goaway(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)),
        "body",
        errors.StreamCutError,
        f"{CUT} (GOAWAY, ENHANCE_YOUR_CALM); try again",
    ),
    # The escape of issue 11: h2 refusing a frame after a GOAWAY, raised raw out of httpcore's body stream.
    Case(
        "body-h2-raw",
        lambda: h2.exceptions.ProtocolError(
            "Invalid input ConnectionInputs.RECV_DATA in state ConnectionState.CLOSED"
        ),
        "body",
        errors.StreamCutError,
        f"{CUT} (HTTP/2 ProtocolError: Invalid input ConnectionInputs.RECV_DATA in state "
        "ConnectionState.CLOSED); try again",
    ),
    Case(
        "body-h2-flow",
        lambda: h2.exceptions.FlowControlError("Cannot send 10 bytes, flow control window is 0"),
        "body",
        errors.StreamCutError,
        f"{CUT} (HTTP/2 FlowControlError: Cannot send 10 bytes, flow control window is 0); try again",
    ),
    Case(
        "body-h2-local",
        lambda: _with_cause(httpcore.LocalProtocolError("x"), h2.exceptions.StreamClosedError(3)),
        "body",
        errors.StreamCutError,
        f"{CUT} (HTTP/2 StreamClosedError: 3); try again",
    ),
    Case(
        "body-h11-raw",
        lambda: h11.RemoteProtocolError("peer unexpectedly closed"),
        "body",
        errors.StreamCutError,
        f"{CUT} (invalid HTTP/1.1: peer unexpectedly closed); try again",
    ),
    Case(
        "body-no-connection",
        lambda: httpcore.ConnectionNotAvailable(),
        "body",
        errors.StreamCutError,
        f"{CUT} (ConnectionNotAvailable); try again",
    ),
]


class _Raising:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    async def __aiter__(self) -> AsyncIterator[bytes]:
        raise self.exc
        yield b""  # pragma: no cover - makes this an async generator

    async def aclose(self) -> None:
        return None


class _FakePool(httpcore.AsyncConnectionPool):
    """Stands for the transport's pool: fires the trace events of a fresh or reused connection, then raises
    the case's exception, or answers 200 with a body that raises it."""

    case: Case

    def __init__(self, **kw: Any) -> None:
        super().__init__()

    async def handle_async_request(self, request: httpcore.Request) -> httpcore.Response:
        trace = request.extensions["trace"]
        if self.case.fresh:
            await trace("connection.connect_tcp.started", {})
            await trace("connection.connect_tcp.complete", {})
        await trace("http2.send_request_headers.started", {})
        if self.case.where == "send":
            raise self.case.make()
        return httpcore.Response(
            200, headers=[(b"content-type", b"text/event-stream")], content=_Raising(self.case.make())
        )


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_each_wire_exception_becomes_one_llmchat_error(
    case: Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_FakePool, "case", case, raising=False)
    monkeypatch.setattr(T, "_Pool", _FakePool)
    async with ChatClient(
        base_url=URL, model="m", http2="h2c", use_cache=False, retry=RetrySettings(max_attempts=1)
    ) as client:
        with pytest.raises(errors.LLMChatError) as caught:
            async for _ in client.stream([{"role": "user", "content": "hi"}]):
                pass
    error = caught.value
    assert type(error) is case.error
    assert str(error) == case.message
    assert "\n" not in str(error)
    event = plan_retry(error, attempt=1, settings=RetrySettings(), waited_s=0.0, rng=random.Random(0))
    planned = None if event is None else f"{event.reason}/{event.wait_source}"
    assert planned == case.retry


def test_the_cases_cover_every_exception_type_httpx_lets_out() -> None:
    raised = {type(c.make()) for c in CASES}
    for kind in (
        httpcore.ConnectTimeout,
        httpcore.ReadTimeout,
        httpcore.WriteTimeout,
        httpcore.PoolTimeout,
        httpcore.ConnectError,
        httpcore.ReadError,
        httpcore.WriteError,
        httpcore.RemoteProtocolError,
        httpcore.LocalProtocolError,
        httpcore.ProxyError,
        httpcore.UnsupportedProtocol,
        httpcore.ConnectionNotAvailable,
        h2.exceptions.ProtocolError,
        h2.exceptions.StreamClosedError,
        h2.exceptions.FlowControlError,
        h11.RemoteProtocolError,
        h11.LocalProtocolError,
    ):
        assert kind in raised, kind
    # Whatever else h2 or h11 raises derives from the bases the transport catches.
    assert issubclass(h2.exceptions.ProtocolError, h2.exceptions.H2Error)
    assert all(
        issubclass(k, T._WIRE_ERRORS)
        for k in (h2.exceptions.H2Error, h11.ProtocolError, httpcore.ConnectionNotAvailable)
    )


def test_every_fallback_word_decides_a_case_of_its_own() -> None:
    # Message matching is the documented fallback (core/http/_transport.py's _CAUSE_WORDS): each word must be
    # met by a case with no cause of a type that would decide it first.
    kinds = {"tls": errors.TLSError, "dns": errors.ConnectError, "refused": errors.ConnectError}
    for kind, words in T._CAUSE_WORDS:
        for word in words:
            decided = [
                c.id for c in CASES
                if c.error is kinds[kind]
                and not any(isinstance(e, t) for e in T._causes(c.make()) for t, _ in T._CAUSE_TYPES)
                and word in " ".join(str(e) for e in T._causes(c.make())).lower()
            ]
            assert decided, f"no case is decided by the word {word!r} ({kind})"


def test_every_cause_type_decides_a_case() -> None:
    for kind, name in T._CAUSE_TYPES:
        assert any(T._cause_kind(c.make()) == name and any(isinstance(e, kind) for e in T._causes(c.make()))
                   for c in CASES), kind
