"""The HUD's comparison of a prompt's replies: one line per alternative (regenerated, or after an edit), its
time to first token, total and rate, the one on screen marked, the fastest of each figure in the success
colour.

Shown when the user switches between alternatives or selects a reply that has some; the records are the ones
history kept with each reply, so a reply from last week compares with the one just regenerated. Hidden
otherwise, so the HUD keeps its layout for a conversation without branches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from textual.content import Content

from llmchat.tui.numbers import duration, figure
from llmchat.tui.widgets.hud._figures import MUTED_STYLE, OK_STYLE
from llmchat.tui.widgets.hud._lines import Lines

_FIGURES = (("ttft_ms", min), ("total_ms", min), ("tokens_per_s", max))
TITLE = "replies: TTFT · total · tok/s"
"""The HUD title above the lines, which carries the figures' names so each line fits a narrow panel."""


def _value(record: Mapping[str, Any] | None, key: str) -> float | None:
    value = (record or {}).get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def render_alternatives(records: Sequence[Mapping[str, Any] | None], current: int) -> list[Content]:
    """A line per alternative, ``records`` oldest first, ``current`` the index of the one on screen; [] for
    fewer than two. A figure is coloured as the best only when two or more replies have it; a failed reply
    shows its error's kind, a cancelled one its figures up to the cancel."""
    if len(records) < 2:
        return []
    best: dict[str, float] = {}
    for key, pick in _FIGURES:
        values = [v for r in records if (v := _value(r, key)) is not None]
        if len(values) > 1:
            best[key] = pick(values)
    lines = []
    for index, record in enumerate(records):
        mark = "▸ " if index == current else "  "
        parts: list[str | tuple[str, str]] = [(f"{mark}{index + 1}/{len(records)}  ", "" if index == current
                                                else MUTED_STYLE)]
        failed = (record or {}).get("error_kind") or (record or {}).get("error")
        if record is None or failed or _value(record, "total_ms") is None:
            parts.append((f"failed ({failed})" if failed else "no timing kept", MUTED_STYLE))
        else:
            for n, (key, _) in enumerate(_FIGURES):
                value = _value(record, key)
                text = figure(value) if key == "tokens_per_s" else duration(value)
                style = OK_STYLE if key in best and value == best[key] else ""
                if n:
                    parts.append((" · ", MUTED_STYLE))
                parts.append((text, style))
            if record.get("cancelled"):
                parts.append((" · cancelled", MUTED_STYLE))
        lines.append(Content.assemble(*parts))
    return lines


class AlternativesLines(Lines):
    """A prompt's replies side by side; hidden until there are two to compare."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.display = False
        self.shown: list[str] = []
        """The lines as plain text, as last painted: for tests."""

    def show(self, records: Sequence[Mapping[str, Any] | None], current: int) -> None:
        """Compare ``records`` (oldest first), ``current`` on screen; fewer than two hides the lines."""
        lines = render_alternatives(records, current)
        self.shown = [line.plain for line in lines]
        if lines:
            self.paint_lines(lines)
        self.display = bool(lines)
