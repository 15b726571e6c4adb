"""The settings the config layer cannot check alone: the theme against Textual's themes, the keymap against
the key binding registry, the local server's profile against its profiles (the server sits above config).
``llmchat config check`` runs these, and ``llmchat`` runs them before its screen opens, so a typo is one line
naming the closest valid value (exit status 2), as the config's own checks say it."""

from __future__ import annotations

import difflib
from collections.abc import Collection

from textual.theme import BUILTIN_THEMES

from llmchat.core import ConfigError, Settings
from llmchat.core.server import PROFILES
from llmchat.tui.keys import check_keymap


def _check_choice(key: str, value: str, choices: Collection[str], what: str) -> None:
    """Raise ConfigError unless ``value`` is one of ``choices``: the closest one, or the list when none is
    close."""
    if value in choices:
        return
    close = difflib.get_close_matches(value, list(choices), n=1)
    hint = f'did you mean "{close[0]}"?' if close else f"the {what}s: " + ", ".join(sorted(choices))
    raise ConfigError(f'{key}: "{value}" is not a {what} ({hint})')


def check_theme(name: str) -> None:
    """Raise ConfigError (one line, exit status 2) unless ``name`` is one of Textual's themes, with the
    closest one, or the list when none is close."""
    _check_choice("ui.theme", name, BUILTIN_THEMES, "Textual theme")


def check_face_settings(settings: Settings) -> None:
    """Every check of this module on ``settings``; raises the first ConfigError."""
    if settings.ui.theme:
        check_theme(settings.ui.theme)
    if settings.server.profile:
        _check_choice("server.profile", settings.server.profile, PROFILES, "server profile")
    check_keymap(settings.keymap)


__all__ = ["check_face_settings", "check_theme"]
