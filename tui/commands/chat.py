"""`llmchat` with no subcommand: the chat app.

Until the Textual app lands, it starts the local server in the foreground and says how to talk to it, so the
README's first command shows something real on a fresh machine.
"""

from __future__ import annotations

import argparse
import asyncio

from llmchat.core.server import resolve_settings, serve


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("chat", help="the interactive chat (the default when no command is given)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print("llmchat: the chat UI is coming. Meanwhile, here is the local server (offline demo); Ctrl-C stops it.")

    def ready(line: str) -> None:
        print(line, flush=True)
        url = line.split(" on ", 1)[1].split(" ", 1)[0]
        print(f"llmchat: in another terminal, try:  llmchat ask \"hello\" --base-url {url}/v1 --stats", flush=True)

    asyncio.run(serve(resolve_settings({"port": 0, "profile": "chat"}), ready=ready))
    return 0
