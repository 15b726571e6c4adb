"""Warm connections: open the pool before the first prompt, and keep it open while the user reads.

A new TCP (and TLS) connection costs one to three round trips before the first byte of a prompt can go out;
``Warmer`` pays that before the user sends anything (GET /models), then pings while idle so the pooled
connection never expires (``http.keepalive_ping_s``, below the server's and our keep-alive expiry). States,
published on the bus as ``WarmupState``: cold -> warming -> warm, or failed (a warning, never an error).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from llmchat.core._bus import RequestDone, RequestStarted, WarmupState
from llmchat.core._errors import LLMChatError

if TYPE_CHECKING:
    from llmchat.core._client import ChatClient

log = logging.getLogger("llmchat.warmup")


class Warmer:
    """Warms ``client``'s connection and keeps it warm. ``start()`` runs it in the background."""

    def __init__(self, client: ChatClient, *, ping_s: float | None = None) -> None:
        self.client = client
        self.ping_s = client.endpoint.http.keepalive_ping_s if ping_s is None else ping_s
        self.state = "cold"
        self.rtt_ms: float | None = None
        self.error: str | None = None
        self._warned = False
        self._last_activity = time.monotonic()
        self._task: asyncio.Task[None] | None = None
        self._unsubs = [
            client.bus.subscribe(RequestStarted, self._touch),
            client.bus.subscribe(RequestDone, self._touch),
        ]

    def _touch(self, _event: object) -> None:
        self._last_activity = time.monotonic()

    def _set(self, state: str) -> None:
        self.state = state
        self.client.bus.publish(WarmupState(self.client.endpoint.name, state, self.rtt_ms, self.error))

    async def warm(self) -> bool:
        """One round trip (GET /models) on the pool. Returns True when it answered.

        Never raises for a provider that cannot be reached or refuses: the state becomes ``failed``, ``error``
        says why, and one warning is logged (repeats while it stays down go to debug).
        """
        if self.state != "warm":
            self._set("warming")
        t0 = time.perf_counter_ns()
        try:
            await self.client.models()
        except LLMChatError as exc:  # APIError, or a ConfigError for a base_url that is not http(s)
            self.error = str(exc)
            # One warning when warm-up goes wrong, not one per ping while the provider stays down.
            log.log(logging.DEBUG if self._warned else logging.WARNING,
                    "warm-up of %s failed: %s", self.client.endpoint.name, exc)
            self._warned = True
            self._set("failed")
            return False
        self.rtt_ms = (time.perf_counter_ns() - t0) / 1e6
        self.error = None
        self._warned = False
        self._set("warm")
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
