"""README as tests: every command its code blocks and its command table show runs as written, through the
installed `llmchat` console script, and behaves as README says.

Commands are taken from README itself, so a README edit is tested by the next run. Only what cannot run here
as written is changed, the same way every time (``_as_run``): port 8000 becomes a free port (several tests run
at once), placeholder hosts become the local server, and long runs get shorter (bench's `--requests 100` -> 5
requests of 8 tokens, `--users 10` -> 3, Locust's `-u 50 -r 10 -t 1m` -> 2 users for 2 s). The two install
commands at the top are what `.ci/run` itself runs (tests/test_layout.py pins that) and the chat app
they start is driven in a real terminal by tests/test_journeys.py.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from processes import reap

from llmchat.tui.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
LLMCHAT = str(Path(sys.executable).parent / "llmchat")
BOUND_S = 60.0

#: Every `llmchat` line of README's sh blocks, as README writes it. A new one fails this list until a test
#: below runs it (test_every_readme_command_is_run_by_a_test).
RUN_BELOW = {
    "llmchat serve --profile chat --port 8000 &              # a local server with a hosted-API feel",
    "llmchat serve --profile chat --port 8000 &",
    'llmchat ask "hello" --base-url http://127.0.0.1:8000/v1 --stats',
    'llmchat ask "hello" --base-url http://127.0.0.1:8000/v1 --json',
    "llmchat serve --profile chat --rtt-ms 50 --port 8000 &",
    "llmchat bench --base-url http://127.0.0.1:8000/v1 --compare h2,h1,nopool --users 10 --requests 100",
    "llmchat bench --dataset conversations.json --turns all --prefix-share 0.25 --base-url "
    "http://127.0.0.1:8000/v1 --users 4 --requests 20",
    "llmchat bench --base-url http://127.0.0.1:8000/v1 --users 10 --requests 100 --report bench.html --csv bench.csv",
    "LLMCHAT_HTTP2=h2c llmchat locust --headless -u 50 -r 10 -t 1m --host http://127.0.0.1:8000/v1",
    "llmchat locust --master --host https://api.example/v1     # on the master",
    "llmchat locust --worker --master-host MASTER_IP           # on each worker",
}
#: The install commands (the first two blocks): run by .ci/run itself.
INSTALL = 2


def sh_blocks() -> list[list[str]]:
    return [block.splitlines() for block in re.findall(r"```sh\n(.+?)\n```", README, re.S)]


def readme_command(start: str) -> str:
    """The README sh command that starts with ``start`` (it may be written more than once, the same way)."""
    found = {line.split("#")[0].strip() for block in sh_blocks()[INSTALL:] for line in block if line.startswith(start)}
    assert len(found) == 1, f"README has {len(found)} different commands starting {start!r}: {found}"
    return found.pop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_run(line: str, port: int, *, url: str = "") -> tuple[dict[str, str], list[str]]:
    """README's line as it runs here: (environment additions, argv). See the module docstring."""
    line = line.split("#")[0].strip().removesuffix("&").strip()
    line = line.replace("8000", str(port))
    if url:
        line = line.replace("https://api.example/v1", url)
    line = re.sub(r"--requests \d+", "--requests 5 --max-tokens 8", line)
    line = re.sub(r"--users \d+", "--users 3", line)
    line = line.replace("-u 50 -r 10 -t 1m", "-u 2 -r 2 -t 2s")
    words = shlex.split(line)
    env: dict[str, str] = {}
    while words and "=" in words[0]:
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    assert words[0] == "llmchat", line
    return env, [LLMCHAT, *words[1:]]


