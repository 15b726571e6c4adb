"""Prompt datasets for `llmchat bench --dataset FILE`: ShareGPT-format JSON and JSON Lines.

Two formats, told apart by the first character of the file:

- **ShareGPT JSON** (a ``[``): a list of entries, each ``{"conversations": [{"from": "human" | "gpt" |
  "system", "value": TEXT}, ...]}`` (``user`` / ``assistant`` are taken for ``from`` too), or the OpenAI-shaped
  ``{"messages": [{"role": ..., "content": ...}, ...]}``.
- **JSON Lines** (anything else): one JSON value a line, a bare string (the prompt), ``{"prompt": TEXT}``, or
  an object with ``messages`` / ``conversations`` as above. Blank lines are skipped.

Only the human turns and the system prompt are kept: a multi-turn run (``--turns all``) replays the human
turns in order with the model's own replies of this run as the assistant turns, so the history a request
carries is what the server just produced (and could have cached). Entries without a human turn (ShareGPT
dumps hold some empty ones) are skipped and counted; anything of the wrong shape is one ``UsageError`` naming
the file, the entry or line, and the fix.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from llmchat.core.errors import UsageError

_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
          "bard": "assistant", "bing": "assistant", "model": "assistant", "system": "system"}
_FIX_JSONL = ('each line must be a JSON string (the prompt), {"prompt": TEXT}, or {"messages": [{"role": ..., '
              '"content": ...}]}')
_FIX_SHAREGPT = ('each entry must be {"conversations": [{"from": "human", "value": TEXT}, ...]} or {"messages": '
                 '[{"role": "user", "content": TEXT}, ...]}')


@dataclass(frozen=True, slots=True)
class Conversation:
    """What a dataset entry sends: its system prompt ("" for none) and its human turns, in order."""

    system: str
    turns: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Dataset:
    """The usable conversations of one file, in file order; ``skipped`` entries had no human turn."""

    path: str
    format: str
    """"sharegpt" (a JSON list) or "jsonl"."""
    conversations: tuple[Conversation, ...]
    skipped: int = 0

    @property
    def turns(self) -> int:
        return sum(len(c.turns) for c in self.conversations)

    def pick(self, pid: int) -> Conversation:
        """The conversation a prompt id stands for: the ids cycle through the file in order."""
        return self.conversations[pid % len(self.conversations)]

    def describe(self) -> str:
        """``name.json (ShareGPT, 12 conversations, 30 human turns, 2 skipped)``."""
        kind = "ShareGPT" if self.format == "sharegpt" else "JSONL"
        skipped = f", {self.skipped} without a human turn skipped" if self.skipped else ""
        return (f"{Path(self.path).name} ({kind}, {len(self.conversations)} conversations, {self.turns} human "
                f"turns{skipped})")


def load_dataset(path: str) -> Dataset:
    """The dataset in ``path`` (read once per path and modification time). Raises UsageError, one line
    naming the file, the entry or line, and the fix, for a file that cannot be read or has the wrong shape."""
    full = str(Path(path).expanduser())
    try:
        st = os.stat(full)
    except OSError as exc:
        raise UsageError(f"--dataset: cannot read {path} ({exc.strerror or exc}); check the path") from None
    return _load(full, st.st_mtime_ns, st.st_size, path)


@functools.lru_cache(maxsize=4)
def _load(full: str, mtime_ns: int, size: int, shown: str) -> Dataset:
    try:
        text = Path(full).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise UsageError(f"--dataset: cannot read {shown} ({why or exc}); give a UTF-8 JSON or JSONL file") \
            from None
    if text.lstrip()[:1] == "[":
        found, skipped = _sharegpt(text, shown), 0
        conversations = [c for c in found if c.turns]
        skipped = len(found) - len(conversations)
        fmt = "sharegpt"
    else:
        found = _jsonl(text, shown)
        conversations = [c for c in found if c.turns]
        skipped = len(found) - len(conversations)
        fmt = "jsonl"
    if not conversations:
        what = "entry" if fmt == "sharegpt" else "line"
        raise UsageError(f"--dataset {shown}: no {what} has a human turn ({skipped} without one); "
                         + (_FIX_SHAREGPT if fmt == "sharegpt" else _FIX_JSONL))
    return Dataset(full, fmt, tuple(conversations), skipped)


def _sharegpt(text: str, shown: str) -> list[Conversation]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"--dataset {shown}: not valid JSON ({_json_why(exc)}); a JSON dataset must be one list "
                         "of conversations (or use JSON Lines: one object a line)") from None
    if not isinstance(data, list):
        raise UsageError(f"--dataset {shown}: a JSON dataset must be a list of conversations; {_FIX_SHAREGPT}")
    return [_entry(item, f"--dataset {shown}: entry {i}", _FIX_SHAREGPT) for i, item in enumerate(data, 1)]


def _jsonl(text: str, shown: str) -> list[Conversation]:
    out: list[Conversation] = []
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"--dataset {shown}: line {no}"
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise UsageError(f"{where} is not JSON ({_json_why(exc)}); {_FIX_JSONL}") from None
        if isinstance(item, str):
            out.append(Conversation("", (item,) if item.strip() else ()))
        elif isinstance(item, dict) and "prompt" in item:
            prompt = item["prompt"]
            if not isinstance(prompt, str):
                raise UsageError(f"{where}: \"prompt\" must be text, got {_kind(prompt)}; {_FIX_JSONL}")
            out.append(Conversation("", (prompt,) if prompt.strip() else ()))
        else:
            out.append(_entry(item, where, _FIX_JSONL))
    return out


def _entry(item: object, where: str, fix: str) -> Conversation:
    """One conversation from ``{"conversations": [...]}`` or ``{"messages": [...]}``."""
    if not isinstance(item, dict):
        raise UsageError(f"{where} is {_kind(item)}, not an object; {fix}")
    if "conversations" in item:
        turns, role_key, text_key = item["conversations"], "from", "value"
    elif "messages" in item:
        turns, role_key, text_key = item["messages"], "role", "content"
    else:
        keys = ", ".join(sorted(map(str, item))[:4]) or "none"
        raise UsageError(f"{where} has neither \"conversations\" nor \"messages\" (its keys: {keys}); {fix}")
    if not isinstance(turns, list):
        raise UsageError(f"{where}: its turns must be a list, got {_kind(turns)}; {fix}")
    system: list[str] = []
    human: list[str] = []
    for k, turn in enumerate(turns, 1):
        if not isinstance(turn, Mapping):
            raise UsageError(f"{where}, turn {k} is {_kind(turn)}, not an object; {fix}")
        role = _ROLES.get(str(turn.get(role_key, "")).lower())
        if role is None:
            raise UsageError(f"{where}, turn {k}: \"{role_key}\" must be human, gpt or system (or user, "
                             f"assistant), got {turn.get(role_key)!r}; {fix}")
        content = _text(turn.get(text_key))
        if content is None:
            raise UsageError(f"{where}, turn {k}: \"{text_key}\" must be text, got {_kind(turn.get(text_key))}; "
                             f"{fix}")
        if role == "system":
            system.append(content)
        elif role == "user" and content.strip():
            human.append(content)
    return Conversation("\n\n".join(system), tuple(human))


def _text(content: object) -> str | None:
    """A turn's text: a string, or OpenAI's list of parts (the text parts joined); None for anything else."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type", "text") == "text"]
        if all(isinstance(p, str) for p in parts):
            return "\n".join(p for p in parts if isinstance(p, str))
    return None


def _kind(value: object) -> str:
    names = {str: "text", int: "a number", float: "a number", bool: "true/false", list: "a list",
             dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _json_why(exc: ValueError) -> str:
    return exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
