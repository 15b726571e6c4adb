"""The metrics pipeline behind the HUD: rolling windows, percentiles, counters, cost and render lag.

Pure (no Textual), so it can be tested and benchmarked alone. ``Metrics.subscribe(bus)`` wires it to the
engine's bus; the chat view reports render lag with ``observe_render_lag``. Readers (the HUD) poll it on
their own timer and use the ``*_version`` counters to repaint only what changed; ``add_listener`` tells them
when something did, so an idle reader needs no timer at all.

What goes where:

- The latency windows (ttfb, ttft, total, tokens_per_s) hold the last ``window`` requests that got a reply
  from the network: errors, cancels and cache hits are counted, not charted, since a 2 ms cache hit or a
  refused connection would pull the percentiles away from what the provider does. TTFT is stream mode only.
- ``requests`` counts finished requests (any outcome); ``in_flight`` is started and not yet finished.
- A cancelled request counts in ``cancelled``, never in ``errors``: the user chose it.
- ``errors`` counts every other request that ended without a reply (``failed``): an error the client named
  (``error_kind``, refused connections and bad URLs before any connection opened among them) and one that
  ended with no response and no error at all, as ``no_reply``. None of them is charted.
- Cache hits and misses count real lookups only (``record.cache_lookup``), as Prometheus does: a streamed
  request does not look in the cache unless ``cache.replay_streams`` is on, so it is neither.
- Attribution (where a request's time went, ``_attribution.attribute``) is computed once per finished
  request, never per chunk, with a ``ColdStartDetector`` this pipeline owns (it sees every finished request,
  in order). ``last_attribution`` is the last request's, whatever its outcome; ``attribution_shares()``
  splits the requests of the latency windows (same rule: no errors, cancels or cache hits). Both are read
  through ``shown_groups``: a routine clock overlap (``is_routine_overlap``) is folded into the server's
  figure, so the last request and the window's shares are split by the same rule. The slowest
  frame painted since that request's turn began is its render lag, in ``last_attribution.after``, outside
  its total.
- ``headroom(provider)``: the provider's rate-limit headroom as its last reply's x-ratelimit-* headers said
  (``headroom_version``); ``pending_hold``: the client's own limiter holding a request back, while it does.
- Cost is also kept per mode (``cost_by_mode``: stream and batch), for the session's cost of each.
- ``server_state(provider)``: the provider's own /metrics as last scraped (``ServerMetricsSampled`` from a
  ``ServerMetricsPoller``): requests waiting and running, KV cache use, or why the scrape failed.

Nothing happens per chunk by default: the stall check reads the last-token stamp of the requests in flight,
and chunks are counted from each finished record. ``subscribe(bus, chunks=True)`` counts them live instead,
a counter and a timestamp per chunk (``observe_chunk``).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from llmchat.core.observe._attribution import GROUPS, RENDER_LAG, Attribution, attribute, shown_groups
from llmchat.core.observe._bus import (
    Bus,
    Chunk,
    FirstToken,
    RateLimitHeld,
    RequestDone,
    RequestStarted,
    RetryPlanned,
    ServerMetricsSampled,
    WarmupState,
)
from llmchat.core.observe._coldstart import ColdStartDetector
from llmchat.core.observe._timing import Headroom, TimingRecord

Series = Literal["ttfb", "ttft", "total", "tokens_per_s", "render_lag"]

#: The request series, in the order the HUD charts them.
REQUEST_SERIES: tuple[Series, ...] = ("ttfb", "ttft", "total", "tokens_per_s")

_NS_PER_S = 1_000_000_000


class Percentiles(NamedTuple):
    """p50, p95 and p99 of one window, by linear interpolation between closest ranks; None when empty."""

    p50: float | None
    p95: float | None
    p99: float | None


_NO_PERCENTILES = Percentiles(None, None, None)


class Spread(NamedTuple):
    """One window at a glance: how many values, the smallest, the percentiles and the largest. The figures
    are None when the window is empty; a reader decides which of them ``n`` values support."""

    n: int
    min: float | None
    p50: float | None
    p95: float | None
    p99: float | None
    max: float | None


_NO_SPREAD = Spread(0, None, None, None, None, None)


class Price(NamedTuple):
    """What a model costs, in currency units per million tokens."""

    input_per_mtok: float
    output_per_mtok: float

    def cost(self, prompt_tokens: float, output_tokens: float) -> float:
        """What that many tokens in and out cost at this price."""
        return (prompt_tokens * self.input_per_mtok + output_tokens * self.output_per_mtok) / 1_000_000


@dataclass(frozen=True, slots=True)
class ConnectionState:
    """The provider connection as warm-up last reported it: cold, warming, warm or failed; ``setup_ms`` is
    what opening it cost (TCP connect and TLS), ``rtt_ms`` the last ping (a round trip on the open
    connection)."""

    provider: str = ""
    state: str = "cold"
    rtt_ms: float | None = None
    error: str | None = None
    setup_ms: float | None = None


@dataclass(frozen=True, slots=True)
class ServerState:
    """A provider's /metrics as last scraped: the gauges (``parse_server_metrics``'s keys), or None and the
    error when the last scrape failed (``last_good`` keeps the gauges from before)."""

    provider: str
    metrics: Mapping[str, float] | None
    error: str | None = None
    last_good: Mapping[str, float] | None = None


def prices_from_settings(table: Mapping[str, Mapping[str, float]]) -> dict[str, Price]:
    """``ui.prices`` (model -> {input_per_mtok, output_per_mtok}) as ``Price`` tuples; a missing side is 0.

    Never fails on a validated table; the config loader has already rejected unknown keys and negatives.
    """
    return {
        model: Price(float(p.get("input_per_mtok", 0.0)), float(p.get("output_per_mtok", 0.0)))
        for model, p in table.items()
    }


def _spread(ordered: list[float]) -> Spread:
    if not ordered:
        return _NO_SPREAD
    last = len(ordered) - 1

    def at(q: float) -> float:
        pos = last * q
        lo = int(pos)
        hi = lo + 1 if lo < last else lo
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)

    return Spread(len(ordered), ordered[0], at(0.50), at(0.95), at(0.99), ordered[-1])


def failed(record: TimingRecord) -> bool:
    """Whether a finished request failed: not cancelled, and an error, or no response and no cache hit (a
    bad base_url or an empty model list raise before any response, without an error kind on the record)."""
    if record.cancelled:
        return False
    if record.error is not None or record.error_kind is not None:
        return True
    return record.status is None and not record.cache_hit


def failure_kind(record: TimingRecord) -> str:
    """The kind ``errors`` counts a failed request under: its error kind, else "error" or "no_reply"."""
    if record.error_kind is not None:
        return record.error_kind
    return "error" if record.error is not None else "no_reply"


class Metrics:
    """Rolling figures over the last ``window`` requests, fed by ``observe_*`` calls or by ``subscribe(bus)``.

    Cheap to feed: an observation appends to deques and bumps counters; percentiles are sorted lazily, once
    per change, when someone asks. Not thread-safe: feed and read it from one event loop.
    """

    def __init__(
        self,
        window: int = 60,
        *,
        prices: Mapping[str, Price | tuple[float, float]] | None = None,
        render_window: int = 240,
        detector: ColdStartDetector | None = None,
    ) -> None:
        """``window`` must be positive (ValueError otherwise); ``render_window`` is how many render-lag
        samples are kept (one per painted frame, so more than requests); ``detector`` flags cold starts in the
        attributions (a default ``ColdStartDetector()`` when not given)."""
        if window < 1 or render_window < 1:
            raise ValueError("Metrics windows must hold at least one value")
        self.window = window
        self.prices: dict[str, Price] = {m: Price(*p) for m, p in (prices or {}).items()}
        self._windows: dict[Series, deque[float]] = {name: deque(maxlen=window) for name in REQUEST_SERIES}
        self._windows["render_lag"] = deque(maxlen=render_window)
        self._spread: dict[Series, Spread] = {}
        self._pct: dict[Series, Percentiles] = {}
        self._replies: deque[TimingRecord] = deque(maxlen=window)
        self._live: dict[int, TimingRecord] = {}
        self._listeners: list[Callable[[], None]] = []
        self._retry: tuple[TimingRecord, object, Any, int] | None = None
        self._hold: tuple[TimingRecord, object, Any, int] | None = None
        self._headroom: dict[str, Headroom] = {}
        self._chunks_live = False  # True while Chunk events are counted as they come (subscribe(chunks=True))
        self.detector = detector if detector is not None else ColdStartDetector()
        # Each with its group_ms(), made once: summing a dozen parts into groups for 60 requests on every
        # finished request cost ~0.7 ms of the HUD's frame.
        self._attributions: deque[tuple[Attribution, dict[str, float]]] = deque(maxlen=window)
        self._shares: dict[str, float] | None = None
        self._turn_lag_ms: float | None = None  # the slowest frame since the current turn's first request

        self.started = 0
        self.requests = 0
        self.errors: Counter[str] = Counter()
        self.cancelled = 0
        self.retries = 0
        self.cache_hits = 0
        self.cache_misses = 0
        self.chunks = 0
        self.last_chunk_ns: int | None = None
        self.last: TimingRecord | None = None
        self.last_attribution: Attribution | None = None
        """Where the last finished request's time went (any outcome); None before the first."""
        self.last_groups: dict[str, float] = {}
        """``shown_groups`` of ``last_attribution``."""
        self.cost_total: float | None = None
        self.cost_last: float | None = None
        self.cost_unknown = 0
        self.cost_by_mode: dict[str, float] = {}
        """The priced requests' cost per mode ("stream", "batch"), for the session's cost of each."""
        self.holds = 0
        """Requests the client's own rate limiter held back."""
        self.connection = ConnectionState()
        self._server: dict[str, ServerState] = {}

        # What changed, for readers that repaint only their part: requests (start, retry, first token, done),
        # done (windows, last record, cost), connection, render lag.
        self.requests_version = 0
        self.done_version = 0
        self.connection_version = 0
        self.render_version = 0
        self.server_version = 0
        self.headroom_version = 0

    # -- reading -------------------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        """Grows with every observation but chunks: a reader that saw this value has seen everything."""
        return (self.requests_version + self.connection_version + self.render_version + self.server_version
                + self.headroom_version)

    @property
    def in_flight(self) -> int:
        """Requests started and not finished."""
        return len(self._live)

    @property
    def error_count(self) -> int:
        """Finished requests that failed (``failed``; cancels are not failures)."""
        return sum(self.errors.values())

    @property
    def hit_ratio(self) -> float | None:
        """Cache hits over lookups, 0..1; None before the first lookup."""
        seen = self.cache_hits + self.cache_misses
        return None if seen == 0 else self.cache_hits / seen

    @property
    def replies(self) -> list[TimingRecord]:
        """The records behind the latency windows (replies from the network), oldest first (a new list).
        ``series("total")`` is their totals in the same order."""
        return list(self._replies)

    def headroom(self, provider: str = "") -> Headroom | None:
        """``provider``'s rate-limit headroom from its last reply that sent x-ratelimit-* headers (any
        provider's last, without a name); None before one."""
        if provider:
            return self._headroom.get(provider)
        return next(reversed(self._headroom.values()), None)

    @property
    def pending_hold(self) -> str | None:
        """The live hold line ("client rate limit 1.2 s (requests)") while the client's own limiter holds a
        request back; None once its attempt went out."""
        if self._hold is None:
            return None
        record, phases, hold, _ = self._hold
        if record.phases is not phases or record.end_ns is not None:
            return None  # the attempt after the hold started (a new Phases), or the request ended
        return str(hold.describe())

    @property
    def pending_retry(self) -> str | None:
        """The live retry line ("retry 2/4 in 1.3 s (429, Retry-After)") while a retry is planned or its
        attempt is unanswered; None once the next attempt's first byte, first token or end came."""
        if self._retry is None:
            return None
        record, phases, event, _ = self._retry
        if record.phases is not phases and record.phases.headers_ns is not None:
            return None  # the attempt after the wait got its response headers
        return str(event.describe())

    @property
    def running(self) -> TimingRecord | None:
        """The request in flight that started last (its record fills in as it runs); None when none is."""
        return next(reversed(self._live.values()), None)

    def planned_retry(self, record: TimingRecord) -> tuple[Any, int] | None:
        """The retry last planned for ``record`` (a RetryEvent) and when it was planned (perf_counter_ns),
        until the request's first token or end; None when none is."""
        if self._retry is None or self._retry[0] is not record:
            return None
        return self._retry[2], self._retry[3]

    def planned_hold(self, record: TimingRecord) -> tuple[Any, int] | None:
        """The limiter's last hold of ``record`` (a Hold) and when it began (perf_counter_ns), until the
        request ends; None when there is none."""
        if self._hold is None or self._hold[0] is not record:
            return None
        return self._hold[2], self._hold[3]

    def series(self, name: Series) -> list[float]:
        """A new list of the window's values, oldest first (a new list, so a Sparkline sees a change)."""
        return list(self._windows[name])

    def spread(self, name: Series) -> Spread:
        """Count, min, p50/p95/p99 and max of one window; sorted once per change of that window. KeyError for
        an unknown name."""
        cached = self._spread.get(name)
        if cached is None:
            cached = self._spread[name] = _spread(sorted(self._windows[name]))
        return cached

    def percentiles(self, name: Series) -> Percentiles:
        """p50/p95/p99 of one window (``spread``'s), made once per change. KeyError for an unknown name."""
        cached = self._pct.get(name)
        if cached is None:
            spread = self.spread(name)
            cached = _NO_PERCENTILES if not spread.n else Percentiles(spread.p50, spread.p95, spread.p99)
            self._pct[name] = cached
        return cached

    def attribution_shares(self) -> dict[str, float]:
        """Each group's share of the summed totals of the windowed requests (replies from the network), in
        bar order, from their ``shown_groups``; {} before the first. Computed once per finished request, when
        asked."""
        if self._shares is None:
            # shares_over's figures, from the group sums kept with each attribution.
            totals: dict[str, float] = {}
            grand = 0.0
            for attribution, groups in self._attributions:
                grand += attribution.total_ms
                for group, ms in groups.items():
                    totals[group] = totals.get(group, 0.0) + ms
            self._shares = {} if grand <= 0 else {g: totals[g] / grand for g in GROUPS if g in totals}
        return self._shares

    @property
    def attributions(self) -> list[Attribution]:
        """The attributions behind ``attribution_shares``, oldest first (a new list)."""
        return [attribution for attribution, _ in self._attributions]

    @property
    def attribution_count(self) -> int:
        """How many attributions ``attribution_shares`` covers."""
        return len(self._attributions)

    def server_state(self, provider: str = "") -> ServerState | None:
        """The last scrape of ``provider``'s /metrics (or, for "", of whichever provider was scraped last);
        None before any."""
        if provider:
            return self._server.get(provider)
        return next(reversed(self._server.values()), None)

    def pending_since_ns(self) -> int | None:
        """The start (perf_counter_ns) of the oldest request in flight; None when none is."""
        if not self._live:
            return None
        return min(r.t0_ns for r in self._live.values())

    def last_activity_ns(self) -> int | None:
        """When a request in flight last showed life: its start, its latest chunk, or the end of a planned
        retry wait (which may lie ahead: a planned wait is not a stall). None when nothing is in flight."""
        if not self._live:
            return None
        # A reasoning model's thinking is life too: without it a long think would read as a stall.
        latest = max(max(r.last_token_ns or r.t0_ns, r.last_reasoning_ns or 0) for r in self._live.values())
        if self.last_chunk_ns is not None and self.last_chunk_ns > latest:
            latest = self.last_chunk_ns
        if self._retry is not None and id(self._retry[0]) in self._live:
            resume_ns = self._retry[3] + int(float(self._retry[2].wait_s) * _NS_PER_S)
            latest = max(latest, resume_ns)
        return latest

    # -- listening -----------------------------------------------------------------------------------------
    def add_listener(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` after every observation but chunks; returns the function that removes it.

        Callbacks run synchronously inside the observation (inside the bus publish), so keep them to
        marking something dirty.
        """
        self._listeners.append(callback)

        def remove() -> None:
            if callback in self._listeners:
                self._listeners.remove(callback)

        return remove

    def _changed(self) -> None:
        for callback in tuple(self._listeners):
            callback()

    def subscribe(self, bus: Bus, *, chunks: bool = False) -> Callable[[], None]:
        """Feed this pipeline from ``bus``; returns the function that unsubscribes all of it.

        ``chunks`` also counts each Chunk event as it comes. Off by default: nothing here needs it (a request
        in flight carries its own last-token stamp, and ``chunks`` is added up from each finished record), and
        while nobody listens to Chunk the client does not even build the per-token events.
        """
        offs = [
            bus.subscribe(RequestStarted, lambda e: self.observe_started(e.record)),
            bus.subscribe(RetryPlanned, lambda e: self.observe_retry(e.record, e.event)),
            bus.subscribe(RateLimitHeld, lambda e: self.observe_hold(e.record, e.hold)),
            bus.subscribe(FirstToken, lambda e: self.observe_first_token(e.record)),
            bus.subscribe(RequestDone, lambda e: self.observe_done(e.record)),
            bus.subscribe(WarmupState, self.observe_warmup),
            bus.subscribe(ServerMetricsSampled, self.observe_server_metrics),
        ]
        if chunks:
            offs.append(bus.subscribe(Chunk, self.observe_chunk))
        self._chunks_live = chunks

        def unsubscribe() -> None:
            for off in offs:
                off()

        return unsubscribe

    # -- observing ---------------------------------------------------------------------------------------
    def observe_started(self, record: TimingRecord) -> None:
        """A request went out: in flight until its ``observe_done``."""
        self.started += 1
        if not self._live:
            self._turn_lag_ms = None  # a new turn: its frames are the ones its attribution carries
        self._live[id(record)] = record
        self.requests_version += 1
        self._changed()

    def observe_retry(self, record: TimingRecord, event: Any) -> None:
        """A retry is planned (``event`` is a RetryEvent: ``describe()``, ``wait_s``): ``pending_retry``."""
        self.retries += 1
        self._retry = (record, record.phases, event, time.perf_counter_ns())
        self.requests_version += 1
        self._changed()

    def observe_hold(self, record: TimingRecord, hold: Any) -> None:
        """The client's limiter holds ``record`` back (``hold``: a Hold, ``describe()``): ``pending_hold``."""
        self.holds += 1
        self._hold = (record, record.phases, hold, time.perf_counter_ns())
        self.requests_version += 1
        self._changed()

    def observe_first_token(self, record: TimingRecord) -> None:
        """The first content token arrived: a retry of this request is over."""
        self._clear_retry(record)
        self.requests_version += 1
        self._changed()

    def observe_chunk(self, chunk: Chunk) -> None:
        """One content chunk: a counter and a timestamp, nothing else (this runs per token). Only for a
        pipeline fed chunk by chunk (``subscribe(bus, chunks=True)``); else finished records are counted."""
        self.chunks += 1
        self.last_chunk_ns = chunk.arrived_ns

    def observe_done(self, record: TimingRecord) -> None:
        """A request finished (reply, error or cancel): counters, windows, cost, ``last``."""
        self._live.pop(id(record), None)
        self._clear_retry(record)
        if not self._chunks_live:
            self.chunks += record.content_chunks
        self.requests += 1
        self.last = record
        # Once per request (~50 us), and the detector must see every finished record, in order.
        self.last_attribution = attribute(record, render_lag_ms=self._turn_lag_ms, detector=self.detector)
        self.last_groups = shown_groups(self.last_attribution)
        is_failure = failed(record)
        if record.cancelled:
            self.cancelled += 1
        elif is_failure:
            self.errors[failure_kind(record)] += 1
        if record.cache_lookup:
            if record.cache_hit:
                self.cache_hits += 1
            else:
                self.cache_misses += 1
        if not (record.cancelled or record.cache_hit or is_failure):
            self._replies.append(record)
            self._add_window("ttfb", record.ttfb_ms)
            if record.mode == "stream":
                self._add_window("ttft", record.ttft_ms)
            self._add_window("total", record.total_ms)
            self._add_window("tokens_per_s", record.tokens_per_s)
            self._attributions.append((self.last_attribution, self.last_groups))
            self._shares = None
        self._add_cost(record)
        if self._hold is not None and self._hold[0] is record:
            self._hold = None
        if record.headroom is not None:
            self._headroom.pop(record.provider, None)  # popped and put back: the last heard is last
            self._headroom[record.provider] = record.headroom
            self.headroom_version += 1
        self.requests_version += 1
        self.done_version += 1
        self._changed()

    def observe_warmup(self, event: WarmupState) -> None:
        """Warm-up's state of the provider connection (cold, warming, warm, failed), its setup and last ping
        (each kept from before when the event does not carry one)."""
        held = self.connection if self.connection.provider in ("", event.provider) else ConnectionState()
        rtt = event.rtt_ms if event.rtt_ms is not None else held.rtt_ms
        setup = event.setup_ms if event.setup_ms is not None else held.setup_ms
        self.connection = ConnectionState(event.provider, event.state, rtt, event.error, setup)
        self.connection_version += 1
        self._changed()

    def observe_server_metrics(self, event: ServerMetricsSampled) -> None:
        """A scrape of a provider's /metrics came back (or failed): ``server_state``."""
        held = self._server.pop(event.provider, None)  # popped and put back: the last scraped is last
        good = event.metrics
        if good is None and held is not None:
            good = held.metrics or held.last_good
        self._server[event.provider] = ServerState(event.provider, event.metrics, event.error, good)
        self.server_version += 1
        self._changed()

    def observe_render_lag(self, ms: float) -> None:
        """The time from a chunk's arrival to the frame that painted it, measured by the chat view."""
        self._windows["render_lag"].append(ms)
        self._changed_window("render_lag")
        if self._turn_lag_ms is None or ms > self._turn_lag_ms:
            self._turn_lag_ms = ms
            last = self.last_attribution
            if last is not None and not self._live:
                # The reply's last frames are painted after its RequestDone: they still belong to it.
                last.after = [RENDER_LAG._replace(ms=ms)]
        self.render_version += 1
        self._changed()

    def observe_many(self, records: Iterable[TimingRecord]) -> None:
        """Finished records, each as started and done: to seed the windows from a history or a test."""
        for record in records:
            self.observe_started(record)
            self.observe_done(record)

    # -- internals -------------------------------------------------------------------------------------------
    def _add_window(self, name: Series, value: float | None) -> None:
        if value is not None:
            self._windows[name].append(value)
            self._changed_window(name)

    def _changed_window(self, name: Series) -> None:
        self._spread.pop(name, None)
        self._pct.pop(name, None)

    def _clear_retry(self, record: TimingRecord) -> None:
        if self._retry is not None and self._retry[0] is record:
            self._retry = None

    def _add_cost(self, record: TimingRecord) -> None:
        price = self.prices.get(record.model)
        if price is None:
            return
        if record.cache_hit:
            cost = 0.0  # answered from the disk cache: nothing was billed
        elif record.usage_from_server and record.prompt_tokens is not None:
            cost = price.cost(record.prompt_tokens, record.output_tokens)
        else:
            # No usage from the server (an error, a cancel, a server that does not send it): a guess from
            # chunk counts would look exact and be wrong, so it is counted as unknown instead.
            self.cost_unknown += 1
            self.cost_last = None
            return
        self.cost_last = cost
        self.cost_total = (self.cost_total or 0.0) + cost
        self.cost_by_mode[record.mode] = self.cost_by_mode.get(record.mode, 0.0) + cost
