"""Fitting a conversation into the model's context window: counting its tokens, learning the window, and
leaving the oldest turns out when the next request would not fit.

Counting asks the server's own tokenizer where it has one (``POST /tokenize`` at the server root: llama.cpp
reads ``content``, vLLM ``prompt``; the body carries both) and remembers each message's count, so a long
conversation costs one small request per new message, not one per message per request. A server without
one (404, 405 or 501: OpenAI, Ollama) is asked once; from then on, and whenever the tokenizer does not answer
within ``timeout_s``, the count is an estimate: 4 bytes of UTF-8 per token, rounded up. Either way each
message adds 4 tokens of chat framing and the reply 3 (OpenAI's count for chat, which llmchat serve's
``usage.prompt_tokens`` follows), and an image counts 85 (OpenAI's low-detail price).

The window is ``providers.NAME.context_window`` when set, else what ``/models`` says of the model (vLLM's
``max_model_len``, llama.cpp's ``meta.n_ctx_train``, OpenRouter's ``context_length``), else unknown (nothing
is left out). Room is kept for the reply: ``max_tokens`` when the conversation sets it, else 512 tokens (at
most a quarter of the window).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import llmchat.core.errors as errors
from llmchat.core.client._client import ChatClient, Message
from llmchat.core.observe import Phases

BYTES_PER_TOKEN = 4
"""The estimate where the server has no tokenizer: UTF-8 bytes per token (about right for English with
GPT-style tokenizers; code and other scripts take more tokens, so it errs short there)."""
MESSAGE_TOKENS = 4
"""Chat framing per message (role and separators)."""
REPLY_TOKENS = 3
"""Framing that primes the reply."""
IMAGE_TOKENS = 85
"""What one image counts for (OpenAI's low-detail price; servers differ)."""
DEFAULT_RESERVE = 512
"""Room kept for the reply when the conversation sets no max_tokens (at most a quarter of the window)."""
_NO_TOKENIZER = frozenset({404, 405, 501})
_CACHE_LIMIT = 4096
_MODELS_RETRY_S = 60.0

Counter = Literal["server", "estimate"]


class ContextOverflowError(errors.UsageError):
    """The system prompt and the last user message alone do not fit in the window with the reply's room."""

    def __init__(self, message: str, *, prompt_tokens: int, window: int, reserve: int) -> None:
        super().__init__(message)
        self.prompt_tokens = prompt_tokens
        self.window = window
        self.reserve = reserve


@dataclass(frozen=True, slots=True)
class ContextFit:
    """What goes into the next request and what that cost to know."""

    messages: list[Message]
    """The messages to send: the system prompt, the newest turns that fit, and the last user message."""
    prompt_tokens: int
    """Their tokens, as counted (``counted_by``), framing included."""
    window: int | None
    """The model's context window, None when neither the config nor the server says."""
    window_source: Literal["config", "server", ""]
    reserve: int
    """Tokens kept for the reply."""
    left_out: int
    """Messages left out, oldest first."""
    turns_left_out: int
    """Whole turns (a user message and the replies after it) left out."""
    counted_by: Counter
    """"server" when its tokenizer counted every message, else "estimate"."""
    count_ms: float
    """How long counting took (tokenizer requests included; cached counts cost nothing)."""

    def to_dict(self) -> dict[str, Any]:
        """The figures, for ``--json`` and tests (not the messages)."""
        return {"prompt_tokens": self.prompt_tokens, "window": self.window, "window_source": self.window_source,
                "reserve": self.reserve, "left_out": self.left_out, "turns_left_out": self.turns_left_out,
                "counted_by": self.counted_by, "count_ms": round(self.count_ms, 3)}


def estimate_tokens(text: str) -> int:
    """The estimate: UTF-8 bytes / 4, rounded up."""
    return -(-len(text.encode("utf-8", "surrogatepass")) // BYTES_PER_TOKEN)


def tokenize_url(base_url: str) -> str:
    """``/tokenize`` at the server root: the API root with its trailing ``/v1`` taken off, its query kept."""
    parts = urlsplit(base_url)
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return urlunsplit((parts.scheme, parts.netloc, path + "/tokenize", parts.query, ""))


def parse_windows(body: bytes) -> dict[str, int]:
    """Each model's context window as GET /models states it; models that state none are left out."""
    try:
        data = json.loads(body).get("data", [])
    except (ValueError, AttributeError):
        return {}
    windows: dict[str, int] = {}
    for model in data if isinstance(data, list) else []:
        if not isinstance(model, dict) or "id" not in model:
            continue
        raw_meta = model.get("meta")
        meta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
        for value in (model.get("max_model_len"), meta.get("n_ctx_train"), model.get("context_length"),
                      model.get("context_window")):
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                windows[str(model["id"])] = value
                break
    return windows


def parse_token_count(body: bytes) -> int | None:
    """The number of tokens a /tokenize answer holds (vLLM's ``count``, else llama.cpp's ``tokens``)."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    count = obj.get("count")
    if isinstance(count, int) and not isinstance(count, bool):
        return count
    tokens = obj.get("tokens")
    return len(tokens) if isinstance(tokens, list) else None


def _texts(content: object) -> tuple[str, int]:
    """The text of a message's content and how many images it carries."""
    if isinstance(content, str):
        return content, 0
    if not isinstance(content, list):
        return "", 0
    texts = [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
    images = sum(1 for p in content if isinstance(p, dict) and p.get("type") == "image_url")
    return "\n".join(texts), images


class ContextBudget:
    """Counts and fits for one client. Hold one per client for the session: it remembers the server's
    counts (per model and text), whether the server has a tokenizer, and the windows /models states."""

    def __init__(self, client: ChatClient, *, timeout_s: float = 2.0) -> None:
        self.client = client
        self.timeout_s = timeout_s
        self._counts: dict[tuple[str, str], int] = {}
        self._tokenizer: bool | None = None
        """None until asked; False once the server said it has none."""
        self._windows: dict[str, int] | None = None
        self._windows_at = 0.0

    def _configured_window(self) -> int:
        provider = self.client.settings.providers.get(self.client.endpoint.name)
        return provider.context_window if provider is not None else 0

    async def window(self, model: str) -> tuple[int | None, Literal["config", "server", ""]]:
        """The context window for ``model`` and where it came from; (None, "") when nobody says. Never
        raises: a /models that fails is asked again a minute later."""
        configured = self._configured_window()
        if configured:
            return configured, "config"
        if self._windows is None or (not self._windows and time.monotonic() - self._windows_at > _MODELS_RETRY_S):
            self._windows_at = time.monotonic()
            try:
                # Bounded as a whole, connecting included: the user is waiting to send.
                self._windows = await asyncio.wait_for(self._fetch_windows(), self.timeout_s)
            except (errors.APIError, TimeoutError):
                self._windows = {}
        windows = self._windows
        if not windows:
            return None, ""
        # No model named: the first one listed is the one a request would take.
        value = windows.get(model) if model else next(iter(windows.values()))
        return (value, "server") if value else (None, "")

    async def _fetch_windows(self) -> dict[str, int]:
        async with self.client.transport.request("GET", "models", phases=Phases()) as resp:
            data = await resp.aread()
        return parse_windows(data) if resp.status < 400 else {}

    async def _server_count(self, text: str, model: str) -> int | None:
        body = json.dumps({"content": text, "prompt": text, "model": model, "add_special_tokens": False},
                          ensure_ascii=False).encode()
        url = tokenize_url(self.client.endpoint.base_url)
        async with self.client.transport.request("POST", url, body=body, phases=Phases()) as resp:
            data = await resp.aread()
        if resp.status in _NO_TOKENIZER:
            self._tokenizer = False
            return None
        if resp.status >= 400:
            return None
        self._tokenizer = True
        return parse_token_count(data)

    async def count(self, messages: Sequence[Message], model: str = "") -> tuple[list[int], Counter]:
        """Each message's tokens (framing included) and who counted them. Never raises: a tokenizer that
        fails or is slow makes this an estimate."""
        model = model or self.client.model
        parts = [_texts(m.get("content")) for m in messages]
        counts: dict[str, int] = {}
        missing = sorted({t for t, _ in parts if t and (model, t) not in self._counts})
        if missing and self._tokenizer is not False:
            try:
                found = await asyncio.wait_for(
                    asyncio.gather(*(self._server_count(t, model) for t in missing)), self.timeout_s)
            except (errors.APIError, TimeoutError):
                found = [None] * len(missing)
            if len(self._counts) + len(missing) > _CACHE_LIMIT:
                self._counts.clear()
            for text, n in zip(missing, found, strict=True):
                if n is not None:
                    self._counts[(model, text)] = n
        by: Counter = "server"
        for text, _ in parts:
            if not text:
                counts[text] = 0
            elif (model, text) in self._counts:
                counts[text] = self._counts[(model, text)]
            else:
                counts[text] = estimate_tokens(text)
                by = "estimate"
        return [MESSAGE_TOKENS + counts[t] + IMAGE_TOKENS * images for t, images in parts], by

    async def fit(self, messages: Sequence[Message], *, max_tokens: int | None = None,
                  model: str = "") -> ContextFit:
        """The messages that fit the window with room for the reply, oldest turns left out first; never the
        leading system prompt, nor the last user message and what follows it. Raises ContextOverflowError
        (one line: the counts, the window, the fix) when those alone do not fit."""
        start = time.perf_counter_ns()
        model = model or self.client.model
        messages = list(messages)
        (costs, by), (window, source) = await asyncio.gather(self.count(messages, model), self.window(model))
        count_ms = (time.perf_counter_ns() - start) / 1e6
        total = REPLY_TOKENS + sum(costs)
        if window is None:
            return ContextFit(messages, total, None, "", max_tokens or 0, 0, 0, by, count_ms)
        reserve = max_tokens or min(DEFAULT_RESERVE, window // 4)
        budget = window - reserve
        head = 0
        while head < len(messages) and messages[head].get("role") == "system":
            head += 1
        last_user = next((i for i in range(len(messages) - 1, head - 1, -1)
                          if messages[i].get("role") == "user"), len(messages))
        fixed = REPLY_TOKENS + sum(costs[:head]) + sum(costs[last_user:])
        if fixed > budget:
            about = "" if by == "server" else "about "
            what = "this message with the system prompt" if head else "this message"
            raise ContextOverflowError(
                f"{what} is {about}{fixed:,} tokens, more than the {window:,}-token context window of "
                f"{model or 'the model'} takes with {reserve:,} kept for the reply; shorten it (or attach "
                "less), or lower max_tokens",
                prompt_tokens=fixed, window=window, reserve=reserve,
            )
        i, turns = head, 0
        while total > budget and i < last_user:
            j = i + 1
            while j < last_user and messages[j].get("role") != "user":
                j += 1
            total -= sum(costs[i:j])
            turns += 1
            i = j
        kept = messages[:head] + messages[i:]
        return ContextFit(kept, total, window, source, reserve, i - head, turns, by, count_ms)

