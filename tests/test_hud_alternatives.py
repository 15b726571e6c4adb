"""The HUD's comparison of a prompt's replies (tui/widgets/hud/_alternatives.py): lines, marks, best figures."""

from __future__ import annotations

from llmchat.tui.widgets.hud._alternatives import render_alternatives
from llmchat.tui.widgets.hud._figures import OK_STYLE


def _styled(line: object, text: str) -> set[str]:
    """The styles of the spans covering ``text`` in a rendered line."""
    plain = line.plain  # type: ignore[attr-defined]
    start = plain.index(text)
    return {str(span.style) for span in line.spans  # type: ignore[attr-defined]
            if span.start <= start and span.end >= start + len(text)}


def test_each_reply_gets_a_line_and_the_best_figures_stand_out() -> None:
    slow = {"ttft_ms": 412.0, "total_ms": 3100.0, "tokens_per_s": 41.5}
    fast = {"ttft_ms": 180.0, "total_ms": 3400.0, "tokens_per_s": 44.0}
    lines = render_alternatives([slow, fast, None], current=1)
    assert [line.plain for line in lines] == [
        "  1/3  412 ms · 3100 ms · 41.5",
        "▸ 2/3  180 ms · 3400 ms · 44.0",
        "  3/3  no timing kept",
    ]
    assert OK_STYLE in _styled(lines[1], "180 ms") and OK_STYLE in _styled(lines[0], "3100 ms")
    assert OK_STYLE not in _styled(lines[0], "412 ms") and OK_STYLE in _styled(lines[1], "44.0")


def test_a_failed_reply_says_so_and_one_reply_is_no_comparison() -> None:
    failed = {"error_kind": "server", "error": "HTTP 500", "total_ms": 20.0}
    lines = render_alternatives([failed, {"ttft_ms": 90.0, "total_ms": 900.0, "cancelled": True}], current=0)
    assert lines[0].plain == "▸ 1/2  failed (server)" and lines[1].plain.endswith(" · cancelled")
    assert OK_STYLE not in _styled(lines[1], "90.0 ms")  # the only TTFT is not "the best of two"
    assert render_alternatives([{"ttft_ms": 1.0, "total_ms": 2.0}], current=0) == []