class Background:
    """A console-script child (a server, a proxy, Locust) whose stdout lines are read by a thread."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        self.process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, cwd=cwd,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        assert self.process.stdout is not None
        threading.Thread(target=self._pump, args=(self.process.stdout,), daemon=True).start()

    def _pump(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout: float = BOUND_S) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                if self.process.poll() is not None:
                    break
                continue
            self.seen.append(line)
            found = re.search(pattern, line)
            if found:
                return found
        err = self.process.stderr.read() if self.process.poll() is not None and self.process.stderr else ""
        raise AssertionError(f"no line matching {pattern!r} in time; saw {self.seen[-5:]}; stderr: {err[-2000:]}")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                pass
        code = self.process.poll()
        reap(self.process, 10)
        return -9 if code is None else code


def run(argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None,
        stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=BOUND_S, input=stdin,
                          env={**os.environ, **(env or {})}, cwd=cwd)


@pytest.fixture
def served() -> Iterator[tuple[Background, str]]:
    """README's `llmchat serve --profile chat --port 8000 &`, on a free port: (the server, its API root)."""
    port = free_port()
    env, argv = _as_run(readme_command("llmchat serve --profile chat --port"), port)
    server = Background(argv, env)
    try:
        url = server.wait_for(r"listening on (http://\S+)")[1] + "/v1"
        yield server, url
    finally:
        assert server.stop() == 0, "llmchat serve did not shut down cleanly on SIGTERM"


# -- the whole of README -------------------------------------------------------------------------------------
def test_every_readme_command_is_run_by_a_test() -> None:
    found = {line for block in sh_blocks()[INSTALL:] for line in block if "llmchat" in line}
    assert found == RUN_BELOW, "README's commands changed: run the new ones in a test here"


def _rows() -> dict[str, str]:
    rows = {}
    for line in README.splitlines():
        found = re.match(r"\| `(llmchat[^`]*)` \| (.+) \|$", line)
        if found:
            rows[found[1]] = found[2]
    return rows


def _help(command: str) -> str:
    parser = build_parser()
    if not command:
        return parser.format_help()
    return parser.commands[command].format_help()


def test_every_flag_of_the_command_table_is_the_commands() -> None:
    rows = _rows()
    names = {row.split()[1] if len(row.split()) > 1 else "" for row in rows}
    assert names >= {"", "ask", "serve", "proxy", "bench", "locust", "batch", "config", "cache", "export"}
    for row, text in rows.items():
        command = row.split()[1] if len(row.split()) > 1 else ""
        flags = set(re.findall(r"`[^`]*?(--[a-z][a-z0-9-]*)", row + " " + text.split("Every key can be")[0]))
        flags.discard("--help")
        if command == "locust":
            flags = {f for f in flags if f == "--path"}  # every other flag there is Locust's
        if command == "":
            # Its row names `llmchat --continue` and the flags of `llmchat chat`; the top level takes them all.
            pass
        usage = _help(command)
        missing = sorted(f for f in flags if f not in usage)
        assert not missing, f"README's `{row}` row names flags its --help lacks: {missing}"


def test_the_shared_options_paragraph_is_true() -> None:
    text = README[README.index("Options several commands share"):]
    text = text[: text.index("\n\n")]
    takes = {
        "--config": ["", "chat", "ask", "serve", "bench", "proxy", "batch", "config", "cache", "export"],
        "--provider": ["", "chat", "ask", "bench", "batch"],
        "--base-url": ["", "chat", "ask", "bench", "batch"],
        "--model": ["", "chat", "ask", "bench", "batch"],
        "--api-key-env": ["", "chat", "ask", "bench", "batch"],
        "--metrics-port": ["", "chat", "bench", "serve"],
    }
    for flag, commands in takes.items():
        assert flag in text
        for command in commands:
            assert flag in _help(command), (flag, command)


