"""The HUD's rate-limit lines: what the provider's x-ratelimit-* headers said on its last reply, requests and
tokens, each as ``N of LIMIT left`` with the time until it is full again.

A kind under ``ui.headroom_warn`` of its limit is coloured, and the line says the threshold beside the colour
(``3 of 60 left, under 10 %``), as the figures do for the latency targets. Hidden until a reply sent the
headers, so a HUD for a provider that sends none keeps its layout.
"""

from __future__ import annotations

from textual.content import Content

from llmchat.core.observe import Headroom
from llmchat.tui.numbers import duration, share
from llmchat.tui.widgets.hud._figures import MISS_STYLE, MUTED_STYLE
from llmchat.tui.widgets.hud._lines import Lines

_KINDS = ("requests", "tokens")


def _line(kind: str, limit: int | None, remaining: int | None, reset_s: float | None, warn: float) -> Content:
    parts: list[str | tuple[str, str]] = [(f"{kind} ", MUTED_STYLE)]
    if remaining is None:
        parts.append(("-", MUTED_STYLE))
    elif limit:
        low = remaining < warn * limit
        parts.append((f"{remaining:,} of {limit:,} left", MISS_STYLE if low else ""))
        if low:
            parts.append((f", under {share(warn)}", MISS_STYLE))
    else:
        parts.append(f"{remaining:,} left")
    if reset_s is not None:
        parts.append((f" · full in {duration(reset_s * 1000)}", MUTED_STYLE))
    return Content.assemble(*parts)


def render_headroom(headroom: Headroom | None, warn: float) -> list[Content]:
    """One line per kind the provider reported (requests, tokens); [] for none."""
    if headroom is None:
        return []
    lines = []
    for kind in _KINDS:
        limit = getattr(headroom, f"limit_{kind}")
        remaining = getattr(headroom, f"remaining_{kind}")
        if limit is None and remaining is None:
            continue
        lines.append(_line(kind, limit, remaining, getattr(headroom, f"reset_{kind}_s"), warn))
    return lines


class HeadroomLines(Lines):
    """Up to two lines, hidden until the provider's first reply with rate-limit headers."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.display = False

    def show(self, headroom: Headroom | None, warn: float) -> None:
        """Paint ``headroom`` with kinds under ``warn`` (a share of the limit) coloured; None hides it."""
        lines = render_headroom(headroom, warn)
        if lines:
            self.paint_lines(lines)
        if self.display != bool(lines):
            self.display = bool(lines)
