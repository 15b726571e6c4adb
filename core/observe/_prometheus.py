"""Prometheus metrics from the bus, served at ``/metrics`` on 127.0.0.1 (``--metrics-port``).

``start_exporter(bus, port)`` is the one call: it makes a registry of its own (never prometheus_client's
global one, so two exporters in a process, or many tests, never collide), subscribes to ``bus`` and serves
the registry from a daemon thread, off the event loop. prometheus_client is an optional dependency (the
``metrics`` extra): without it the call is a one-line UsageError saying what to install.

What is exported, by Prometheus's naming conventions (seconds, ``_total`` counters), with labels
``provider``, ``model`` and ``mode`` (stream, batch, embed) unless said otherwise:

- ``llmchat_requests_total{outcome}``: finished requests; outcome is ok, error or cancelled.
- ``llmchat_request_ttfb_seconds``, ``llmchat_request_ttft_seconds`` (stream mode),
  ``llmchat_request_duration_seconds`` (end to end) and ``llmchat_output_tokens_per_second``: histograms of
  the requests that got their reply from the network. Errors, cancels and cache hits are counted, not put in
  the histograms: a 2 ms cache hit or a refused connection would pull the quantiles away from what the
  provider does (the HUD keeps the same rule). Definitions as in ``TimingRecord``.
- ``llmchat_request_part_seconds{part, group}``: where each of those requests' time went, one histogram
  per attribution part (``_attribution.PARTS``: encode, pool_wait, connect, tls, send, server_queue,
  server_model_load, server_prefill, network_first_token, decode, unexplained ...; group is client,
  network, server, network+server, retry or unexplained). A request observes the parts it has (a reused
  connection has no connect). A negative unexplained part (a server that reported more than the span it
  fits in) is observed as 0: a histogram's sum must never go down.
- ``llmchat_request_flags_total{flag}``: finished requests flagged by attribution (cold_start, saturation,
  cache_hit), any outcome.
- ``llmchat_output_tokens_total``: output tokens received.
- ``llmchat_retries_total{provider, reason}``: retries planned, by reason (429, 503, connect, ...).
- ``llmchat_cache_requests_total{provider, mode, result}``: hit or miss, for requests the reply cache was
  asked about (a request the cache policy leaves out is neither).
- ``llmchat_request_errors_total{provider, model, mode, kind}``: failures by class (``APIError.kind``:
  connect, timeout_read, http_429, stream_cut ...). Cancels are not errors.
- ``llmchat_requests_in_flight{provider, mode}``: started and not finished.
- ``llmchat_warmup_state{provider, state}``: 1 for the provider's current warm-up state (cold, warming, warm,
  failed), 0 for the others; a reply from the provider sets it to warm again (``Warmer``).
  ``llmchat_warmup_rtt_seconds{provider}``: the last ping, a round trip on the open connection;
  ``llmchat_warmup_setup_seconds{provider}``: what opening the connection cost (TCP connect and TLS) when
  warm-up last opened one.
- ``llmchat_provider_requests_waiting{provider}``, ``llmchat_provider_requests_running{provider}`` and
  ``llmchat_provider_kv_cache_usage_ratio{provider}``: the provider's own /metrics as last scraped
  (``providers.NAME.metrics_url``, ``ServerMetricsPoller``); ``llmchat_provider_metrics_up{provider}`` is 1
  when the last scrape answered, 0 when it failed (then the other three keep their last values).
- ``llmchat_ratelimit_limit{provider, kind}``, ``llmchat_ratelimit_remaining{provider, kind}`` and
  ``llmchat_ratelimit_reset_seconds{provider, kind}`` (kind ``requests`` or ``tokens``): the provider's
  headroom as its last reply's x-ratelimit-* headers said it.
- ``llmchat_rate_limit_holds_total{provider, reason}`` and ``llmchat_rate_limit_hold_seconds_total{provider}``:
  requests the client's own limiter held back, and the waits it planned (reason ``requests``, ``tokens`` or
  ``429``).

Cardinality stays bounded: past ``max_models`` distinct models the rest are counted as ``model="other"``;
part, group and flag come from fixed sets.
"""

from __future__ import annotations

