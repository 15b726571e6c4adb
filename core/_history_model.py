"""What the chat history holds, as plain values, and the two ways it leaves llmchat: Markdown and JSON.

Pure: no I/O, no clock reads, no SQLite. :mod:`llmchat.core._history` fills these from the database. A
timing record is the dict ``TimingRecord.summary()`` makes, which by construction holds figures and names,
never request headers, so nothing here can carry an API key.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["user", "assistant", "system"]
#: "streaming" while a reply is written (and forever when the process writing it was killed); "cancelled" when
#: the user stopped it; "interrupted" when llmchat quit or closed the history mid-reply.
Status = Literal["streaming", "done", "cancelled", "interrupted", "error"]

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

    @property
    def partial(self) -> bool:
        """A reply that did not finish: cancelled, interrupted, failed, or still streaming when llmchat was
        killed."""
        return self.role == "assistant" and self.status != "done"


@dataclass(frozen=True, slots=True, kw_only=True)
class Conversation:
    """A whole conversation: its list line, its system prompt and its messages, oldest first."""

    info: ConversationInfo
    system_prompt: str = ""
    messages: list[Message] = field(default_factory=list)

    @property
    def id(self) -> int:
        return self.info.id

    @property
    def title(self) -> str:
        return self.info.title

    def messages_for_api(self) -> list[dict[str, str]]:
        """The ``messages`` to send to resume this conversation: the system prompt first, then every message.

        An empty reply is left out (the model said nothing). A partial reply is kept, since it is what the
        user saw and may answer, with a short note after it so the model knows it was cut.
        """
        out: list[dict[str, str]] = []
        if self.system_prompt:
            out.append({"role": "system", "content": self.system_prompt})
        for msg in self.messages:
            if msg.role == "assistant" and not msg.content:
                continue
            content = msg.content
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
    """The italic line that says a reply is not whole ("" for a finished one or a user message)."""
    return _PARTIAL_MARKS[_status_word(msg.status)] if msg.partial else ""


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


def export_markdown(conv: Conversation) -> str:
    """The conversation as a Markdown document: title, system prompt, then each message under a role heading.

    A reply that did not finish says so in its heading ("(cancelled)", "(error: ...)", "(interrupted)") and in
    an italic line after what arrived of it; each reply ends with its model and timing line in italics. Never
    fails for a well-formed ``Conversation``.
    """
    title = conv.title or f"Conversation {conv.id}"
    lines = [f"# {title}", "", f"*Conversation {conv.id} · started {_when(conv.info.created_at)} · "
             f"{len(conv.messages)} {'message' if len(conv.messages) == 1 else 'messages'}*", ""]
    if conv.system_prompt:
        lines += ["## System prompt", "", conv.system_prompt.rstrip(), ""]
    for msg in conv.messages:
        lines += [_heading(msg), ""]
        if msg.content:
            lines += [msg.content.rstrip(), ""]
        mark = partial_mark(msg)
        if mark:
            lines += [mark, ""]
        if msg.role == "assistant":
            timing = timing_line(msg)
            if timing:
                lines += [f"*{timing}*", ""]
    return "\n".join(lines)


def export_records_json(conv: Conversation) -> str:
    """A JSON list with one object per reply that has a timing record: the message id, conversation id,
    status and error, then the record's own fields. Replies without a record (none was made) are left out.
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
            **msg.record,
        })
    return json.dumps(out, indent=2, ensure_ascii=False) + "\n"
