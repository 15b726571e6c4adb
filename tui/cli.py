"""The `llmchat` command line: one parser, one module per subcommand under ``commands/``.

Each command module exposes ``register(subparsers)``, which adds its parser and sets ``func`` to a
``run(args) -> int``. Options several commands share (``--config``, ``--base-url``, ``--metrics-port``...) are
accepted before or after the command (``commands/_options.py``); bare ``llmchat`` is the chat app and takes
its flags. Errors a user can cause end as one line on stderr with exit status 2 (usage, config) or 1 (API,
network); never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from llmchat.core import __version__
from llmchat.core.errors import LLMChatError
from llmchat.tui.commands import COMMANDS, _options


def build_parser() -> _options.Parser:
    """The whole parser; tests build it to check every subcommand is listed. Parse with ``parse_args``."""
    parser = _options.Parser(
        prog="llmchat",
        description="Chat with OpenAI-compatible LLM APIs and see where every millisecond of a reply went. "
        "With no command, the chat app starts; its options below work here too.",
    )
    parser.add_argument("--version", action="version", version=f"llmchat {__version__}")
    _options.add_top_level(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        module.register(sub)
    parser.commands = dict(sub.choices)
    for name, command in sub.choices.items():
        if name != "locust":  # every option after `llmchat locust` is Locust's (it has a --config of its own)
            _options.add(command, "config")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """``argv`` parsed, each shared option filled from wherever it was given. Raises ``UsageError`` for a
    shared option the command does not take, and ``SystemExit`` (argparse) for the rest."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if getattr(args, "_passes_unknown", False):
        args.passthrough = rest  # `llmchat locust`: Locust's own arguments
    elif rest:
        parser.commands.get(args.command or "", parser).error(f"unrecognized arguments: {' '.join(rest)}")
    return _options.merge(args, args.command)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `llmchat` console script; returns the exit status."""
    for stream in (sys.stdout, sys.stderr):
        # A terminal whose encoding cannot show a character gets "?" rather than a traceback.
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="replace")
    try:
        args = parse_args(argv)
        func = getattr(args, "func", None)
        if func is None:
            from llmchat.tui.commands import chat

            func = chat.run
        return int(func(args))
    except LLMChatError as exc:
        print(f"llmchat: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`llmchat ask ... | head -c 5`): stop quietly, as shell tools do (128 + SIGPIPE).
        # stdout now points nowhere, so the interpreter's last flush cannot fail again on the way out.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