# -- Try it ---------------------------------------------------------------------------------------------------
def test_try_it_ask_with_stats_and_json(served: tuple[Background, str]) -> None:
    server, url = served
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    # Both at once: each takes a few seconds of the chat profile's pace, and they share nothing.
    stats_env, stats_argv = _as_run(readme_command('llmchat ask "hello" --base-url http://127.0.0.1:8000/v1 --stats'),
                                    port)
    json_env, json_argv = _as_run(readme_command('llmchat ask "hello" --base-url http://127.0.0.1:8000/v1 --json'),
                                  port)
    with ThreadPoolExecutor(2) as pool:
        stats_run = pool.submit(run, stats_argv, stats_env)
        json_run = pool.submit(run, json_argv, json_env)
    done = stats_run.result()
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip(), "the reply goes to stdout"
    *_, split, summary = done.stderr.splitlines()
    # README: "one line such as `server 87% · network 12% · client 1% · unexplained 0%`", then the summary.
    assert re.fullmatch(r"llmchat: (\S+ -?\d+% · )+\S+ -?\d+%( \[.*\])?", split), split
    assert re.match(r"llmchat: HTTP/\S+ \(new conn\) \| ttfb [\d.]+ ms \| ttft [\d.]+ ms \| total", summary), summary
    done = json_run.result()
    assert done.returncode == 0, done.stderr
    obj = json.loads(done.stdout)
    assert obj["reply"] and obj["error"] is None and obj["ttft_ms"] > 0
    assert {"parts", "shares", "flags"} <= set(obj["attribution"])


# -- Configuration ----------------------------------------------------------------------------------------------
def test_the_configuration_example_checks(tmp_path: Path) -> None:
    toml = re.search(r"```toml\n(.+?)\n```", README, re.S)
    assert toml is not None
    config = tmp_path / "config.toml"
    config.write_text(toml[1] + "\n", encoding="utf-8")
    done = run([LLMCHAT, "config", "check", "--config", str(config)])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "config.toml: ok (2 providers, default: ollama)"
    shown = run([LLMCHAT, "config", "show", "--config", str(config)], {"OPENAI_API_KEY": "sk-" + "r" * 40})
    assert shown.returncode == 0 and "r" * 40 not in shown.stdout
    assert "# providers.openai: key from env OPENAI_API_KEY (providers.openai.api_key_env)" in shown.stdout


# -- Measured ----------------------------------------------------------------------------------------------------
def test_the_measured_comparison_runs() -> None:
    port = free_port()
    env, argv = _as_run(readme_command("llmchat serve --profile chat --rtt-ms 50"), port)
    server = Background(argv, env)
    try:
        server.wait_for(r"listening on http://")
        env, argv = _as_run(readme_command("llmchat bench --base-url http://127.0.0.1:8000/v1 --compare"), port)
        done = run(argv, env)
        assert done.returncode == 0, done.stderr
        # The before/after table README's tables were made from: the three configurations, side by side.
        for row in ("conn. opened", "conn. setup ms", "TTFT ms", "end-to-end ms", "requests/s"):
            assert row in done.stdout, done.stdout
        assert re.search(r"h2\s.*h1\s.*nopool", done.stdout), done.stdout
    finally:
        server.stop()


# -- Locust --------------------------------------------------------------------------------------------------------
def test_locust_on_one_machine(served: tuple[Background, str], tmp_path: Path) -> None:
    _, url = served
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    env, argv = _as_run(readme_command("LLMCHAT_HTTP2=h2c llmchat locust --headless"), port)
    done = run([*argv, "--only-summary", "--loglevel", "WARNING"], {**env, "LLMCHAT_MAX_TOKENS": "16"}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"LLM\s+e2e\s", done.stdout + done.stderr)


def test_locust_master_and_worker(served: tuple[Background, str], tmp_path: Path) -> None:
    _, url = served
    bind = free_port()
    env, master_argv = _as_run(readme_command("llmchat locust --master"), 0, url=url)
    # Headless, so the master starts the run itself once its worker is there, and stops after 3 s.
    master = Background([*master_argv, "--master-bind-port", str(bind), "--headless", "--expect-workers", "1",
                         "-u", "2", "-r", "2", "-t", "3s", "--only-summary", "--loglevel", "INFO"],
                        {**env, "LLMCHAT_HTTP2": "h2c", "LLMCHAT_MAX_TOKENS": "16"}, cwd=tmp_path)
    env, worker_argv = _as_run(readme_command("llmchat locust --worker"), 0)
    worker_argv = [a.replace("MASTER_IP", "127.0.0.1") for a in worker_argv]
    worker = Background([*worker_argv, "--master-port", str(bind), "--loglevel", "WARNING"],
                        {**env, "LLMCHAT_HTTP2": "h2c", "LLMCHAT_MAX_TOKENS": "16"}, cwd=tmp_path)
    try:
        assert master.process.wait(BOUND_S) == 0
        out = (master.process.stdout.read() if master.process.stdout else "") + "\n".join(master.seen)
        err = master.process.stderr.read() if master.process.stderr else ""
        assert re.search(r"LLM\s+e2e\s", out + err), (out + err)[-3000:]
    finally:
        master.stop()
        worker.stop()


