"""How long the command line takes to start, and what it imports to get there.

Runs each command several times, interleaved, in fresh processes and prints the median wall time, its ratio
against the interpreter's own start (``python -c pass``, measured in the same run, since these machines are
noisy) and, from one ``python -X importtime`` run, the heaviest top-level imports and whether the server
(hypercorn) or the app (Textual) came along. ``llmchat ask --help`` and ``llmchat ask`` need neither.

    python benchmarks/startup.py [--runs 15] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent
COMMANDS: dict[str, list[str]] = {
    "python -c pass (floor)": [sys.executable, "-c", "pass"],
    "import httpx": [sys.executable, "-c", "import httpx"],
    "llmchat --version": [str(BIN / "llmchat"), "--version"],
    "llmchat ask --help": [str(BIN / "llmchat"), "ask", "--help"],
    "llmchat serve --help": [str(BIN / "llmchat"), "serve", "--help"],
}
WATCHED = ("hypercorn", "textual", "llmchat.core.server._start", "llmchat.tui.app", "locust", "prometheus_client")


def wall_ms(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return (time.perf_counter() - start) * 1000


def importtime(argv: list[str]) -> tuple[list[tuple[int, str]], set[str]]:
    """(cumulative us, module) of every top-level import of ``llmchat ask --help``, and the modules seen."""
    code = "import sys; from llmchat.tui.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code, *argv], capture_output=True, text=True)
    rows: list[tuple[int, str]] = []
    seen: set[str] = set()
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = (part.strip() for part in line.removeprefix("import time:").split("|"))
        if not cumulative.isdigit():
            continue
        seen.add(name.strip())
        if not name.startswith(" "):  # a top-level import of the program
            rows.append((int(cumulative), name.strip()))
    return sorted(rows, reverse=True), seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.runs):  # interleaved: noise hits every command alike
        for name, argv in COMMANDS.items():
            times[name].append(wall_ms(argv))
    floor = statistics.median(times["python -c pass (floor)"])
    medians = {name: statistics.median(v) for name, v in times.items()}
    rows, seen = importtime(["ask", "--help"])
    watched = {m: any(s == m or s.startswith(m + ".") for s in seen) for m in WATCHED}
    if args.json:
        print(json.dumps({"median_ms": medians, "floor_ms": floor, "imports_ask_help": watched,
                          "top_imports_us": rows[:12]}, indent=2))
        return 0
    print(f"start-up, median of {args.runs} interleaved runs (ratio to the interpreter's own start)")
    for name, ms in medians.items():
        print(f"  {name:<26} {ms:7.1f} ms  {ms / floor:5.2f}x  (+{ms - floor:.0f} ms)")
    print("\nllmchat ask --help imports:")
    for module, present in watched.items():
        print(f"  {module:<22} {'yes' if present else 'no'}")
    print("\nheaviest top-level imports of llmchat ask --help (cumulative):")
    for us, name in rows[:10]:
        print(f"  {us / 1000:7.1f} ms  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
