"""llmchat's engine: transport, SSE decoding, retries, caching, timing and the local server.

Nothing here imports Textual; the faces in ``llmchat.tui`` talk to the engine through the names below.
"""

from __future__ import annotations

from llmchat.core._attribution import (
    Attribution,
    Part,
    attribute,
    format_shares,
    part_samples,
    shares_over,
)
from llmchat.core._batcher import MicroBatcher
from llmchat.core._bus import (
    Bus,
    Chunk,
    FirstToken,
    RequestDone,
    RequestStarted,
    RetryPlanned,
    ServerMetricsSampled,
    WarmupState,
)
from llmchat.core._cache import ReplyCache
from llmchat.core._client import ChatClient, ChatReply, ChatStream
from llmchat.core._coldstart import Baseline, ColdStartDetector
from llmchat.core._coldstart_store import BaselineStore
from llmchat.core._config import (
    ResolvedProvider,
    default_config_path,
    load_settings,
    mask_secret,
    mask_url,
    resolve_provider,
)
from llmchat.core._errors import (
    APIError,
    AuthError,
    CancelledByUser,
    ConfigError,
    ConnectError,
    DisconnectedError,
    HTTPStatusError,
    LLMChatError,
    NotFoundError,
    ProtocolError,
    RateLimitError,
    ServerError,
    StreamCutError,
    TimeoutError,
    TLSError,
    UsageError,
)
from llmchat.core._metrics_poller import ServerMetricsPoller
from llmchat.core._retry import RetryEvent
from llmchat.core._server_metrics import parse_server_metrics, scrape_server_metrics
from llmchat.core._settings import (
    BatchSettings,
    CacheSettings,
    Http2Mode,
    HttpSettings,
    LogSettings,
    ProviderSettings,
    RetrySettings,
    ServerSettings,
    Settings,
    UISettings,
)
from llmchat.core._signals import ServerSignals
from llmchat.core._timing import Phases, TimingRecord, percentile
from llmchat.core._warmup import Warmer
from llmchat.core.sse import ServerSentEvent, SSEDecoder

__version__ = "0.1.0"

__all__ = [
    "APIError",
    "Attribution",
    "AuthError",
    "Baseline",
    "BaselineStore",
    "BatchSettings",
    "Bus",
    "CacheSettings",
    "CancelledByUser",
    "ChatClient",
    "ChatReply",
    "ChatStream",
    "Chunk",
    "ColdStartDetector",
    "ConfigError",
    "ConnectError",
    "DisconnectedError",
    "FirstToken",
    "HTTPStatusError",
    "Http2Mode",
    "HttpSettings",
    "LLMChatError",
    "LogSettings",
    "MicroBatcher",
    "NotFoundError",
    "Part",
    "Phases",
    "ProtocolError",
    "ProviderSettings",
    "RateLimitError",
    "ReplyCache",
    "RequestDone",
    "RequestStarted",
    "ResolvedProvider",
    "RetryEvent",
    "RetryPlanned",
    "RetrySettings",
    "SSEDecoder",
    "ServerError",
    "ServerMetricsPoller",
    "ServerMetricsSampled",
    "ServerSentEvent",
    "ServerSettings",
    "ServerSignals",
    "Settings",
    "StreamCutError",
    "TLSError",
    "TimeoutError",
    "TimingRecord",
    "UISettings",
    "UsageError",
    "Warmer",
    "WarmupState",
    "__version__",
    "attribute",
    "default_config_path",
    "format_shares",
    "load_settings",
    "mask_secret",
    "mask_url",
    "parse_server_metrics",
    "part_samples",
    "percentile",
    "resolve_provider",
    "scrape_server_metrics",
    "shares_over",
]
