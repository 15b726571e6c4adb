"""Fitting a conversation into the model's context window: counting its tokens, learning the window and the
server's chat template, and leaving the oldest turns out when the next request would not fit.

Counting asks the server's own tokenizer where it has one (``POST /tokenize`` at the server root: llama.cpp
reads ``content``, vLLM ``prompt``; the body carries both) and remembers each message's count, so a long
conversation costs one small request per new message, not one per message per request. A server without
one (404, 405 or 501: OpenAI, Ollama) is asked once; from then on, and whenever the tokenizer does not answer
within ``timeout_s``, the count is an estimate: 4 bytes of UTF-8 per token, rounded up. Either way each
message adds 4 tokens of chat framing and the reply 3 (OpenAI's count for chat, which llmchat serve's
``usage.prompt_tokens`` follows), and an image counts 85 (OpenAI's low-detail price).

A server's chat template costs more than that (llama.cpp's about 14 tokens a message). The budget watches its
client's requests (on the bus) and learns from each reply's ``usage.prompt_tokens``: the framing per message
becomes ``4 + ceil((server count - own count) / messages)`` when that is more, per model, and never less than
it was (a shorter count, as from a server that shifted its context, teaches nothing). Each request it saw
start gets ``record.prompt_sent_tokens``, its own count, so the record can tell a prompt the server cut.

The window is ``providers.NAME.context_window`` when set, else what the server says: llama.cpp's ``GET
{root}/props`` (``default_generation_settings.n_ctx``, or a top-level ``n_ctx`` in older versions: the
window it really runs, which ``/models``' ``meta.n_ctx_train`` is not), else what ``/models`` says of the
model (vLLM's ``max_model_len``, llama.cpp's ``meta.n_ctx_train``, OpenRouter's ``context_length``), else
unknown (nothing is left out). A request refused for its length (HTTP 400: llama.cpp's "exceeds the
available context size", vLLM's "maximum context length is N tokens") teaches the window when the error
states it (then it wins over all of those, even the config's), else more framing when the window is known,
else that a prompt that long does not fit; the next fit says so once (``ContextFit.note``). Room is kept for
the reply: ``max_tokens`` when the conversation sets it, else 512 tokens (at most a quarter of the window).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import llmchat.core.errors as errors
from llmchat.core.client._client import ChatClient, Message
from llmchat.core.client._count import (
    IMAGE_TOKENS,
    MESSAGE_TOKENS,
    REPLY_TOKENS,
    content_texts,
    estimate_tokens,
)
from llmchat.core.observe import Phases, RequestDone, RequestStarted, TimingRecord

DEFAULT_RESERVE = 512
"""Room kept for the reply when the conversation sets no max_tokens (at most a quarter of the window)."""
_NO_TOKENIZER = frozenset({404, 405, 501})
_CACHE_LIMIT = 4096
_MODELS_RETRY_S = 60.0
_PENDING_LIMIT = 256
_FRAMING_LIMIT = 1_000
"""No template costs more a message; a learned framing past this is a broken count, not a template."""

# A refusal for the prompt's length, as the servers word it (matched on the error's one line, which carries
# the server's own message): llama.cpp, vLLM (and OpenAI), and the window when they state it.
_REFUSAL = re.compile(r"context (?:size|length|window)|maximum context|too many tokens|context_length_exceeded",
                      re.IGNORECASE)
_STATED_WINDOW = (
    re.compile(r"maximum context length is ([\d,]+) tokens", re.IGNORECASE),  # vLLM, OpenAI
    re.compile(r"available context size \(([\d,]+) tokens\)", re.IGNORECASE),  # llama.cpp since 2025
    re.compile(r"\bn_ctx\W{1,4}(\d+)"),  # llama.cpp's error object, when a proxy passes it on as text
)

Counter = Literal["server", "estimate"]
WindowSource = Literal["config", "server", "refusal", ""]


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
    window_source: WindowSource
    """"config", "server" (/props or /models), "refusal" (stated in a 400 for length), or "" (unknown)."""
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
    framing: int = MESSAGE_TOKENS
    """Tokens counted per message for the chat template: 4, or more once the server's usage showed more."""
    note: str = ""
    """One line to show once: this fit follows a refusal for length, and what it learned from it."""

    def to_dict(self) -> dict[str, Any]:
        """The figures, for ``--json`` and tests (not the messages)."""
        return {"prompt_tokens": self.prompt_tokens, "window": self.window, "window_source": self.window_source,
                "reserve": self.reserve, "left_out": self.left_out, "turns_left_out": self.turns_left_out,
                "counted_by": self.counted_by, "count_ms": round(self.count_ms, 3), "framing": self.framing,
                "note": self.note}


