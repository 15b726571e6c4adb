"""What is measured and who hears it: the bus, the timing record, attribution, cold starts, the HUD's rolling
window, Prometheus, the request log and what servers report about themselves.
"""

from __future__ import annotations

from llmchat.core.observe._attribution import (
    GROUPS,
    PARTS,
    Attribution,
    Part,
    attribute,
    format_shares,
    part_samples,
    record_notes,
    shares_over,
)
from llmchat.core.observe._baselines import BaselineStore
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
from llmchat.core.observe._coldstart import Baseline, ColdStartDetector
from llmchat.core.observe._prometheus import LATENCY_BUCKETS, load_prometheus_client, start_exporter
from llmchat.core.observe._requestlog import RequestLog, attach_observers
from llmchat.core.observe._timing import Headroom, Phases, TimingRecord, percentile, round_ms
from llmchat.core.observe._window import (
    REQUEST_SERIES,
    ConnectionState,
    Metrics,
    Price,
    Series,
    ServerState,
    Spread,
    failed,
    prices_from_settings,
)

__all__ = [
    "Attribution",
    "Baseline",
    "BaselineStore",
    "Bus",
    "Chunk",
    "ColdStartDetector",
    "ConnectionState",
    "FirstToken",
    "GROUPS",
    "Headroom",
    "LATENCY_BUCKETS",
    "Metrics",
    "PARTS",
    "Part",
    "Phases",
    "Price",
    "REQUEST_SERIES",
    "RateLimitHeld",
    "RequestDone",
    "RequestLog",
    "RequestStarted",
    "RetryPlanned",
    "Series",
    "ServerMetricsSampled",
    "ServerState",
    "Spread",
    "TimingRecord",
    "WarmupState",
    "attach_observers",
    "attribute",
    "failed",
    "format_shares",
    "load_prometheus_client",
    "part_samples",
    "percentile",
    "record_notes",
    "round_ms",
    "prices_from_settings",
    "shares_over",
    "start_exporter",
]
