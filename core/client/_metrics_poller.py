"""Scraping a provider's ``/metrics`` beside the requests, never in their way.

``ServerMetricsPoller`` GETs ``providers.NAME.metrics_url`` (vLLM, llama.cpp ``--metrics``, llmchat serve's
``/metrics``) and hands each snapshot (``parse_server_metrics``: requests waiting and running, KV cache use)
to three places:

- every request of that provider in flight on a bus it watches carries one (``TimingRecord.server_metrics``,
  which ``attribute`` reads for the saturation flag): the busiest taken while it was in flight (most
  requests waiting, the latest among equals). Not simply the latest: a request that queued on the server
  ends after the queue drained, so the latest snapshot of its life would hide the very wait it sat in. Until
  one comes in flight, a request carries the latest from before its start, if that is fresh (no older than
  ``interval_s`` plus the timeout);
- each watched bus gets a ``ServerMetricsSampled`` event (the HUD's line, the Prometheus gauges);
- ``on_snapshot`` (``llmchat bench``'s per-configuration figures).

Two cadences: ``start()`` scrapes every ``interval_s`` (the app, ``llmchat bench``) on a schedule that never
drifts; ``per_request`` scrapes once beside each request of the provider (``llmchat ask``): once the request
is on the wire, so concurrent with it (never before it) and out of the way of its sending, and
``settle(record)`` waits (bounded by the timeout) for that one snapshot.

Never in the request's way: the poller has its own HTTP/1.1 connection (kept open between scrapes), never
the client's pool (so a scrape never takes a connection a request would have reused) and never its API key.
A scrape is bounded by ``timeout_s``; a failure is one warning for the poller's life (later ones only change
``last_error`` and the events), never an exception into a request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import llmchat.core.errors as errors
from llmchat.core.client._server_metrics import fetch_server_metrics, metrics_transport, metrics_url_of
from llmchat.core.config import HttpSettings
from llmchat.core.http import Transport
from llmchat.core.observe import (
    Bus,
    RequestDone,
    RequestStarted,
    ServerMetricsSampled,
    TimingRecord,
    percentile,
)

if TYPE_CHECKING:
    from llmchat.core.client._client import ChatClient

log = logging.getLogger("llmchat.metrics")

TIMEOUT_S = 2.0


class ServerMetricsPoller:
    """Scrapes ``url`` for the requests of ``provider``; see the module docstring. Close it with ``aclose``.

    ``interval_s``: seconds between scrapes once ``start()``ed (positive, else ValueError); ``timeout_s``: the
    bound of one scrape; ``per_request``: scrape once beside each request instead of (or besides) the cadence.
    """

    def __init__(
        self,
        url: str,
        provider: str,
        *,
        interval_s: float = 2.0,
        timeout_s: float = TIMEOUT_S,
        per_request: bool = False,
        on_snapshot: Callable[[Mapping[str, float] | None], object] | None = None,
        http: HttpSettings | None = None,
    ) -> None:
        if not interval_s > 0 or not timeout_s > 0:
            raise ValueError("interval_s and timeout_s must be positive")
        self.url = url
        self.provider = provider
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.per_request = per_request
        self.on_snapshot = on_snapshot
        self.http = http
        """The provider's HTTP settings, for verifying an https:// metrics URL (never its key or headers)."""
        self.latest: dict[str, float] | None = None
        """The last snapshot that came back; None before the first."""
        self.latest_ns: int | None = None
        """When it came back (perf_counter_ns)."""
        self.scrapes = 0
        self.failures = 0
        self.last_error: str | None = None
        """Why the last scrape failed; None once one succeeds again."""
        self._buses: list[Bus] = []
        self._offs: list[Callable[[], None]] = []
        self._live: dict[int, TimingRecord] = {}
        self._provisional: set[int] = set()  # live records still carrying a snapshot from before their start
        self._beside: dict[int, asyncio.Task[dict[str, float] | None]] = {}
        self._transport: Transport | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._warned = False
        self._closed = False

    @classmethod
    def for_client(
        cls,
        client: ChatClient,
        *,
        per_request: bool = False,
        on_snapshot: Callable[[Mapping[str, float] | None], object] | None = None,
    ) -> ServerMetricsPoller | None:
        """A poller of the client's ``providers.NAME.metrics_url`` every ``metrics_interval_s``, verifying an
        https:// URL as the provider's ``http`` settings say, watching the client's bus; None when the
        provider names no metrics URL."""
        url = metrics_url_of(client)
        if not url:
            return None
        interval = client.settings.providers[client.endpoint.name].metrics_interval_s
        poller = cls(url, client.endpoint.name, interval_s=interval, per_request=per_request,
                     on_snapshot=on_snapshot, http=client.endpoint.http)
        poller.watch(client.bus)
        return poller

    # -- wiring --------------------------------------------------------------------------------------------
    def watch(self, bus: Bus) -> None:
        """Stamp the provider's requests on ``bus`` and publish each snapshot there (until ``aclose``). A bus
        already watched is left as it is."""
        if any(b is bus for b in self._buses):
            return
        self._buses.append(bus)
        self._offs.append(bus.subscribe(RequestStarted, self._on_started))
        self._offs.append(bus.subscribe(RequestDone, self._on_done))

    def _on_started(self, event: RequestStarted) -> None:
        record = event.record
        if record.provider != self.provider or self._closed:
            return
        self._live[id(record)] = record
        fresh_ns = (self.interval_s + self.timeout_s) * 1e9
        if self.latest is not None and self.latest_ns is not None and (
            time.perf_counter_ns() - self.latest_ns <= fresh_ns
        ):
            record.server_metrics = self.latest
            self._provisional.add(id(record))
        if self.per_request and id(record) not in self._beside:
            # A task, so the scrape runs beside the request: this callback runs before the request is sent.
            self._beside[id(record)] = asyncio.get_running_loop().create_task(self._scrape_beside(record))

    def _on_done(self, event: RequestDone) -> None:
        self._live.pop(id(event.record), None)
        self._provisional.discard(id(event.record))

    # -- scraping ------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Scrape every ``interval_s`` from now on, on the running loop, until ``aclose``."""
        if self._loop_task is None and not self._closed:
            self._loop_task = asyncio.get_running_loop().create_task(self._every())

    async def _every(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            await self.scrape()
            due += self.interval_s
            now = loop.time()
            if due < now:  # a scrape that took longer than the interval: the next one is due now, not late
                due = now
            await asyncio.sleep(due - now)

    async def _scrape_beside(self, record: TimingRecord) -> dict[str, float] | None:
        """One scrape once ``record``'s request is on the wire (or over, or ``timeout_s`` on): its work (a new
        connection, the parse) then overlaps the server's time to answer, never the client's own sending.
        Started with the request, it cost a 20 ms local request 10 ms (benchmarks/server_metrics.py)."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.timeout_s
        wait = 0.001
        # A few wake-ups, doubling: sending takes a connect and a write, so this ends within twice that.
        while record.phases.send_end_ns is None and record.end_ns is None and loop.time() < give_up:
            await asyncio.sleep(wait)
            wait = min(wait * 2, 0.1)
        return await self.scrape()

    async def scrape(self) -> dict[str, float] | None:
        """One snapshot, handed on as the module docstring says; None (and ``last_error``) when it failed.
        Never raises but CancelledError."""
        try:
            if self._transport is None:
                self._transport = metrics_transport(self.url, self.http)
            snapshot = await fetch_server_metrics(self._transport, self.url, timeout_s=self.timeout_s)
        except errors.LLMChatError as exc:
            self._failed(str(exc))
            return None
        except Exception as exc:  # a scrape is a hint: nothing it does may break the app or a request
            self._failed(f"{type(exc).__name__}: {exc}")
            return None
        self.scrapes += 1
        self.latest, self.latest_ns, self.last_error = snapshot, time.perf_counter_ns(), None
        waiting = snapshot.get("requests_waiting", 0.0)
        for key, record in self._live.items():
            held = record.server_metrics
            if held is None or key in self._provisional or waiting >= held.get("requests_waiting", 0.0):
                record.server_metrics = snapshot
        self._provisional.clear()
        self._publish(ServerMetricsSampled(self.provider, snapshot))
        return snapshot

    def _failed(self, error: str) -> None:
        self.failures += 1
        self.last_error = error
        if not self._warned:
            self._warned = True
            log.warning("%s metrics: %s; requests go on without them", self.provider, error)
        self._publish(ServerMetricsSampled(self.provider, None, error))

    def _publish(self, event: ServerMetricsSampled) -> None:
        for bus in self._buses:
            bus.publish(event)
        if self.on_snapshot is not None:
            self.on_snapshot(event.metrics)

    async def settle(self, record: TimingRecord) -> dict[str, float] | None:
        """Wait for the scrape taken beside ``record`` (``per_request``; bounded by the timeout) and give
        ``record`` its snapshot if the request ended first. Returns what the record carries."""
        task = self._beside.pop(id(record), None)
        if task is not None:
            snapshot = await task
            if record.server_metrics is None and snapshot is not None:
                record.server_metrics = snapshot
        return record.server_metrics

    async def aclose(self) -> None:
        """Stop scraping, let a scrape beside a request end (bounded), close the connection. Safe twice."""
        self._closed = True
        for off in self._offs:
            off()
        self._offs.clear()
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
            self._loop_task = None
        beside = list(self._beside.values())
        self._beside.clear()
        if beside:
            await asyncio.gather(*beside, return_exceptions=True)
        transport, self._transport = self._transport, None
        if transport is not None:
            await transport.aclose()


@dataclass(frozen=True, slots=True)
class SnapshotFigures:
    """Figures over a run's snapshots: how many answered and failed, p50 and max of requests waiting and
    running, the fullest KV cache (None where no snapshot had the gauge)."""

    snapshots: int
    failed: int
    waiting_p50: float | None
    waiting_max: float | None
    running_p50: float | None
    running_max: float | None
    kv_cache_usage_max: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "snapshots": self.snapshots,
            "failed": self.failed,
            "requests_waiting": {"p50": self.waiting_p50, "max": self.waiting_max},
            "requests_running": {"p50": self.running_p50, "max": self.running_max},
            "kv_cache_usage_max": self.kv_cache_usage_max,
        }


def summarize_snapshots(snapshots: Sequence[Mapping[str, float] | None]) -> SnapshotFigures:
    """``SnapshotFigures`` of ``snapshots`` (None for a failed scrape)."""
    ok = [s for s in snapshots if s is not None]

    def values(key: str) -> list[float]:
        return [s[key] for s in ok if key in s]

    waiting, running, kv = values("requests_waiting"), values("requests_running"), values("kv_cache_usage")
    return SnapshotFigures(
        snapshots=len(ok),
        failed=len(snapshots) - len(ok),
        waiting_p50=percentile(waiting, 50),
        waiting_max=max(waiting, default=None),
        running_p50=percentile(running, 50),
        running_max=max(running, default=None),
        kv_cache_usage_max=max(kv, default=None),
    )
