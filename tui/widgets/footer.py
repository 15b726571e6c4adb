"""The footer: Textual's, with its labels shortened before a key is cut off.

Textual's footer is a row that scrolls: on a narrow terminal the keys past its right edge are simply not seen.
This one measures the row for the width it has. When the labels do not fit it turns compact (less space
around each key), then shortens the labels (each binding's short label from the registry), then drops them,
least important key first; the help key keeps its label longest, since it lists everything the others do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rich.cells import cell_len
from textual import events
from textual.app import ComposeResult
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

from llmchat.tui.fit import fit
from llmchat.tui.keys import BY_ID


@dataclass(frozen=True, slots=True)
class _Key:
    display: str
    forms: tuple[str, ...]
    """The label, the short label, none."""
    palette: bool


def _width(keys: list[_Key], labels: list[str], *, compact: bool) -> int:
    """Cells the row takes, by Textual's FooterKey padding and margins (see its DEFAULT_CSS; a test checks the
    keys' regions against the screen's width)."""
    total = 0
    for key, label in zip(keys, labels, strict=True):
        total += cell_len(key.display) + (cell_len(label) + 1 if label else 0)
        if key.palette:
            total += 1 if compact else 2  # its border, and its padding outside compact mode
        else:
            # Compact: a margin after each key. Otherwise a key with a label is padded by one cell each side.
            total += 1 if compact else (2 if label else 0)
    return total


class KeyFooter(Footer):
    """A footer that keeps every key visible: compact, then short labels, then keys alone.

    ``first`` is the binding id whose label goes last (the help key). ``labels`` maps binding ids to the
    label forms wanted, overriding the registry's ``label`` and ``short``.
    """

    def __init__(self, *, first: str = "help.open", labels: Mapping[str, tuple[str, ...]] | None = None,
                 id: str | None = None) -> None:
        super().__init__(id=id)
        self.first = first
        self.labels = dict(labels or {})
        self.shown: list[tuple[str, str]] = []
        """(key as shown, label) of each key, as last composed: for tests."""
        self._width = 0

    def _forms(self, binding_id: str | None, label: str) -> tuple[str, ...]:
        if binding_id in self.labels:
            return self.labels[binding_id]
        entry = BY_ID.get(binding_id or "")
        short = entry.short if entry is not None and entry.short else label
        return (label, short, "")

    def compose(self) -> ComposeResult:
        widgets = list(super().compose())
        found = [w for w in widgets if isinstance(w, FooterKey)]
        active = self.screen.active_bindings if found else {}
        keys: list[_Key] = []
        first: int | None = None
        for index, widget in enumerate(found):
            bound = active.get(widget.key)
            binding_id = bound.binding.id if bound is not None else None
            if binding_id == self.first:
                first = index
            palette = widget.has_class("-command-palette")
            forms = (widget.description,) if palette else self._forms(binding_id, widget.description)
            keys.append(_Key(widget.key_display, forms, palette))
        self._width = width = self.size.width or self.app.size.width
        labels = [k.forms[0] for k in keys]
        compact = _width(keys, labels, compact=False) > width
        if compact:
            # The palette key and the help key last: they say where everything else is.
            order = [i for i, k in enumerate(keys) if k.palette or i == first]
            order += [i for i in range(len(keys)) if i not in order]
            labels = fit([k.forms for k in keys], lambda chosen: _width(keys, chosen, compact=True), width,
                         importance=order)
        self.set_reactive(Footer.compact, compact)
        self.set_class(compact, "-compact")
        for widget, label in zip(found, labels, strict=True):
            widget.description = label
        self.shown = [(k.display, label) for k, label in zip(keys, labels, strict=True)]
        yield from widgets

    def on_resize(self, event: events.Resize) -> None:
        if event.size.width != self._width:
            self.refresh(recompose=True)


__all__ = ["KeyFooter"]
