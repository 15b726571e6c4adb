"""The last request's waterfall: where its time went, phase by phase, on one time axis.

Each row's bar sits where that phase happened between t0 and the end, so the bars tile the request. The
figures are the standard ones (TTFB and TTFT count from t0, as everywhere in llmchat); the bars of TTFB, TTFT
and streaming are the stretch in which that milestone was reached: waiting for the server after sending,
waiting for the first token after the headers, and receiving the rest. A reply that thought has its TTFT bar
in two colours, think then answer: waiting for the first reasoning token, then (in the accent colour) the
thinking up to the first answer token, and the header says ``thought 2022 ms`` in the same colour. No row of its
own: the HUD's height is fixed, and a row for the few models that think would cost every user a line.

No target colours here: the charts above say whether the request met its target, with the target beside the
verdict; a bar's colour would say it again without the reason.
"""

from __future__ import annotations

from typing import NamedTuple

from textual.content import Content
from textual.widgets import Static

from llmchat.core.observe import TimingRecord
from llmchat.tui.numbers import duration, plural
from llmchat.tui.widgets.hud._figures import MISS_STYLE, MUTED_STYLE, WARN_STYLE

_EIGHTHS = " ▏▎▍▌▋▊▉"
THINK_STYLE = "$accent"
"""The thinking's colour: its part of the TTFT bar, and ``thought N ms`` in the header."""
_NAME_W = 8
_VALUE_W = 9
#: Header plus one row per phase.
ROWS = 9


class _Row(NamedTuple):
    name: str
    value_ms: float | None
    start_ns: int | None
    end_ns: int | None
    split_ns: int | None = None
    """Where the bar turns to the accent colour (the thinking in the TTFT row)."""


def bar(start: float, end: float, width: int) -> str:
    """A bar from ``start`` to ``end`` (fractions 0..1 of the axis) in ``width`` cells, eighth-cell precise
    at its end; at least a sliver when the phase took any time at all."""
    start = min(max(start, 0.0), 1.0)
    end = min(max(end, start), 1.0)
    lead = int(start * width)
    eighths = round(end * width * 8) - lead * 8
    if eighths <= 0:
        eighths = 1 if end > start else 0
    full, part = divmod(eighths, 8)
    text = " " * lead + "█" * full + (_EIGHTHS[part] if part else "")
    return text[:width]


def _rows(record: TimingRecord) -> list[_Row]:
    p = record.phases
    pool_end = p.connect_start_ns if p.connect_start_ns is not None else p.send_start_ns
    sent = p.send_end_ns if p.send_end_ns is not None else p.send_start_ns
    first, end = record.first_token_ns, record.end_ns
    stream = record.mode == "stream"
    streaming_ms = None if first is None or end is None else (end - first) / 1e6
    return [
        _Row("pool", record.pool_wait_ms, p.start_ns if pool_end is not None else None, pool_end),
        _Row("connect", record.connect_ms, p.connect_start_ns, p.connect_end_ns),
        _Row("tls", record.tls_ms, p.tls_start_ns, p.tls_end_ns),
        _Row("send", record.send_ms, p.send_start_ns, p.send_end_ns),
        _Row("ttfb", record.ttfb_ms, sent, p.headers_ns),
        _Row("ttft", record.ttft_ms if stream else None, p.headers_ns, first, _thinking_start(record)),
        _Row("stream", streaming_ms if stream else None, first, end),
        _Row("total", record.total_ms, record.t0_ns, end),
    ]


def _thinking_start(record: TimingRecord) -> int | None:
    """The first reasoning token, when the reply thought before its first answer token."""
    think, first = record.first_reasoning_ns, record.first_token_ns
    return think if think is not None and first is not None and think < first else None


def header(record: TimingRecord) -> Content:
    """``HTTP/2 · reused · 200 · 1 retry``: the protocol, the connection (or the cache), ``via proxy`` when it
    went through one, then the status; for a failure without an error status (a timeout, a cut stream) the
    error kind instead, in red."""
    parts: list[str | tuple[str, str]] = [record.http_version or "-", " · "]
    if record.cache_hit:
        parts.append(("cache hit", "$success"))
    elif record.connection_reused:
        parts.append("reused")
    else:
        parts.append(("new conn", WARN_STYLE))
    if record.proxy and not record.cache_hit:
        parts.append(" · via proxy")  # which one: ask --json's `proxy`, the doctor's path section
    failed = record.error is not None or (record.error_kind is not None and not record.cancelled)
    if record.cancelled:
        outcome: str | None = "cancelled"
    elif failed and not (record.status is not None and record.status >= 400):
        outcome = record.error_kind or "error"  # a 200 cut mid-stream: the status would say all was well
    else:
        outcome = None if record.status is None else str(record.status)
    if outcome:
        parts += [" · ", (outcome, MISS_STYLE if failed else MUTED_STYLE if record.cancelled else "")]
    if record.retries:
        parts += [" · ", (plural(len(record.retries), "retry"), WARN_STYLE)]
    if record.mode == "stream" and record.thinking_ms is not None:
        parts += [" · ", (f"thought {duration(record.thinking_ms)}", THINK_STYLE)]
    return Content.assemble(*parts)


def render_waterfall(record: TimingRecord | None, width: int) -> Content:
    """The waterfall of ``record`` in ``width`` cells: a header line, then one line per phase; a phase that
    did not happen (no connect on a reused connection, no TTFT in batch mode) shows ``-`` and no bar."""
    if record is None:
        return Content.styled("no request yet", MUTED_STYLE)
    bar_w = max(width - _NAME_W - _VALUE_W - 1, 4)
    t0 = record.t0_ns
    span = (record.end_ns or t0) - t0
    lines: list[Content] = [header(record)]
    for row in _rows(record):
        cells: list[str | tuple[str, str]] = [
            f"{row.name:<{_NAME_W}}", f"{duration(row.value_ms):>{_VALUE_W}}",
        ]
        if row.value_ms is not None and row.start_ns is not None and row.end_ns is not None and span > 0:
            start, end = (row.start_ns - t0) / span, (row.end_ns - t0) / span
            if row.split_ns is None:
                cells += [" ", (bar(start, end, bar_w), "$primary")]
            else:
                split = (row.split_ns - t0) / span
                waiting = bar(start, split, bar_w)
                cells += [" ", (waiting, "$primary"), (bar(split, end, bar_w)[len(waiting):], THINK_STYLE)]
        lines.append(Content.assemble(*cells))
    return Content("\n").join(lines)


class Waterfall(Static):
    """The waterfall of the last finished request, repainted with ``show`` (never a re-layout)."""

    DEFAULT_CSS = f"""
    Waterfall {{
        height: {ROWS};
        text-wrap: nowrap;
        text-overflow: clip;
    }}
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(render_waterfall(None, 30), id=id)
        self._shown: TimingRecord | None = None

    def show(self, record: TimingRecord | None) -> None:
        """Paint ``record``'s waterfall."""
        self._shown = record
        self.update(render_waterfall(record, self.content_size.width or 30), layout=False)

    def on_resize(self) -> None:
        # The bars are drawn to the width, so a new width needs new bars (the height is fixed).
        self.show(self._shown)
