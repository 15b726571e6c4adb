"""What a transport is: the small protocol ``ChatClient(transport=...)`` takes, and the endpoint it talks to.

The default transport (``Transport``, on httpx, in ``_transport``) and ``MockTransport`` (for unit tests of the
client) both satisfy it; nothing above this package sees the HTTP stack behind it. This module imports no HTTP
library, so the protocol and the mock cost nothing to import.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit

from llmchat.core.config import HttpSettings, mask_url
from llmchat.core.observe import Phases


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


class HTTPResponse(Protocol):
    """An open response: status, headers, the HTTP version used, and the body as raw byte chunks.

    Reading the body raises llmchat's errors (``StreamCutError``, ``TimeoutError``), never the HTTP stack's.
    """

    status: int
    headers: Mapping[str, str]
    http_version: str

    def aiter_bytes(self) -> AsyncIterator[bytes]: ...

    async def aread(self) -> bytes: ...


class HTTPTransport(Protocol):
    """What ``ChatClient`` sends through: one endpoint's connections.

    ``request`` is an async context manager that sends one request and yields the open response (headers
    read, body not yet), stamping ``phases`` as the attempt goes (start, pool wait, connect, TLS, send,
    headers); leaving it releases the connection. Failures before the headers raise llmchat's errors
    (``ConnectError``, ``TLSError``, ``TimeoutError``, ``DisconnectedError``...), so the retry layer decides on
    llmchat types alone. ``proxy`` names the proxy in between, if any (masked: it goes in records).
    ``prepare`` builds what the first request would otherwise pay for (safe to call again); ``aclose`` closes
    every connection.
    """

    @property
    def endpoint(self) -> Endpoint: ...

    @property
    def is_open(self) -> bool: ...

    @property
    def proxy(self) -> str | None:
        """The proxy the requests go through, its URL with credentials masked; None when they go direct."""
        ...

    async def prepare(self) -> None: ...

    def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        phases: Phases,
        stream: bool = False,
        extra_headers: Mapping[str, str] | None = None,
    ) -> AbstractAsyncContextManager[HTTPResponse]: ...

    async def aclose(self) -> None: ...
