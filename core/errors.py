"""Typed errors, each with a one-line message for the user: the cause, then the fix.

``str(error)`` is that line. It never holds an API key: messages are built from what we know (host, status,
which setting supplied the key), never from request headers. Every error raised by a request carries what
arrived before it failed (``partial_text``, ``tokens_received``) so nothing the user saw is lost.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmchat.core.observe._timing import TimingRecord


class LLMChatError(Exception):
    """Base of every error llmchat shows to a user. ``exit_code`` is what the command line exits with."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        # One line, always: a multi-line message would break the status bar and log lines.
        super().__init__(" ".join(message.split()))

    @property
    def message(self) -> str:
        return str(self)


class ConfigError(LLMChatError):
    """A broken config file, environment variable or flag value. Exit status 2."""

    exit_code = 2


class UsageError(LLMChatError):
    """A command used the wrong way. Exit status 2."""

    exit_code = 2


class APIError(LLMChatError):
    """A request that failed: network, protocol or HTTP status.

    ``retryable`` says whether the retry layer may send it again; ``body_started`` is set once any byte of the
    reply body has reached the caller, after which a request is never retried (the user has seen it).
    """

    retryable = False

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        headers: Mapping[str, str] | None = None,
        partial_text: str = "",
        tokens_received: int = 0,
        body_started: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        # Only the response headers the retry layer reads are kept (retry-after-ms, retry-after,
        # x-should-retry): response headers can echo request data, and request headers hold the key.
        self.headers: dict[str, str] = {
            k.lower(): v
            for k, v in (headers or {}).items()
            if k.lower() in ("retry-after", "retry-after-ms", "x-should-retry")
        }
        self.partial_text = partial_text
        self.tokens_received = tokens_received
        self.body_started = body_started
        #: The request's TimingRecord, attached by the client, so a failure keeps its timings too.
        self.record: TimingRecord | None = None

    @property
    def kind(self) -> str:
        """A short class name for counters and logs: ``connect``, ``timeout``, ``http_429`` ..."""
        return "api"


class ConnectError(APIError):
    """No connection: refused, DNS failure, unreachable. Safe to retry: nothing was sent."""

    retryable = True

    @property
    def kind(self) -> str:
        return "connect"


class TLSError(APIError):
    """The TLS handshake failed (unknown CA, wrong host name, plain HTTP on an https URL)."""

    @property
    def kind(self) -> str:
        return "tls"


class TimeoutError(APIError):  # noqa: A001 - deliberately shadows the builtin inside this module's namespace
    """Connect, pool, write or read timeout. ``phase`` says which; connect and pool are retryable."""

    def __init__(self, message: str, *, phase: str, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.phase = phase
        self.retryable = phase in ("connect", "pool")

    @property
    def kind(self) -> str:
        return f"timeout_{self.phase}"


class DisconnectedError(APIError):
    """The server closed the connection without sending a response.

    On a reused keep-alive connection this is the stale-connection case (llama.cpp closes after every stream)
    and is retried on a fresh connection; ``reused`` says which it was. ``reason`` says why no response came:
    "stale connection", or "goaway" / "refused stream" for an HTTP/2 request the server said it never took.
    """

    def __init__(self, message: str, *, reused: bool, reason: str = "stale connection", **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.reused = reused
        self.reason = reason
        self.retryable = reused

    @property
    def kind(self) -> str:
        return "disconnected"


class HTTPStatusError(APIError):
    """The server answered with an error status. 408, 409, 429 and 5xx are retryable."""

    def __init__(self, message: str, *, status: int, **kw: object) -> None:
        super().__init__(message, status=status, **kw)  # type: ignore[arg-type]
        self.retryable = status in (408, 409, 429) or status >= 500
        should = self.headers.get("x-should-retry")
        if should == "true":
            self.retryable = True
        elif should == "false":
            self.retryable = False

    @property
    def kind(self) -> str:
        return f"http_{self.status}"


class AuthError(HTTPStatusError):
    """401 or 403: the key is missing, wrong or not allowed."""


class NotFoundError(HTTPStatusError):
    """404: an unknown model or a wrong base URL."""


class RateLimitError(HTTPStatusError):
    """429 after every retry was spent, or with a wait longer than allowed."""


class ServerError(HTTPStatusError):
    """5xx after every retry was spent."""


class ProtocolError(APIError):
    """The reply was not what the protocol says: an HTML page, a data line that is not JSON, a cut stream."""

    @property
    def kind(self) -> str:
        return "protocol"


class StreamCutError(APIError):
    """The connection dropped mid-reply. ``partial_text`` holds what arrived."""

    @property
    def kind(self) -> str:
        return "stream_cut"


class CancelledByUser(APIError):
    """The user stopped the reply (Esc, Ctrl-C). ``partial_text`` holds what arrived."""

    @property
    def kind(self) -> str:
        return "cancelled"