# -- the command table, row by row -----------------------------------------------------------------------------------
def test_proxy_row(served: tuple[Background, str]) -> None:
    _, url = served
    proxy = Background([LLMCHAT, "proxy", "--rtt-ms", "50", "--to", url])
    try:
        via = proxy.wait_for(r"llmchat proxy listening on (http://\S+) -> ")[1]
        done = run([LLMCHAT, "ask", "hi", "--base-url", via, "--max-tokens", "4", "--json"])
        assert done.returncode == 0, done.stderr
        # A new connection through the proxy pays its round trip: connect + TTFB well above a direct one's.
        assert json.loads(done.stdout)["ttfb_ms"] >= 50
    finally:
        assert proxy.stop() == 0


def test_serve_row_tls_and_metrics_port() -> None:
    server = Background([LLMCHAT, "serve", "--tls", "--port", "0", "--metrics-port", "0"])
    try:
        server.wait_for(r"metrics on http://127.0.0.1:\d+/metrics")
        cert = server.wait_for(r"listening on (https://\S+) \(.*\) certificate (\S+)")
        done = run([LLMCHAT, "ask", "hi", "--base-url", cert[1] + "/v1", "--max-tokens", "4", "--json"],
                   {"SSL_CERT_FILE": cert[2]})
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["http_version"] == "HTTP/2"  # h2 by ALPN, as the row says
    finally:
        server.stop()


def test_batch_row(served: tuple[Background, str], tmp_path: Path) -> None:
    _, url = served
    jobs = tmp_path / "IN.jsonl"
    jobs.write_text('{"id": "a", "prompt": "hi", "max_tokens": 4}\n{"id": "b", "prompt": "yo", "max_tokens": 4}\n',
                    encoding="utf-8")
    done = run([LLMCHAT, "batch", str(jobs), "-o", str(tmp_path / "OUT.jsonl"), "--base-url", url])
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in (tmp_path / "OUT.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in results) == ["a", "b"] and all(r["error"] is None for r in results)
    assert "latency p50" in done.stderr  # the summary table at the end
    again = run([LLMCHAT, "batch", str(jobs), "-o", str(tmp_path / "OUT.jsonl"), "--base-url", url])
    assert again.returncode == 0 and re.search(r"skipped \(already done\)\s+2", again.stderr)  # resumable


def test_bench_row_json_and_plot_and_the_reports_command(served: tuple[Background, str], tmp_path: Path) -> None:
    _, url = served
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    env, argv = _as_run(readme_command("llmchat bench --base-url http://127.0.0.1:8000/v1 --users 10 --requests 100 "
                                       "--report"), port)
    # Both at once, as the Try-it pair: each is mostly the chat profile's pace, and they share nothing.
    with ThreadPoolExecutor(2) as pool:
        reports = pool.submit(run, [*argv, "--quiet"], env, tmp_path)
        row = pool.submit(run, [LLMCHAT, "bench", "--base-url", url, "--requests", "4", "--users", "2",
                                "--max-tokens", "8", "--json", str(tmp_path / "b.json"), "--plot",
                                str(tmp_path / "p.svg"), "--quiet"])
    done = reports.result()
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "bench.html").read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") >= 3 and "<script" not in page
    assert "TTFT ms" in page and "where the time went" in page  # the terminal's tables, and the shares
    rows = (tmp_path / "bench.csv").read_text().splitlines()
    assert rows[0].startswith("config,slice,index,request_id,") and len(rows) == 1 + 5  # README's 100 -> 5
    done = row.result()
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in (tmp_path / "b.json").read_text().splitlines()]  # JSON Lines
    assert "TTFT" in done.stdout
    assert [line["type"] for line in lines] == ["bench", *["request"] * 4, "summary"]
    assert (tmp_path / "p.svg").read_text().lstrip().startswith("<")


