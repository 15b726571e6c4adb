"""Tool calls a model asks for, assembled from streamed ``tool_calls`` deltas. Nothing is ever executed.

OpenAI streams a call in pieces: the first delta of a call carries its ``index``, ``id``, ``type`` and
``function.name``; the following ones carry the same ``index`` and a slice of ``function.arguments`` (a JSON
string cut anywhere). Several calls may be interleaved by index. Some servers (llama.cpp, Ollama) send a whole
call in one delta, or leave ``index`` out when there is one call; both are handled.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class ToolCall:
    """One call the model asked for: its position, id, function name and arguments (JSON text, as sent)."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""
    type: str = "function"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, in OpenAI's shape: ``{"id", "type", "function": {"name", "arguments"}}``."""
        return {"id": self.id, "type": self.type, "function": {"name": self.name, "arguments": self.arguments}}

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any], index: int = 0) -> ToolCall:
        """A call from OpenAI's shape (a whole reply's ``message.tool_calls`` item, or a stored one)."""
        raw = obj.get("function")
        fn: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
        args = fn.get("arguments", "")
        return cls(
            index=obj["index"] if isinstance(obj.get("index"), int) else index,
            id=str(obj.get("id") or ""),
            name=str(fn.get("name") or ""),
            # Some servers send the arguments as an object rather than a JSON string.
            arguments=args if isinstance(args, str) else _dumps(args),
            type=str(obj.get("type") or "function"),
        )


def _dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


class ToolCallAssembler:
    """Collects ``tool_calls`` deltas by index; ``calls`` lists them in index order."""

    __slots__ = ("_calls",)

    def __init__(self) -> None:
        self._calls: dict[int, ToolCall] = {}

    def __bool__(self) -> bool:
        return bool(self._calls)

    def feed(self, deltas: Sequence[Any]) -> None:
        """Take one chunk's ``delta.tool_calls`` list. Items that are not objects are ignored."""
        for position, item in enumerate(deltas):
            if not isinstance(item, Mapping):
                continue
            index = item.get("index")
            if not isinstance(index, int):
                index = position
            call = self._calls.get(index)
            if call is None:
                call = self._calls[index] = ToolCall(index=index)
            if item.get("id"):
                call.id = str(item["id"])
            if isinstance(item.get("type"), str):
                call.type = item["type"]
            fn = item.get("function")
            if isinstance(fn, Mapping):
                name = fn.get("name")
                if isinstance(name, str) and name and name != call.name:
                    # Sent once by OpenAI; repeated whole by some servers, in pieces by a few.
                    call.name = name if not call.name else call.name + name
                args = fn.get("arguments")
                if isinstance(args, str):
                    call.arguments += args
                elif args is not None:
                    call.arguments += _dumps(args)

    @property
    def calls(self) -> list[ToolCall]:
        """The calls so far, by index."""
        return [self._calls[i] for i in sorted(self._calls)]


def tool_calls_from(message: Mapping[str, Any]) -> list[ToolCall]:
    """The calls of a whole reply's ``message`` (``message.tool_calls``); [] when it has none."""
    raw = message.get("tool_calls")
    if not isinstance(raw, list):
        return []
    return [ToolCall.from_dict(item, i) for i, item in enumerate(raw) if isinstance(item, Mapping)]
