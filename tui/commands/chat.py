"""`llmchat` (or `llmchat chat`): the interactive chat app.

With no provider configured and no OPENAI_API_KEY / OPENAI_BASE_URL, it starts `llmchat serve` as a
subprocess on a free port, says so with a badge, and stops it on exit.
"""

from __future__ import annotations

import argparse

from llmchat.core import ChatClient, load_settings
from llmchat.core._history import HistoryStore
from llmchat.tui.commands._provider import offline_default


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("chat", help="the interactive chat (the default when no command is given)",
                       description="The interactive chat. `llmchat --continue` reopens the last conversation.")
    p.add_argument("--provider", help="a provider name from the config")
    p.add_argument("--model", help="the model (default: the provider's)")
    p.add_argument("--base-url", help="an OpenAI-compatible API root to use instead of a configured provider")
    p.add_argument("--metrics-port", dest="app_metrics_port", type=int, metavar="PORT",
                   help="serve Prometheus metrics on 127.0.0.1:PORT (0 takes a free port)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from llmchat.tui.app import Offline, make_app
    from llmchat.tui.keys import check_keymap

    settings = load_settings(args.config)
    check_keymap(settings.keymap)  # one line and exit 2 now, before a server starts or the screen opens
    if getattr(args, "app_metrics_port", None) is not None:
        from llmchat.core._prometheus import load_prometheus_client

        load_prometheus_client()  # a missing extra is one line now, not a crash inside the running app
    with offline_default(settings, args.provider, args.base_url, quiet=True) as (base_url, http2, model):
        offline = Offline(base_url) if base_url and not args.base_url else None
        client = ChatClient(settings, provider=args.provider or ("local" if offline else None), base_url=base_url,
                            model=args.model or model, http2=http2)
        app = make_app(settings=settings, client=client, store=HistoryStore(),
                       continue_last=bool(getattr(args, "continue_last", False)), offline=offline,
                       metrics_port=getattr(args, "app_metrics_port", None))
        app.run()
    return 0
