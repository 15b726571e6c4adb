"""The wire: the transport (connection pools on httpx, the trace hook, errors mapped by type), the SSE
decoder and OpenAI's request and reply shapes.
"""

from __future__ import annotations

from llmchat.core.http._ratelimit import parse_reset, read_headroom
from llmchat.core.http._sse import ServerSentEvent, SSEDecoder
from llmchat.core.http._transport import Endpoint, Transport, WireResponse

__all__ = [
    "Endpoint",
    "SSEDecoder",
    "ServerSentEvent",
    "Transport",
    "WireResponse",
    "parse_reset",
    "read_headroom",
]
