"""How the HUD spells its figures: milliseconds, rates, money, and the SLA colour of a latency.

Styles are Textual theme variables ("$success", "$error", ...) so the HUD follows the app's theme.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmchat.core._metrics import Series
from llmchat.core._settings import UISettings

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


def ms(value: float | None) -> str:
    """A duration for a label: ``0.42 ms``, ``12.3 ms``, ``345 ms``, ``12.3 s``; ``-`` when unknown."""
    if value is None:
        return "-"
    if value < 10:
        return f"{value:.2f} ms"
    if value < 100:
        return f"{value:.1f} ms"
    if value < 10_000:
        return f"{value:.0f} ms"
    return f"{value / 1000:.1f} s"


def number(value: float | None) -> str:
    """A figure for a table cell, at most 5 characters: ``4.56``, ``45.6``, ``345``, ``12.3k``; ``-``."""
    if value is None:
        return "-"
    if value < 10:
        return f"{value:.2f}"
    if value < 100:
        return f"{value:.1f}"
    if value < 10_000:
        return f"{value:.0f}"
    return f"{value / 1000:.1f}k"


def figure(name: Series, value: float | None) -> str:
    """A value of series ``name`` with its unit: milliseconds, or tokens per second."""
    if name == "tokens_per_s":
        return "-" if value is None else f"{number(value)} tok/s"
    return ms(value)


def money(value: float) -> str:
    """An estimated cost: ``$0``, ``$0.000033`` and ``$0.00021`` (tiny, still readable), ``$0.0123``,
    ``$12.34``."""
    if value == 0:
        return "$0"
    if value < 0.001:
        return f"${value:.6f}".rstrip("0")
    return f"${value:.4f}" if value < 10 else f"${value:,.2f}"


def sla_style(value: float | None, threshold_ms: float | None) -> str:
    """``$success`` at or under the SLA, ``$error`` over it, no style when either is unknown."""
    if value is None or threshold_ms is None:
        return ""
    return OK_STYLE if value <= threshold_ms else MISS_STYLE


@dataclass(frozen=True, slots=True)
class Sla:
    """The latency target the HUD colours: TTFT in stream mode, total in batch mode."""

    series: Series
    threshold_ms: float

    def style(self, name: Series, value: float | None) -> str:
        """The SLA colour of ``value`` when it is a value of the SLA's series; no style otherwise."""
        return sla_style(value, self.threshold_ms) if name == self.series else ""


def sla_for(mode: str, ui: UISettings) -> Sla:
    """``ui.sla_ttft_ms`` on TTFT in stream mode, ``ui.sla_total_ms`` on total in batch mode."""
    if mode == "batch":
        return Sla("total", ui.sla_total_ms)
    return Sla("ttft", ui.sla_ttft_ms)
