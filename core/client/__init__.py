"""ChatClient (stream, complete, embed) and what runs beside it on its connections: warm-up pings, the
server's /metrics, and fitting a conversation into the model's context window.
"""

from __future__ import annotations

from llmchat.core.client._client import ChatClient, ChatReply, ChatStream, endpoint_from_settings
from llmchat.core.client._count import MESSAGE_TOKENS, REPLY_TOKENS, estimate_tokens
from llmchat.core.client._fit import ContextBudget, ContextFit, ContextOverflowError
from llmchat.core.client._metrics_poller import ServerMetricsPoller, summarize_snapshots
from llmchat.core.client._server_metrics import parse_server_metrics, scrape_server_metrics
from llmchat.core.client._signals import ServerSignals
from llmchat.core.client._warmup import Warmer

__all__ = [
    "MESSAGE_TOKENS",
    "REPLY_TOKENS",
    "ChatClient",
    "ChatReply",
    "ChatStream",
    "ContextBudget",
    "ContextFit",
    "ContextOverflowError",
    "ServerMetricsPoller",
    "ServerSignals",
    "Warmer",
    "endpoint_from_settings",
    "estimate_tokens",
    "parse_server_metrics",
    "scrape_server_metrics",
    "summarize_snapshots",
]
