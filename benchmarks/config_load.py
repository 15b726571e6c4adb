"""How much startup time config loading costs: load_settings against bare tomllib on the same file.

Prints the median time of each over many runs and their ratio (the validation, environment and provider
work on top of parsing). Run: ``python benchmarks/config_load.py [PATH]`` (default: config.example.toml with
its provider examples uncommented, so the provider paths are exercised too).
"""

from __future__ import annotations

import re
import statistics
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

from llmchat.core.config import load_settings, resolve_provider

REPO = Path(__file__).resolve().parent.parent
RUNS = 2000


def _medians_us(fns: list[Callable[[], object]], runs: int = RUNS) -> list[float]:
    # Interleaved, one call of each per round, so load from other processes hits every variant alike and the
    # ratios hold even when the absolute figures drift.
    samples: list[list[int]] = [[] for _ in fns]
    for _ in range(runs):
        for fn, out in zip(fns, samples, strict=True):
            start = time.perf_counter_ns()
            fn()
            out.append(time.perf_counter_ns() - start)
    return [statistics.median(s) / 1000 for s in samples]


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        if len(sys.argv) > 1:
            path = Path(sys.argv[1])
        else:
            text = (REPO / "config.example.toml").read_text(encoding="utf-8")
            path = Path(tmp) / "config.toml"
            path.write_text(re.sub(r"(?m)^# (\[[^\]]+\]|[A-Za-z0-9_]+ = .*)$", r"\1", text), encoding="utf-8")
        _report(path)


def _report(path: Path) -> None:
    env = {"OPENAI_API_KEY": "sk-bench-" + "x" * 32}

    def parse_only() -> object:
        return tomllib.loads(path.read_text(encoding="utf-8"))

    def load() -> object:
        return load_settings(path, env=env)

    def load_and_resolve() -> object:
        return resolve_provider(load_settings(path, env=env), env=env)

    for fn in (parse_only, load, load_and_resolve):  # warm caches and imports before timing
        fn()
    base, loaded, resolved = _medians_us([parse_only, load, load_and_resolve])
    print(f"file: {path.name} ({path.stat().st_size} bytes), {RUNS} interleaved runs each, median")
    print(f"tomllib read+parse (baseline):  {base:8.1f} us")
    print(f"load_settings:                  {loaded:8.1f} us  ({loaded / base:.2f}x baseline)")
    print(f"load_settings+resolve_provider: {resolved:8.1f} us  ({resolved / base:.2f}x baseline)")


if __name__ == "__main__":
    main()
