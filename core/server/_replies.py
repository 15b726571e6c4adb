"""Deterministic reply text and a small tokeniser for the local server.

A reply is fixed by (model, messages, seed) and built so a client meets every rendering path early: a heading
and Markdown prose, a list, a fenced code block, a table, then non-ASCII text (accents, a combining accent,
CJK, emoji with a zero-width joiner and a flag), each split by the tokeniser so multi-byte characters and
grapheme clusters arrive across chunk boundaries. Without ``max_tokens`` a reply ends at the first block
boundary past ``default_max_tokens`` (finish_reason "stop"); with it, the reply is cut at exactly that many
tokens (finish_reason "length"), as a model that hits its limit is.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

from llmchat.core.server._structured import json_text

# One token: a run of newlines, an optional space and up to 8 ASCII letters or 3 digits, an optional space and
# one other character (so every non-ASCII code point is a token of its own), a run of blanks, or other space.
_TOKEN = re.compile(r"\n+| ?[A-Za-z]{1,8}| ?[0-9]{1,3}| ?[^\sA-Za-z0-9]|[ \t]+|\s")


def tokenize(text: str) -> list[str]:
    """Split ``text`` into tokens whose concatenation is ``text`` exactly. Never fails."""
    return _TOKEN.findall(text)


def count_tokens(text: str) -> int:
    """The number of tokens ``tokenize`` would return, without building the list."""
    return sum(1 for _ in _TOKEN.finditer(text))


def chat_charge(body: bytes, default_max_tokens: int) -> int:
    """What a chat request counts against a tokens-per-minute limit as it arrives, as OpenAI counts it: its
    prompt tokens plus the max_tokens it asks for (the server's default when it names none). A body that is
    not a chat request is charged 0 here; its 400 comes from the parser after."""
    try:
        obj = json.loads(body)
    except ValueError:
        return 0
    if not isinstance(obj, dict) or not isinstance(obj.get("messages"), list):
        return 0
    messages = [m for m in obj["messages"] if isinstance(m, dict)]
    asked = obj.get("max_completion_tokens", obj.get("max_tokens"))
    out = asked if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0 else default_max_tokens
    return count_prompt_tokens(messages) + out


def count_prompt_tokens(messages: Sequence[dict[str, object]], template_overhead: int = 0) -> int:
    """Prompt tokens as OpenAI counts them for chat: each message's text plus a few tokens of framing, and
    ``template_overhead`` more per message (a chat template's, as llama.cpp's)."""
    total = 3
    for message in messages:
        total += 4 + template_overhead
        for key in ("content", "name"):
            value = message.get(key)
            if isinstance(value, str):
                total += count_tokens(value)
            elif isinstance(value, list):
                for part in value:
                    if isinstance(part, dict) and isinstance(part.get("text"), str):
                        total += count_tokens(part["text"])
                    elif isinstance(part, dict):
                        total += 85  # what OpenAI charges for a low-detail image
    return total


@dataclass(frozen=True, slots=True)
class Reply:
    """A reply's tokens, the same tokens JSON-escaped as UTF-8 bytes (ready to drop into a template)."""

    tokens: tuple[str, ...]
    escaped: tuple[bytes, ...]
    finish_reason: str

    @property
    def text(self) -> str:
        return "".join(self.tokens)


def build_reply(
    model: str,
    messages_key: str,
    last_user_text: str,
    seed: int,
    max_tokens: int,
    explicit_limit: bool,
    stop: tuple[str, ...] = (),
) -> Reply:
    """The reply for a request, cached, so repeated prompts (benchmarks) cost only the lookup.

    ``messages_key`` is any string that identifies the messages (the caller passes their canonical JSON).
    ``explicit_limit`` says ``max_tokens`` came from the request. Never fails.
    """
    return _build_reply(model, messages_key, last_user_text, seed, max_tokens, explicit_limit, stop)


@lru_cache(maxsize=512)
def _build_reply(
    model: str,
    messages_key: str,
    last_user_text: str,
    seed: int,
    max_tokens: int,
    explicit_limit: bool,
    stop: tuple[str, ...],
) -> Reply:
    digest = hashlib.sha256(f"{model}\x00{seed}\x00{messages_key}".encode()).digest()
    rng = random.Random(int.from_bytes(digest[:8], "big"))
    tokens: list[str] = []
    finish = "stop"
    for block in _blocks(rng, last_user_text):
        block_tokens = tokenize(block)
        if explicit_limit and len(tokens) + len(block_tokens) >= max_tokens:
            tokens.extend(block_tokens[: max_tokens - len(tokens)])
            finish = "length"
            break
        tokens.extend(block_tokens)
        if not explicit_limit and len(tokens) >= max_tokens:
            while tokens and not tokens[-1].strip():  # a reply does not end in a blank line
                tokens.pop()
            break
    if stop:
        tokens, stopped = _apply_stop(tokens, stop)
        if stopped:
            finish = "stop"
    return Reply(tuple(tokens), tuple(_escape(t) for t in tokens), finish)


def build_json_reply(
    model: str,
    messages_key: str,
    format_key: str,
    seed: int,
    max_tokens: int | None,
    stop: tuple[str, ...] = (),
) -> Reply:
    """The reply to a request with a JSON ``response_format``: ``format_key`` is its ``ResponseFormat.key``
    (the type and schema as JSON). The document is whole (finish_reason "stop") unless the request's own
    ``max_tokens`` (None: none given) cuts it, as it cuts a model's JSON ("length"). Cached; never fails."""
    return _build_json_reply(model, messages_key, format_key, seed, max_tokens, stop)


@lru_cache(maxsize=128)
def _build_json_reply(
    model: str, messages_key: str, format_key: str, seed: int, max_tokens: int | None, stop: tuple[str, ...]
) -> Reply:
    digest = hashlib.sha256(f"{model}\x00{seed}\x00{messages_key}\x00{format_key}".encode()).digest()
    kind, schema = json.loads(format_key)
    text = json_text(schema if kind == "json_schema" else None, random.Random(int.from_bytes(digest[:8], "big")))
    tokens = tokenize(text)
    finish = "stop"
    if max_tokens is not None and len(tokens) > max_tokens:
        tokens, finish = tokens[:max_tokens], "length"
    if stop:
        tokens, stopped = _apply_stop(tokens, stop)
        finish = "stop" if stopped else finish
    return Reply(tuple(tokens), tuple(_escape(t) for t in tokens), finish)


def _apply_stop(tokens: list[str], stop: tuple[str, ...]) -> tuple[list[str], bool]:
    text = "".join(tokens)
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
    if cut < 0:
        return tokens, False
    kept: list[str] = []
    length = 0
    for token in tokens:
        if length + len(token) > cut:
            if cut > length:
                kept.append(token[: cut - length])
            break
        kept.append(token)
        length += len(token)
    return kept, True


def split_surrogates(reply: Reply) -> Reply:
    """``reply`` with every token holding a character outside the BMP (emoji) cut in two after the high half
    of its first such character's surrogate pair, written as ASCII ``\\uXXXX`` escapes: each piece is valid
    JSON, the pair is split across two stream chunks. The fault ``--split-surrogates`` serves this."""
    tokens: list[str] = []
    escaped: list[bytes] = []
    for token in reply.tokens:
        at = next((i for i, c in enumerate(token) if ord(c) > 0xFFFF), -1)
        if at < 0:
            tokens.append(token)
            escaped.append(_escape(token))
            continue
        pair = json.dumps(token[at])[1:-1]  # "\ud83d\ude80"
        high, low = pair[:6], pair[6:]
        tokens += [token[: at + 1], token[at + 1 :]]  # what the two chunks say, once joined
        escaped += [_escape(token[:at]) + high.encode(), low.encode() + _escape(token[at + 1 :])]
    return Reply(tuple(tokens), tuple(escaped), reply.finish_reason)


@lru_cache(maxsize=8192)
def _escape(token: str) -> bytes:
    return json.dumps(token, ensure_ascii=False)[1:-1].encode()


_TOPICS = [
    "connection pooling",
    "streaming replies",
    "time to first token",
    "HTTP/2 multiplexing",
    "retry budgets",
    "disk caches",
    "backpressure",
    "tail latency",
]
_ADJECTIVES = ["steady", "careful", "measured", "honest", "quick", "patient", "lean", "plain"]
_SENTENCES = [
    "The first token is what a reader feels; the rest is throughput.",
    "A warm connection skips the handshake, and that saves a round trip or two.",
    "Measure on the same clock at both ends, or the numbers argue with each other.",
    "Retries are cheap until they all happen at once; jitter spreads them out.",
    "A cache that answers in a millisecond is only useful if it answers correctly.",
    "When the server falls behind, it sends several tokens in one write instead of waiting.",
    "Every stream ends with a sentinel so the client knows nothing was lost.",
    "Small writes cost system calls; large writes cost latency. Pick per situation.",
]
_LIST_ITEMS = [
    "Open one pool per provider and **reuse** it.",
    "Send `stream: true` and render tokens as they arrive.",
    "Keep an eye on *p95*, not just the mean.",
    "Back off with full jitter after a `429`.",
    "Cache only deterministic requests (temperature 0 or a fixed seed).",
    "Warm the connection before the first prompt.",
    "Cut a stalled stream after a timeout, and keep what arrived.",
]
_CODE = [
    (
        "python",
        'async def first_token(stream):\n    """Return the first content delta."""\n'
        "    async for chunk in stream:\n        if chunk.content:\n            return chunk.content\n"
        "    return None",
    ),
    (
        "rust",
        "fn tokens_per_second(tokens: u64, elapsed_ms: u64) -> f64 {\n"
        "    if elapsed_ms == 0 { return 0.0; }\n    tokens as f64 * 1000.0 / elapsed_ms as f64\n}",
    ),
    (
        "bash",
        'for i in $(seq 1 5); do\n  curl -sN http://127.0.0.1:8000/v1/models > /dev/null && echo "ok $i"\n'
        "done",
    ),
    (
        "json",
        '{\n  "model": "llmchat-local",\n  "stream": true,\n'
        '  "messages": [{"role": "user", "content": "hi"}]\n}',
    ),
]
_TABLE_ROWS = [
    ("TTFT", "250 ms", "first visible token"),
    ("Throughput", "70 tok/s", "steady state"),
    ("Handshake", "1 RTT", "TLS 1.3"),
    ("Pool", "10 conns", "per provider"),
    ("Retry", "4 tries", "full jitter"),
    ("Cache", "1 week", "deterministic only"),
]
_INTERNATIONAL = [
    "Café, naïve, façade and résumé keep their accents; so does the combining form: cafe\u0301.",
    "日本語のテキストも正しく表示されます。中文也一样：你好，世界！한국어도 좋아요.",
    "Emoji stay whole: 🚀 ⚡ 🎉, a joined one 👩\u200d💻, and a flag 🇫🇷.",
    "Größe, Ærøskøbing, São Paulo, Ελληνικά, русский текст, עברית and العربية.",
    "Math and symbols: π ≈ 3.14159, ∑ x² ≤ ∞, € 12,50 — “quoted” — … done.",
]


def _blocks(rng: random.Random, last_user_text: str) -> Iterator[str]:
    """Yield Markdown blocks, each ending in a blank line, endlessly: the caller stops when it has enough."""
    topic = rng.choice(_TOPICS)
    echo = " ".join(last_user_text.split()[:8]).replace("`", "'")
    heading = f"## On {topic}\n\n"
    intro = (
        f"You asked: *{echo}*. " if echo else ""
    ) + f"Here is a **{rng.choice(_ADJECTIVES)}** look at {topic}, with `code` where it helps. "
    yield heading + intro + " ".join(rng.sample(_SENTENCES, 2)) + "\n\n"
    if rng.random() < 0.5:
        items = "".join(f"- {item}\n" for item in rng.sample(_LIST_ITEMS, 4))
    else:
        items = "".join(f"{n}. {item}\n" for n, item in enumerate(rng.sample(_LIST_ITEMS, 4), 1))
    yield "Steps worth taking:\n\n" + items + "\n"
    lang, code = rng.choice(_CODE)
    yield f"A short example:\n\n```{lang}\n{code}\n```\n\n"
    rows = rng.sample(_TABLE_ROWS, 3)
    table = "| Measure | Typical | Note |\n|---|---:|---|\n" + "".join(
        f"| {a} | {b} | {c} |\n" for a, b, c in rows
    )
    yield table + "\n"
    # Accents, CJK and emoji always appear in the first reply of default length; the order varies.
    yield " ".join(rng.sample(_INTERNATIONAL[:3], 3)) + "\n\n"
    while True:
        yield " ".join(rng.sample(_SENTENCES, 3)) + "\n\n"
        yield " ".join(rng.sample(_INTERNATIONAL, 2)) + "\n\n"
