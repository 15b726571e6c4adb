"""Round-trip emulation: a TCP proxy on 127.0.0.1 that delays every byte by half a round trip each way.

A chunk read from one side at time t is written to the other at t + rtt/2, whatever happened to earlier
chunks: each direction is a queue of (due time, bytes), written in order as each falls due, so throughput is
not serialized by the delay (a 50 ms link still carries a fast stream at full speed, 25 ms late). The proxy
never parses what it carries, so HTTP/1.1, h2c and TLS (h2 by ALPN) pass through alike.

The TCP handshake: the kernel completes a client's connect to the proxy at once, with no user code involved,
so that round trip cannot be delayed where it happens. It is charged to the client's first bytes instead:
nothing the client sends reaches the upstream before one full round trip after the connection was accepted,
which is when its data could first have left a real client. A new connection's first reply therefore comes
two round trips after connect (three with TLS 1.3, whose handshake is more bytes the proxy delays), as across
regions; the client's record shows the wait in TLS or time to first byte, not in ``connect_ms``.

Closing is passed on in order: an end of stream (FIN) from one side reaches the other, after the data before
it, as a half-close; a connection is closed on both sides once both directions ended, or at once when either
side errors.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from llmchat.core.errors import LLMChatError, UsageError

#: Stop reading from a side while this many bytes wait in its queue (the other side reads too slowly).
_HIGH_WATER = 4 * 1024 * 1024
#: ...and read again once the queue has drained below this.
_LOW_WATER = 1024 * 1024
#: The monotonic clock's resolution: asyncio may run a timer this early, and a chunk then is due.
_EARLY_S = time.get_clock_info("monotonic").resolution


@dataclass(frozen=True)
class Target:
    """Where the proxy forwards to, read from a URL: the host, the port, and the URL's scheme and path."""

    host: str
    port: int
    scheme: str
    path: str

    @classmethod
    def from_url(cls, url: str) -> Target:
        """Parse ``http://host:port/v1`` (the port defaults by scheme); UsageError for anything else."""
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            raise UsageError(f"--to {url!r} is not a URL; give one like http://127.0.0.1:8000/v1") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"--to {url!r} is not an http:// or https:// URL; give one like "
                             "http://127.0.0.1:8000/v1")
        default = 443 if parts.scheme == "https" else 80
        return cls(parts.hostname, port or default, parts.scheme, parts.path.rstrip("/"))


class _Pipe:
    """One direction of a link: bytes read from ``src`` are written to ``dst`` when due, in order."""

    __slots__ = ("link", "src", "dst", "queue", "queued", "timer", "not_before", "ended", "full", "blocked")

    def __init__(self, link: _Link, not_before: float) -> None:
        self.link = link
        self.src: asyncio.Transport | None = None
        self.dst: asyncio.Transport | None = None
        # (due, data); data None is the end of stream, after everything queued before it.
        self.queue: collections.deque[tuple[float, bytes | None]] = collections.deque()
        self.queued = 0
        self.timer: asyncio.TimerHandle | None = None
        self.not_before = not_before
        self.ended = False  # the end of stream was delivered
        self.full = False  # src paused: too many bytes waiting
        self.blocked = False  # src paused: dst's write buffer is full

    def push(self, data: bytes | None) -> None:
        if self.link.closed:
            return
        loop = self.link.loop
        due = max(loop.time(), self.not_before) + self.link.delay_s
        self.queue.append((due, data))
        if data is not None:
            self.queued += len(data)
            if self.queued > _HIGH_WATER and not self.full:
                self.full = True
                self._pause_src()
        if self.timer is None:
            self.timer = loop.call_at(due, self.flush)

    def flush(self) -> None:
        """Write every chunk that is due, then wait for the next one. Chunks wait while dst is not open."""
        self.timer = None
        dst = self.dst
        if dst is None or self.ended or self.link.closed:
            return
        now = self.link.loop.time() + _EARLY_S
        queue = self.queue
        while queue and queue[0][0] <= now:
            _, data = queue.popleft()
            if data is None:
                self.ended = True
                queue.clear()
                self.link.direction_ended(self)
                return
            self.queued -= len(data)
            if not dst.is_closing():
                dst.write(data)
        if self.full and self.queued < _LOW_WATER:
            self.full = False
            self._resume_src()
        if queue:
            self.timer = self.link.loop.call_at(queue[0][0], self.flush)

    def attach(self, dst: asyncio.Transport) -> None:
        self.dst = dst
        if self.timer is None and self.queue:
            self.flush()

    def set_blocked(self, blocked: bool) -> None:
        self.blocked = blocked
        if blocked:
            self._pause_src()
        else:
            self._resume_src()

    def _pause_src(self) -> None:
        if self.src is not None and self.src.is_reading():
            self.src.pause_reading()

    def _resume_src(self) -> None:
        if self.src is not None and not self.full and not self.blocked and not self.src.is_closing():
            self.src.resume_reading()

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.queue.clear()


class _Side(asyncio.Protocol):
    """One socket of a link (the client's, or the upstream's); hands everything to the link."""

    def __init__(self, link: _Link, out: _Pipe, back: _Pipe) -> None:
        self.link = link
        self.out = out  # what this side sends
        self.back = back  # what this side receives
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.out.src = transport
        self.link.side_open(self, transport)

    def data_received(self, data: bytes) -> None:
        self.out.push(data)

    def eof_received(self) -> bool:
        self.out.push(None)
        return True  # keep the socket half-open: the reply may still be on its way to this side

    def pause_writing(self) -> None:
        self.back.set_blocked(True)

    def resume_writing(self) -> None:
        self.back.set_blocked(False)

    def connection_lost(self, exc: Exception | None) -> None:
        self.link.side_lost(self)


