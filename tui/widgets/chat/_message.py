"""The messages of a conversation: the user's text, and an assistant reply that streams in.

A reply is a single leaf widget (see ``_frozen``). Deltas are only buffered as they arrive; a frame
renders what came since the last one, and only the reply's tail is rendered again (see
``_document``). A delta that finds the last frame long enough ago is painted on the next turn of the
loop; one that comes sooner waits for the next frame, which is due after ``frame_rate``'s interval or,
if frames cost more, after their cost over ``_MAX_FRAME_SHARE``. ``finish()`` renders the final text
and the widget is then as cheap as any other finished message.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from time import perf_counter_ns, thread_time_ns
from typing import ClassVar, Literal, get_args

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Region
from textual.message import Message

from llmchat.tui.widgets.chat._blocks import code_blocks
from llmchat.tui.widgets.chat._document import MarkdownDocument, estimate_rows
from llmchat.tui.widgets.chat._frozen import FrozenLines, bar
from llmchat.tui.widgets.chat._lines import Line

Status = Literal["done", "cancelled", "interrupted", "error", "cached", "refused"]
"""How a reply ended: complete, stopped by the user, cut off by quitting or a crash (a reply from history),
failed, served from the cache, or refused by the model (the note then quotes the refusal)."""

_STATUSES: tuple[str, ...] = get_args(Status)
_HIGHLIGHT_SLICE_NS = 5_000_000
"""Most time one frame spends highlighting code; the rest waits for the next turn of the loop."""
_RENDER_SLICE_NS = 8_000_000
"""Time from a frame's start after which no further block is rendered in that frame."""
_SLICE_GAP_NS = 1_000_000
"""Pause before the next slice of a frame that ran out of time or has highlighting left: input and
the screen's own updates get the loop in between."""
_HEADROOM_MIN, _HEADROOM_MAX = 4, 12
"""Rows a streaming reply reserves below its text, so it changes height (a layout of the whole screen,
scrollbar included) once every few rows instead of on every new row: about half a second of growth at
the current pace, within these bounds."""
_MAX_FRAME_SHARE = 0.10
"""Most of a core that streaming frames take. A frame's cost is the CPU time from its start until it is
on screen (rendering here, then Textual's paint); frames are spaced at least their usual cost over this
share apart. At 60 frames/s a frame may cost 1.7 ms; frames that cost more lower the frame rate
instead of taking more of the machine."""
_COSTS_KEPT = 9
"""A frame's usual cost is the median of the last 9: that window also holds whatever else ran before
the frame was on screen (the HUD's own repaint, the network), and now and then a layout of the whole
screen, which comes with rows of growth, not with frames; a median leaves those out, an average would
charge them to every frame and lower the frame rate for them."""
LIVE_INTERVAL_S = 0.1
"""How often a followed state line is read and, when it changed, repainted: 10 times a second."""
_FLOWING_NS = 100_000_000
"""Text painted this recently means tokens are flowing: a changed state line then waits for the next frame,
which repaints it with the text in the same screen update, instead of costing a screen update of its own."""
_FLOWING_EVERY_NS = 500_000_000
"""While tokens flow the text shows the reply moving, and the state line (tokens so far, the time) is
repainted twice a second rather than ten times: each repaint adds a row to a frame."""

LiveState = Callable[[int, int], tuple[str, Text]]
"""What ``ChatMessage.follow`` reads on its ticker: given ``perf_counter_ns()`` and the width in cells, the
reply's label and its state line (one row; longer text is cut)."""


def _same(old: Line, new: Line) -> bool:
    return old is new or old == new


