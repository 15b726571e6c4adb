"""``Pools``: connection pools owned by whoever holds them (the app, a command, a bench run, a Locust user).

No pool lives in a module global: a face makes one ``Pools``, hands it to every ``ChatClient`` it builds, and
closes it when it is done, so every client of that face shares the same warm connections, and two faces (or a
test and the next) never do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from llmchat.core.http._interface import Endpoint, HTTPTransport
from llmchat.core.http._transport import Transport


class Pools:
    """Transports by endpoint: ``acquire`` shares one per endpoint (and event loop) among its callers,
    reference counted, and ``release`` closes it when its last caller lets go; ``open`` makes one that is
    nobody else's. ``aclose`` closes every transport still open. ``factory`` builds a transport for an
    endpoint (``Transport``, on httpx, by default).
    """

    def __init__(self, factory: Callable[[Endpoint], HTTPTransport] | None = None) -> None:
        self._factory: Callable[[Endpoint], HTTPTransport] = factory or Transport
        self._shared: dict[tuple[Any, ...], tuple[asyncio.AbstractEventLoop, HTTPTransport, int]] = {}
        self._own: list[HTTPTransport] = []

    def __repr__(self) -> str:
        return f"Pools(shared={len(self._shared)}, own={len(self._own)})"

    @staticmethod
    def _key(ep: Endpoint) -> tuple[Any, ...]:
        # In memory only: the key never leaves this dict (it holds the API key to keep two accounts apart).
        return (ep.name, ep.base_url, ep.api_key, tuple(sorted(ep.headers.items())), ep.http)

    def acquire(self, endpoint: Endpoint) -> HTTPTransport:
        """The shared transport for ``endpoint`` on the running event loop, made on first use. Each call
        needs one ``release``."""
        loop = asyncio.get_running_loop()
        key = self._key(endpoint)
        entry = self._shared.get(key)
        if entry is not None and entry[0] is loop and not loop.is_closed():
            self._shared[key] = (loop, entry[1], entry[2] + 1)
            return entry[1]
        transport = self._factory(endpoint)
        self._shared[key] = (loop, transport, 1)
        return transport

    async def release(self, transport: HTTPTransport) -> None:
        """Let go of a transport from ``acquire`` (closed once nobody holds it) or ``open`` (closed now)."""
        if transport in self._own:
            self._own.remove(transport)
            await transport.aclose()
            return
        key = self._key(transport.endpoint)
        entry = self._shared.get(key)
        if entry is None or entry[1] is not transport:
            await transport.aclose()
            return
        if entry[2] <= 1:
            del self._shared[key]
            await transport.aclose()
        else:
            self._shared[key] = (entry[0], transport, entry[2] - 1)

    def open(self, endpoint: Endpoint) -> HTTPTransport:
        """A transport for ``endpoint`` that no other caller shares (a bench configuration, a load-test user),
        closed by ``release`` or ``aclose``."""
        transport = self._factory(endpoint)
        self._own.append(transport)
        return transport

    async def aclose(self) -> None:
        """Close every transport still open; the pools can be used again afterwards."""
        transports = [t for _, t, _ in self._shared.values()] + self._own
        self._shared, self._own = {}, []
        await asyncio.gather(*(t.aclose() for t in transports))

    async def __aenter__(self) -> Pools:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