class _Link:
    """One client connection and its upstream connection, and the two delayed directions between them."""

    def __init__(self, proxy: DelayProxy, loop: asyncio.AbstractEventLoop) -> None:
        self.proxy = proxy
        self.loop = loop
        self.delay_s = proxy.rtt_s / 2
        accepted = loop.time()
        # The handshake's round trip, charged to the client's first bytes (see the module docstring).
        self.up = _Pipe(self, not_before=accepted + proxy.rtt_s)
        self.down = _Pipe(self, not_before=accepted)
        self.client = _Side(self, out=self.up, back=self.down)
        self.upstream = _Side(self, out=self.down, back=self.up)
        self.connecting: asyncio.Task[None] | None = None
        self.closed = False

    def side_open(self, side: _Side, transport: asyncio.Transport) -> None:
        if side is self.client:
            self.proxy._links.add(self)
            self.connecting = self.loop.create_task(self._connect())
        else:
            self.up.attach(transport)

    async def _connect(self) -> None:
        target = self.proxy.target
        try:
            await self.loop.create_connection(lambda: self.upstream, target.host, target.port)
        except OSError:
            # Nothing listens there: the client sees its connection closed unanswered, as it would directly
            # (a refused connect cannot be replayed to a client whose connect already succeeded).
            self.close()
            return
        assert self.client.transport is not None
        self.down.attach(self.client.transport)

    def direction_ended(self, pipe: _Pipe) -> None:
        dst = pipe.dst
        other = self.down if pipe is self.up else self.up
        if dst is not None and not dst.is_closing() and dst.can_write_eof() and not other.ended:
            dst.write_eof()
        else:
            self.close()
        if self.up.ended and self.down.ended:
            self.close()

    def side_lost(self, side: _Side) -> None:
        # A socket that is gone can send nothing more and receive nothing: what it sent before still goes
        # out, in time, then the other side closes too.
        if self.closed:
            return
        out, back = side.out, side.back
        back.cancel()
        back.ended = True
        if not out.ended:
            if not out.queue or out.queue[-1][1] is not None:
                out.push(None)
        if self.up.ended and self.down.ended:
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.proxy._links.discard(self)
        if self.connecting is not None and not self.connecting.done():
            self.connecting.cancel()
        for pipe in (self.up, self.down):
            pipe.cancel()
        for side in (self.client, self.upstream):
            if side.transport is not None and not side.transport.is_closing():
                side.transport.close()

    def abort(self) -> None:
        self.closed = True
        if self.connecting is not None and not self.connecting.done():
            self.connecting.cancel()
        for pipe in (self.up, self.down):
            pipe.cancel()
        for side in (self.client, self.upstream):
            if side.transport is not None:
                side.transport.abort()


class DelayProxy:
    """A listening proxy to ``target`` that adds ``rtt_ms`` of round trip to every connection through it.

    ``await start()`` binds (port 0 takes a free one; ``port`` then says which); ``await aclose()`` stops
    listening and drops every open connection.
    """

    def __init__(self, target: Target, rtt_ms: float, *, host: str = "127.0.0.1", port: int = 0) -> None:
        if not (rtt_ms >= 0 and math.isfinite(rtt_ms)):
            raise UsageError(f"--rtt-ms must be a non-negative number of milliseconds, got {rtt_ms!r}")
        self.target = target
        self.rtt_ms = rtt_ms
        self.rtt_s = rtt_ms / 1000.0
        self.host = host
        self._port = port
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()

    @property
    def port(self) -> int:
        """The port the proxy listens on (known once started)."""
        return self._port

    @property
    def connections(self) -> int:
        """How many client connections are open through the proxy now."""
        return len(self._links)

    def url(self, scheme: str | None = None) -> str:
        """The proxy's address as a client uses it: the target's scheme and path on the proxy's port."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme or self.target.scheme}://{host}:{self._port}{self.target.path}"

    async def start(self) -> None:
        """Listen. Raises LLMChatError, one line, when the address cannot be bound."""
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(
                lambda: _Link(self, loop).client, self.host, self._port, reuse_address=True
            )
        except OSError as exc:
            raise LLMChatError(
                f"cannot listen on {self.host}:{self._port}: {exc.strerror or exc}; "
                "pick another --port, or --port 0 for a free one"
            ) from None
        self._port = self._server.sockets[0].getsockname()[1]

    async def aclose(self) -> None:
        """Stop listening and abort every connection still open. Safe to call twice."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for link in list(self._links):
            link.abort()
        self._links.clear()
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)

    async def __aenter__(self) -> DelayProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def run_proxy(
    target: Target,
    rtt_ms: float,
    *,
    shutdown: asyncio.Event,
    host: str = "127.0.0.1",
    port: int = 0,
    announce: Callable[[DelayProxy], object] | None = None,
) -> None:
    """Run a DelayProxy until ``shutdown`` is set; ``announce(proxy)`` is called once it listens.

    Raises UsageError for a negative ``rtt_ms``, LLMChatError when the address cannot be bound.
    """
    async with DelayProxy(target, rtt_ms, host=host, port=port) as proxy:
        if announce is not None:
            announce(proxy)
        await shutdown.wait()