def test_bench_dataset_example(served: tuple[Background, str], tmp_path: Path) -> None:
    # README's example file, as README shows it, and its command in the folder that holds it.
    _, url = served
    section = README[README.index("### Datasets, multi-turn runs"):]
    (tmp_path / "conversations.json").write_text(re.findall(r"```json\n(.+?)\n```", section, re.S)[0])
    env, argv = _as_run(readme_command("llmchat bench --dataset"), int(url.split(":")[2].split("/")[0]))
    done = run([*argv, "--json", "run.jsonl", "--quiet"], env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "TTFT by turn" in done.stdout and "shared system-prompt prefix: 25%" in done.stdout
    summary = json.loads((tmp_path / "run.jsonl").read_text().splitlines()[-1])
    tokens = summary["configs"][0]["tokens"]
    assert set(tokens["ttft_by_turn"]) == {"1", "2"} and tokens["prompt_tokens"]["counted_by"] == "server"


def test_config_and_cache_rows() -> None:
    commands = [["config", a] for a in ("path", "check", "show")] + [["cache", a] for a in ("stats", "clear", "path")]
    with ThreadPoolExecutor(3) as pool:
        runs = list(pool.map(lambda c: run([LLMCHAT, *c]), commands))
    for command, done in zip(commands, runs, strict=True):
        assert done.returncode == 0 and done.stdout.strip(), (command, done.stderr)


async def test_export_row(tmp_path: Path) -> None:
    from llmchat.core.history._store import HistoryStore

    store = HistoryStore()  # the default path under $XDG_DATA_HOME, as the app writes it
    await store.open()
    try:
        conv = await store.new_conversation(system_prompt="", provider="local", model="m")
        await store.add_user_message(conv, "Is it saved?")
        writer = store.reply_writer(await store.start_reply(conv, provider="local", model="m", mode="stream"))
        writer.append("It is.")
        await writer.finish(status="done", error=None, record={"ttft_ms": 12.5, "total_ms": 40.0})
    finally:
        await store.aclose()
    done = run([LLMCHAT, "export", "last"])
    assert done.returncode == 0, done.stderr
    assert "Is it saved?" in done.stdout and "It is." in done.stdout
    out = tmp_path / "records.json"
    done = run([LLMCHAT, "export", str(conv), "--format", "json", "-o", str(out)])
    assert done.returncode == 0, done.stderr
    assert "12.5" in out.read_text() and oct(out.stat().st_mode & 0o777) == "0o600"


async def test_search_row() -> None:
    from llmchat.core.history._store import HistoryStore

    store = HistoryStore()  # the default path under $XDG_DATA_HOME, as the app writes it
    await store.open()
    try:
        conv = await store.new_conversation(title="kettles", provider="local", model="m")
        await store.add_user_message(conv, "When does the kettle whistle?")
        reply = await store.start_reply(conv, provider="local", model="m", mode="stream")
        writer = store.reply_writer(reply)
        writer.append("At a rolling boil.")
        await writer.finish(status="done")
    finally:
        await store.aclose()
    done = run([LLMCHAT, "search", "rolling", "boi"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"{conv}:{reply}\tkettles\tassistant\tAt a [rolling] [boil]."]
    done = run([LLMCHAT, "search", "kettle", "--json", "--limit", "1"])
    assert done.returncode == 0, done.stderr
    (hit,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert (hit["conversation_id"], hit["role"], hit["title"]) == (conv, "user", "kettles")
    done = run([LLMCHAT, "search", "teapot"])
    assert (done.returncode, done.stdout) == (1, "") and "no message holds" in done.stderr
    done = run([LLMCHAT, "search", "--limit", "0", "kettle"])
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--limit must be at least 1" in done.stderr