def root_url(base_url: str, path: str) -> str:
    """``path`` at the server root: the API root with its trailing ``/v1`` taken off (llama.cpp and vLLM
    serve ``/tokenize`` and ``/props`` there), the base URL's query kept (Azure's ``?api-version=``)."""
    parts = urlsplit(base_url)
    root = parts.path.rstrip("/")
    if root.endswith("/v1"):
        root = root[:-3]
    return urlunsplit((parts.scheme, parts.netloc, root + path, parts.query, ""))


def tokenize_url(base_url: str) -> str:
    """``/tokenize`` at the server root, the base URL's query kept."""
    return root_url(base_url, "/tokenize")


def _json_object(body: bytes) -> dict[str, Any] | None:
    """``body`` as a JSON object; None for anything else (these answers only ever inform an estimate)."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _first_window(*values: Any) -> int | None:
    """The first of ``values`` that is a window: a positive whole number (not a bool)."""
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def parse_props(body: bytes) -> int | None:
    """The window llama.cpp's ``GET /props`` states: ``default_generation_settings.n_ctx`` (recent versions,
    per slot), else a top-level ``n_ctx`` (older ones); None for anything else."""
    obj = _json_object(body)
    if obj is None:
        return None
    settings = obj.get("default_generation_settings")
    return _first_window(settings.get("n_ctx") if isinstance(settings, dict) else None, obj.get("n_ctx"))


def context_refusal(status: int | None, message: str) -> tuple[bool, int | None]:
    """Whether an error is a refusal for the prompt's length (HTTP 400 in the words of llama.cpp, vLLM or
    OpenAI), and the window it states, if it does."""
    if status != 400 or not _REFUSAL.search(message):
        return False, None
    for pattern in _STATED_WINDOW:
        found = pattern.search(message)
        if found:
            value = int(found.group(1).replace(",", ""))
            if value > 0:
                return True, value
    return True, None


def learned_framing(server_count: int, own_count: int, messages: int, framing: int = MESSAGE_TOKENS) -> int:
    """The framing per message a reply's usage shows: ``framing`` plus the excess of the server's count over
    the own count (made with ``framing``), shared out over the messages and rounded up; never less than
    ``framing`` (a server that counts fewer, having cut the prompt, teaches nothing)."""
    if messages <= 0 or server_count <= own_count:
        return framing
    return framing + -(-(server_count - own_count) // messages)


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
        window = _first_window(model.get("max_model_len"), meta.get("n_ctx_train"), model.get("context_length"),
                               model.get("context_window"))
        if window is not None:
            windows[str(model["id"])] = window
    return windows


def parse_token_count(body: bytes) -> int | None:
    """The number of tokens a /tokenize answer holds (vLLM's ``count``, else llama.cpp's ``tokens``)."""
    obj = _json_object(body)
    if obj is None:
        return None
    count = obj.get("count")
    if isinstance(count, int) and not isinstance(count, bool):
        return count
    tokens = obj.get("tokens")
    return len(tokens) if isinstance(tokens, list) else None


class ContextBudget:
    """Counts and fits for one client. Hold one per client for the session: it remembers the server's
    counts (per model and text), whether the server has a tokenizer, the windows /props and /models state,
    and what the client's requests taught (the template's framing per message, a window a refusal stated).

    It listens on the client's bus from the start (every request through the client teaches it, fitted by
    it or not); ``close`` stops that. Never raises from a listener: a record it cannot read teaches nothing.
    """

    def __init__(self, client: ChatClient, *, timeout_s: float = 2.0) -> None:
        self.client = client
        self.timeout_s = timeout_s
        self._counts: dict[tuple[str, str], int] = {}
        self._tokenizer: bool | None = None
        """None until asked; False once the server said it has none."""
        self._windows: dict[str, int] | None = None
        self._props: int | None = None
        self._windows_at = 0.0
        self._framing: dict[str, int] = {}
        """Per model: tokens a message costs as the server's usage counts them (never below MESSAGE_TOKENS)."""
        self._refused: dict[str, int] = {}
        """Per model: the window a refusal for length taught (stated by the server, else the refused count)."""
        self._notes: dict[str, str] = {}
        """Per model: what the next fit says once (after a refusal for length)."""
        self._last_window: dict[str, int] = {}
        self._pending: dict[str, tuple[int, int, int]] = {}
        """Per request id: the own count at MESSAGE_TOKENS a message, the count as sent, the messages."""
        self._unsubscribe: list[Callable[[], None]] = [
            client.bus.subscribe(RequestStarted, self._on_started),
            client.bus.subscribe(RequestDone, self._on_done),
        ]

    def close(self) -> None:
        """Stop learning from the client's requests (the counts and what was learnt stay)."""
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe.clear()

    def framing(self, model: str = "") -> int:
        """Tokens counted per message for ``model``'s chat template: MESSAGE_TOKENS until a reply's usage
        showed more."""
        return self._framing.get(model or self.client.model, MESSAGE_TOKENS)

    # -- learning from the client's requests -----------------------------------------------------------
    def _own_count(self, messages: Sequence[Message], model: str) -> int:
        """The prompt's tokens at MESSAGE_TOKENS a message, from the counts known now (no request)."""
        total = REPLY_TOKENS
        for m in messages:
            text, images = content_texts(m.get("content"))
            n = self._counts.get((model, text)) if text else 0
            total += MESSAGE_TOKENS + (estimate_tokens(text) if n is None else n) + IMAGE_TOKENS * images
        return total

    def _on_started(self, event: RequestStarted) -> None:
        record, messages = event.record, event.messages
        if record.mode not in ("stream", "batch") or not messages:
            return
        model = record.model or self.client.model
        own = self._own_count(messages, model)
        sent = own + len(messages) * (self.framing(model) - MESSAGE_TOKENS)
        if len(self._pending) >= _PENDING_LIMIT:
            self._pending.clear()  # requests that never finished (a listener added mid-request): forget them
        self._pending[record.request_id] = (own, sent, len(messages))
        # The record compares the server's count with this one (a better count than the client's estimate).
        record.prompt_sent_tokens = sent

    def _on_done(self, event: RequestDone) -> None:
        record = event.record
        pending = self._pending.pop(record.request_id, None)
        if pending is None:
            return
        own, sent, messages = pending
        model = record.model or self.client.model
        if record.error is not None:
            self._on_refused(record, model, sent, messages)
            return
        got = record.prompt_tokens
        if got is None or record.cache_hit or record.prompt_truncated:
            return
        framing = learned_framing(got, own, messages)
        if self.framing(model) < framing <= _FRAMING_LIMIT:
            self._framing[model] = framing

    def _on_refused(self, record: TimingRecord, model: str, sent: int, messages: int) -> None:
        refused, stated = context_refusal(record.status, record.error or "")
        if not refused:
            return
        window = self._last_window.get(model)
        if stated:
            self._refused[model] = stated
            note = (f"the server refused the last request as longer than its {stated:,}-token context window; "
                    "this one is fitted to that window")
        elif window and sent < window and messages:
            # The window is known and the prompt we counted under it was refused: the template costs more
            # than counted, by at least the difference, shared over the messages.
            framing = self.framing(model) + -(-(window - sent) // messages)
            self._framing[model] = min(framing, _FRAMING_LIMIT)
            note = (f"the server refused the last request as longer than its {window:,}-token context window; "
                    f"this one is fitted counting {self._framing[model]} tokens a message of chat template")
        else:
            # Nothing says how large the window is: a prompt that long (as counted here) does not fit.
            self._refused[model] = min(sent, self._refused.get(model, sent))
            note = (f"the server refused the last request ({sent:,} tokens as counted here) as longer than its "
                    "context window; this one is fitted to less")
        self._notes[model] = note

    # -- the window ------------------------------------------------------------------------------------
    def _configured_window(self) -> int:
        provider = self.client.settings.providers.get(self.client.endpoint.name)
        return provider.context_window if provider is not None else 0

    async def window(self, model: str) -> tuple[int | None, WindowSource]:
        """The context window for ``model`` and where it came from; (None, "") when nobody says. A window a
        refusal taught wins when it is smaller. Never raises: a /props and /models that fail are asked again
        a minute later."""
        value, source = await self._stated_window(model)
        refused = self._refused.get(model or self.client.model)
        if refused is not None and (value is None or refused < value):
            value, source = refused, "refusal"
        if value is not None:
            self._last_window[model or self.client.model] = value
        return value, source

    async def _stated_window(self, model: str) -> tuple[int | None, WindowSource]:
        configured = self._configured_window()
        if configured:
            return configured, "config"
        stale = not self._windows and self._props is None and time.monotonic() - self._windows_at > _MODELS_RETRY_S
        if self._windows is None or stale:
            self._windows_at = time.monotonic()
            # Bounded as a whole, connecting included: the user is waiting to send.
            windows, props = await asyncio.gather(
                asyncio.wait_for(self._fetch_windows(), self.timeout_s),
                asyncio.wait_for(self._fetch_props(), self.timeout_s),
                return_exceptions=True,
            )
            self._windows = windows if isinstance(windows, dict) else {}
            self._props = props if isinstance(props, int) else None
            for outcome in (windows, props):
                if isinstance(outcome, BaseException) and not isinstance(outcome, errors.APIError | TimeoutError):
                    raise outcome
        if self._props is not None:
            # llama.cpp's running window (-c), which its /models' n_ctx_train (the training window) is not.
            return self._props, "server"
        windows = self._windows
        if not windows:
            return None, ""
        # No model named: the first one listed is the one a request would take.
        value = windows.get(model) if model else next(iter(windows.values()))
        return (value, "server") if value else (None, "")

    async def _fetch_props(self) -> int | None:
        url = root_url(self.client.endpoint.base_url, "/props")
        async with self.client.transport.request("GET", url, phases=Phases()) as resp:
            data = await resp.aread()
        return parse_props(data) if resp.status < 400 else None

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
        """Each message's tokens (framing included: ``framing(model)`` a message) and who counted them. Never
        raises: a tokenizer that fails or is slow makes this an estimate."""
        model = model or self.client.model
        parts = [content_texts(m.get("content")) for m in messages]
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
        framing = self.framing(model)
        return [framing + counts[t] + IMAGE_TOKENS * images for t, images in parts], by

    async def fit(self, messages: Sequence[Message], *, max_tokens: int | None = None,
                  model: str = "") -> ContextFit:
        """The messages that fit the window with room for the reply, oldest turns left out first; never the
        leading system prompt, nor the last user message and what follows it. Each message counts the
        framing learnt for ``model`` (``framing``); after a refusal for length the fit carries a ``note``,
        once. Raises ContextOverflowError (one line: the counts, the window, the fix) when those alone do not
        fit."""
        start = time.perf_counter_ns()
        model = model or self.client.model
        messages = list(messages)
        (costs, by), (window, source) = await asyncio.gather(self.count(messages, model), self.window(model))
        count_ms = (time.perf_counter_ns() - start) / 1e6
        total = REPLY_TOKENS + sum(costs)
        framing, note = self.framing(model), self._notes.pop(model, "")  # the note is said once
        if window is None:
            return ContextFit(messages, total, None, "", max_tokens or 0, 0, 0, by, count_ms, framing, note)
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
        return ContextFit(kept, total, window, source, reserve, i - head, turns, by, count_ms, framing, note)

