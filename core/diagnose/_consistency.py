"""The doctor's self-check: findings never contradict the figures they print, nor each other, nor the config.

``reconcile`` runs last in ``prescribe``: it drops every change to a key already at that value (the provider's
effective [http] with its defaults, or the other sections of the settings) and every change another one makes
unneeded (``UNNEEDED``). ``contradictions`` then checks a finished report against its own figures: each
verdict holds on them (``RULES``), each "costs ~X" is the difference they print, nothing is prescribed twice or
already in force, and no behaviour gets two verdicts. The battery records what it finds in
``Report.contradictions``; the tests hold it empty.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from llmchat.core.config import HttpSettings, Settings
from llmchat.core.diagnose._findings import Changes, Finding, Report, fmt_ms


@dataclasses.dataclass(frozen=True, slots=True)
class Unneeded:
    """``by`` at ``value`` makes ``drop`` unneeded, for the reason ``why``. Keys are [http] keys unless given
    as "section.key"; ``prescribed_only`` counts ``by`` only when the doctor prescribes it (every config has
    some http2, and its default does not mean HTTP/2 over http://)."""

    by: str
    value: object
    drop: str
    why: str
    prescribed_only: bool = False


UNNEEDED: tuple[Unneeded, ...] = (
    # HTTP/2 keeps one connection across streams: retiring each after one request would throw away the very
    # connection the switch was for (the close it answers was HTTP/1.1's). Prescribed http2 = false (leaving
    # an h2c the server does not speak) is no switch to HTTP/2, so it counts only when not false.
    Unneeded("http2", "not false", "max_requests_per_connection",
             "HTTP/2 keeps its connection across streams, so retiring it after each request is not needed",
             prescribed_only=True),
    # A connection retired after one request has nothing for a ping to keep warm, and the ping would spend
    # its one request.
    Unneeded("max_requests_per_connection", 1, "keepalive_ping_s",
             "a connection used for one request only has nothing for pings to keep warm"),
    # Warm-up's GET /models would be the connection's one request: the prompt then opens another anyway.
    Unneeded("max_requests_per_connection", 1, "warmup",
             "warm-up's connection would be retired by its own GET before the first prompt"),
    # Batch mode shows no stream, so no stall badge either.
    Unneeded("ui.stream", False, "ui.stall_s", "without streaming there is no stall badge to tune"),
)


def _split(key: str) -> tuple[str, str]:
    section, _, name = key.rpartition(".")
    return section or "http", name


def _effective(path: tuple[str, ...], key: str, settings: Settings, http: HttpSettings) -> tuple[bool, Any]:
    """(known, value) of ``key`` in the table at ``path`` as the client runs with it."""
    section: object = http if path[-1] == "http" else getattr(settings, path[-1], None)
    if section is None or not dataclasses.is_dataclass(section) or not hasattr(section, key):
        return False, None
    return True, getattr(section, key)


def _same(a: object, b: object) -> bool:
    # 15 and 15.0 are one value in TOML's eyes and the settings'; True and 1 are not.
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b


def _value(merged: Mapping[str, Mapping[str, object]], section: str, key: str,
           settings: Settings, http: HttpSettings) -> object:
    if key in merged.get(section, {}):
        return merged[section][key]
    known, value = _effective((section,), key, settings, http)
    return value if known else None


def _section(path: tuple[str, ...]) -> str:
    return "http" if path[-1] == "http" else path[-1]


def reconcile(findings: list[Finding], settings: Settings, http: HttpSettings) -> list[Finding]:
    """``findings`` with no change to a key already at that value, and none that another change (or the
    config in force) makes unneeded (``UNNEEDED``); what was dropped is said in the finding's advice."""
    for f in findings:
        kept: Changes = {}
        notes: list[str] = []
        for path, keys in f.changes.items():
            for key, value in keys.items():
                known, current = _effective(path, key, settings, http)
                if known and _same(current, value):
                    notes.append(f"{key} = {_toml(value)} is already in force")
                    continue
                kept.setdefault(path, {})[key] = value
        f.changes = kept
        if notes:
            f.advice = "; ".join(([f.advice] if f.advice else []) + notes)
    merged = _merged(findings)
    for f in findings:
        if f.mark not in ("warn", "fail"):
            continue
        notes = []
        for path in list(f.changes):
            for key in list(f.changes[path]):
                why = _unneeded_by(merged, _section(path), key, settings, http)
                if why:
                    del f.changes[path][key]
                    notes.append(f"not {key}: {why}")
            if not f.changes[path]:
                del f.changes[path]
        if notes:
            f.advice = "; ".join(([f.advice] if f.advice else []) + notes)
    return findings


def _toml(value: object) -> str:
    from llmchat.core.config._toml import toml_value

    return toml_value(value)


def _merged(findings: list[Finding]) -> dict[str, dict[str, object]]:
    merged: dict[str, dict[str, object]] = {}
    for f in findings:
        if f.mark in ("warn", "fail"):
            for path, keys in f.changes.items():
                merged.setdefault(_section(path), {}).update(keys)
    return merged


def _unneeded_by(merged: Mapping[str, Mapping[str, object]], section: str, key: str, settings: Settings,
                 http: HttpSettings) -> str:
    """Why ``section.key`` is unneeded given the other changes and the config in force; "" when it is not."""
    for pair in UNNEEDED:
        if _split(pair.drop) != (section, key):
            continue
        b_section, b_key = _split(pair.by)
        if pair.prescribed_only and b_key not in merged.get(b_section, {}):
            continue
        current = _value(merged, b_section, b_key, settings, http)
        if (current is not False) if pair.value == "not false" else _same(current, pair.value):
            return pair.why
    return ""


# -- the check ------------------------------------------------------------------------------------------------
Rule = Callable[[dict[str, float]], tuple[bool, float | None]]
"""figures -> (the verdict holds on them, the effect they imply in ms or None when the effect is not theirs)."""


def _http2(f: dict[str, float]) -> tuple[bool, float | None]:
    return f["http2_wall_ms"] < f["http1_wall_ms"], f["http1_wall_ms"] - f["http2_wall_ms"]


def _new_cost(f: dict[str, float]) -> tuple[bool, float | None]:
    from llmchat.core.diagnose._prescribe import CONNECT_COST_WARN_MS

    cost = f["new_min_ms"] - f["reused_min_ms"]
    return cost >= CONNECT_COST_WARN_MS, cost


def _keepalive(f: dict[str, float]) -> tuple[bool, float | None]:
    closed = f.get("reused_after_stream", f.get("reused_between_requests", 1.0)) == 0 \
        or f.get("closes_after_response", 0.0) > 0
    return closed, f.get("new_connection_cost_ms")


def _cold(f: dict[str, float]) -> tuple[bool, float | None]:
    extra = f["first_ttft_ms"] - f["later_ttft_median_ms"]
    return extra > 0 or f["server_model_load_ms"] > 0, max(extra, f["server_model_load_ms"])


def _idle(f: dict[str, float]) -> tuple[bool, float | None]:
    from llmchat.core.diagnose._server import COLD_MIN_MS

    return f["extra_ms"] >= COLD_MIN_MS, f["extra_ms"]


def _stall(f: dict[str, float]) -> tuple[bool, float | None]:
    from llmchat.core.diagnose._streaming import STALL_MIN_MS

    return f["longest_gap_ms"] >= STALL_MIN_MS, f["longest_gap_ms"]


def _buffered(f: dict[str, float]) -> tuple[bool, float | None]:
    from llmchat.core.diagnose._streaming import BUNCHED_SHARE

    return f["span_share"] < BUNCHED_SHARE, f.get("server_span_ms", f["total_ms"])


def _timing(f: dict[str, float]) -> tuple[bool, float | None]:
    from llmchat.core.diagnose._prescribe import READ_TIMEOUT_FACTOR

    return f["read_timeout_s"] * 1000 < READ_TIMEOUT_FACTOR * f["slowest_wait"], None


def _limit(f: dict[str, float]) -> tuple[bool, float | None]:
    from llmchat.core.diagnose._prescribe import HEADROOM_MIN, HEADROOM_SHARE

    return f["remaining"] <= max(HEADROOM_SHARE * f["limit"], HEADROOM_MIN), None


#: Each warning or failure that recommends something (a change or an effect) has its rule here: the
#: comparison its verdict claims, on the figures it carries.
RULES: dict[str, Rule] = {
    "connection.http2": _http2,
    "connection.new_cost": _new_cost,
    "connection.keepalive": _keepalive,
    "server.cold_start": _cold,
    "server.idle": _idle,
    "server.saturation": lambda f: (f["saturated_requests"] > 0 or f["queue_ms_max"] > 0, None),
    "streaming.stall": _stall,
    "streaming.buffered": _buffered,
    "streaming.timing": _timing,
    "path.h2c": lambda f: (f["h2c"] == 0, None),
    "limits.requests": _limit,
    "limits.tokens": _limit,
}
#: Checks that judge one behaviour between them: one verdict for all of them.
BEHAVIOURS: dict[str, tuple[str, ...]] = {
    "keep-alive": ("connection.keepalive", "connection.close_after_stream"),
    "http2": ("connection.http2", "path.h2c"),
}


def contradictions(report: Report, settings: Settings, http: HttpSettings) -> list[str]:
    """Every way ``report``'s findings disagree with the figures they print, with the config in force or with
    each other, one line each; empty when they agree. Pure, never raises for a finding's content."""
    out: list[str] = []
    for f in report.findings:
        shown_text = f"{f.title} {f.evidence}"
        for name, value in f.figures.items():
            if name.endswith("_ms") and fmt_ms(value) not in shown_text:
                out.append(f"{f.check}: its figure {name} ({fmt_ms(value)}) is not printed")
        recommends = f.mark in ("warn", "fail") and (f.changes or f.effect_ms is not None)
        if not recommends:
            continue
        rule = RULES.get(f.check)
        if rule is None:
            out.append(f"{f.check}: recommends with no rule to check it against its figures")
            continue
        try:
            holds, effect = rule(f.figures)
        except KeyError as exc:
            out.append(f"{f.check}: lacks the figure {exc.args[0]} its rule compares")
            continue
        if not holds:
            out.append(f"{f.check}: {f.mark} but its figures say otherwise: {f.figures}")
        if effect is not None and f.effect_ms is not None and fmt_ms(effect) != fmt_ms(f.effect_ms):
            out.append(f"{f.check}: costs ~{fmt_ms(f.effect_ms)} but its figures differ by {fmt_ms(effect)}")
    merged = _merged(report.findings)
    for section, keys in merged.items():
        for key, prescribed in keys.items():
            known, current = _effective((section,), key, settings, http)
            if known and _same(current, prescribed):
                out.append(f"prescribes {section}.{key} = {_toml(prescribed)}, already in force")
            why = _unneeded_by(merged, section, key, settings, http)
            if why:
                out.append(f"prescribes {section}.{key} beside what makes it unneeded: {why}")
    seen: dict[str, str] = {}
    for f in report.findings:
        if f.check in seen:
            out.append(f"{f.check}: two findings")
        seen[f.check] = f.mark
    for name, checks in BEHAVIOURS.items():
        marks = {seen[c] for c in checks if c in seen}
        if "pass" in marks and marks & {"warn", "fail"}:
            out.append(f"{name}: both [ ok ] and a warning or failure ({', '.join(c for c in checks if c in seen)})")
    return out
