"""The one number style of the HUD and its charts: durations, figures, plurals, shares, percentiles, ticks."""

from __future__ import annotations

import re

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from llmchat.tui.numbers import (
    MIN_SAMPLES,
    duration,
    duration_range,
    figure,
    index_ticks,
    money,
    nice_ticks,
    plural,
    rate,
    share,
    spread_stats,
    tick_labels,
)


@pytest.mark.parametrize(("ms", "text"), [
    (None, "-"), (0.0, "0 ms"), (0.02, "<0.1 ms"), (0.3, "0.3 ms"), (8.42, "8.4 ms"), (10.0, "10.0 ms"),
    (45.04, "45.0 ms"), (99.96, "100 ms"), (263.4, "263 ms"), (5163.4, "5163 ms"), (9999.6, "10.0 s"),
    (13_240.0, "13.2 s"), (45_000.0, "45.0 s"), (99_960.0, "100 s"), (132_000.0, "132 s"), (-3.25, "-3.2 ms"),
])
def test_durations_are_ms_below_10_s_and_seconds_above(ms: float | None, text: str) -> None:
    assert duration(ms) == text


@given(st.floats(min_value=0.05, max_value=1e7, allow_nan=False))
def test_a_duration_has_no_k_and_no_more_figures_than_it_measured(ms: float) -> None:
    text = duration(ms)
    assert "k" not in text
    value, unit = text.split(" ")
    assert unit in ("ms", "s")
    digits = value.replace(".", "").lstrip("0")
    # Three significant figures, except whole milliseconds (1000-9999 ms) and whole seconds past 999 s.
    assert len(digits) <= 3 or "." not in value
    assert float(value) * (1000 if unit == "s" else 1) == pytest.approx(ms, rel=0.06, abs=0.051)


def test_ranges_share_their_unit() -> None:
    assert duration_range(28.5, 5049.0) == "28.5–5049 ms"
    assert duration_range(980.0, 13_200.0) == "980 ms–13.2 s"


def test_figures_rates_shares_and_money() -> None:
    assert [figure(v) for v in (5.42, 69.94, 99.96, 263.4, 5163.0)] == ["5.4", "69.9", "100", "263", "5163"]
    assert rate(69.94) == "69.9 tok/s" and rate(None) == "-"
    assert [share(v) for v in (0.613, 0.004, 0.0, 1.0)] == ["61%", "<1%", "0%", "100%"]
    assert [money(v) for v in (0.0, 0.000033, 0.0123, 12.345)] == ["$0", "$0.000033", "$0.0123", "$12.35"]


@pytest.mark.parametrize(("n", "one", "text"), [
    (1, "retry", "1 retry"), (2, "retry", "2 retries"), (0, "error", "0 errors"), (1, "miss", "1 miss"),
    (3, "miss", "3 misses"), (2, "reply", "2 replies"), (1, "request", "1 request"), (2, "day", "2 days"),
])
def test_plurals(n: int, one: str, text: str) -> None:
    assert plural(n, one) == text


def test_percentiles_need_enough_samples() -> None:
    assert MIN_SAMPLES == {"p95": 20, "p99": 100}
    assert spread_stats(0) == spread_stats(3) == spread_stats(19) == ("min", "median", "max")
    assert spread_stats(20) == spread_stats(99) == ("median", "p95", "max")
    assert spread_stats(100) == ("median", "p95", "p99")


@given(st.floats(min_value=0, max_value=1e6, allow_nan=False), st.floats(min_value=0, max_value=1e6,
                                                                           allow_nan=False),
       st.integers(min_value=2, max_value=10))
def test_nice_ticks_cover_the_range_in_round_even_steps(a: float, b: float, most: int) -> None:
    lo, hi = min(a, b), max(a, b)
    # Latencies and rates: nothing finer than a microsecond.
    assume((hi == lo or hi - lo > 1e-3) and (lo == 0 or lo > 1e-3))
    ticks = nice_ticks(lo, hi, most)
    assert 2 <= len(ticks) <= most
    assert ticks[0] <= lo + 1e-9 and ticks[-1] >= hi - 1e-9
    steps = {round(y - x, 9) for x, y in zip(ticks, ticks[1:], strict=False)}
    assert len({round(step / max(steps), 6) for step in steps}) == 1  # evenly spaced
    step = max(steps)
    mantissa = step / 10 ** int(f"{step:e}".split("e")[1])
    assert round(mantissa, 6) in (1.0, 2.0, 5.0)


def test_nice_ticks_over_a_tiny_range_read_plainly() -> None:
    # What the charts drew as six digits over a 0.06 range: now round values with their unit.
    ticks = nice_ticks(0.0, 0.06)
    assert tick_labels(ticks, "ms") == ["0.00 ms", "0.02 ms", "0.04 ms", "0.06 ms"]
    assert tick_labels(nice_ticks(0.0, 48.0), "ms") == ["0 ms", "10 ms", "20 ms", "30 ms", "40 ms", "50 ms"]
    assert tick_labels(nice_ticks(0.0, 13_200.0), "ms") == ["0 s", "5 s", "10 s", "15 s"]
    assert tick_labels(nice_ticks(0.0, 148.0), "tok/s") == ["0", "50", "100", "150"]


@given(st.integers(min_value=1, max_value=1000), st.integers(min_value=2, max_value=12))
def test_request_ticks_are_whole_numbers_from_1_to_n(n: int, most: int) -> None:
    ticks = index_ticks(n, most)
    assert ticks[0] == 1 and ticks[-1] == n
    assert len(ticks) <= most and ticks == sorted(set(ticks))
    assert all(isinstance(t, int) for t in ticks)


def test_two_requests_are_ticked_1_and_2() -> None:
    assert index_ticks(2) == [1, 2] and index_ticks(1) == [1]
    assert not any(re.search(r"\.\d", str(t)) for t in index_ticks(7))


def test_nice_ticks_for_one_small_value_stay_round_and_near_it() -> None:
    # Found by Hypothesis: one sample of 0.0078125 with room for two ticks used to give
    # [-5000000000.0, 0.0], a step grown until rounding made it "fit".
    assert nice_ticks(0.0078125, 0.0078125, 2) == [0.0, 2.0]
    assert nice_ticks(0.0, 0.0, 2) == [0.0, 1.0]
