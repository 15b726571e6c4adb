"""What the client decides around a request: retries (tenacity), the reply cache (diskcache, no pickle) and
micro-batching, and the client-side rate limiter.
"""

from __future__ import annotations

from llmchat.core.policy._batcher import MicroBatcher
from llmchat.core.policy._cache import ReplyCache, replay_chunks
from llmchat.core.policy._limiter import Hold, ProviderLimiter, RateLimits, request_charge
from llmchat.core.policy._retry import RetryEvent, call_with_retries

__all__ = [
    "Hold",
    "MicroBatcher",
    "ProviderLimiter",
    "RateLimits",
    "ReplyCache",
    "RetryEvent",
    "call_with_retries",
    "replay_chunks",
    "request_charge",
]
