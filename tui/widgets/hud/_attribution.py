"""The HUD's attribution panel: where the last request's time went, and where the last N replies' went.

Top to bottom, each line wrapped to the panel (nothing is cut):

- a stacked bar the width of the panel, one segment per group, proportional to its milliseconds, in ``GROUPS``
  order;
- its key, in words: each group with its bar glyph in its colour and its share, largest first
  (``█ server 62% · █ network 30% · █ client 8%``); a cache hit or a cancel is said in a sentence
  (``answered from the cache in 2.0 ms``, ``cancelled after 1578 ms: 275 ms waiting for the first token,
  1303 ms streaming``);
- the flags as badges, then the notes;
- the shares over the last N replies from the server, split by the same rule as the last request.

The core keeps every nanosecond honest, down to a negative "unexplained" when a server reports a little more
than the span it fits in: the one-way delays of two stamps overlap by a few ms. Such a routine overlap (under
5 ms, or under 5 % of the time the server reported: ``core/observe/_attribution.py:is_routine_overlap``) is
folded into the server's figure, with no note; a larger one is shown as what it is, ``overlap 150 ms``, with a
note saying why it can happen. An unexplained remainder under ``MUTE_MS`` (the same module) is shown as zero;
``llmchat ask --stats`` prints the same shares (``format_shares``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from textual.content import Content

from llmchat.core.observe import GROUPS, Attribution, Metrics, TimingRecord
from llmchat.tui.numbers import duration, plural, share
from llmchat.tui.widgets.hud._figures import MUTED_STYLE, WARN_STYLE
from llmchat.tui.widgets.hud._lines import Lines, wrap

MIN_SHARE = 0.005
"""A group under this share of the bar rounds to 0 % in the key: it gets no segment either."""

#: Per group: its name in words, the bar's glyph and colour. "not reported" and "unexplained" are shaded
#: rather than solid so that they read as unknown even without colour.
GROUP_LOOK: dict[str, tuple[str, str, str]] = {
    "client": ("client", "█", "$success"),
    "limit": ("client rate limit", "█", "$warning"),
    "network": ("network", "█", "$primary"),
    "network+server": ("network + server (not reported)", "▒", "$primary"),
    "server": ("server", "█", "$accent"),
    "retry": ("retries", "█", "$error"),
    "unexplained": ("unexplained", "░", MUTED_STYLE),
}
BADGE_STYLE = "bold $text on $warning"
#: Flag -> (badge text, style). A flag not listed shows under its own name; a cache hit is said in words.
BADGES: dict[str, tuple[str, str]] = {
    "cold_start": ("cold start", BADGE_STYLE),
    "saturation": ("saturated", BADGE_STYLE),
}
# The core's note about a reported span overrunning a measured one ends with this, and its note about a
# request that ended early starts with the other: the panel says both in its own words.
OVERLAP_NOTE = "the overlap is shown as negative unexplained time"
ENDED_EARLY_NOTE = "the request ended early ("
_SEP = (" · ", MUTED_STYLE)


def segments(group_ms: Mapping[str, float], width: int) -> list[tuple[str, int]]:
    """Cells per group for a bar ``width`` cells wide, in ``GROUPS`` order, summing to ``width``.

    Proportional to the positive milliseconds (largest remainder). A group the key names (at least
    ``MIN_SHARE`` of the positive time) gets at least one cell when there is room, so every colour of the
    key is in the bar; a smaller one gets none, so a 0.2 ms pool wait does not look like 3 % of the bar.
    Negative and zero groups get none; [] when nothing is positive or ``width`` < 1.
    """
    positive = [(g, group_ms[g]) for g in GROUPS if group_ms.get(g, 0.0) > 0]
    total = sum(ms for _, ms in positive)
    if total <= 0 or width < 1:
        return []
    shown = [(g, ms) for g, ms in positive if ms >= MIN_SHARE * total]
    total = sum(ms for _, ms in shown)
    exact = [ms * width / total for _, ms in shown]
    cells = [int(x) for x in exact]
    if len(shown) <= width:
        cells = [max(1, c) for c in cells]
    while sum(cells) < width:
        i = max(range(len(cells)), key=lambda k: exact[k] - cells[k])
        cells[i] += 1
    while sum(cells) > width:
        # Taken back from the segment drawn most beyond its exact size that can spare a cell.
        i = max((k for k in range(len(cells)) if cells[k] > 1), key=lambda k: cells[k] - exact[k])
        cells[i] -= 1
    return [(g, n) for (g, _), n in zip(shown, cells, strict=True) if n > 0]


def render_bar(groups: Mapping[str, float] | None, width: int) -> Content:
    """The stacked bar of ``groups`` (ms per group) in ``width`` cells; a dim note when there is nothing to
    split."""
    if groups is None:
        return Content.styled("no request yet", MUTED_STYLE)
    cells = segments(groups, width)
    if not cells:
        return Content.styled("no time to split", MUTED_STYLE)
    parts = []
    for group, n in cells:
        _, glyph, style = GROUP_LOOK.get(group, (group, "█", ""))
        parts.append((glyph * n, style))
    return Content.assemble(*parts)


def flow(entries: Sequence[Content], width: int, lead: Content | None = None) -> list[Content]:
    """``entries`` joined by `` · `` on as few lines of ``width`` as they fit, breaking between entries (an
    entry wider than a line is wrapped on its own); ``lead`` starts the first line."""
    lines: list[Content] = []
    line, has_entry = (lead if lead is not None else Content("")), False
    for entry in entries:
        joined = Content.assemble(line, _SEP, entry) if has_entry else Content.assemble(line, entry)
        if has_entry and joined.cell_length > width:
            lines.append(line)
            line = entry
        else:
            line = joined
        has_entry = True
    if line.plain:
        lines.append(line)
    return [part for item in lines for part in wrap(item, width)]


def key_entries(groups: Mapping[str, float], total_ms: float, *, glyphs: bool = True) -> list[Content]:
    """The key of a split: each group named (with its bar glyph in its colour, with ``glyphs``) and its share
    of ``total_ms``, largest first, unexplained last. A negative unexplained part is an overlap: in ms with
    ``glyphs`` (one request), as a share without (shares over several, ``total_ms`` 1)."""
    if total_ms <= 0:
        return []
    named = sorted((g for g, ms in groups.items() if g != "unexplained" and ms >= MIN_SHARE * total_ms),
                   key=lambda g: -groups[g])
    entries = []
    for group in named:
        entries.append(_entry(group, share(groups[group] / total_ms), glyphs))
    rest = groups.get("unexplained", 0.0)
    if rest >= MIN_SHARE * total_ms:
        entries.append(_entry("unexplained", share(rest / total_ms), glyphs))
    elif rest < 0:
        amount = duration(-rest) if glyphs else share(-rest / total_ms)
        entries.append(Content.styled(f"overlap {amount}", WARN_STYLE))
    return entries


def _entry(group: str, pct: str, glyphs: bool) -> Content:
    name, glyph, style = GROUP_LOOK.get(group, (group, "█", ""))
    if glyphs:
        return Content.assemble((glyph, style), " ", name, f" {pct}")
    return Content.assemble((name, style), f" {pct}")


def _seconds_apart(record: TimingRecord) -> str:
    """``cancelled after 1578 ms: 275 ms waiting for the first token, 1303 ms streaming``."""
    total = duration(record.total_ms)
    first = record.first_token_ns
    if record.mode == "stream" and first is not None and record.end_ns is not None:
        waited = duration((first - record.t0_ns) / 1e6)
        streamed = duration((record.end_ns - first) / 1e6)
        return f"cancelled after {total}: {waited} waiting for the first token, {streamed} streaming"
    if record.mode == "stream":
        return f"cancelled after {total}, waiting for the first token"
    return f"cancelled after {total}, waiting for the reply"


def _status(attribution: Attribution, record: TimingRecord | None, overlap_ms: float) -> list[Content]:
    """The badges and the notes, in words."""
    parts: list[str | tuple[str, str]] = []
    for flag in attribution.flags:
        if flag == "cache_hit":
            continue  # said in a sentence of its own
        text, style = BADGES.get(flag, (flag.replace("_", " "), BADGE_STYLE))
        parts += [(f" {text} ", style), " "]
    cancelled = record is not None and record.cancelled
    notes = [n for n in attribution.notes
             if OVERLAP_NOTE not in n and not (cancelled and n.startswith(ENDED_EARLY_NOTE))]
    if overlap_ms > 0:
        notes.append(f"overlap: the server reported {duration(overlap_ms)} more than the client measured "
                     "(a clock step, or a server that counts its own sending)")
    if notes:
        parts.append(("; ".join(notes), MUTED_STYLE))
    elif not parts and attribution.reporter != "cache":
        if attribution.reporter:
            parts.append((f"server times: {attribution.reporter}", MUTED_STYLE))
        else:
            parts.append(("the server reported no times", MUTED_STYLE))
    return [Content.assemble(*parts)] if parts else []


def render_attribution(
    last: Attribution | None,
    groups: Mapping[str, float],
    record: TimingRecord | None,
    over: Mapping[str, float],
    count: int,
    width: int,
) -> list[Content]:
    """The panel's lines: the bar of ``last`` (``groups``: its ``shown_groups``) in ``width`` cells, what
    happened to ``record`` (its request) in words, the key, the flags and notes, and the shares ``over`` the
    last ``count`` replies from the server."""
    if last is None:
        return [render_bar(None, width)]
    lines = [render_bar(groups, width)]
    if record is not None and record.cache_hit:
        lines += wrap(Content(f"answered from the cache in {duration(last.total_ms)}"), width)
    else:
        if record is not None and record.cancelled:
            lines += wrap(Content(_seconds_apart(record)), width)
        lines += flow(key_entries(groups, last.total_ms), width)
    overlap = -groups.get("unexplained", 0.0)
    for status in _status(last, record, max(0.0, overlap)):
        lines += wrap(status, width)
    if over:
        lead = Content.styled(f"last {plural(count, 'reply', 'replies')}: ", MUTED_STYLE)
        lines += flow(key_entries(over, 1.0, glyphs=False), width, lead)
    else:
        lines += wrap(Content.styled("no reply from the server yet (cancels, errors and cache hits are left "
                                     "out)", MUTED_STYLE), width)
    return lines


class AttributionPanel(Lines):
    """Where the time went, repainted with ``show`` when a request finished; it re-lays out only when its line
    count changes."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._shown: tuple[Attribution | None, Mapping[str, float], TimingRecord | None, Mapping[str, float],
                           int] = (None, {}, None, {}, 0)
        self._paint()

    def show(self, metrics: Metrics) -> None:
        """Paint the last attribution of ``metrics`` and its shares over the windowed replies."""
        self._shown = (metrics.last_attribution, metrics.last_groups, metrics.last,
                       metrics.attribution_shares(), metrics.attribution_count)
        self._paint()

    def _paint(self) -> None:
        self.paint_lines(render_attribution(*self._shown, self.width_for_text))

    def on_resize(self) -> None:
        # The bar is drawn to the width, and the lines wrap to it.
        if self.width_changed:
            self._paint()
