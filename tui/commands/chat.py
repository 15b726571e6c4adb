"""`llmchat` (or `llmchat chat`): the interactive chat app.

With no provider configured and no OPENAI_API_KEY / OPENAI_BASE_URL, it starts `llmchat serve` as a
subprocess on a free port, says so with a badge, and stops it on exit.
"""

from __future__ import annotations

import argparse

from llmchat.core import ChatClient, Pools, load_settings
from llmchat.core.history import HistoryStore
from llmchat.core.policy import RateLimits
from llmchat.tui.commands import _options
from llmchat.tui.commands._provider import offline_default


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("chat", help="the interactive chat (the default when no command is given)",
                       description="The interactive chat. `llmchat --continue` reopens the last conversation.")
    _options.add(p, "endpoint", "metrics", "continue")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from llmchat.tui.app import Offline, make_app
    from llmchat.tui.checks import check_face_settings

    settings = load_settings(args.config)
    check_face_settings(settings)  # one line and exit 2 now, before a server starts or the screen opens
    if args.metrics_port is not None:
        from llmchat.core.observe import load_prometheus_client

        load_prometheus_client()  # a missing extra is one line now, not a crash inside the running app
    with offline_default(settings, args.provider, args.base_url, quiet=True) as (base_url, http2, model):
        offline = Offline(base_url) if base_url and not args.base_url else None
        # One set of pools for the session, which the app closes: every client it opens shares them.
        pools = Pools()
        client = ChatClient(settings, provider=args.provider or ("local" if offline else None), base_url=base_url,
                            model=args.model or model, http2=http2, api_key_env=args.api_key_env, pools=pools,
                            limits=RateLimits.from_settings(settings.providers))
        # Named on the command line: a conversation resumed at start goes on with these, not its own.
        pinned = bool(args.provider or args.model or args.base_url)
        app = make_app(settings=settings, client=client, store=HistoryStore(),
                       continue_last=args.continue_last, offline=offline, metrics_port=args.metrics_port,
                       freeze_gc=True, pinned=pinned, pools=pools)
        app.run()
    return 0
