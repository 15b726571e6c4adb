"""`llmchat cache stats | clear | path`: look at, empty or locate the reply and embedding cache."""

from __future__ import annotations

import argparse

from llmchat.core import CacheSettings, load_settings
from llmchat.core.policy import ReplyCache
from llmchat.tui.commands import _options


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "cache",
        help="show, clear or locate the reply and embedding cache",
        description="The disk cache of batch-mode replies and embeddings (see [cache] in config.toml).",
    )
    actions = p.add_subparsers(dest="cache_action", metavar="ACTION", required=True)
    for name, text in (("stats", "entries, size on disk against the limit, policy and TTL"),
                       ("clear", "remove every entry and print how many"),
                       ("path", "print the cache folder")):
        _options.add(actions.add_parser(name, help=text), "config")
    p.set_defaults(func=run)


def _load_cache_settings(config: str | None) -> CacheSettings:
    return load_settings(config).cache


def _human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def _human_seconds(s: float) -> str:
    if s <= 0:
        return "none (kept until evicted)"
    for unit, length in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= length and s % length == 0:
            return f"{int(s // length)} {unit}"
    return f"{s:g} s"


def run(args: argparse.Namespace) -> int:
    """Runs one cache action; a cache that cannot be opened ends as one line on stderr, exit status 1."""
    settings = _load_cache_settings(getattr(args, "config", None))
    cache = ReplyCache(settings)
    try:
        if args.cache_action == "path":
            print(cache.path)
        elif args.cache_action == "clear":
            removed = cache.clear()
            print(f"removed {removed} {'entry' if removed == 1 else 'entries'} from {cache.path}")
        else:
            st = cache.stats()
            rows = [
                ("path", str(st.path)),
                ("entries", str(st.entries)),
                ("size", f"{_human_bytes(st.bytes)} of {_human_bytes(st.size_limit)}"),
                ("policy", settings.policy),
                ("ttl", _human_seconds(settings.ttl_s)),
            ]
            width = max(len(name) for name, _ in rows)
            for name, value in rows:
                print(f"{name:<{width}}  {value}")
    finally:
        cache.close()
    return 0
