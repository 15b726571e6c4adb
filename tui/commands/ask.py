"""`llmchat ask`: placeholder until its issue lands."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("ask", help="(not built yet)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print("llmchat ask: not built yet")
    return 2
