"""Incremental decoder for ``text/event-stream`` bodies, per the WHATWG "event stream" interpretation rules.

``SSEDecoder().feed(chunk)`` takes raw body bytes in whatever pieces the network delivers and returns the
events those bytes complete; ``close()`` ends the stream. Every chunking of a stream yields the same events.

The rules, as the WHATWG HTML standard states them ("Server-sent events", "Interpreting an event stream"):

* bytes are UTF-8; invalid bytes become U+FFFD and never raise; a character split across chunks decodes whole;
  one leading U+FEFF (BOM) is dropped, only at the very start of the stream;
* lines end at CR, LF or CRLF only; U+2028, U+2029 and U+0085, which servers send raw inside JSON, are text;
* ``name:value`` with one leading space stripped from the value; a line without a colon is a name with an
  empty value; a line starting with a colon is a comment; unknown names are ignored;
* ``data`` lines join with LF; ``event`` names the next event (``"message"`` when unset or empty) and resets
  after each blank line; ``id`` sets the last-event-ID buffer unless the value holds NUL, and the buffer
  persists across events; ``retry`` sets the reconnection time when the value is all ASCII digits;
* a blank line dispatches the event, unless no ``data`` line arrived since the last blank line, in which case
  nothing is dispatched (an ``id:`` followed by a ``: ping`` and a blank line is not an event);
* an event still unterminated at the end of the stream is discarded.

Choices the standard leaves to us: an event's ``retry`` is the value of a valid ``retry`` line in its own
block (``None`` when its block had none), as httpx-sse and eventsource-parser report it; the reconnection time
in force for the stream (the last valid ``retry`` line) is the decoder's ``retry``. A ``retry`` value too long
for ``int()`` (over 4300 digits) is ignored like any other invalid value.

Speed matters because this runs for every token of every reply. Line and event boundaries are found in the
raw bytes with ``bytes`` methods (CR and LF never occur inside a UTF-8 multi-byte character, and nothing here
uses ``splitlines``, which also splits at U+2028 and friends); each run of complete events is decoded once.
Runs made only of ``data: ...`` events with one data line each, which is what OpenAI-compatible servers send,
become events without a Python-level loop per line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, cast

__all__ = ["SSEDecoder", "ServerSentEvent"]


class ServerSentEvent(NamedTuple):
    """One dispatched event. Immutable; a tuple underneath because that is the cheapest object to build."""

    event: str = "message"
    data: str = ""
    id: str = ""
    retry: int | None = None


# Building events with tuple.__new__ skips NamedTuple's Python-level __new__: measured 40% cheaper per event.
_new_event = cast(
    Callable[[type[ServerSentEvent], tuple[str, str, str, int | None]], ServerSentEvent], tuple.__new__
)
_BOM = b"\xef\xbb\xbf"


class SSEDecoder:
    """Turns ``text/event-stream`` bytes into :class:`ServerSentEvent` values, incrementally.

    One decoder per stream. ``retry`` (the stream's reconnection time, from the last valid ``retry`` line; each
    event's own ``retry`` is only its block's) and ``last_event_id`` (the ID a reconnecting client sends as
    ``Last-Event-ID``) stay readable after :meth:`close`.
    """

    __slots__ = ("_head", "_skip_lf", "_parts", "_parts_end_lf", "_id", "_last_event_id", "_retry", "_extra")

    def __init__(self, *, extra_fields: tuple[str, ...] = ()) -> None:
        # Off-spec lines some servers send: llama.cpp's server reports a failure mid-stream as a bare
        # "error: {...}" line, which the standard would ignore as an unknown field. A name listed here is
        # dispatched at once as an event of that type with the line's value as data.
        self._extra = frozenset(extra_fields)
        self._retry: int | None = None
        self._last_event_id = ""
        self._start_stream()

    def _start_stream(self) -> None:
        # The first bytes of the stream, held while they could still be the start of a BOM; None once past it.
        self._head: bytes | None = b""
        # The last chunk ended with CR: a LF opening the next one ends no line, being the CRLF's second half.
        self._skip_lf = False
        # LF-normalised bytes since the last event boundary (the last blank line), not yet parsed.
        self._parts: list[bytes] = []
        self._parts_end_lf = False
        self._id = ""

    @property
    def retry(self) -> int | None:
        """The reconnection time in milliseconds from the last valid ``retry`` line; ``None`` if none came."""
        return self._retry

    @property
    def last_event_id(self) -> str:
        """The last-event-ID buffer as of the last blank line: what a reconnect sends as Last-Event-ID."""
        return self._last_event_id

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """Decode the next piece of the stream; return the events it completes, in order (often none).

        Never raises on any input: malformed UTF-8 becomes U+FFFD and malformed lines are ignored per spec.
        """
        if self._head is not None:
            chunk = self._head + chunk
            if len(chunk) < 3 and _BOM.startswith(chunk):
                self._head = chunk
                return []
            self._head = None
            if chunk.startswith(_BOM):
                chunk = chunk[3:]
        if not chunk:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[0] == 10:
                chunk = chunk[1:]
                if not chunk:
                    return []
        if b"\r" in chunk:
            self._skip_lf = chunk[-1] == 13
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")

        parts = self._parts
        if parts:
            if b"\n\n" in chunk or (self._parts_end_lf and chunk[0] == 10):
                parts.append(chunk)
                chunk = b"".join(parts)
                parts.clear()
            else:
                # No boundary yet: keep pieces apart so a long event costs linear, not quadratic, copying.
                parts.append(chunk)
                self._parts_end_lf = chunk[-1] == 10
                return []

        end = chunk.rfind(b"\n\n") + 2
        if end == 1:
            parts.append(chunk)
            self._parts_end_lf = chunk[-1] == 10
            return []
        if end < len(chunk):
            rest = chunk[end:]
            parts.append(rest)
            self._parts_end_lf = rest[-1] == 10
            chunk = chunk[:end]

        # ``chunk`` now holds whole events, ending in a blank line. UTF-8 never uses an ASCII byte inside a
        # multi-byte character, so decoding it apart from its neighbours gives what decoding the stream would.
        text = chunk.decode("utf-8", "replace")
        # Fast path: every event is one "data: " line. Then each LF belongs to a "\n\ndata: " separator or to
        # the final "\n\n", so counting LFs proves the shape without looking at each line.
        if text.startswith("data: "):
            values = text.split("\n\ndata: ")
            count = len(values)
            if chunk.count(b"\n") == 2 * count:
                values[0] = values[0][6:]
                values[-1] = values[-1][:-2]
                event_id = self._last_event_id = self._id
                return [_new_event(ServerSentEvent, ("message", value, event_id, None)) for value in values]
        out: list[ServerSentEvent] = []
        self._parse_lines(text[:-1].split("\n"), out)
        return out

    def close(self) -> list[ServerSentEvent]:
        """End the stream: discard any unterminated event (per spec) and reset for a new stream.

        Returns the events the end of the stream completes, which per spec is always none; complete lines of
        the discarded event still take effect on ``retry``, as the standard processes each line on arrival.
        ``retry`` and ``last_event_id`` survive the reset; the last-event-ID buffer and BOM state do not.
        """
        pending = b"".join(self._parts)
        out: list[ServerSentEvent] = []
        cut = pending.rfind(b"\n")
        if cut >= 0:
            # No "\n\n" in pending, so a blank line can only be its first line, before any data: no dispatch.
            self._parse_lines(pending[:cut].decode("utf-8", "replace").split("\n"), out)
        self._start_stream()
        return out

    def _parse_lines(self, lines: list[str], out: list[ServerSentEvent]) -> None:
        """Apply complete lines, appending dispatched events to ``out``; the general, line-by-line path."""
        data: list[str] = []
        event_type = ""
        event_retry: int | None = None  # a valid retry line in the current event's block
        last_id = self._id
        for line in lines:
            if not line:
                self._last_event_id = last_id
                if data:
                    out.append(
                        _new_event(
                            ServerSentEvent, (event_type or "message", "\n".join(data), last_id, event_retry)
                        )
                    )
                    data = []
                event_type = ""
                event_retry = None
                continue
            if line[:6] == "data: ":
                data.append(line[6:])
                continue
            colon = line.find(":")
            if colon == 0:
                continue
            if colon < 0:
                name = line
                value = ""
            else:
                name = line[:colon]
                value = line[colon + 1 :]
                if value[:1] == " ":
                    value = value[1:]
            if name == "data":
                data.append(value)
            elif name == "event":
                event_type = value
            elif name == "id":
                if "\0" not in value:
                    last_id = value
            elif name in self._extra:
                out.append(_new_event(ServerSentEvent, (name, value, last_id, event_retry)))
            elif name == "retry" and value.isascii() and value.isdigit():
                try:
                    self._retry = event_retry = int(value)
                except ValueError:
                    pass
        self._id = last_id
