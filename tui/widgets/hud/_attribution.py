"""The HUD's attribution panel: where the last request's time went, and where the last N requests' went.

Four fixed lines: a stacked bar the width of the panel (one coloured segment per group, proportional to its
milliseconds, in ``GROUPS`` order), its legend (``net 61% · srv 30% · cli 4% · ? 5%``, largest first, the
unexplained rest last), the shares over the windowed requests, and the flags as badges followed by the notes.

The core keeps every nanosecond honest, down to a negative "unexplained" when a server reports a little more
than the span it fits in. A few milliseconds either way is clock noise, not news, so here an unexplained
part under ``MUTE_MS`` counts as zero: no segment, no legend entry, no note about it.
"""

from __future__ import annotations

from collections.abc import Mapping

from textual.content import Content
from textual.widgets import Static

from llmchat.core._attribution import GROUPS, Attribution
from llmchat.core._metrics import Metrics
from llmchat.tui.widgets.hud._figures import MUTED_STYLE, WARN_STYLE

MUTE_MS = 2.0
"""An unexplained remainder smaller than this (either sign) is shown as zero."""
MIN_SHARE = 0.005
"""A group under this share of the bar rounds to 0 % in the legend: it gets no segment either."""
ROWS = 4

#: Per group: the legend's short name, the bar's glyph and colour. "not reported" and "unexplained" are
#: shaded rather than solid so that they read as unknown even without colour.
GROUP_LOOK: dict[str, tuple[str, str, str]] = {
    "client": ("cli", "█", "$success"),
    "network": ("net", "█", "$primary"),
    "network+server": ("net+srv", "▒", "$primary"),
    "server": ("srv", "█", "$accent"),
    "retry": ("retry", "█", "$error"),
    "unexplained": ("?", "░", MUTED_STYLE),
}
BADGE_STYLE = "bold $text on $warning"
#: Flag -> (badge text, style). A flag not listed shows under its own name.
BADGES: dict[str, tuple[str, str]] = {
    "cold_start": ("cold start", BADGE_STYLE),
    "saturation": ("saturated", BADGE_STYLE),
    "cache_hit": ("cache hit", "bold $text on $success"),
}
# The core's note about a reported span overrunning a measured one ends with this; muted with the part.
_NEGATIVE_NOTE = "negative unexplained"


def visible_group_ms(attribution: Attribution) -> dict[str, float]:
    """Milliseconds per group as the HUD shows them: ``group_ms()`` with an unexplained part under
    ``MUTE_MS`` (either sign) dropped."""
    groups = attribution.group_ms()
    rest = groups.get("unexplained")
    if rest is not None and abs(rest) < MUTE_MS:
        del groups["unexplained"]
    return groups


def segments(group_ms: Mapping[str, float], width: int) -> list[tuple[str, int]]:
    """Cells per group for a bar ``width`` cells wide, in ``GROUPS`` order, summing to ``width``.

    Proportional to the positive milliseconds (largest remainder). A group the legend names (at least
    ``MIN_SHARE`` of the positive time) gets at least one cell when there is room, so every colour of the
    legend is in the bar; a smaller one gets none, so a 0.2 ms pool wait does not look like 3 % of the bar.
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


def render_bar(attribution: Attribution | None, width: int) -> Content:
    """The stacked bar of ``attribution`` in ``width`` cells; a dim note when there is nothing to split."""
    if attribution is None:
        return Content.styled("no request yet", MUTED_STYLE)
    cells = segments(visible_group_ms(attribution), width)
    if not cells:
        return Content.styled("no time to split", MUTED_STYLE)
    parts = []
    for group, n in cells:
        _, glyph, style = GROUP_LOOK.get(group, (group, "█", ""))
        parts.append((glyph * n, style))
    return Content.assemble(*parts)


def legend(shares: Mapping[str, float]) -> list[str | tuple[str, str]]:
    """``net 61% · srv 30% · cli 4% · ? 5%``: the groups largest first, unexplained last, each name in its
    bar colour; a group that rounds to 0% is left out, a negative unexplained share is in warning colour."""
    rounded = {g: round(s * 100) for g, s in shares.items()}
    known = sorted((g for g in rounded if g != "unexplained" and rounded[g] != 0), key=lambda g: -shares[g])
    order = known + (["unexplained"] if rounded.get("unexplained", 0) != 0 else [])
    out: list[str | tuple[str, str]] = []
    for group in order:
        short, _, style = GROUP_LOOK.get(group, (group, "█", ""))
        if out:
            out.append((" · ", MUTED_STYLE))
        pct = rounded[group]
        out += [(short, style), (f" {pct}%", WARN_STYLE if pct < 0 else "")]
    return out


def _request_shares(attribution: Attribution) -> dict[str, float]:
    if attribution.total_ms <= 0:
        return {}
    return {g: ms / attribution.total_ms for g, ms in visible_group_ms(attribution).items()}


def _status(attribution: Attribution) -> Content:
    parts: list[str | tuple[str, str]] = []
    for flag in attribution.flags:
        text, style = BADGES.get(flag, (flag.replace("_", " "), BADGE_STYLE))
        parts += [(f" {text} ", style), " "]
    muted = abs(attribution.ms("unexplained")) < MUTE_MS
    notes = [n for n in attribution.notes if not (muted and _NEGATIVE_NOTE in n)]
    if notes:
        parts.append(("; ".join(notes), MUTED_STYLE))
    elif not parts:
        if attribution.reporter == "cache":
            parts.append(("answered from the cache", MUTED_STYLE))
        elif attribution.reporter:
            parts.append((f"server times: {attribution.reporter}", MUTED_STYLE))
        else:
            parts.append(("the server reported no times", MUTED_STYLE))
    return Content.assemble(*parts)


def render_attribution(
    last: Attribution | None, over: Mapping[str, float], count: int, width: int
) -> Content:
    """The panel's four lines: the bar of ``last`` in ``width`` cells, its legend, the shares ``over`` the
    last ``count`` requests, and the flags and notes of ``last``."""
    bar = render_bar(last, width)
    if last is None:
        return Content("\n").join([bar, Content(""), Content(""), Content("")])
    this = Content.assemble(*legend(_request_shares(last))) if last.total_ms > 0 else Content("")
    if over:
        window = Content.assemble((f"last {count}  ", MUTED_STYLE), *legend(over))
    else:
        window = Content.styled("last requests: no reply yet", MUTED_STYLE)
    return Content("\n").join([bar, this, window, _status(last)])


class AttributionPanel(Static):
    """Where the time went, repainted with ``show`` when a request finished (never a re-layout)."""

    DEFAULT_CSS = f"""
    AttributionPanel {{
        height: {ROWS};
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }}
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(render_attribution(None, {}, 0, 30), id=id)
        self._shown: tuple[Attribution | None, Mapping[str, float], int] = (None, {}, 0)

    def show(self, metrics: Metrics) -> None:
        """Paint the last attribution of ``metrics`` and its shares over the windowed requests."""
        self._shown = (metrics.last_attribution, metrics.attribution_shares(), metrics.attribution_count)
        self._paint()

    def _paint(self) -> None:
        last, over, count = self._shown
        self.update(render_attribution(last, over, count, self.content_size.width or 30), layout=False)

    def on_resize(self) -> None:
        # The bar is drawn to the width; the height is fixed.
        self._paint()
