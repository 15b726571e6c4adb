"""Subcommands of `llmchat`, one module each. The order here is the order `llmchat --help` lists them."""

from __future__ import annotations

from llmchat.tui.commands import (
    ask,
    batch,
    bench,
    cache,
    chat,
    config,
    doctor,
    export,
    locust,
    proxy,
    search,
    serve,
)

COMMANDS = [chat, ask, serve, bench, proxy, locust, batch, doctor, config, cache, export, search]
