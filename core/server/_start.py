"""Running the local server: on hypercorn in this event loop, or on its own loop in a daemon thread.

We bind the listening socket ourselves (so ``port`` 0 tells us the port it took, and so the socket can track
its connections, see ``_connections``) and hand it to hypercorn through ``Config.create_sockets``. Plain http
speaks HTTP/1.1 and h2c (prior knowledge, and the Upgrade dance for bodiless requests); TLS offers h2 and
http/1.1 by ALPN. The ready line is printed once the socket listens: a client that connects from then on is
queued by the kernel and served.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, cast

from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config, Sockets
from hypercorn.typing import ASGIFramework

from llmchat.core.config import ServerSettings
from llmchat.core.errors import LLMChatError
from llmchat.core.server._app import ServerApp
from llmchat.core.server._connections import ConnectionRegistry, TrackingSocket
from llmchat.core.server._metrics import ServerMetrics
from llmchat.core.server._profiles import validate_settings
from llmchat.core.server._proxy import DelayProxy, Target
from llmchat.core.server._retire import NO_LIMIT
from llmchat.core.server._retire import install as install_retiring_h2
from llmchat.core.server._tls import TLSFiles, self_signed, user_files

Handler = Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object]

GRACEFUL_S = 2.0
"""On shutdown, replies in flight are finished at once (unpaced); any still going after this long (a client
that stopped reading) are cancelled."""
KEEP_ALIVE_S = 120.0
"""An idle keep-alive connection is closed after this long: longer than clients keep idle connections (30 s by
default), so a client's pool, not the server, decides when a connection retires."""


@dataclass(frozen=True)
class Listening:
    """Where a started server listens, and the line it announces itself with."""

    host: str
    port: int
    scheme: str
    cert_path: str | None
    rtt_ms: float = 0.0
    """The round trip an in-process DelayProxy adds in front of the server (``--rtt-ms``); 0 for none."""

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    @property
    def line(self) -> str:
        """``llmchat server listening on http://127.0.0.1:PORT (http/1.1, h2c)``; with TLS, ``https://...
        (http/1.1, h2) certificate PATH`` naming the PEM file a client should trust. With round-trip emulation
        the parentheses end with ``, rtt 50 ms``."""
        rtt = f", rtt {self.rtt_ms:g} ms" if self.rtt_ms > 0 else ""
        if self.scheme == "https":
            return f"llmchat server listening on {self.url} (http/1.1, h2{rtt}) certificate {self.cert_path}"
        return f"llmchat server listening on {self.url} (http/1.1, h2c{rtt})"


class _Config(Config):
    """hypercorn's Config, serving the socket we bound instead of binding its own; ``retire_after`` is read by
    ``RetiringH2Protocol``."""

    def __init__(self, sock: socket.socket, tls: bool) -> None:
        super().__init__()
        self._sock = sock
        self._tls = tls
        self.retire_after = 0

    def create_sockets(self) -> Sockets:
        if self._tls:
            return Sockets(secure_sockets=[self._sock], insecure_sockets=[], quic_sockets=[])
        return Sockets(secure_sockets=[], insecure_sockets=[self._sock], quic_sockets=[])


async def serve(
    settings: ServerSettings,
    *,
    ready: Callable[[str], None] | None = None,
    shutdown: asyncio.Event | None = None,
    metrics: ServerMetrics | None = None,
) -> None:
    """Serve until ``shutdown`` is set (default: until SIGINT or SIGTERM), then stop cleanly.

    ``ready`` is called with the ready line once the server listens; ``metrics`` (``--metrics-port``) counts
    every request. Raises UsageError for settings out of range or unusable TLS files, LLMChatError when the
    address cannot be bound.
    """
    await _serve(settings, on_listening=(lambda info: ready(info.line)) if ready else None, shutdown=shutdown,
                 metrics=metrics)


async def _serve(
    settings: ServerSettings,
    *,
    on_listening: Callable[[Listening], None] | None,
    shutdown: asyncio.Event | None,
    metrics: ServerMetrics | None = None,
) -> None:
    validate_settings(settings)
    install_retiring_h2()
    tls: TLSFiles | None = None
    if settings.certfile:
        tls = user_files(settings.certfile, settings.keyfile)
    elif settings.tls:
        try:  # a key pair and two small files: off the event loop, which may be the chat app's
            tls = await asyncio.get_running_loop().run_in_executor(None, self_signed)
        except OSError as exc:
            raise LLMChatError(
                f"cannot write a self-signed certificate: {exc}; set TMPDIR to a writable folder"
            ) from None
    registry = ConnectionRegistry()
    sock: socket.socket | None = None
    proxy: DelayProxy | None = None
    try:
        # With --rtt-ms the server listens on a free port of its own and the announced port is a DelayProxy's.
        sock = _bind(settings.host, 0 if settings.rtt_ms > 0 else settings.port, registry)
        config = _Config(sock, tls is not None)
        if tls is not None:
            config.certfile, config.keyfile = tls.certfile, tls.keyfile
        config.keep_alive_timeout = KEEP_ALIVE_S
        # A connection retires after max_requests_per_connection requests as nginx's do (see _retire):
        # HTTP/1.1 by hypercorn's own Connection: close, HTTP/2 by RetiringH2Protocol's graceful GOAWAY.
        config.retire_after = settings.max_requests_per_connection
        config.keep_alive_max_requests = settings.max_requests_per_connection or NO_LIMIT
        config.graceful_timeout = GRACEFUL_S
        config.errorlog = _quiet_log()
        config.accesslog = None
        config.include_server_header = False
        host, port = sock.getsockname()[:2]
        if settings.rtt_ms > 0:
            target = Target(host, port, "", "")
            proxy = DelayProxy(target, settings.rtt_ms, host=settings.host, port=settings.port)
            await proxy.start()
            port = proxy.port
        loop = asyncio.get_running_loop()
        remove_signals = False
        if shutdown is None:
            shutdown = asyncio.Event()
            remove_signals = _install_signals(loop, shutdown)
        info = Listening(
            host, port, "https" if tls else "http", tls.trust_path if tls else None, settings.rtt_ms
        )
        if on_listening is not None:
            on_listening(info)
        app = ServerApp(settings, registry)

        async def stopping() -> None:
            await shutdown.wait()
            app.hurry()
            loop.set_exception_handler(_drop_cancelled_noise(loop.get_exception_handler()))

        previous_handler = loop.get_exception_handler()
        try:
            # ServerApp speaks ASGI 3 with plain dicts; hypercorn types its messages as TypedDicts.
            asgi = app if metrics is None else metrics.wrap(app)
            await hypercorn_serve(cast("ASGIFramework", asgi), config, shutdown_trigger=stopping, mode="asgi")
        finally:
            await app.aclose()
            loop.set_exception_handler(previous_handler)
            if remove_signals:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(sig)
    finally:
        if proxy is not None:
            await proxy.aclose()
        if sock is not None:
            sock.close()  # hypercorn closed it already unless it failed before serving; closing twice is fine
        if tls is not None:
            tls.cleanup()