import bisect
import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from socket import AF_INET6
from socketserver import ThreadingMixIn
from types import ModuleType
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from llmchat.core.errors import LLMChatError, UsageError
from llmchat.core.observe._attribution import attribute
from llmchat.core.observe._bus import (
    Bus,
    RateLimitHeld,
    RequestDone,
    RequestStarted,
    RetryPlanned,
    ServerMetricsSampled,
    WarmupState,
)
from llmchat.core.observe._coldstart import ColdStartDetector
from llmchat.core.observe._timing import Headroom

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

#: Latency buckets in seconds, 25 ms to 2 minutes: a local server's first byte to a reasoning model's reply.
LATENCY_BUCKETS = (
    0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0,
    60.0, 120.0,
)
#: Output tokens per second: a slow local model to a cache-fast replay.
TOKENS_PER_S_BUCKETS = (
    1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 50.0, 75.0, 100.0, 150.0, 200.0, 300.0, 500.0, 1000.0, 2000.0, 5000.0,
)
#: Attribution parts in seconds, 100 us to 2 minutes: a request's encoding to a reasoning model's generation.
PART_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0, 120.0,
)
WARMUP_STATES = ("cold", "warming", "warm", "failed")
INSTALL_HINT = 'pip install "llmchat[metrics]"'


def load_prometheus_client() -> ModuleType:
    """prometheus_client, imported on first use; UsageError, one line, when it is not installed."""
    try:
        return importlib.import_module("prometheus_client")
    except ImportError:
        raise UsageError(f"--metrics-port needs prometheus_client: {INSTALL_HINT}") from None


