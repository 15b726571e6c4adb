"""How llmchat's screens spell numbers: one style for durations, rates, counts, shares, money and chart ticks.

Durations: tenths of a millisecond below 100 ms (``0.3 ms``, ``8.4 ms``, ``45.0 ms``; finer than that is below
what a Python event loop can time), whole milliseconds below 10 s (``263 ms``, ``5163 ms``), then tenths of a
second (``13.2 s``) and whole seconds from 100 s (``132 s``). So at most three significant figures, except
that whole milliseconds are never rounded away (``5163 ms``, not ``5160 ms``), and never a ``k``.

Percentiles: a percentile needs enough samples to mean anything. p95 of 3 requests is an interpolation between
the two slowest, a value nobody measured. So p95 is shown from ``MIN_SAMPLES["p95"]`` (20) samples, p99 from
``MIN_SAMPLES["p99"]`` (100); with fewer, the screens show the sample count with min, median and max, which
are always values that were measured (the median of an even count is the mean of the middle two).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

Stat = Literal["min", "median", "p95", "p99", "max"]

MIN_SAMPLES: dict[Stat, int] = {"p95": 20, "p99": 100}
"""The fewest samples each percentile is shown from (min, median and max need one)."""


def duration(ms: float | None) -> str:
    """A duration given in milliseconds: ``0.3 ms``, ``45.0 ms``, ``263 ms``, ``5163 ms``, ``13.2 s``,
    ``132 s``; ``<0.1 ms`` for a sliver above zero, ``0 ms`` for zero, ``-`` when unknown. Negative values
    keep their sign."""
    if ms is None or math.isnan(ms):
        return "-"
    if ms < 0:
        return "-" + duration(-ms)
    if ms == 0:
        return "0 ms"
    if ms < 0.05:
        return "<0.1 ms"
    if round(ms, 1) < 100:
        return f"{ms:.1f} ms"
    if round(ms) < 10_000:
        return f"{ms:.0f} ms"
    s = ms / 1000
    if round(s, 1) < 100:
        return f"{s:.1f} s"
    return f"{s:.0f} s"


def duration_range(lo_ms: float, hi_ms: float) -> str:
    """``28.5–5049 ms``: two durations sharing their unit when they have the same one, else
    ``980 ms–13.2 s``."""
    lo, hi = duration(lo_ms), duration(hi_ms)
    lo_value, _, lo_unit = lo.rpartition(" ")
    hi_value, _, hi_unit = hi.rpartition(" ")
    if lo_unit == hi_unit and not lo.startswith("<"):
        return f"{lo_value}–{hi_value} {hi_unit}"
    return f"{lo}–{hi}"


def figure(value: float | None) -> str:
    """A plain quantity (a rate, a count that may be fractional): three significant figures with at most one
    decimal, ``5.4``, ``69.9``, ``263``, ``5163``; ``-`` when unknown."""
    if value is None or math.isnan(value):
        return "-"
    if round(abs(value), 1) < 100:
        text = f"{value:.1f}"
        return "0" if text in ("0.0", "-0.0") else text
    return f"{value:.0f}"


def rate(value: float | None, unit: str = "tok/s") -> str:
    """``69.9 tok/s``; ``-`` when unknown."""
    return "-" if value is None else f"{figure(value)} {unit}"


def share(fraction: float) -> str:
    """A share of a whole, 0..1 (or beyond, for a figure that overlaps): ``61%``; ``<1%`` for a sliver."""
    pct = fraction * 100
    if 0 < pct < 0.5:
        return "<1%"
    return f"{pct:.0f}%"


def plural(n: int, one: str, many: str | None = None) -> str:
    """``1 retry``, ``2 retries``, ``0 errors``: the count and the noun in the form it takes. ``many``
    defaults to ``one`` + "s" (+ "es" after s, x, ch, sh; y after a consonant becomes "ies")."""
    if n == 1:
        return f"{n} {one}"
    if many is None:
        if one.endswith(("s", "x", "ch", "sh")):
            many = one + "es"
        elif one.endswith("y") and one[-2:-1] not in ("a", "e", "i", "o", "u"):
            many = one[:-1] + "ies"
        else:
            many = one + "s"
    return f"{n} {many}"


def money(value: float) -> str:
    """An estimated cost: ``$0``, ``$0.000033`` and ``$0.00021`` (tiny, still readable), ``$0.0123``,
    ``$12.34``."""
    if value == 0:
        return "$0"
    if value < 0.001:
        return f"${value:.6f}".rstrip("0")
    return f"${value:.4f}" if value < 10 else f"${value:,.2f}"


def spread_stats(n: int) -> tuple[Stat, Stat, Stat]:
    """The three figures worth showing for ``n`` samples: min, median and max below 20; median, p95 and max
    from 20; median, p95 and p99 from 100 (``MIN_SAMPLES``)."""
    if n >= MIN_SAMPLES["p99"]:
        return ("median", "p95", "p99")
    if n >= MIN_SAMPLES["p95"]:
        return ("median", "p95", "max")
    return ("min", "median", "max")


def nice_ticks(lo: float, hi: float, most: int = 6) -> list[float]:
    """At most ``most`` (>= 2) evenly spaced round values (steps of 1, 2 or 5 times a power of ten) covering
    ``lo`` to ``hi``: 0-48 gives 0, 10, 20, 30, 40, 50. A zero-width range gets a step around its value."""
    most = max(2, most)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0, 1.0]
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        pad = abs(hi) * 0.1 if abs(hi) >= 0.01 else 1.0
        # Not below zero for a value that is not: a range straddling 0 cannot be covered by two round ticks
        # (the loop below would grow the step to absurd sizes looking for them).
        lo, hi = (lo - pad if lo - pad >= 0 or lo < 0 else 0.0), hi + pad
    power = 10.0 ** math.floor(math.log10((hi - lo) / (most - 1)))
    while True:
        for mult in (1, 2, 5):
            step = mult * power
            first = math.floor(lo / step) * step
            count = math.ceil(round((hi - first) / step, 9)) + 1
            if count <= most:
                break
        else:
            power *= 10  # even 5x did not fit (the range straddles a round value): the next power
            continue
        break
    ticks = [first + i * step for i in range(count)]
    # Rounded to the step's decimals, so a tick reads 0.3, not 0.30000000000000004.
    decimals = max(0, -math.floor(math.log10(step)))
    return [round(t, decimals) for t in ticks]


def index_ticks(n: int, most: int = 6) -> list[int]:
    """Whole-number ticks for requests 1..n: at most ``most`` (>= 2), always 1 and n; [1] for one request."""
    if n <= 1:
        return [1]
    step = max(1, math.ceil((n - 1) / (max(2, most) - 1)))
    ticks = list(range(1, n, step))
    if len(ticks) > 1 and n - ticks[-1] < step / 2:
        ticks.pop()  # n would crowd the tick before it
    return [*ticks, n]


def tick_labels(ticks: Sequence[float], unit: str) -> list[str]:
    """Axis labels in the style above, each with its unit, to the ticks' own precision: ``0 ms``, ``50 ms``,
    ``100 ms``; ``10 s``, ``12.5 s``; a rate as a plain figure (``0``, ``20``, ``40``)."""
    if len(ticks) > 1:
        step = min(abs(b - a) for a, b in zip(ticks, ticks[1:], strict=False)) or 1.0
    else:
        step = abs(ticks[0]) if ticks and ticks[0] else 1.0
    if unit != "ms":
        decimals = max(0, -math.floor(math.log10(step)))
        return [f"{t:.{decimals}f}" for t in ticks]
    top = max((abs(t) for t in ticks), default=0.0)
    if top < 10_000:
        decimals = max(0, -math.floor(math.log10(step)))
        return [f"{t:.{decimals}f} ms" for t in ticks]
    decimals = max(0, -math.floor(math.log10(step / 1000)))
    return [f"{t / 1000:.{decimals}f} s" for t in ticks]