def _bind(host: str, port: int, registry: ConnectionRegistry) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise LLMChatError(f"cannot listen on {host}: {exc.strerror}; use --host 127.0.0.1") from None
    family, _, proto, _, address = infos[0]
    sock = TrackingSocket(family, socket.SOCK_STREAM, proto)
    sock.registry = registry
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(1024)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise LLMChatError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}; "
            "pick another --port, or --port 0 for a free one"
        ) from None
    return sock


def _drop_cancelled_noise(previous: Handler | None) -> Handler:
    """An exception handler that drops the CancelledError asyncio.streams reports for a connection task that
    hypercorn cancels at the end of its graceful period (Python 3.11 logs it with a traceback; 3.12 does not),
    and passes everything else on."""

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if isinstance(context.get("exception"), asyncio.CancelledError):
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    return handler


def _install_signals(loop: asyncio.AbstractEventLoop, shutdown: asyncio.Event) -> bool:
    if threading.current_thread() is not threading.main_thread():
        return False
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, shutdown.set)
    return True


def _quiet_log() -> logging.Logger:
    # hypercorn logs "Running on ..." at info and client mishaps at warning; our ready line says the first,
    # and the second are the faults this server makes on purpose. Real errors still show.
    # No handler of our own: with none configured, logging's last resort writes to the current sys.stderr.
    log = logging.getLogger("llmchat.server.hypercorn")
    log.setLevel(logging.ERROR)
    return log


class RunningServer:
    """A server on its own event loop in a daemon thread. Use as a context manager, or call ``close``."""

    def __init__(self, settings: ServerSettings, metrics: ServerMetrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self._info: Listening | None = None
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._shutdown: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="llmchat-server", daemon=True)

    @property
    def host(self) -> str:
        return self._listening.host

    @property
    def port(self) -> int:
        return self._listening.port

    @property
    def scheme(self) -> str:
        return self._listening.scheme

    @property
    def url(self) -> str:
        """The server's root, e.g. ``http://127.0.0.1:PORT``."""
        return self._listening.url

    @property
    def base_url(self) -> str:
        """The API root a client is given, e.g. ``http://127.0.0.1:PORT/v1``."""
        return self._listening.url + "/v1"

    @property
    def cert_path(self) -> str | None:
        """The PEM file to pass as ``verify=`` when TLS is on; None for plain http."""
        return self._listening.cert_path

    @property
    def _listening(self) -> Listening:
        assert self._info is not None, "the server has not started"
        return self._info

    def _start(self, timeout: float) -> None:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise LLMChatError(f"the local server did not start within {timeout:g} s; see stderr for why")
        if self._error is not None:
            self._thread.join(timeout)
            raise self._error

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # handed to the starting thread (or dropped after close)
            self._error = exc
        finally:
            self._ready.set()

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._shutdown = asyncio.Event()

        def listening(info: Listening) -> None:
            self._info = info
            self._ready.set()

        await _serve(self.settings, on_listening=listening, shutdown=self._shutdown, metrics=self.metrics)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the server and join its thread, waiting at most ``timeout`` seconds. Safe to call twice."""
        loop, shutdown = self._loop, self._shutdown
        if loop is not None and shutdown is not None and self._thread.is_alive():
            try:
                loop.call_soon_threadsafe(shutdown.set)
            except RuntimeError:  # the loop already closed
                pass
        if self._thread.ident is not None:
            self._thread.join(timeout)

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def start_in_thread(
    settings: ServerSettings, *, timeout: float = 30.0, metrics: ServerMetrics | None = None
) -> RunningServer:
    """Start a server on its own event loop in a daemon thread; return once it listens. ``metrics`` counts
    its requests (serve them with ``llmchat.core.observe._prometheus.MetricsServer(metrics.registry, port)``).

    Raises what ``serve`` raises (UsageError, LLMChatError), or LLMChatError if it is not listening within
    ``timeout`` seconds.
    """
    server = RunningServer(settings, metrics)
    server._start(timeout)
    return server
