"""The `llmchat` command line: one parser, one module per subcommand under ``commands/``.

Each command module exposes ``register(subparsers)``, which adds its parser and sets ``func`` to a
``run(args) -> int``. Errors a user can cause end as one line on stderr with exit status 2 (usage, config) or
1 (API, network); never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from llmchat.core import __version__
from llmchat.core._errors import LLMChatError
from llmchat.tui.commands import COMMANDS


def build_parser() -> argparse.ArgumentParser:
    """The whole parser; tests build it to check every subcommand is listed."""
    parser = argparse.ArgumentParser(
        prog="llmchat",
        description="Chat with OpenAI-compatible LLM APIs and see where every millisecond of a reply went.",
    )
    parser.add_argument("--version", action="version", version=f"llmchat {__version__}")
    parser.add_argument("--config", metavar="PATH", help="the config file (default: $LLMCHAT_CONFIG or "
                        "$XDG_CONFIG_HOME/llmchat/config.toml)")
    parser.add_argument("--continue", dest="continue_last", action="store_true",
                        help="reopen the last conversation in the chat app")
    parser.add_argument("--metrics-port", dest="app_metrics_port", type=int, metavar="PORT",
                        help="the chat app serves Prometheus metrics on 127.0.0.1:PORT")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `llmchat` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        from llmchat.tui.commands import chat

        func = chat.run
        for name in ("provider", "model", "base_url", "app_metrics_port"):
            setattr(args, name, getattr(args, name, None))
    try:
        return int(func(args))
    except LLMChatError as exc:
        print(f"llmchat: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