class UserMessage(FrozenLines):
    """The user's text, as typed (no Markdown), wrapped to the width."""

    DEFAULT_CSS = """
    UserMessage {
        margin: 0 0 1 0;
    }
    """

    LEFT = 2

    def __init__(
        self, text: str, *, name: str | None = None, id: str | None = None, classes: str | None = None
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self._text = text

    @property
    def text(self) -> str:
        """The text as given."""
        return self._text

    def build_lines(self, width: int) -> list[Line]:
        lines = self.renderer.rich(Text(self._text, end=""), width)
        if self.marker:
            lines += self.renderer.rich(Text(f"‹ {self.marker} ›", style="status.muted", end=""), width)
        return lines

    def estimate_height(self, width: int) -> int:
        return estimate_rows(self._text, width) + (1 if self.marker else 0)

    def left_margin(self) -> Segment:
        # A bar in the theme's primary colour marks the user's turns (drawn here, not as a CSS border,
        # which Textual would add to every row on every repaint).
        return bar(Style(color=self.renderer.palette.primary), self.LEFT)


class ChatMessage(FrozenLines):
    """An assistant reply: Markdown, streamed in with ``append``, ended with ``finish``.

    A reply made with a ``status`` is finished from the start (a reply from history). A ``label`` (the model
    that answers) is a muted first row. While it streams, a reply can ``follow`` a live state: one row under
    the text, read and repainted on a ticker of its own at most 10 times a second, never per token and never
    with a layout (the rows reserved below a streaming reply hold it).
    """

    DEFAULT_CSS = """
    ChatMessage {
        margin: 0 0 1 0;
    }
    """

    ASIDE: ClassVar[bool] = False
    """True for a widget that streams like a reply but is not one (a reply's thinking): the conversation's
    ``messages()`` and ``last_reply()`` leave it out."""

    class RenderLag(Message):
        """Time from the arrival of the oldest delta in a frame to that frame being on screen.

        "On screen" is when Textual has written the screen update holding the frame's rows to its
        driver (the terminal's output): the message is sent from a callback that Textual runs after
        that refresh (``call_after_refresh``); the terminal's own drawing after that is not counted.
        Posted to the app directly (no widget in between handles it): bubbling through the
        conversation and the screen woke each of them, with their idle work, on every frame.
        """

        def __init__(self, ms: float, chat_message: ChatMessage | None = None) -> None:
            super().__init__()
            self.ms = ms
            """Milliseconds, measured on ``time.perf_counter_ns``; never negative."""
            self.chat_message = chat_message
            """The reply that painted the frame."""

        @property
        def control(self) -> ChatMessage | None:
            """The reply that painted the frame."""
            return self.chat_message

    def __init__(
        self,
        text: str = "",
        *,
        status: Status | None = None,
        note: str = "",
        label: str | None = None,
        frame_rate: float = 60.0,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        """``frame_rate``: most frames a second while streaming (deltas arriving faster are coalesced);
        must be positive. Textual paints at most 60 times a second (``TEXTUAL_FPS``), so more gains
        nothing. ``label``: the first row, muted (None: no label row)."""
        if frame_rate <= 0:
            raise ValueError(f"frame_rate must be positive, got {frame_rate!r}")
        super().__init__(name=name, id=id, classes=classes)
        self._doc = MarkdownDocument(text)
        self._pending: list[str] = []
        self._first_arrival_ns: int | None = None
        self._frame_interval_ns = int(1e9 / frame_rate)
        self._next_frame_ns = 0
        # Counted as free until measured: a reply's first frame also lays it out (tens of ms), and a
        # median of that one sample would hold its first tokens back for hundreds of ms.
        self._frame_costs: deque[int] = deque([0] * _COSTS_KEPT, maxlen=_COSTS_KEPT)
        """The CPU cost of the last frames until they were on screen (see ``_MAX_FRAME_SHARE``)."""
        self._frame_cost_ns = 0
        """Their median."""
        self._handle: asyncio.Handle | None = None
        """The next frame, scheduled on the event loop (cheaper than a Textual timer per frame)."""
        self._status: Status | None = None
        self._note = ""
        self._final = asyncio.Event()
        self._reserved: tuple[int, int] = (0, 0)
        self._growth: deque[tuple[int, int]] = deque()
        """Recent (time, row count) pairs while streaming: how fast the reply grows."""
        self._unpainted_ns: int | None = None
        """Arrival of the oldest delta taken in but not fully rendered yet."""
        self._render_deadline_ns: int | None = None
        """Set during a frame: rendering of new blocks stops at this time."""
        """While streaming: (width, height reserved at that width)."""
        self.renders = 0
        """Frames that took in new text (highlighting slices not counted): the coalescing at work."""
        self._label = label
        self._label_cache: tuple[object, Line] = (None, ())
        self._live: LiveState | None = None
        self._live_text: Text | None = None
        self._live_line: Line | None = None
        """The state row as last rendered, while a followed reply streams."""
        self._live_row: int | None = None
        """Where the state row was last placed (the row after the text), to repaint it when it moves."""
        self._live_handle: asyncio.TimerHandle | None = None
        self._live_dirty = False
        """The state row changed and waits for the next frame to be painted with it."""
        self._text_frame_ns = 0
        """When a frame last took in text."""
        self._live_read_ns = 0
        """When the state was last read and found changed."""
        self.live_repaints = 0
        """How many ticks repainted the state row (it is repainted only when its text changed)."""
        if status is not None:
            self._end(status, note)
        else:
            self.add_class("-streaming")

    # -- what the shell reads

    @property
    def text(self) -> str:
        """The full text so far, including deltas not painted yet."""
        return self._doc.text + "".join(self._pending)

    @property
    def status(self) -> Status | None:
        """How the reply ended, or None while it streams."""
        return self._status

    @property
    def note(self) -> str:
        """The note shown under the reply (timing, or the error)."""
        return self._note

    @property
    def label(self) -> str | None:
        """The muted first row (the model), or None for none."""
        return self._label

    @property
    def live_text(self) -> str:
        """The state line as last painted ("" when there is none): for the shell and for tests."""
        return "" if self._live_text is None else self._live_text.plain

    @property
    def is_final(self) -> bool:
        """True once finished and the final render (code colours included) is complete."""
        return self._final.is_set()

    async def wait_final(self) -> None:
        """Return once ``is_final``; never returns for a reply that is never finished.

        Code in a reply from history is highlighted once it is first seen; waiting starts it now.
        """
        if self._status is not None and self._handle is None and self.is_mounted and not self._final.is_set():
            self._schedule(0)
        await self._final.wait()

    def code_blocks(self) -> list[str]:
        """The code of each code block in the reply, in order (for copying)."""
        return code_blocks(self.text)

    # -- what the shell calls while the reply streams

    def append(self, text: str, arrived_ns: int | None = None) -> None:
        """Add a delta. O(1): it is buffered and painted with the next frame.

        ``arrived_ns`` is when it arrived (``time.perf_counter_ns()``), for ``RenderLag``; now if not
        given. Deltas after ``finish()`` are ignored (a late one can race a cancel).
        """
        if not text or self._status is not None:
            return
        self._pending.append(text)
        arrived = perf_counter_ns() if arrived_ns is None else arrived_ns
        if self._first_arrival_ns is None or arrived < self._first_arrival_ns:
            self._first_arrival_ns = arrived
        # A reply removed from the conversation stays "mounted" for Textual; it paints nothing more.
        if self._handle is None and self.is_mounted and self.is_attached:
            self._schedule(max(0, self._next_frame_ns - perf_counter_ns()))

    def restart(self) -> None:
        """Drop the text so far, painted or not: it was not the answer (a reply that started inside its
        thinking, ``ChatStream.on_reclaim``). Ignored once the reply is finished."""
        if self._status is not None:
            return
        self._doc = MarkdownDocument("")
        self._pending.clear()
        self._first_arrival_ns = None
        self.invalidate_lines()
        if self.is_mounted:
            self.refresh(layout=True)

    def follow(self, state: LiveState, *, interval_s: float = LIVE_INTERVAL_S) -> None:
        """Show ``state`` under the text while the reply streams: read every ``interval_s`` seconds (at least
        0.1: ValueError below), repainted only when it changed, gone with ``finish``. A label it returns
        replaces the reply's. Ignored once the reply is finished."""
        if interval_s < LIVE_INTERVAL_S:
            raise ValueError(f"interval_s must be at least {LIVE_INTERVAL_S}, got {interval_s!r}")
        if self._status is not None:
            return
        self._live = state
        self._live_interval_s = interval_s
        if self._label is None:
            self._label = ""  # the row is held from the start, so naming the model later moves nothing
            self.invalidate_lines()
        if self.is_mounted:
            self.refresh(layout=True)
            self._live_tick()

    def set_label(self, label: str | None) -> None:
        """Change the muted first row (None removes it)."""
        if label == self._label:
            return
        self._label = label
        if self.is_mounted:
            self._render_deadline_ns = perf_counter_ns() + _RENDER_SLICE_NS
            try:
                self._repaint()
            finally:
                self._render_deadline_ns = None
        else:
            self.invalidate_lines()

    def finish(self, *, status: Status = "done", note: str = "") -> None:
        """End the reply: render the final text whole, correctly, and show the status line.

        ``note`` is shown under the reply: the timing for "done" and "cached", the reason for
        "error". Code colours that are still being worked out follow in slices of a few ms (see
        ``wait_final``). Calling it again only changes the status line. Raises ValueError for an
        unknown status.
        """
        if self._status is not None:
            self._set_status(status, note)
            self.invalidate_lines()
            self.refresh(layout=True)
            return
        self._end(status, note)
        self.remove_class("-streaming")
        self._stop_live()
        if self.is_mounted:
            self._frame()

    # -- frames

    def _end(self, status: Status, note: str) -> None:
        self._set_status(status, note)
        if self._pending:
            self._doc.append("".join(self._pending))
            self._pending.clear()
        self._doc.finish()

    def _set_status(self, status: Status, note: str) -> None:
        if status not in _STATUSES:
            raise ValueError(f"status must be one of {', '.join(_STATUSES)}, got {status!r}")
        if self._status is not None:
            self.remove_class(f"-{self._status}")
        self._status, self._note = status, note
        self.add_class(f"-{status}")

    def _stop_live(self) -> None:
        if self._live_handle is not None:
            self._live_handle.cancel()
            self._live_handle = None
        self._live = None
        self._live_text = self._live_line = None

    def _live_tick(self) -> None:
        """Read the state, repaint its row if it changed (one row, no layout), and come back."""
        self._live_handle = None
        state = self._live
        if state is None or self._status is not None or not self.is_attached:
            return
        width = self.inner_width
        now = perf_counter_ns()
        flowing = self._handle is not None or now - self._text_frame_ns < _FLOWING_NS
        if width > 0 and not (flowing and now - self._live_read_ns < _FLOWING_EVERY_NS):
            label, text = state(now, width)
            if label != self._label:
                self.set_label(label)
            if text != self._live_text:
                self._live_text, self._live_read_ns = text, now
                self._live_line = self.renderer.line(text, width)
                row = len(self.lines_for(width))
                if self.content_height(width) != self.content_size.height:
                    # The row is not laid out yet (followed after mounting): paint it on the next tick.
                    self.refresh(layout=True)
                    self._live_text = None
                elif flowing and not self._live_dirty:
                    self._live_dirty = True  # the next frame paints it; if none comes, the next tick does
                else:
                    rows = {row} if self._live_row is None else {row, self._live_row}
                    top, bottom = min(rows), max(rows) + 1
                    self.refresh(Region(0, top, self.content_size.width, bottom - top))
                    self._live_row, self._live_dirty = row, False
                    self.live_repaints += 1
        self._live_handle = asyncio.get_running_loop().call_later(self._live_interval_s, self._live_tick)

    def row_after_lines(self, index: int, width: int) -> Line | None:
        if index == 0 and self._live_line is not None and self._status is None:
            return self._live_line
        return None

    def on_mount(self) -> None:
        if self._live is not None and self._live_handle is None:
            self._live_tick()
        if self._pending:
            self._schedule(0)
        elif self._doc.finished:
            self._doc.bind(self.renderer)
            if not self._doc.busy:
                self._final.set()
            elif not self.deferred:
                self._schedule(0)

    def on_unmount(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._live_handle is not None:
            self._live_handle.cancel()
            self._live_handle = None

    def first_painted(self) -> None:
        if self._doc.finished and self._handle is None and not self._final.is_set():
            self._schedule(0)

    def estimate_height(self, width: int) -> int:
        status = 1 if self._status_text() is not None else 0
        label = 1 if self._label is not None else 0
        return label + estimate_rows(self._doc.text, width) + status

    def _schedule(self, delay_ns: int) -> None:
        """Run a frame in ``delay_ns``, or on the next turn of the loop if that is 0 or less."""
        if self._handle is not None:
            self._handle.cancel()
        loop = asyncio.get_running_loop()
        if delay_ns > 0:
            self._handle = loop.call_later(delay_ns / 1e9, self._run_frame)
        else:
            self._handle = loop.call_soon(self._run_frame)

    def _run_frame(self) -> None:
        self._handle = None
        try:
            self._frame()
        except Exception as error:
            # Raised again where Textual handles a widget's errors, not in the event loop's handler.
            self.call_next(_raise, error)

    def _frame(self) -> None:
        """Paint the text that arrived since the last frame, and/or a slice of code highlighting."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        start = perf_counter_ns()
        # CPU time, not wall time, paces frames: a busy machine that pre-empts the app must not slow them.
        cpu_start = thread_time_ns()
        # A highlighting slice may run before the next frame is due; new text then waits for it.
        take_text = bool(self._pending) and start >= self._next_frame_ns
        first_arrival = None
        if take_text:
            first_arrival, self._first_arrival_ns = self._first_arrival_ns, None
            self._doc.append("".join(self._pending))
            self._pending.clear()
            self._doc.sync()
        elif self._doc.finished and self._first_arrival_ns is not None:
            # finish() took in the last deltas; this frame paints them.
            first_arrival, self._first_arrival_ns = self._first_arrival_ns, None
        if first_arrival is not None:
            self.renders += 1
            self._text_frame_ns = start
            if self._unpainted_ns is None or first_arrival < self._unpainted_ns:
                self._unpainted_ns = first_arrival
        self._doc.bind(self.renderer)
        self._doc.work(start + _HIGHLIGHT_SLICE_NS)
        # A burst of text renders a slice of blocks per frame; the rest follows on the next turns.
        self._render_deadline_ns = start + _RENDER_SLICE_NS
        try:
            self._repaint()
        finally:
            self._render_deadline_ns = None
        complete = self._doc.complete(self.inner_width)
        if first_arrival is not None:
            # A lower bound until the frame is on screen and its whole cost is known (``_painted``).
            cost = max(thread_time_ns() - cpu_start, self._frame_cost_ns)
            self._next_frame_ns = start + max(self._frame_interval_ns, int(cost / _MAX_FRAME_SHARE))
        if complete and self._unpainted_ns is not None:
            self.call_after_refresh(self._painted, self._unpainted_ns, start, cpu_start)
            self._unpainted_ns = None
        if self._doc.busy or not complete:
            self._schedule(_SLICE_GAP_NS)
        elif self._pending:
            self._schedule(max(0, self._next_frame_ns - perf_counter_ns()))
        elif self._doc.finished:
            self._final.set()

    def _repaint(self) -> None:
        width = self.inner_width
        if width <= 0:
            self.invalidate_lines()
            self.refresh(layout=True)
            return
        before = self.lines_for(width)
        self.invalidate_lines()
        after = self.lines_for(width)
        # Repaint only rows that differ: re-wrapping the tail gives new row objects, but text added
        # to a paragraph changes only its last rows (a repainted row costs Textual ~0.1 ms).
        same = min(len(before), len(after))
        first = next((y for y in range(same) if not _same(before[y], after[y])), same)
        last = max(len(before), len(after))
        if len(before) == len(after):
            while last > first and _same(before[last - 1], after[last - 1]):
                last -= 1
        # The state row sits right after the text: when the text gains or loses rows it moves, and both its
        # old row and its new one are painted again.
        live_row = len(after) if self._live_line is not None and self._status is None else None
        if live_row != self._live_row or (self._live_dirty and live_row is not None):
            moved = [row for row in (live_row, self._live_row) if row is not None]
            if first < last:
                first, last = min(first, *moved), max(last, *(row + 1 for row in moved))
            else:
                first, last = min(moved), max(moved) + 1
            if self._live_dirty:
                self._live_dirty = False
                self.live_repaints += 1
            self._live_row = live_row
        # Against the height laid out now: finishing drops the rows reserved below the text.
        layout = self.content_height(width) != self.content_size.height
        if first < last:
            self.refresh(Region(0, first, self.content_size.width, last - first), layout=layout)
        elif layout:
            self.refresh(Region(0, 0, 0, 0), layout=True)

    def content_height(self, width: int) -> int:
        lines = len(self.lines_for(width))
        if self._status is not None:
            return lines
        # A followed reply holds a row for its state under the text.
        needed = lines + (1 if self._live is not None else 0)
        reserved_width, reserved = self._reserved
        if reserved_width != width or needed > reserved:
            text_rows = lines - (1 if self._label is not None else 0)
            reserved = lines + self._headroom(lines) if text_rows > 0 else needed
            self._reserved = (width, reserved)
        return reserved

    def _headroom(self, lines: int) -> int:
        now = perf_counter_ns()
        self._growth.append((now, lines))
        while len(self._growth) > 2 and now - self._growth[0][0] > 1_000_000_000:
            self._growth.popleft()
        first_ns, first_lines = self._growth[0]
        seconds = max((now - first_ns) / 1e9, 0.25)
        per_half_second = int((lines - first_lines) / seconds / 2)
        return min(_HEADROOM_MAX, max(_HEADROOM_MIN, per_half_second))

    def _painted(self, first_arrival_ns: int, start_ns: int, cpu_start_ns: int) -> None:
        now = perf_counter_ns()
        self.app.post_message(self.RenderLag(max(0.0, (now - first_arrival_ns) / 1e6), self))
        self._frame_costs.append(thread_time_ns() - cpu_start_ns)
        self._frame_cost_ns = sorted(self._frame_costs)[len(self._frame_costs) // 2]
        due = start_ns + int(self._frame_cost_ns / _MAX_FRAME_SHARE)
        if due > self._next_frame_ns:
            self._next_frame_ns = due
            if self._handle is not None and self._pending and not self._doc.busy:
                self._schedule(due - now)

    # -- lines

    def build_lines(self, width: int) -> list[Line]:
        self._doc.bind(self.renderer)
        lines = self._doc.lines(width, self._render_deadline_ns)
        status = self._status_text() if self._doc.complete(width) else None
        if self._label is not None:
            lines = [self._label_line(width), *lines]
        if status is None:
            return lines
        return [*lines, *self.renderer.rich(status, width)]

    def _label_line(self, width: int) -> Line:
        # Built once per label, width and theme: the lines are built again on every frame while streaming.
        key = (self._label, width, self.app.theme)
        if self._label_cache[0] != key:
            label = Text(self._label or "", style="status.label", end="")
            self._label_cache = (key, self.renderer.line(label, width))
        return self._label_cache[1]

    def _status_text(self) -> Text | None:
        status, note = self._status, self._note
        if self.marker:
            note = f"‹ {self.marker} › · {note}" if note else f"‹ {self.marker} ›"
        if status is None or (status == "done" and not note):
            return None
        if status == "done":
            return Text(note, style="status.muted", end="")
        if status == "error":
            return Text.assemble(
                ("error", "status.error"), (f": {note}" if note else "", "status.error"), end=""
            )
        if status == "refused":
            # Never an empty success: the model said no, and the note says what it said.
            return Text.assemble(("refused", "status.warning"), (f": {note}" if note else "", "status.muted"),
                                 end="")
        label = {"cancelled": ("cancelled", "status.warning"),
                 "interrupted": ("interrupted: the reply was cut off", "status.warning")}.get(
                     status, ("from cache", "status.cached"))
        return Text.assemble(label, (f" · {note}" if note else "", "status.muted"), end="")


def _raise(error: Exception) -> None:
    raise error
