"""`llmchat` with no subcommand: the chat app. Until the app lands it starts the local server and says so."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("chat", help="the interactive chat (the default when no command is given)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print("llmchat: the chat UI is coming; for now try `llmchat serve` and `llmchat ask`.")
    return 0