class ClientMetrics:
    """The engine's metrics in a registry of their own, fed by the buses it is subscribed to."""

    def __init__(self, registry: CollectorRegistry | None = None, *, max_models: int = 50) -> None:
        prom = load_prometheus_client()
        self.registry: CollectorRegistry = registry if registry is not None else prom.CollectorRegistry()
        self.max_models = max_models
        self._models: set[str] = set()
        self._in_flight: dict[str, bool] = {}
        self._by_labels: dict[tuple[str, str, str], _Series] = {}
        self._lock = threading.Lock()
        self.detector = ColdStartDetector()
        """Flags cold starts for ``llmchat_request_flags_total`` (it sees every finished request)."""
        r = self.registry
        common = ("provider", "model", "mode")

        def histogram(name: str, doc: str, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> Any:
            return prom.Histogram(name, doc, common, registry=r, buckets=buckets)

        def counter(name: str, doc: str, labels: tuple[str, ...]) -> Any:
            return prom.Counter(name, doc, labels, registry=r)

        def gauge(name: str, doc: str, labels: tuple[str, ...]) -> Any:
            return prom.Gauge(name, doc, labels, registry=r)

        self.requests = counter("llmchat_requests", "Finished requests, by outcome (ok, error, cancelled).",
                                (*common, "outcome"))
        self.ttfb = histogram("llmchat_request_ttfb_seconds",
                              "From the request's start to the response headers (replies from the network).")
        self.ttft = histogram("llmchat_request_ttft_seconds",
                              "From the request's start to the first answer token (stream mode).")
        self.duration = histogram("llmchat_request_duration_seconds",
                                  "From the request's start to the end of the reply (end to end).")
        self.tokens_per_s = histogram("llmchat_output_tokens_per_second",
                                      "Output tokens per second of generation, per request.",
                                      TOKENS_PER_S_BUCKETS)
        self.parts = _PartHistograms()
        r.register(self.parts)
        self.flags = counter("llmchat_request_flags", "Finished requests flagged by attribution.",
                             ("flag", *common))
        self.output_tokens = counter("llmchat_output_tokens", "Output tokens received.", common)
        self.retries = counter("llmchat_retries", "Retries planned, by reason.", ("provider", "reason"))
        self.cache = counter("llmchat_cache_requests", "Requests the reply cache was asked about, by result.",
                             ("provider", "mode", "result"))
        self.errors = counter("llmchat_request_errors", "Failed requests, by error class.", (*common, "kind"))
        self.in_flight = gauge("llmchat_requests_in_flight", "Requests started and not finished.",
                               ("provider", "mode"))
        self.warmup = gauge("llmchat_warmup_state", "1 for the provider's current warm-up state.",
                            ("provider", "state"))
        self.warmup_rtt = gauge("llmchat_warmup_rtt_seconds",
                                "The last warm-up ping: a round trip on the open connection.", ("provider",))
        self.warmup_setup = gauge("llmchat_warmup_setup_seconds", "What opening the connection cost "
                                  "(TCP connect and TLS) when warm-up last opened one.", ("provider",))
        self.server_gauges = {
            key: gauge(name, doc, ("provider",)) for key, name, doc in (
                ("requests_waiting", "llmchat_provider_requests_waiting",
                 "Requests the provider's /metrics showed waiting, last scrape."),
                ("requests_running", "llmchat_provider_requests_running",
                 "Requests the provider's /metrics showed running, last scrape."),
                ("kv_cache_usage", "llmchat_provider_kv_cache_usage_ratio",
                 "The provider's KV cache use (0 to 1) in its /metrics, last scrape."),
            )
        }
        self.headroom = {
            field: gauge(name, doc, ("provider", "kind")) for field, name, doc in (
                ("limit", "llmchat_ratelimit_limit", "The provider's rate limit (x-ratelimit-limit-*)."),
                ("remaining", "llmchat_ratelimit_remaining",
                 "What remains of the provider's rate limit (x-ratelimit-remaining-*), last reply."),
                ("reset", "llmchat_ratelimit_reset_seconds",
                 "Seconds until the provider's rate limit is full again (x-ratelimit-reset-*), last reply."),
            )
        }
        self.holds = counter("llmchat_rate_limit_holds", "Requests the client's own rate limiter held back.",
                             ("provider", "reason"))
        self.hold_seconds = counter("llmchat_rate_limit_hold_seconds",
                                    "The waits the client's own rate limiter planned.", ("provider",))
        self.server_up = gauge("llmchat_provider_metrics_up", "1 when the last scrape of the provider's "
                               "/metrics answered, 0 when it failed.", ("provider",))

    def subscribe(self, bus: Bus) -> Callable[[], None]:
        """Count what ``bus`` reports from now on; returns a function that stops that."""
        subs = [
            bus.subscribe(RequestStarted, self.on_started),
            bus.subscribe(RequestDone, self.on_done),
            bus.subscribe(RetryPlanned, self.on_retry),
            bus.subscribe(RateLimitHeld, self.on_hold),
            bus.subscribe(WarmupState, self.on_warmup),
            bus.subscribe(ServerMetricsSampled, self.on_server_metrics),
        ]

        def unsubscribe() -> None:
            for sub in subs:
                sub()

        return unsubscribe

    def _model(self, model: str) -> str:
        with self._lock:
            if model in self._models:
                return model
            if len(self._models) < self.max_models:
                self._models.add(model)
                return model
        return "other"

    def _series(self, provider: str, model: str, mode: str) -> _Series:
        # prometheus_client's labels() costs a lock and a few dict lookups per call, seven calls a request:
        # the children are looked up once per label set and kept.
        labels = (provider, self._model(model), mode)
        series = self._by_labels.get(labels)
        if series is None:
            series = _Series(
                ok=self.requests.labels(*labels, "ok"),
                error=self.requests.labels(*labels, "error"),
                cancelled=self.requests.labels(*labels, "cancelled"),
                ttfb=self.ttfb.labels(*labels),
                ttft=self.ttft.labels(*labels),
                duration=self.duration.labels(*labels),
                tokens_per_s=self.tokens_per_s.labels(*labels),
                output_tokens=self.output_tokens.labels(*labels),
                in_flight=self.in_flight.labels(provider, mode),
                labels=labels,
                parts={},
            )
            self._by_labels[labels] = series
        return series

    def on_started(self, event: RequestStarted) -> None:
        record = event.record
        # By request id: a record finished without a start (a model lookup that failed first) or started on
        # two buses this exporter listens to is counted once, and the gauge never goes below zero.
        with self._lock:
            if record.request_id in self._in_flight:
                return
            self._in_flight[record.request_id] = True
        self._series(record.provider, record.model, record.mode).in_flight.inc()

    def on_done(self, event: RequestDone) -> None:
        record = event.record
        series = self._series(record.provider, record.model, record.mode)
        with self._lock:
            started = self._in_flight.pop(record.request_id, False)
        if started:
            series.in_flight.dec()
        if record.cancelled:
            series.cancelled.inc()
        elif record.error_kind is not None:
            series.error.inc()
            self.errors.labels(*series.labels, record.error_kind).inc()
        else:
            series.ok.inc()
        if record.cache_lookup:
            self.cache.labels(record.provider, record.mode, "hit" if record.cache_hit else "miss").inc()
        if record.output_tokens:
            series.output_tokens.inc(record.output_tokens)
        if record.headroom is not None:
            self._headroom(record.provider, record.headroom)
        with self._lock:  # the detector keeps state across requests, and buses may publish from two threads
            attribution = attribute(record, detector=self.detector)
        for flag in attribution.flags:
            self.flags.labels(flag, *series.labels).inc()
        if record.cancelled or record.error_kind is not None or record.cache_hit:
            return
        self.parts.observe(series, attribution.parts)
        _observe(series.ttfb, record.ttfb_ms)
        if record.mode == "stream":
            _observe(series.ttft, record.ttft_ms)
        _observe(series.duration, record.total_ms)
        tps = record.tokens_per_s
        if tps is not None:
            series.tokens_per_s.observe(tps)

    def _headroom(self, provider: str, h: Headroom) -> None:
        for kind, values in (("requests", (h.limit_requests, h.remaining_requests, h.reset_requests_s)),
                             ("tokens", (h.limit_tokens, h.remaining_tokens, h.reset_tokens_s))):
            for field, value in zip(("limit", "remaining", "reset"), values, strict=True):
                if value is not None:
                    self.headroom[field].labels(provider, kind).set(value)

    def on_hold(self, event: RateLimitHeld) -> None:
        hold = event.hold
        self.holds.labels(event.record.provider, str(getattr(hold, "reason", "unknown"))).inc()
        self.hold_seconds.labels(event.record.provider).inc(float(getattr(hold, "wait_s", 0.0)))

    def on_retry(self, event: RetryPlanned) -> None:
        self.retries.labels(event.record.provider, str(getattr(event.event, "reason", "unknown"))).inc()

    def on_warmup(self, event: WarmupState) -> None:
        for state in WARMUP_STATES:
            self.warmup.labels(event.provider, state).set(1.0 if state == event.state else 0.0)
        if event.rtt_ms is not None:
            self.warmup_rtt.labels(event.provider).set(event.rtt_ms / 1000.0)
        if event.setup_ms is not None:
            self.warmup_setup.labels(event.provider).set(event.setup_ms / 1000.0)

    def on_server_metrics(self, event: ServerMetricsSampled) -> None:
        self.server_up.labels(event.provider).set(0.0 if event.metrics is None else 1.0)
        for key, value in (event.metrics or {}).items():
            gauge = self.server_gauges.get(key)
            if gauge is not None:
                gauge.labels(event.provider).set(value)


def _observe(child: Any, ms: float | None) -> None:
    if ms is not None:
        child.observe(ms / 1000.0)


@dataclass(frozen=True, slots=True)
class _Series:
    """The children of one (provider, model, mode): what every finished request touches."""

    ok: Any
    error: Any
    cancelled: Any
    ttfb: Any
    ttft: Any
    duration: Any
    tokens_per_s: Any
    output_tokens: Any
    in_flight: Any
    labels: tuple[str, str, str]
    parts: dict[str, _PartRow]
    """``llmchat_request_part_seconds`` rows by part key, made on first use."""


@dataclass(slots=True)
class _PartRow:
    labels: tuple[str, ...]
    counts: list[int]
    """Per bucket of ``PART_BUCKETS`` and a last one for +Inf; not cumulative (``collect`` adds them up)."""
    total: float = 0.0


class _PartHistograms:
    """``llmchat_request_part_seconds`` as a collector of its own: plain counts, turned into a histogram
    family when scraped. A finished request observes a dozen parts, and prometheus_client's
    ``Histogram.observe`` (a lock and a walk of the buckets each) cost about 2 us apiece on the event loop;
    here it is one lock and a bisect per part."""

    NAME = "llmchat_request_part_seconds"
    DOC = "Where a request's time went, per attribution part (replies from the network)."
    LABELS = ("part", "group", "provider", "model", "mode")

    def __init__(self) -> None:
        self._family = importlib.import_module("prometheus_client.core").HistogramMetricFamily
        go_float = importlib.import_module("prometheus_client.utils").floatToGoString
        self._bounds = [go_float(b) for b in (*PART_BUCKETS, float("inf"))]  # "0.0001" ... "+Inf"
        self._rows: list[_PartRow] = []
        self._lock = threading.Lock()

    def observe(self, series: _Series, parts: Any) -> None:
        """Count each part of a request (``Part`` tuples) in the rows of ``series``; a negative one as 0."""
        with self._lock:
            for part in parts:
                row = series.parts.get(part.key)
                if row is None:
                    row = series.parts[part.key] = _PartRow((part.key, part.group, *series.labels),
                                                            [0] * (len(PART_BUCKETS) + 1))
                    self._rows.append(row)
                seconds = part.ms / 1000.0 if part.ms > 0 else 0.0
                # bisect_left: the first bound >= the value, Prometheus's "le" (less than or equal).
                row.counts[bisect.bisect_left(PART_BUCKETS, seconds)] += 1
                row.total += seconds

    def describe(self) -> list[Any]:
        return [self._family(self.NAME, self.DOC, labels=self.LABELS)]

    def collect(self) -> list[Any]:
        family = self._family(self.NAME, self.DOC, labels=self.LABELS)
        with self._lock:
            rows = [(row.labels, list(row.counts), row.total) for row in self._rows]
        for labels, counts, total in rows:
            cumulative = 0
            buckets = []
            for bound, n in zip(self._bounds, counts, strict=True):
                cumulative += n
                buckets.append((bound, cumulative))
            family.add_metric(list(labels), buckets, total)
        return [family]



class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's parameter name
        pass  # a scrape every 15 s is not news


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in progress never holds up the exit


class MetricsServer:
    """A registry served at ``http://HOST:PORT/metrics`` (prometheus_client's WSGI app) from a daemon thread.

    prometheus_client's own ``start_http_server`` would do, but its thread polls for shutdown every 0.5 s, so
    every close took that long; this one polls every 50 ms.
    """

    def __init__(self, registry: CollectorRegistry, port: int, host: str = "127.0.0.1") -> None:
        prom = load_prometheus_client()
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise UsageError(f"--metrics-port must be a port number from 0 to 65535, got {port!r}")
        server_class: type[_ThreadingWSGIServer] = _ThreadingWSGIServer
        if ":" in host:
            server_class = type("_Server6", (_ThreadingWSGIServer,), {"address_family": AF_INET6})
        try:
            self._httpd: WSGIServer | None = make_server(
                host, port, prom.make_wsgi_app(registry), server_class, handler_class=_QuietHandler
            )
        except OSError as exc:
            raise LLMChatError(
                f"--metrics-port: cannot listen on {host}:{port}: {exc.strerror or exc}; pick another port, "
                "or 0 for a free one"
            ) from None
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="llmchat-metrics", daemon=True)
        self._thread.start()
        self.host = host
        self.port: int = self._httpd.server_port
        """The port it listens on (the one taken when 0 was asked)."""

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self, timeout: float = 5.0) -> None:
        """Stop serving and free the port (waits up to ``timeout`` s for the thread). Safe to call twice."""
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
            self._thread.join(timeout)


class Exporter:
    """What ``start_exporter`` returns: the metrics, where they are served, and ``close()``."""

    def __init__(self, metrics: ClientMetrics, server: MetricsServer) -> None:
        self.metrics = metrics
        self.server = server
        self._unsubscribe: list[Callable[[], None]] = []

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT/metrics``."""
        return self.server.url

    def attach(self, bus: Bus) -> None:
        """Also count what another bus reports (a second client, a bench configuration)."""
        self._unsubscribe.append(self.metrics.subscribe(bus))

    def close(self) -> None:
        """Unsubscribe from every bus and stop serving. Safe to call twice."""
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe.clear()
        self.server.close()

    def __enter__(self) -> Exporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_exporter(bus: Bus | None, port: int, *, host: str = "127.0.0.1") -> Exporter:
    """Serve the metrics of ``bus`` (more with ``attach``) at ``http://host:port/metrics``; port 0 takes a
    free one (``.port`` says which). Returns the handle whose ``close()`` stops it.

    Raises UsageError when prometheus_client is not installed, LLMChatError when the port cannot be bound.
    """
    metrics = ClientMetrics()
    exporter = Exporter(metrics, MetricsServer(metrics.registry, port, host))
    if bus is not None:
        exporter.attach(bus)
    return exporter
