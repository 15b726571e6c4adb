"""The wire: the transport protocol the client takes (``HTTPTransport``) and its default on httpx
(``Transport``: connection pools, the trace hook, errors mapped by type), the pools a caller owns (``Pools``),
a ``MockTransport`` for unit tests, the SSE decoder, OpenAI's request and reply shapes, and files attached to a message.
"""

from __future__ import annotations

from llmchat.core.http._attach import (
    Attachment,
    AttachmentError,
    message_content,
    message_text,
    read_attachment,
    split_file_lines,
)
from llmchat.core.http._interface import Endpoint, HTTPResponse, HTTPTransport
from llmchat.core.http._mock import MockRequest, MockResponse, MockTransport
from llmchat.core.http._openai import parse_chunk, parse_reply
from llmchat.core.http._pools import Pools
from llmchat.core.http._proxy_route import ProxyRoute, resolve_proxy
from llmchat.core.http._ratelimit import parse_reset, read_headroom
from llmchat.core.http._sse import ServerSentEvent, SSEDecoder
from llmchat.core.http._toolcalls import ToolCall
from llmchat.core.http._transport import Transport, WireResponse

__all__ = [
    "Attachment",
    "AttachmentError",
    "Endpoint",
    "HTTPResponse",
    "HTTPTransport",
    "MockRequest",
    "MockResponse",
    "MockTransport",
    "Pools",
    "ProxyRoute",
    "SSEDecoder",
    "ServerSentEvent",
    "ToolCall",
    "Transport",
    "WireResponse",
    "parse_chunk",
    "parse_reply",
    "parse_reset",
    "read_headroom",
    "resolve_proxy",
    "message_content",
    "message_text",
    "read_attachment",
    "split_file_lines",
]
