"""Inline reasoning: a ``<think>...</think>`` block at the start of the content, split from the answer.

Some servers (llama.cpp without ``--reasoning-format``, vLLM without a reasoning parser, Ollama's raw mode)
stream a reasoning model's thinking inside ``content``, wrapped in ``<think>`` tags, instead of as
``reasoning_content`` / ``reasoning`` deltas. The tags may be cut anywhere by chunk boundaries (``<thi`` in
one chunk, ``nk>`` in the next), so a possible partial tag is held back until the next chunk says what it is.

Only a block that opens the answer counts (leading blank space allowed): a ``<think>`` later in a reply is
text the model wrote (an explanation of the format, code), and is left alone. Once the answer has begun the
splitter passes content through untouched, so a reply without thinking pays one check per chunk at most
until its first visible character.
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"

_BEFORE, _INSIDE, _AFTER, _ANSWER = range(4)


def _held_suffix(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that is a proper start of ``tag`` (a tag cut in two)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ThinkSplitter:
    """Feeds content deltas, returns ``(answer, reasoning)`` per delta; ``flush`` at the end of the stream.

    ``answering`` turns True once the answer has begun: from then on ``feed`` returns its input as the answer,
    and a caller may drop the splitter altogether. The blank space between ``</think>`` and the answer is
    dropped (the answer starts at its first visible character, which is when TTFT is stamped).
    """

    __slots__ = ("_state", "_held")

    def __init__(self) -> None:
        self._state = _BEFORE
        self._held = ""

    @property
    def answering(self) -> bool:
        """True once content is answer text for good."""
        return self._state == _ANSWER

    def feed(self, content: str) -> tuple[str, str]:
        """Split one content delta into its answer and reasoning parts (either may be empty)."""
        if self._state == _ANSWER:
            return content, ""
        text = self._held + content
        self._held = ""
        if self._state == _BEFORE:
            stripped = text.lstrip()
            if not stripped:
                self._held = text  # blank space only: what follows decides
                return "", ""
            if stripped.startswith(OPEN):
                self._state = _INSIDE
                text = stripped[len(OPEN):]
            elif OPEN.startswith(stripped):
                self._held = text  # "<thi": the next chunk says whether it is the tag
                return "", ""
            else:
                self._state = _ANSWER
                return text, ""
        if self._state == _INSIDE:
            end = text.find(CLOSE)
            if end < 0:
                keep = _held_suffix(text, CLOSE)
                if keep:
                    self._held = text[-keep:]
                    text = text[:-keep]
                return "", text
            reasoning, text = text[:end], text[end + len(CLOSE):]
            self._state = _AFTER
            answer, _ = self._after(text)
            return answer, reasoning
        return self._after(text)

    def _after(self, text: str) -> tuple[str, str]:
        answer = text.lstrip()
        if answer:
            self._state = _ANSWER
        return answer, ""

    def flush(self) -> tuple[str, str]:
        """What is still held at the end of the stream: a cut tag that never completed is text after all
        (answer text before the block, reasoning inside an unclosed one)."""
        held, self._held = self._held, ""
        if self._state == _INSIDE:
            return "", held
        if self._state == _BEFORE and held.strip():
            self._state = _ANSWER
            return held, ""
        return "", ""


def split_inline(content: str) -> tuple[str, str]:
    """A whole reply's ``(answer, reasoning)``: the leading ``<think>`` block taken out, if there is one."""
    splitter = ThinkSplitter()
    answer, reasoning = splitter.feed(content)
    tail_answer, tail_reasoning = splitter.flush()
    return answer + tail_answer, reasoning + tail_reasoning
