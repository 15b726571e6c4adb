"""Shortening a row of parts to a width: the footer's keys, a reply's state line.

Each part comes with its forms, from the one wanted to the last resort (a shorter label, then none). When the
preferred forms do not fit, parts are shortened one level at a time, least important first: every part loses
its long form before any loses its short one, so what matters most keeps its words longest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def fit(
    forms: Sequence[Sequence[T]],
    width_of: Callable[[list[T]], int],
    width: int,
    *,
    importance: Sequence[int] | None = None,
) -> list[T]:
    """One form per part, in the parts' order: the first forms if ``width_of`` says they fit in ``width``,
    else the least shortening that does, or every part's last form when nothing fits.

    ``importance`` lists the parts' indexes, most important first (default: their order). A part with a
    single form is never shortened. ValueError for a part without any form.
    """
    if any(not f for f in forms):
        raise ValueError("every part needs at least one form")
    chosen = [f[0] for f in forms]
    if width_of(chosen) <= width:
        return chosen
    order = list(importance) if importance is not None else list(range(len(forms)))
    for level in range(1, max(len(f) for f in forms)):
        for index in reversed(order):
            if len(forms[index]) > level:
                chosen[index] = forms[index][level]
                if width_of(chosen) <= width:
                    return chosen
    return chosen


__all__ = ["fit"]
