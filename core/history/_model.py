"""What the chat history holds, as plain values, and the two ways it leaves llmchat: Markdown and JSON.

Pure: no I/O, no clock reads, no SQLite. :mod:`llmchat.core.history._store` fills these from the database. A
timing record is the dict ``TimingRecord.summary()`` makes, which by construction holds figures and names,
never request headers, so nothing here can carry an API key.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from llmchat.core.config import is_secret_header

Role = Literal["user", "assistant", "system"]
#: "streaming" while a reply is written (and forever when the process writing it was killed); "cancelled" when
#: the user stopped it; "interrupted" when llmchat quit or closed the history mid-reply; "refused" when the
#: model declined to answer (its words in ``Message.refusal``: a whole reply, not a partial one).
Status = Literal["streaming", "done", "cancelled", "interrupted", "error", "refused"]

#: How a conversation reached its provider, so that resuming it can reach the same one: "provider", a provider
#: configured by name; "base_url", an ad-hoc ``--base-url`` (its URL is kept, never a key); "offline", the
#: offline demo's local server (its port changes each run: it is "the local server", not a URL); "" unknown
#: (a conversation saved before llmchat kept this: only the provider's name is known).
Origin = Literal["provider", "base_url", "offline", ""]
ORIGINS: tuple[Origin, ...] = ("provider", "base_url", "offline", "")

#: A default title is cut to this many characters, on one line.
TITLE_CHARS = 60


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) made one space, trimmed."""
    return " ".join(text.split())


def title_from(text: str, limit: int = TITLE_CHARS) -> str:
    """A conversation title made from a user's first message: one line, at most ``limit`` characters.

    A cut title ends with an ellipsis, at a word boundary when one falls in the last third.
    """
    line = one_line(text)
    if len(line) <= limit:
        return line
    cut = line[: limit - 1]
    space = cut.rfind(" ")
    if space >= (limit * 2) // 3:
        cut = cut[:space]
    return cut.rstrip() + "…"


def storable_url(url: str) -> str:
    """``url`` as the history may keep it: without user name and password, without a query parameter whose
    name looks like a credential (``?key=``, ``&token=``) and without a fragment. A key is never stored; a URL
    that needed one in it gets it again from the command line or the config. "" for something not a URL."""
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname
        port = parts.port
    except ValueError:
        return ""
    if parts.scheme not in ("http", "https") or not host:
        return ""
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    pairs = [(n, v) for n, v in parse_qsl(parts.query, keep_blank_values=True) if not is_secret_header(n)]
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), urlencode(pairs), ""))


#: What the generation settings accept: (lowest, highest, whole numbers only). The same bounds as
#: ``llmchat ask --temperature / --seed / --max-tokens``.
_BOUNDS: dict[str, tuple[float | None, float | None, bool]] = {
    "temperature": (0.0, 2.0, False),
    "seed": (None, None, True),
    "max_tokens": (1, None, True),
}


