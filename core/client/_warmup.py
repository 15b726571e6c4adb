"""Warm connections: open the pool before the first prompt, and keep it open while the user reads.

A new TCP (and TLS) connection costs one to three round trips before the first byte of a prompt can go out;
``Warmer`` pays that before the user sends anything (GET /models), then pings while idle so the pooled
connection never expires (``http.keepalive_ping_s``, below the server's and our keep-alive expiry). States,
published on the bus as ``WarmupState``: cold -> warming -> warm, or failed (a warning, never an error).

Two figures, kept apart: ``setup_ms``, what opening the connection cost (TCP connect and TLS, from the
request's own phases), and ``rtt_ms``, the ping, a round trip on the open connection. The GET that opens the
connection is not a ping: besides the setup it pays the server's first answer and whatever the app is doing
while it starts, so when a GET had to open a connection a second one, on the connection now open, is the ping.

A request that got a reply from this provider shows the connection works: the state becomes ``warm`` again
(after a failed ping, the HUD and ``llmchat_warmup_state`` would otherwise say ``failed`` while requests
succeed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from llmchat.core.errors import LLMChatError
from llmchat.core.observe import Phases, RequestDone, RequestStarted, WarmupState, failed

if TYPE_CHECKING:
    from llmchat.core.client._client import ChatClient

log = logging.getLogger("llmchat.warmup")


class Warmer:
    """Warms ``client``'s connection and keeps it warm. ``start()`` runs it in the background."""

    def __init__(self, client: ChatClient, *, ping_s: float | None = None) -> None:
        self.client = client
        self.ping_s = client.endpoint.http.keepalive_ping_s if ping_s is None else ping_s
        self.state = "cold"
        self.rtt_ms: float | None = None
        """The last ping: a round trip on the open connection."""
        self.setup_ms: float | None = None
        """What the last connection warm-up opened cost: TCP connect plus TLS."""
        self.error: str | None = None
        self._warned = False
        self._last_activity = time.monotonic()
        self._task: asyncio.Task[None] | None = None
        self._unsubs = [
            client.bus.subscribe(RequestStarted, self._touch),
            client.bus.subscribe(RequestDone, self._on_done),
        ]

    def _touch(self, _event: object) -> None:
        self._last_activity = time.monotonic()

    def _on_done(self, event: RequestDone) -> None:
        self._touch(event)
        record = event.record
        if (self.state != "warm" and record.provider == self.client.endpoint.name and not record.cancelled
                and not record.cache_hit and not failed(record)):
            self.error = None
            self._warned = False
            # A reply came from the provider: the connection works, whatever the last ping said.
            self._set("warm")

    def _set(self, state: str, setup_ms: float | None = None) -> None:
        self.state = state
        self.client.bus.publish(
            WarmupState(self.client.endpoint.name, state, self.rtt_ms, self.error, setup_ms)
        )

    async def _get(self) -> tuple[float, float | None]:
        """One GET /models: its round trip in ms, and the setup (connect + TLS) of a connection it opened."""
        phases = Phases()
        t0 = time.perf_counter_ns()
        await self.client.models(phases=phases)
        took = (time.perf_counter_ns() - t0) / 1e6
        if phases.reused:
            return took, None
        setup = 0
        for start, end in ((phases.connect_start_ns, phases.connect_end_ns),
                           (phases.tls_start_ns, phases.tls_end_ns)):
            if start is not None and end is not None:
                setup += end - start
        return took, setup / 1e6

    async def warm(self) -> bool:
        """Make sure the pool holds an open connection, and ping on it (GET /models). Returns True when it
        answered.

        When the GET had to open a connection, ``setup_ms`` is its connect and TLS, and a second GET on the
        open connection is the ping (``rtt_ms``). Never raises for a provider that cannot be reached or
        refuses: the state becomes ``failed``, ``error`` says why, and one warning is logged (repeats while it
        stays down go to debug).
        """
        if self.state != "warm":
            self._set("warming")
        try:
            took, setup = await self._get()
            if setup is not None:
                took, _ = await self._get()
        except LLMChatError as exc:  # APIError, or a ConfigError for a base_url that is not http(s)
            self.error = str(exc)
            # One warning when warm-up goes wrong, not one per ping while the provider stays down.
            log.log(logging.DEBUG if self._warned else logging.WARNING,
                    "warm-up of %s failed: %s", self.client.endpoint.name, exc)
            self._warned = True
            self._set("failed")
            return False
        self.rtt_ms = took
        if setup is not None:
            self.setup_ms = setup
        self.error = None
        self._warned = False
        self._set("warm", setup)
        return True

    def start(self) -> None:
        """Warm now and, when ``ping_s`` > 0, ping whenever the connection has been idle that long."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        await self.warm()
        if self.ping_s <= 0:
            return
        while True:
            idle = time.monotonic() - self._last_activity
            if idle < self.ping_s:
                await asyncio.sleep(self.ping_s - idle)
                continue
            await self.warm()
            self._last_activity = time.monotonic()

    async def aclose(self) -> None:
        for unsub in self._unsubs:
            unsub()
        self._unsubs = []
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
