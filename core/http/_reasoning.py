"""Inline reasoning: a ``<think>...</think>`` block at the start of the content, split from the answer.

Some servers (llama.cpp without ``--reasoning-format``, vLLM without a reasoning parser, Ollama's raw mode)
stream a reasoning model's thinking inside ``content``, wrapped in ``<think>`` tags, instead of as
``reasoning_content`` / ``reasoning`` deltas. The tags may be cut anywhere by chunk boundaries (``<thi`` in
one chunk, ``nk>`` in the next), so a possible partial tag is held back until the next chunk says what it is.

Only a block that opens the answer counts (leading blank space allowed): a ``<think>`` later in a reply is
text the model wrote (an explanation of the format, code), and is left alone.

R1-style chat templates open ``<think>`` in the prompt, so the stream carries only ``thinking</think>\n\nanswer``.
Nothing at the start tells such a reply from a plain answer, and holding every reply back until its end would
stop streaming, so a reply that does not open with ``<think>`` is passed on as answer at once while the splitter
watches its first ``WATCH_CHARS`` for a bare ``</think>``: when one comes before any ``<think>``, what was passed
on so far was thinking after all (``reclaimed`` says so, and the caller moves it), the rest of that delta before
the tag is thinking too, and the answer starts after the tag and the blank space after it. A ``<think>`` first,
or ``WATCH_CHARS`` of answer without a ``</think>``, ends the watch: later tags are the model's text. Once the
answer is settled the splitter passes content through untouched (``answering``), so a reply without thinking
pays a tag search per chunk for its first ``WATCH_CHARS`` at most.
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"

#: How much of a reply that did not open with ``<think>`` is watched for a bare ``</think>``: R1 distills think
#: for thousands of tokens (tens of KiB) before they answer.
WATCH_CHARS = 256 * 1024

_BEFORE, _INSIDE, _AFTER, _ANSWER, _WATCH = range(5)


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

    __slots__ = ("_state", "_held", "_watched", "reclaimed")

    def __init__(self) -> None:
        self._state = _BEFORE
        self._held = ""
        self._watched = 0
        self.reclaimed = False
        """Set by the ``feed`` that found a bare ``</think>``: every answer returned before that call was
        thinking (the reply started inside reasoning). It stays True; a caller acts on it once."""

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
                self._state = _WATCH
        if self._state == _WATCH:
            return self._watch(text)
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

    def _watch(self, text: str) -> tuple[str, str]:
        """Answer text that may yet turn out to be thinking: passed on, but for a possible cut tag at its end."""
        if "<" not in text:
            # The common chunk: no tag and no start of one (both open with "<"), so one scan and no more.
            self._watched += len(text)
            if self._watched >= WATCH_CHARS:
                self._state = _ANSWER
            return text, ""
        end = text.find(CLOSE)
        opened = text.find(OPEN)
        if 0 <= opened and (end < 0 or opened < end):
            self._state = _ANSWER  # the model writes about the tags: its text, whatever follows
            return text, ""
        if end >= 0:
            self.reclaimed = True
            self._state = _AFTER
            answer, _ = self._after(text[end + len(CLOSE):])
            return answer, text[:end]
        keep = max(_held_suffix(text, CLOSE), _held_suffix(text, OPEN))
        if keep:
            self._held = text[-keep:]
            text = text[:-keep]
        self._watched += len(text)
        if self._watched >= WATCH_CHARS:
            self._state = _ANSWER
            text, self._held = text + self._held, ""
        return text, ""

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
        if self._state in (_BEFORE, _WATCH) and held.strip():
            self._state = _ANSWER
            return held, ""
        return "", ""


def split_inline(content: str) -> tuple[str, str]:
    """A whole reply's ``(answer, reasoning)``: the leading ``<think>`` block taken out, if there is one, or
    the thinking before a bare ``</think>`` (a template that opened the tag in the prompt)."""
    splitter = ThinkSplitter()
    answer, reasoning = splitter.feed(content)
    tail_answer, tail_reasoning = splitter.flush()
    return answer + tail_answer, reasoning + tail_reasoning