def _number_text(value: float) -> str:
    """A number as a person writes it: ``0``, ``0.7``, ``1234567890``; never rounded."""
    if isinstance(value, int):
        return str(value)
    short = f"{value:g}"
    return short if float(short) == value else repr(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class Generation:
    """The generation settings a conversation sends with every request; None sends nothing (the server's
    default). A temperature of 0 or a seed makes a batch reply cacheable under the "deterministic" policy."""

    temperature: float | None = None
    seed: int | None = None
    max_tokens: int | None = None

    def params(self) -> dict[str, Any]:
        """The request parameters: only the settings that are set."""
        out: dict[str, Any] = {}
        if self.temperature is not None:
            out["temperature"] = self.temperature
        if self.seed is not None:
            out["seed"] = self.seed
        if self.max_tokens is not None:
            out["max_tokens"] = self.max_tokens
        return out

    def describe(self) -> str:
        """One line for the user: ``temperature 0 · seed 7``, or ``server defaults`` when nothing is set."""
        shown = [f"{name.replace('_', ' ')} {_number_text(value)}" for name, value in self.params().items()]
        return " · ".join(shown) or "server defaults"

    def shown(self, name: str) -> str:
        """The setting ``name`` as text to edit: ``"0.7"``, or ``""`` when not set."""
        value = getattr(self, name)
        return "" if value is None else _number_text(value)


    def with_text(self, name: str, text: str) -> Generation:
        """A copy with ``name`` ("temperature", "seed" or "max_tokens") set from what a person typed; empty
        text unsets it. ValueError with one line saying what is wanted for anything else."""
        low, high, whole = _BOUNDS[name]
        text = text.strip()
        if not text:
            return self._with(name, None)
        if low is not None and high is not None:
            bounds = f" from {low:g} to {high:g}"
        elif low is not None:
            bounds = f" of at least {low:g}"
        else:
            bounds = ""
        wanted = f"{name.replace('_', ' ')} must be {'a whole number' if whole else 'a number'}{bounds}"
        try:
            value: float = int(text) if whole else float(text)
        except ValueError:
            raise ValueError(f"{wanted} (or empty for the server's default), got {text!r}") from None
        out_of_range = (low is not None and value < low) or (high is not None and value > high)
        if not math.isfinite(value) or out_of_range:
            raise ValueError(f"{wanted} (or empty for the server's default), got {text}")
        return self._with(name, value)

    def _with(self, name: str, value: float | None) -> Generation:
        changes: dict[str, Any] = {name: value}
        return replace(self, **changes)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationInfo:
    """One line of the history list. Times are wall-clock seconds since the epoch (to show, not to time)."""

    id: int
    title: str
    created_at: float
    updated_at: float
    message_count: int
    provider: str
    """The provider of the latest reply (or the one the conversation was started with)."""
    model: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """One stored message. ``record`` is the reply's timing summary; None for user messages."""

    id: int
    conversation_id: int
    role: Role
    content: str
    status: Status
    error: str | None
    provider: str
    model: str
    mode: str
    record: dict[str, Any] | None
    created_at: float
    reasoning: str = ""
    """A reasoning model's thinking before this reply, apart from ``content`` (never sent back to it)."""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    """The tool calls the reply asked for, in OpenAI's shape (``id``, ``type``, ``function``); none ran."""
    refusal: str = ""
    """The model's refusal, in its words, apart from ``content`` ("" unless ``status`` is "refused")."""
    parent_id: int | None = None
    """The message this one follows (None for the first): see :mod:`llmchat.core.history._tree`."""
    alternatives: tuple[int, ...] = ()
    """The ids of this message's alternatives, itself included, oldest first (regenerated replies, edited
    prompts); () when it was loaded without its tree."""

    @property
    def alternative_marker(self) -> str:
        """``"2/3"`` for the second of three alternatives; "" for a message with none."""
        if len(self.alternatives) < 2 or self.id not in self.alternatives:
            return ""
        return f"{self.alternatives.index(self.id) + 1}/{len(self.alternatives)}"

    @property
    def partial(self) -> bool:
        """A reply that did not finish: cancelled, interrupted, failed, or still streaming when llmchat was
        killed. A refused reply finished: the model said no."""
        return self.role == "assistant" and self.status not in ("done", "refused")


@dataclass(frozen=True, slots=True, kw_only=True)
class Conversation:
    """A whole conversation: its list line, its system prompt, its messages (oldest first), where it was
    held (``info.provider`` and ``info.model``, with ``origin`` and ``base_url``: see :data:`Origin`) and the
    generation settings it sends."""

    info: ConversationInfo
    system_prompt: str = ""
    messages: list[Message] = field(default_factory=list)
    origin: Origin = ""
    base_url: str = ""
    """The provider's API root when the conversation was last used ("" for the offline demo's server)."""
    generation: Generation = field(default_factory=Generation)

    @property
    def id(self) -> int:
        return self.info.id

    @property
    def title(self) -> str:
        return self.info.title

    def messages_for_api(self) -> list[dict[str, str]]:
        """The ``messages`` to send to resume this conversation: the system prompt first, then every message.

        An empty reply is left out (the model said nothing). A partial reply is kept, since it is what the
        user saw and may answer, with a short note after it so the model knows it was cut. A refusal goes as
        the reply's text (every server takes ``content``; not every one takes ``refusal``): the user may answer
        it, and the model must know what it said.
        """
        out: list[dict[str, str]] = []
        if self.system_prompt:
            out.append({"role": "system", "content": self.system_prompt})
        for msg in self.messages:
            content = (msg.content or msg.refusal) if msg.role == "assistant" else msg.content
            if msg.role == "assistant" and not content:
                continue
            if msg.partial:
                content += f"\n\n[reply cut short: {_status_word(msg.status)}]"
            out.append({"role": msg.role, "content": content})
        return out


def _status_word(status: str) -> str:
    # A row left "streaming" was written by a process that was killed mid-reply: it was interrupted too.
    return "interrupted" if status == "streaming" else status


#: The line a Markdown export puts under a reply that did not finish, so nobody takes it for a whole answer.
_PARTIAL_MARKS = {
    "cancelled": "_(cancelled: the reply was stopped before it ended)_",
    "interrupted": "_(interrupted: the reply was cut off)_",
    "error": "_(error: the reply did not finish)_",
}


def partial_mark(msg: Message) -> str:
    """The italic line that says a reply is not whole ("" for a finished one or a user message), or that the
    model refused, with its words: ``_(refused: the model declined: "I'm sorry...")_``."""
    if msg.role == "assistant" and msg.status == "refused":
        return f"_(refused: the model declined: {refusal_words(msg.refusal)})_"
    return _PARTIAL_MARKS[_status_word(msg.status)] if msg.partial else ""


def refusal_words(refusal: str) -> str:
    """A refusal quoted on one line (``"I'm sorry..."``); ``no reason given`` for an empty one."""
    words = one_line(refusal)
    return f'"{words}"' if words else "no reason given"


# -- export --------------------------------------------------------------------------------------------------

def _duration(ms: float | None) -> str | None:
    if ms is None:
        return None
    return f"{ms:.0f} ms" if ms < 1000 else f"{ms / 1000:.2f} s"


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def timing_line(msg: Message) -> str:
    """A compact line about how a reply went: ``llmchat-local · HTTP/2 · TTFT 212 ms · 70 tok/s · 1.42 s``.

    Built from the message's model and timing record; parts the record lacks are left out. Empty for a
    message with neither a model nor a record.
    """
    rec = msg.record or {}
    model = msg.model or str(rec.get("model") or "")
    parts: list[str] = []
    if model:
        parts.append(f"{model} via {msg.provider}" if msg.provider and msg.provider != model else model)
    if rec.get("cache_hit"):
        parts.append("cache hit")
    elif rec.get("http_version"):
        parts.append(str(rec["http_version"]))
    thinking = _duration(_number(rec.get("thinking_ms")))
    if thinking:
        parts.append(f"thought {thinking}")
    ttft = _duration(_number(rec.get("ttft_ms")))
    if ttft:
        parts.append(f"TTFT {ttft}")
    rate = _number(rec.get("tokens_per_s"))
    if rate is not None and rate > 0:
        parts.append(f"{rate:.0f} tok/s" if rate >= 10 else f"{rate:.1f} tok/s")
    total = _duration(_number(rec.get("total_ms")))
    if total:
        parts.append(total)
    retries = rec.get("retries")
    if isinstance(retries, int) and retries > 0:
        parts.append(f"{retries} {'retry' if retries == 1 else 'retries'}")
    return " · ".join(parts)


def _heading(msg: Message) -> str:
    name = {"user": "You", "assistant": "Assistant", "system": "System"}.get(msg.role, msg.role)
    if msg.role != "assistant" or msg.status == "done":
        return f"## {name}"
    if msg.status == "error":
        return f"## {name} (error: {one_line(msg.error or 'unknown')})"
    return f"## {name} ({_status_word(msg.status)})"


def _when(wall: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(wall))


_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_ATX = re.compile(r"^( {0,3})(#{1,6})(?=[ \t]|$)")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
#: Lines that are something else than a paragraph's text, so a --- under them is no heading underline.
_NOT_PARAGRAPH = re.compile(r"^(?: {4}|\t| {0,3}(?:[-+*>#|]|\d{1,9}[.)])(?:[ \t]|$))")


def nest_headings(markdown: str, levels: int = 2) -> str:
    """``markdown`` with each heading moved ``levels`` down (``#`` is ``###``, at most ``######``), so a
    message's own headings sit under the export's ``## Assistant`` instead of beside it.

    Fenced code (``` or ~~~) is left exactly as it is: a ``#`` there is a comment, not a heading. A one-line
    setext heading (a paragraph line underlined with === or ---) becomes a ``#`` heading at its new level.
    """
    out: list[str] = []
    fence: tuple[str, int] | None = None  # the open fence's character and length
    for line in markdown.split("\n"):
        m = _FENCE.match(line)
        if fence is not None:
            if m and m[1][0] == fence[0] and len(m[1]) >= fence[1] and not m[2].strip():
                fence = None
            out.append(line)
            continue
        if m and not (m[1][0] == "`" and "`" in m[2]):  # a backtick fence's info string holds no backtick
            fence = (m[1][0], len(m[1]))
            out.append(line)
            continue
        if atx := _ATX.match(line):
            out.append(atx[1] + "#" * min(6, len(atx[2]) + levels) + line[atx.end():])
            continue
        setext = _SETEXT.match(line)
        start = _paragraph_start(out) if setext else None
        if setext and start is not None:
            level = (1 if setext[1][0] == "=" else 2) + levels
            out[start:] = ["#" * min(6, level) + " " + " ".join(t.strip() for t in out[start:])]
            continue
        out.append(line)
    return "\n".join(out)


def _paragraph_start(out: list[str]) -> int | None:
    """Where the paragraph that ends ``out`` starts, when a setext underline under it makes it a heading: a
    run of text lines after a blank line (or the start), none a list item, quote, table row, code or
    heading. None otherwise (then a --- under it is a rule, and === is text)."""
    start = len(out)
    while start > 0 and out[start - 1].strip():
        start -= 1
    if start == len(out) or any(_NOT_PARAGRAPH.match(text) for text in out[start:]):
        return None
    return start


def tool_call_lines(call: Mapping[str, Any]) -> list[str]:
    """A tool call as Markdown: ``**Tool call** `name` (id)`` and its arguments in a fenced JSON block
    (indented when they are valid JSON, as sent otherwise)."""
    raw = call.get("function")
    fn: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    name = str(fn.get("name") or "?")
    ident = f" ({call['id']})" if call.get("id") else ""
    return [f"**Tool call** `{name}`{ident}", "", "```json", pretty_arguments(fn.get("arguments")), "```"]


def pretty_arguments(arguments: object) -> str:
    """Tool-call arguments for people: indented JSON when they parse, else the text as it came."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return text


def export_markdown(conv: Conversation, *, thinking: bool = False) -> str:
    """The conversation as a Markdown document: title, system prompt, then each message under a role heading.

    A reply's tool calls follow its text, each with its arguments; with ``thinking`` a reply's reasoning comes
    first, as a quoted block under *Thinking*.

    A reply that did not finish says so in its heading ("(cancelled)", "(error: ...)", "(interrupted)") and in
    an italic line after what arrived of it; a refused one says "(refused)" and quotes the refusal in that
    line. Each reply ends with its model and timing line in italics. The messages' own headings are nested
    under their role heading (:func:`nest_headings`). Never fails for a well-formed ``Conversation``.
    """
    title = conv.title or f"Conversation {conv.id}"
    lines = [f"# {title}", "", f"*Conversation {conv.id} · started {_when(conv.info.created_at)} · "
             f"{len(conv.messages)} {'message' if len(conv.messages) == 1 else 'messages'}*", ""]
    if conv.system_prompt:
        lines += ["## System prompt", "", nest_headings(conv.system_prompt.rstrip()), ""]
    for msg in conv.messages:
        lines += [_heading(msg), ""]
        if thinking and msg.reasoning.strip():
            lines += ["*Thinking:*", ""] + [f"> {line}" if line else ">" for line in
                                           msg.reasoning.strip().split("\n")] + [""]
        if msg.content:
            lines += [nest_headings(msg.content.rstrip()), ""]
        for call in msg.tool_calls:
            lines += [*tool_call_lines(call), ""]
        mark = partial_mark(msg)
        if mark:
            lines += [mark, ""]
        if msg.role == "assistant":
            timing = timing_line(msg)
            if timing:
                lines += [f"*{timing}*", ""]
    return "\n".join(lines)


def export_records_json(conv: Conversation, *, thinking: bool = False) -> str:
    """A JSON list with one object per reply that has a timing record: the message id, conversation id,
    status ("refused" for a refusal) and error, the refusal in the model's words (``refusal``, null for none),
    the tool calls it asked for (``tool_call_list``), with ``thinking`` its reasoning text,
    then the record's own fields. Replies without a record (none was made) are left out.
    """
    out: list[dict[str, Any]] = []
    for msg in conv.messages:
        if msg.role != "assistant" or msg.record is None:
            continue
        out.append({
            "message_id": msg.id,
            "conversation_id": conv.id,
            "message_status": msg.status,
            "message_error": msg.error,
            "refusal": msg.refusal or None,
            "tool_call_list": list(msg.tool_calls),
            **({"reasoning": msg.reasoning} if thinking else {}),
            **msg.record,
        })
    return json.dumps(out, indent=2, ensure_ascii=False) + "\n"
