"""What the doctor measures and what it concludes: findings with their evidence, effect and config change."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Mark = Literal["pass", "warn", "fail", "info", "skip"]
#: The report's sections, in the order it prints them.
SECTIONS: tuple[str, ...] = ("path", "connection", "streaming", "server", "limits")
SECTION_TITLES: dict[str, str] = {
    "path": "The path to the server",
    "connection": "The connection's life",
    "streaming": "Streaming health",
    "server": "The server's side",
    "limits": "Limits and errors",
}

#: A config change: the table's key path (("http",), ("providers", "groq", "http"), ("retry",)) -> key -> value.
Changes = dict[tuple[str, ...], dict[str, object]]


def fmt_ms(ms: float | None) -> str:
    """Milliseconds as every finding prints them: whole from 10 ms up, tenths below, ``-`` for none."""
    if ms is None:
        return "-"
    return f"{ms:.0f} ms" if abs(ms) >= 10 else f"{ms:.1f} ms"


def shown(ms: float) -> float:
    """``ms`` rounded as ``fmt_ms`` prints it: a difference of two shown figures is the difference a reader
    computes from the report, so an effect derived from them never disagrees with the printed numbers."""
    return float(round(ms)) if abs(ms) >= 10 else round(ms, 1)


@dataclass(slots=True)
class Finding:
    """One conclusion: ``check`` is a stable id (``connection.keepalive``), ``title`` one line for people,
    ``evidence`` the numbers it rests on, ``effect_ms`` what it costs the user per request (``effect_per``
    says per what), ``changes`` the config that addresses it and ``advice`` what to do besides (or instead)."""

    section: str
    check: str
    mark: Mark
    title: str
    evidence: str = ""
    effect_ms: float | None = None
    effect_per: str = "request"
    changes: Changes = field(default_factory=dict)
    advice: str = ""
    figures: dict[str, float] = field(default_factory=dict)
    """The numbers the finding rests on, by name, each as its title or evidence prints it: what
    ``_consistency.contradictions`` checks its verdict, its effect and its changes against."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "section": self.section,
            "check": self.check,
            "mark": self.mark,
            "title": self.title,
            "evidence": self.evidence,
            "effect_ms": None if self.effect_ms is None else round(self.effect_ms, 1),
            "effect_per": self.effect_per,
            "changes": {".".join(path): dict(keys) for path, keys in self.changes.items()},
            "advice": self.advice,
            "figures": dict(self.figures),
        }


@dataclass(slots=True)
class Estimate:
    """What a battery will send before it sends anything: requests, tokens, and the cost when priced."""

    requests: int
    chat_requests: int
    prompt_tokens: int
    output_tokens: int
    cost_usd: float | None
    """None when ``ui.prices`` has no price for the model."""
    max_time_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "chat_requests": self.chat_requests,
                "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
                "cost_usd": self.cost_usd, "max_time_s": self.max_time_s}


@dataclass(slots=True)
class Report:
    """A battery's result: every measurement by section, the findings, and how the run went."""

    target: str
    """The base URL, masked."""
    provider: str
    model: str
    measurements: dict[str, dict[str, Any]] = field(default_factory=lambda: {s: {} for s in SECTIONS})
    findings: list[Finding] = field(default_factory=list)
    requests_sent: int = 0
    elapsed_s: float = 0.0
    interrupted: bool = False
    skipped: list[str] = field(default_factory=list)
    """Steps left out: by the request or time budget, or because they did not apply."""
    contradictions: list[str] = field(default_factory=list)
    """What the self-check (``_consistency.contradictions``) found wrong with the findings: empty, or a bug."""

    def worst(self) -> Mark:
        marks = {f.mark for f in self.findings}
        return "fail" if "fail" in marks else "warn" if "warn" in marks else "pass"

    def changes(self) -> Changes:
        """Every finding's config changes merged (later findings win for the same key)."""
        merged: Changes = {}
        for f in self.findings:
            if f.mark in ("warn", "fail"):
                for path, keys in f.changes.items():
                    merged.setdefault(path, {}).update(keys)
        return merged

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "provider": self.provider,
            "model": self.model,
            "verdict": self.worst(),
            "requests_sent": self.requests_sent,
            "elapsed_s": round(self.elapsed_s, 3),
            "interrupted": self.interrupted,
            "skipped": list(self.skipped),
            "measurements": self.measurements,
            "findings": [f.to_dict() for f in self.findings],
            "changes": {".".join(path): dict(keys) for path, keys in self.changes().items()},
            "contradictions": list(self.contradictions),
        }
