"""What a face holds, for one run, to tell the server's side truly: cold starts and server metrics.

``ServerSignals`` bundles the two things a single process cannot know alone:

- the cold-start baselines of earlier processes: a ``BaselineStore`` (the XDG state folder) loaded at
  ``open()`` into its ``detector`` (and any other detector given to ``seed``), and saved from it at
  ``aclose()``, both in the default executor, never on the event loop;
- the provider's own ``/metrics``: ``follow(client)`` starts a ``ServerMetricsPoller`` for a provider with a
  ``metrics_url`` (once per provider), on a cadence, or beside each request with ``per_request``.

The caller owns it and closes it: nothing here is module-global.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmchat.core.client._metrics_poller import ServerMetricsPoller
from llmchat.core.config import Settings
from llmchat.core.observe import (
    Attribution,
    Baseline,
    BaselineStore,
    ColdStartDetector,
    TimingRecord,
    attribute,
)

if TYPE_CHECKING:
    from llmchat.core.client._client import ChatClient


class ServerSignals:
    """Baselines in and out of ``store`` through ``detector``, and a metrics poller per provider followed.

    ``detector``: the detector whose windows are saved (default: a new ``ColdStartDetector``); ``store``:
    where (default: ``BaselineStore()``); ``per_request``: pollers scrape once beside each request
    (``llmchat ask``) instead of every ``metrics_interval_s``.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        detector: ColdStartDetector | None = None,
        store: BaselineStore | None = None,
        per_request: bool = False,
    ) -> None:
        self.settings = settings
        self.detector = detector if detector is not None else ColdStartDetector()
        self.store = store if store is not None else BaselineStore()
        self.per_request = per_request
        self.baselines: list[Baseline] = []
        """What ``open()`` loaded: seed other detectors with it (``seed``, ``attach_observers``)."""
        self.pollers: dict[str, ServerMetricsPoller] = {}

    async def open(self) -> ServerSignals:
        """Load the baselines (in the executor) and seed ``detector``; returns self. Never raises."""
        self.baselines = await self.store.aload()
        self.detector.seed(self.baselines)
        return self

    def seed(self, detector: ColdStartDetector) -> None:
        """Seed another detector (the exporter's, say) with what ``open()`` loaded."""
        detector.seed(self.baselines)

    def follow(self, client: ChatClient) -> ServerMetricsPoller | None:
        """Scrape the metrics of ``client``'s provider from now on, stamping its requests on ``client.bus``;
        None when the provider names no ``metrics_url``. A provider already followed keeps its poller."""
        name = client.endpoint.name
        if name in self.pollers:
            return self.pollers[name]
        poller = ServerMetricsPoller.for_client(client, per_request=self.per_request)
        if poller is None:
            return None
        self.pollers[name] = poller
        if not self.per_request:
            poller.start()
        return poller

    async def attribute(self, record: TimingRecord) -> Attribution:
        """``record``'s attribution with ``detector``, after the snapshot taken beside it came (bounded by the
        scrape's timeout). Call once per record, in the order they finished."""
        poller = self.pollers.get(record.provider)
        if poller is not None:
            await poller.settle(record)
        return attribute(record, detector=self.detector)

    async def aclose(self) -> None:
        """Stop every poller and save the detector's baselines (in the executor). Never raises."""
        for poller in self.pollers.values():
            await poller.aclose()
        self.pollers.clear()
        await self.store.asave(self.detector.baselines())
