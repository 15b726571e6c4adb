"""`llmchat bench`'s dataset and token figures on the terminal: what prompts were sent, prompt and output
lengths and who counted them, ITL per chunk beside ITL per token, and TTFT by turn of a multi-turn run."""

from __future__ import annotations

from collections.abc import Sequence

from llmchat.core.load import ConfigStats, Scenario
from llmchat.tui.commands._bench_report import fmt_ms, grid


def prompts_line(scenario: Scenario) -> str | None:
    """The prompts a dataset or shared-prefix run sent, one line; None for plain synthetic prompts."""
    parts: list[str] = []
    dataset = scenario.load_dataset()
    if dataset is not None:
        turns = ("every human turn, with this run's replies as history" if scenario.turns == "all"
                 else "the first human turn of each")
        parts.append(f"prompts: {dataset.describe()}, {turns}")
    if scenario.prefix_share:
        parts.append(f"shared system-prompt prefix: {scenario.prefix_share:.0%} of each prompt's words")
    return "; ".join(parts) or None


def _pair(a: float | None, b: float | None, fmt: str = "ms") -> str:
    def one(v: float | None) -> str:
        return fmt_ms(v) if fmt == "ms" else "-" if v is None else f"{v:,.0f}"

    return f"{one(a)} / {one(b)}"


def tokens_table(stats: Sequence[ConfigStats], *, mode: str) -> str:
    """Prompt and output tokens (p50 / max, with who counted them) and ITL per chunk and per token (p50 /
    p99, with where the tokens per chunk came from), one column per configuration."""
    shown = [s for s in stats if s.tokens is not None and s.ok]
    if not shown:
        return ""
    figs = [s.tokens for s in shown if s.tokens is not None]
    rows: list[list[str]] = [["tokens", *(s.name for s in shown)]]
    if any(f.prompt_by is not None for f in figs):
        rows.append(["prompt tokens p50 / max", *(_pair(f.prompt["p50"], f.prompt["max"], "n") for f in figs)])
        rows.append(["  counted by", *(_counted(f.prompt_by, "tokenizer") for f in figs)])
    rows.append(["output tokens p50 / max", *(_pair(f.output["p50"], f.output["max"], "n") for f in figs)])
    rows.append(["  counted by", *(_counted(f.output_by, "usage") for f in figs)])
    if mode == "stream":
        rows.append(["ITL per chunk ms p50 / p99",
                     *(_pair(f.itl_per_chunk["p50"], f.itl_per_chunk["p99"]) for f in figs)])
        rows.append(["ITL per token ms p50 / p99",
                     *(_pair(f.itl_per_token["p50"], f.itl_per_token["p99"]) for f in figs)])
        rows.append(["  tokens per chunk from", *(f.itl_source or "-" for f in figs)])
    return (grid(rows) + "\ncounted by server: its tokenizer (POST /tokenize) or its usage; estimated: 4 bytes a "
            "token, or one token a chunk. ITL per token divides each chunk gap among the chunk's tokens")


def _counted(by: str | None, how: str) -> str:
    if by is None:
        return "-"
    return f"server {how}" if by == "server" else "estimated"


def turns_table(stats: Sequence[ConfigStats]) -> str:
    """TTFT p50 / p95 by turn number (ms, and how many requests) when some conversation had more than one
    turn; empty otherwise."""
    figs = [(s.name, s.tokens) for s in stats if s.tokens is not None]
    turns = sorted({t for _, f in figs if f is not None for t in f.ttft_by_turn})
    if len(turns) < 2:
        return ""
    rows: list[list[str]] = [["TTFT by turn, ms p50 / p95", *(name for name, _ in figs)]]
    for t in turns:
        cells = []
        for _, f in figs:
            row = None if f is None else f.ttft_by_turn.get(t)
            cells.append("-" if row is None else f"{_pair(row['p50'], row['p95'])}  (n {row['n']:.0f})")
        rows.append([f"turn {t}", *cells])
    return grid(rows) + "\nturn 1 is each conversation's first request; later turns carry its history so far"
