"""`llmchat config path | check | show`: where the config file is, whether it loads, what it amounts to."""

from __future__ import annotations

import argparse
import os
import sys

from llmchat.core.config import (
    config_path_in_use,
    load_settings,
    mask_secret,
    resolve_provider,
    settings_to_toml,
)
from llmchat.core.errors import UsageError
from llmchat.tui.commands import _options


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `config` parser and its three actions."""
    p = sub.add_parser(
        "config",
        help="show where the config file is, check it, or print the effective settings",
        description="path: print the config file in use; check: load it and report; "
        "show: print the effective settings as TOML, secrets masked.",
    )
    actions = p.add_subparsers(dest="config_action", metavar="ACTION")
    for name, text in (("path", "print the config file in use and whether it exists"),
                       ("check", "load the config file and report the first problem, if any"),
                       ("show", "print the effective settings (file, environment, defaults) as TOML")):
        # `llmchat config check --config F` as well as `llmchat config --config F check`.
        _options.add(actions.add_parser(name, help=text), "config")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run one action; returns 0, or raises ConfigError/UsageError (exit status 2) for a broken setup."""
    action = getattr(args, "config_action", None)
    config = getattr(args, "config", None)
    if action == "path":
        return _path(config)
    if action == "check":
        return _check(config)
    if action == "show":
        return _show(config)
    raise UsageError("config needs an action: path, check or show; try `llmchat config check`")


def _path(config: str | None) -> int:
    path, named_by = config_path_in_use(config, os.environ)
    # The bare path on stdout so `$(llmchat config path)` works; the note for people on stderr.
    print(path)
    origin = f"named by {named_by}" if named_by else "the default location"
    state = (
        "exists" if path.is_file() else "does not exist; defaults apply" if not named_by else "does not exist"
    )
    print(f"({origin}; {state})", file=sys.stderr)
    return 0


def _check(config: str | None) -> int:
    # Textual's theme and key names; no other command needs Textual.
    from llmchat.tui.checks import check_face_settings

    path, _ = config_path_in_use(config, os.environ)
    settings = load_settings(config)
    check_face_settings(settings)
    provider = resolve_provider(settings)
    count = len(settings.providers)
    default = provider.name if provider is not None else "the local server"
    found = "ok" if path.is_file() else "not found, defaults apply"
    print(f"{path.name}: {found} ({count} provider{'' if count == 1 else 's'}, default: {default})")
    return 0


def _show(config: str | None) -> int:
    path, _ = config_path_in_use(config, os.environ)
    settings = load_settings(config)
    state = "" if path.is_file() else " (not found)"
    print(f"# effective settings: defaults < {path}{state} < environment < flags; secrets masked")
    for name in settings.providers:
        # Keys from the environment are not in the settings themselves; say where each one comes from.
        resolved = resolve_provider(settings, name)
        if resolved is not None:
            hint = f" ({mask_secret(resolved.api_key)})" if resolved.api_key else ""
            print(f"# providers.{name}: key from {resolved.api_key_source}{hint}")
    print(settings_to_toml(settings, mask=True), end="")
    return 0
