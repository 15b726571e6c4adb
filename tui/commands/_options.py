"""Options that more than one command takes, accepted before or after the command's name.

People type ``llmchat --config F ask hi`` and ``llmchat ask hi --config F`` and mean the same thing, and
README documents the chat app's flags on bare ``llmchat`` (``llmchat --base-url URL --model M``). So each
shared option is added twice: to the top-level parser under ``top_<dest>``, and to every command that takes it
with ``default=SUPPRESS`` (a subparser's defaults would otherwise overwrite what was given before the command).
``merge`` then fills each command's value from the top level where it was not given after the command, and
refuses a top-level option the command does not take, in one line.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from llmchat.core.errors import UsageError

SUPPRESS = argparse.SUPPRESS


class Parser(argparse.ArgumentParser):
    """argparse's parser with its usage errors on one line (what, then where to look), exit status 2."""

    commands: dict[str, argparse.ArgumentParser] = {}
    """The top-level parser's command parsers, by name (so an error can name the command's --help)."""

    def error(self, message: str) -> NoReturn:
        where = self.prog.removeprefix("llmchat").strip()
        print(f"llmchat: {where + ': ' if where else ''}{message}; see `{self.prog} --help`", file=sys.stderr)
        raise SystemExit(2)


def number(low: float | None = None, high: float | None = None, *, integer: bool = False) -> Callable[[str], float]:
    """An argparse ``type`` for a finite number in [low, high]: `--temperature nan` or `--max-tokens -5` is a
    usage error where it is typed, never a request the server has to refuse (NaN is not even JSON)."""
    if low is not None and high is not None:
        bounds = f" from {low:g} to {high:g}"
    elif low is not None:
        bounds = " (at least 1)" if integer and low == 1 else f" of at least {low:g}"
    else:
        bounds = ""
    wanted = f"{'a whole number' if integer else 'a finite number'}{bounds}"

    def parse(text: str) -> float:
        try:
            value: float = int(text) if integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}") from None
        if not math.isfinite(value) or (low is not None and value < low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text}")
        return value

    parse.__name__ = "integer" if integer else "number"  # what argparse names in its own messages
    return parse


PORT = number(0, 65535, integer=True)



@dataclass(frozen=True, slots=True)
class _Option:
    flag: str
    dest: str
    group: str
    kwargs: dict[str, object]


_ENDPOINT_HELP = {
    "--provider": "a provider name from the config",
    "--base-url": "an OpenAI-compatible API root to use instead of a configured provider "
    "(e.g. http://127.0.0.1:8000/v1)",
    "--model": "the model (default: the provider's, else the first the server lists)",
    "--api-key-env": "send the API key held in this environment variable (the key stays out of argv and "
    "shell history)",
}

OPTIONS: tuple[_Option, ...] = (
    _Option("--config", "config", "config", {"metavar": "PATH", "help": "the config file (default: "
            "$LLMCHAT_CONFIG or $XDG_CONFIG_HOME/llmchat/config.toml)"}),
    _Option("--provider", "provider", "endpoint", {"metavar": "NAME", "help": _ENDPOINT_HELP["--provider"]}),
    _Option("--base-url", "base_url", "endpoint", {"metavar": "URL", "help": _ENDPOINT_HELP["--base-url"]}),
    _Option("--model", "model", "endpoint", {"metavar": "MODEL", "help": _ENDPOINT_HELP["--model"]}),
    _Option("--api-key-env", "api_key_env", "endpoint", {"metavar": "VAR", "help": _ENDPOINT_HELP["--api-key-env"]}),
    _Option("--metrics-port", "metrics_port", "metrics", {"type": PORT, "metavar": "PORT", "help": "serve "
            "Prometheus metrics on http://127.0.0.1:PORT/metrics; 0 takes a free port (needs the metrics extra)"}),
    _Option("--continue", "continue_last", "continue", {"action": "store_true", "help": "reopen the last "
            "conversation in the chat app"}),
)
"""Every shared option; ``group`` is what a command declares it takes."""

#: What the chat app takes; bare ``llmchat`` (no command) is the chat app.
CHAT_GROUPS = ("config", "endpoint", "metrics", "continue")


def add_top_level(parser: argparse.ArgumentParser) -> None:
    """Every shared option on the top-level parser, stored as ``top_<dest>``."""
    for opt in OPTIONS:
        kwargs = dict(opt.kwargs)
        if kwargs.get("action") != "store_true":
            kwargs["default"] = None
        parser.add_argument(opt.flag, dest=f"top_{opt.dest}", **kwargs)  # type: ignore[arg-type]


def add(parser: argparse.ArgumentParser, *groups: str, help: dict[str, str] | None = None) -> None:
    """Add the options of ``groups`` to a command's parser; ``help`` overrides the help text per flag.

    The command then reads them as ``args.<dest>`` (after ``merge``). ``config`` is added to every command by
    ``register_all``; name it here only for a nested parser (``llmchat config check --config F``).
    """
    for opt in OPTIONS:
        if opt.group not in groups:
            continue
        kwargs = dict(opt.kwargs)
        kwargs["default"] = SUPPRESS
        if help and opt.flag in help:
            kwargs["help"] = help[opt.flag]
        parser.add_argument(opt.flag, dest=opt.dest, **kwargs)  # type: ignore[arg-type]
    parser.set_defaults(**{f"_takes_{g}": True for g in groups})


def merge(args: argparse.Namespace, command: str | None) -> argparse.Namespace:
    """Fill each shared option's ``args.<dest>`` from after the command, else from before it, else its
    default; a top-level option the command does not take is a UsageError naming both."""
    for opt in OPTIONS:
        top = getattr(args, f"top_{opt.dest}", None)
        takes = command is None and opt.group in CHAT_GROUPS or getattr(args, f"_takes_{opt.group}", False)
        if not takes:
            if _given(top):
                raise UsageError(
                    f"{opt.flag} does not apply to `llmchat {command}`; see `llmchat {command} --help`"
                )
            continue
        if not _given(getattr(args, opt.dest, None)):
            default: object = False if opt.kwargs.get("action") == "store_true" else None
            setattr(args, opt.dest, top if _given(top) else default)
    return args


def _given(value: object) -> bool:
    # Not `value not in (None, False)`: 0 == False, and `--metrics-port 0` is a port.
    return value is not None and value is not False

