"""The ``n`` choices of one reply, as OpenAI sends them: whole, a ``choices`` list; streamed, interleaved.

In a stream each choice's events are chunks of their own with the choice's ``index`` (one role chunk each
first); step k of the stream holds token k of every choice that has one, and a choice's last token carries its
``finish_reason`` at its own step. The final step (the longest choices' last tokens) is built when it is sent,
so its last chunk, or the usage chunk after it, carries ``server_timing``. With one choice the stream is the
single plan's events and final chunk, byte for byte.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llmchat.core.server import _encode as _wire
from llmchat.core.server._thinking import Events, Plan, whole_message


@dataclass(frozen=True, slots=True)
class ChoiceStream:
    """A streamed reply's bytes: ``roles`` first, then ``steps`` paced one per token, then ``final``."""

    roles: bytes
    steps: list[bytes]
    last: list[tuple[Events, Plan]]
    """The choices that end at the final step (at least one)."""
    template: _wire.ChunkTemplate

    def final(self, usage: dict[str, Any], extra: dict[str, Any]) -> bytes:
        """The final step and ``[DONE]``: ``extra`` on the last chunk, or on the usage chunk when the request
        asked for usage."""
        parts = [ev.finish(p.last_content, p.finish_reason, p.last_logprobs, None) for ev, p in self.last[:-1]]
        ev, p = self.last[-1]
        if self.template.include_usage:
            parts += [ev.finish(p.last_content, p.finish_reason, p.last_logprobs, None),
                      self.template.usage(usage, extra)]
        else:
            parts.append(ev.finish(p.last_content, p.finish_reason, p.last_logprobs, extra))
        parts.append(_wire.DONE)
        return b"".join(parts)


def choice_stream(
    template: _wire.ChunkTemplate, choices: Sequence[tuple[Events, Plan]], logprobs: bool
) -> ChoiceStream:
    """Interleave ``choices`` (each its ``Events`` and ``Plan``, in index order; at least one)."""
    roles = b"".join(ev.role(logprobs) for ev, _ in choices)
    final_step = max(len(p.events) for _, p in choices)
    steps: list[bytes] = []
    for k in range(final_step):
        parts: list[bytes] = []
        for ev, p in choices:
            if k < len(p.events):
                parts.append(p.events[k])
            elif k == len(p.events):
                parts.append(ev.finish(p.last_content, p.finish_reason, p.last_logprobs, None))
        steps.append(parts[0] if len(parts) == 1 else b"".join(parts))
    last = [(ev, p) for ev, p in choices if len(p.events) == final_step]
    return ChoiceStream(roles, steps, last, template)


def whole_choices(plans: Sequence[Plan], logprobs: bool) -> list[dict[str, Any]]:
    """The ``choices`` of a whole reply, one per plan, with ``logprobs.content`` when asked for."""
    return [
        {
            "index": i,
            "message": whole_message(p),
            "logprobs": {"content": p.logprobs or [], "refusal": None} if logprobs else None,
            "finish_reason": p.finish_reason,
        }
        for i, p in enumerate(plans)
    ]
