"""The settings only the faces can check: the theme against Textual's themes, the keymap against the key
binding registry. ``llmchat config check`` runs these, and ``llmchat`` runs them before its screen opens, so a
typo is one line naming the closest valid value (exit status 2), as the config's own checks say it."""

from __future__ import annotations

import difflib

from textual.theme import BUILTIN_THEMES

from llmchat.core import ConfigError, Settings
from llmchat.tui.keys import check_keymap


def check_theme(name: str) -> None:
    """Raise ConfigError (one line, exit status 2) unless ``name`` is one of Textual's themes, with the
    closest one, or the list when none is close."""
    if name in BUILTIN_THEMES:
        return
    close = difflib.get_close_matches(name, list(BUILTIN_THEMES), n=1)
    hint = f'did you mean "{close[0]}"?' if close else "the themes: " + ", ".join(sorted(BUILTIN_THEMES))
    raise ConfigError(f'ui.theme: "{name}" is not a Textual theme ({hint})')


def check_face_settings(settings: Settings) -> None:
    """Every check of this module on ``settings``; raises the first ConfigError."""
    if settings.ui.theme:
        check_theme(settings.ui.theme)
    check_keymap(settings.keymap)


__all__ = ["check_face_settings", "check_theme"]
