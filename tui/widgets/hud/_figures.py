"""How the HUD names its series, its styles, and the latency targets it colours against.

Numbers are spelled by ``llmchat.tui.numbers`` (one style for every part of the HUD and its charts). Styles
are Textual theme variables ("$success", "$error", ...) so the HUD follows the app's theme.

Targets: TTFT is held to ``ui.sla_ttft_ms`` in stream mode, the total to ``ui.sla_total_ms`` in batch mode.
Each request is judged against the target of its own mode (``TimingRecord.mode``), so toggling the mode never
recolours a request already made; and a colour always comes with the target that explains it
(``263 ms > 200 ms target``).
"""

from __future__ import annotations

from dataclasses import dataclass

from llmchat.core.config import UISettings
from llmchat.core.observe import Series
from llmchat.tui.numbers import duration, rate

#: The HUD's name for each series.
TITLES: dict[Series, str] = {
    "ttfb": "TTFB",
    "ttft": "TTFT",
    "total": "total",
    "tokens_per_s": "tok/s",
    "render_lag": "render",
}

OK_STYLE = "$success"
MISS_STYLE = "$error"
MUTED_STYLE = "$text-muted"
WARN_STYLE = "$warning"


def value_text(name: Series, value: float | None) -> str:
    """A value of series ``name`` with its unit: a duration, or tokens per second."""
    return rate(value) if name == "tokens_per_s" else duration(value)


@dataclass(frozen=True, slots=True)
class Targets:
    """The latency targets: TTFT in stream mode, the total in batch mode."""

    ttft_ms: float
    total_ms: float

    @classmethod
    def from_ui(cls, ui: UISettings) -> Targets:
        """``ui.sla_ttft_ms`` and ``ui.sla_total_ms``."""
        return cls(ui.sla_ttft_ms, ui.sla_total_ms)

    def target(self, name: Series, mode: str) -> float | None:
        """The target series ``name`` is held to for a request made in ``mode``; None when that series is not
        the mode's target (the total of a streamed reply, TTFB, tokens/s)."""
        if mode == "batch":
            return self.total_ms if name == "total" else None
        return self.ttft_ms if name == "ttft" else None

    def style(self, name: Series, value: float | None, mode: str) -> str:
        """``$success`` at or under the target, ``$error`` over it; no style without a target or a value."""
        target = self.target(name, mode)
        if value is None or target is None:
            return ""
        return OK_STYLE if value <= target else MISS_STYLE

    def verdict(self, name: Series, value: float | None, mode: str) -> tuple[str, str] | None:
        """``("> 200 ms target", "$error")`` or ``("≤ 200 ms target", "$success")``: the reason for the
        colour, to show beside it; None when there is no target to judge by."""
        target = self.target(name, mode)
        if value is None or target is None:
            return None
        over = value > target
        return f"{'>' if over else '≤'} {duration(target)} target", MISS_STYLE if over else OK_STYLE
