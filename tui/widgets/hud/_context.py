"""The HUD's context lines: the next request's prompt tokens against the model's window, what the prompt
cost the server (its reported prefill and that share of time to first token), and what was left out to fit.

Two fixed lines at the panel's end (the HUD is 38 columns wide and every row counts), painted with
``layout=False``; hidden until the first request was fitted, so a HUD that never sent keeps its layout.
"""

from __future__ import annotations

from textual.content import Content
from textual.widgets import Static

from llmchat.core.client import ContextFit
from llmchat.core.observe import Attribution, TimingRecord
from llmchat.tui.numbers import plural
from llmchat.tui.widgets.hud._figures import MUTED_STYLE, WARN_STYLE


def prefill_share(attribution: Attribution | None, record: TimingRecord | None) -> tuple[float, float] | None:
    """The server's reported prefill in ms and its share of TTFT; None without a report or a TTFT."""
    if attribution is None or record is None or attribution.part("server_prefill") is None:
        return None
    ttft = record.ttft_ms
    if not ttft:
        return None
    prefill = attribution.ms("server_prefill")
    return prefill, prefill / ttft


def render_context(fit: ContextFit | None, attribution: Attribution | None,
                   record: TimingRecord | None) -> Content:
    """``prompt 1,234 / 4,096 tok · 2 turns out`` (or ``all in``), then ``prefill 38 ms, 12% of TTFT``."""
    if fit is None:
        return Content("")
    count = f"{fit.prompt_tokens:,}" + (" (estimate)" if fit.counted_by == "estimate" else "")
    first: list[str | tuple[str, str]] = [("prompt ", MUTED_STYLE)]
    if fit.window is None:
        first += [f"{count} tok", (" · window unknown", MUTED_STYLE)]
    else:
        first += [f"{count} / {fit.window:,} tok"]
        if fit.turns_left_out:
            first += [(" · ", MUTED_STYLE), (f"{plural(fit.turns_left_out, 'turn')} out", WARN_STYLE)]
        else:
            first.append((" · all in", MUTED_STYLE))
    share = prefill_share(attribution, record)
    second: list[str | tuple[str, str]] = [("prefill not reported by the server", MUTED_STYLE)]
    if share is not None:
        second = [("prefill ", MUTED_STYLE), f"{share[0]:.0f} ms, {share[1]:.0%} of TTFT"]
    return Content.assemble(*first, "\n", *second)


class ContextLine(Static):
    """The two context lines; ``show`` repaints them without a re-layout once they are shown."""

    DEFAULT_CSS = """
    ContextLine {
        height: 2;
        margin-top: 1;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.display = False

    def show(self, fit: ContextFit | None, attribution: Attribution | None, record: TimingRecord | None) -> None:
        """Paint ``fit`` with the last request's prefill share."""
        if fit is None:
            return
        self.update(render_context(fit, attribution, record), layout=False)
        if not self.display:
            self.display = True
