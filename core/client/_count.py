"""Counting a prompt's tokens without asking anyone: the estimate the client and the context budget share.

The estimate is 4 bytes of UTF-8 per token, rounded up; each message adds ``MESSAGE_TOKENS`` of chat framing
and the reply ``REPLY_TOKENS`` (OpenAI's count for chat, which llmchat serve's ``usage.prompt_tokens``
follows), and an image counts ``IMAGE_TOKENS`` (OpenAI's low-detail price). Servers with a chat template of
their own (llama.cpp's costs about 14 tokens a message) count more; ``ContextBudget`` learns by how much.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

BYTES_PER_TOKEN = 4
"""The estimate where the server has no tokenizer: UTF-8 bytes per token (about right for English with
GPT-style tokenizers; code and other scripts take more tokens, so it errs short there)."""
MESSAGE_TOKENS = 4
"""Chat framing per message (role and separators)."""
REPLY_TOKENS = 3
"""Framing that primes the reply."""
IMAGE_TOKENS = 85
"""What one image counts for (OpenAI's low-detail price; servers differ)."""


def estimate_tokens(text: str) -> int:
    """The estimate: UTF-8 bytes / 4, rounded up."""
    return -(-len(text.encode("utf-8", "surrogatepass")) // BYTES_PER_TOKEN)


def content_texts(content: object) -> tuple[str, int]:
    """The text of a message's content and how many images it carries."""
    if isinstance(content, str):
        return content, 0
    if not isinstance(content, list):
        return "", 0
    texts = [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
    images = sum(1 for p in content if isinstance(p, dict) and p.get("type") == "image_url")
    return "\n".join(texts), images


def estimate_prompt(messages: Sequence[Mapping[str, Any]]) -> int:
    """The whole prompt's estimate, framing included: what the client compares the server's
    ``usage.prompt_tokens`` with when nobody counted better (``TimingRecord.prompt_sent_tokens``)."""
    total = REPLY_TOKENS
    for message in messages:
        text, images = content_texts(message.get("content"))
        total += MESSAGE_TOKENS + (estimate_tokens(text) if text else 0) + IMAGE_TOKENS * images
    return total
