"""`llmchat serve`: run the local OpenAI-compatible server until SIGINT or SIGTERM.

The flags and what they do are the engine's (``llmchat.core.server``'s command line, which
``python -m llmchat.core.server`` also runs); this face adds the shared ``--config`` and ``--metrics-port``.
Nothing heavy is imported until the command runs.
"""

from __future__ import annotations

import argparse

from llmchat.core.server import cli
from llmchat.tui.commands import _options


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve",
        help="run a local OpenAI-compatible server (offline demo, tests, benchmarks)",
        description=cli.DESCRIPTION,
        epilog=cli.EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cli.add_arguments(p)
    _options.add(p, "metrics", help={"--metrics-port": cli.METRICS_HELP})
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return cli.run(args)
