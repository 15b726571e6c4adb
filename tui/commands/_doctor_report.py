"""`llmchat doctor`'s report as text: a short summary first, then one section per concern with a mark per
finding, then the config change. Wrapped to the terminal's width (80 columns at most) so it reads in any
terminal and in a pasted bug report."""

from __future__ import annotations

import re
import shutil
import textwrap

from llmchat.core.diagnose import SECTION_TITLES, SECTIONS, Estimate, Finding, Report, toml_snippet

MARKS = {"pass": "[ ok ]", "warn": "[WARN]", "fail": "[FAIL]", "info": "[info]", "skip": "[skip]"}
_INDENT = " " * 9


def width() -> int:
    return max(40, min(80, shutil.get_terminal_size((80, 24)).columns))


_UNIT = re.compile(r"(\d) (ms|s)\b")


def _wrap(text: str, first: str, rest: str, cols: int) -> list[str]:
    # A number never parts from its unit at a line break: glued for the wrap, spaced again after.
    glued = _UNIT.sub("\\1\u00a0\\2", text)
    lines = textwrap.wrap(glued, cols, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False)
    return [line.replace("\u00a0", " ") for line in lines] or [first]


def effect_text(f: Finding) -> str:
    if f.effect_ms is None:
        return ""
    ms = f.effect_ms
    amount = f"{ms / 1000:.1f} s" if ms >= 10_000 else f"{ms:.0f} ms" if ms >= 10 else f"{ms:.1f} ms"
    return f"costs ~{amount} per {f.effect_per}"


def _finding(f: Finding, cols: int, *, detail: bool) -> list[str]:
    lines = _wrap(f.title, f"  {MARKS[f.mark]} ", _INDENT, cols)
    if detail:
        for extra in (f.evidence, effect_text(f), f.advice):
            if extra:
                lines += _wrap(extra, _INDENT, _INDENT, cols)
        if f.changes and f.mark in ("warn", "fail"):
            lines += [_INDENT + line for line in toml_snippet(f.changes).splitlines()]
    return lines


def estimate_text(e: Estimate, target: str, *, cols: int = 80) -> str:
    cost = "cost unknown (no ui.prices for this model)" if e.cost_usd is None else f"about ${e.cost_usd:.4f}"
    text = (f"llmchat doctor will send at most {e.requests} requests to {target} ({e.chat_requests} of them "
            f"chat completions: ~{e.prompt_tokens} prompt + ~{e.output_tokens} output tokens, {cost}) within "
            f"{e.max_time_s:.0f} s.")
    return "\n".join(_wrap(text, "", "", cols))


def render(report: Report, *, config_path: str = "", cols: int | None = None) -> str:
    cols = cols or width()
    out: list[str] = []
    model = f", {report.model}" if report.model else ""
    out += _wrap(f"llmchat doctor: {report.target} ({report.provider}{model})", "", "  ", cols)
    state = " (interrupted: partial results)" if report.interrupted else ""
    out.append(f"{report.requests_sent} requests in {report.elapsed_s:.1f} s{state}")
    out.append("")
    bad = [f for f in report.findings if f.mark in ("fail", "warn")]
    bad.sort(key=lambda f: (f.mark != "fail", -(f.effect_ms or 0.0)))
    fails = sum(f.mark == "fail" for f in bad)
    warns = len(bad) - fails
    if not bad:
        out.append("Summary: healthy: no problem found.")
    else:
        parts = [f"{fails} failure{'s' * (fails != 1)}" if fails else "", f"{warns} warning{'s' * (warns != 1)}"
                 if warns else ""]
        out.append("Summary: " + ", ".join(p for p in parts if p) + ".")
        for f in bad:
            out += _finding(f, cols, detail=False)
            if effect_text(f):
                out += _wrap(effect_text(f), _INDENT, _INDENT, cols)
    for section in SECTIONS:
        found = [f for f in report.findings if f.section == section]
        errors = report.measurements.get(section, {}).get("errors") or {}
        if not found and not errors:
            continue
        out += ["", SECTION_TITLES[section]]
        for f in found:
            out += _finding(f, cols, detail=True)
        for step, error in errors.items():
            out += _wrap(f"{step}: {error}", f"  {MARKS['fail']} ", _INDENT, cols)
    if report.contradictions:  # the doctor's own self-check: a bug to report, never advice to follow
        out += ["", "Self-check (a bug in llmchat doctor; please report it)"]
        for line in report.contradictions:
            out += _wrap(line, f"  {MARKS['warn']} ", _INDENT, cols)
    if report.skipped:
        out += ["", "Skipped"]
        for reason in report.skipped:
            out += _wrap(reason, f"  {MARKS['skip']} ", _INDENT, cols)
    changes = report.changes()
    if changes:
        where = f" ({config_path})" if config_path else ""
        out += ["", *_wrap(f"The config change{where}; --write-config applies it:", "", "", cols), ""]
        out += ["  " + line if line else "" for line in toml_snippet(changes).splitlines()]
    return "\n".join(out) + "\n"
