"""The wire: the transport (connection pools on httpx, the trace hook, errors mapped by type), the SSE
decoder, OpenAI's request and reply shapes, and files attached to a message.
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
from llmchat.core.http._sse import ServerSentEvent, SSEDecoder
from llmchat.core.http._transport import Endpoint, Transport, WireResponse

__all__ = [
    "Attachment",
    "AttachmentError",
    "Endpoint",
    "SSEDecoder",
    "ServerSentEvent",
    "Transport",
    "WireResponse",
    "message_content",
    "message_text",
    "read_attachment",
    "split_file_lines",
]
