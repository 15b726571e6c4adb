"""The fault matrix: every fault and bad input a user can meet, through the installed `llmchat` console script.

Each case runs the real program in a child process against the project's own server (or a scripted peer) on
127.0.0.1 and asserts the same four things: the exit status; that every stderr line is one of llmchat's own
(`llmchat: ...`), the last naming the cause; that no traceback appears anywhere; and what was kept (the
partial reply on stdout, the JSON record, the results file). Cases that already worked are here too, so a
regression in any of them fails this module.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import peers as P
import pytest

from llmchat.core.server import RunningServer

if TYPE_CHECKING:
    from terminal import Terminal, TerminalSession

LLMCHAT = str(Path(sys.executable).parent / "llmchat")
MODEL = "llmchat-local"
BOUND_S = 60.0
#: Fast retries and short timeouts, set as a user would, so failing cases fail in well under a second.
FAST = {
    "LLMCHAT_RETRY__MAX_ATTEMPTS": "3",
    "LLMCHAT_RETRY__BASE_DELAY_S": "0.01",
    "LLMCHAT_RETRY__MAX_DELAY_S": "5",
    "LLMCHAT_HTTP__READ_TIMEOUT_S": "5",
    "LLMCHAT_HTTP__CONNECT_TIMEOUT_S": "3",
}

Factory = Callable[..., RunningServer]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Run:
    code: int
    out: bytes
    err: str

    @property
    def text(self) -> str:
        return self.out.decode("utf-8")


def llmchat(*argv: str, env: dict[str, str] | None = None, stdin: bytes | None = None, cwd: Path | None = None) -> Run:
    done = subprocess.run([LLMCHAT, *argv], input=stdin if stdin is not None else b"", capture_output=True,
                          timeout=BOUND_S, env={**os.environ, **FAST, **(env or {})}, cwd=cwd)
    return Run(done.returncode, done.stdout, done.stderr.decode("utf-8", "replace"))


def clean_failure(run: Run, code: int, cause: str) -> str:
    """The run exited with ``code``, wrote only llmchat's own lines on stderr, the last matching ``cause``."""
    assert "Traceback" not in run.err and "Traceback" not in run.out.decode("utf-8", "replace"), run.err
    lines = run.err.splitlines()
    assert lines, f"nothing on stderr; exit {run.code}"
    assert all(line.startswith("llmchat: ") or line.startswith("llmchat bench") for line in lines
               if line.strip() and not _table_line(line)), run.err
    assert run.code == code, f"exit {run.code}, wanted {code}: {run.err}"
    last = lines[-1]
    assert re.search(cause, last), f"{cause!r} not in the last line: {last!r}"
    return last


def _table_line(line: str) -> bool:
    # batch's summary table: "ok       3", "latency p50  1.2 ms"
    return bool(re.match(r"^[a-z][a-z ()0-9]*\s{2,}\S", line))


# -- ask: the network, the server, the stream ----------------------------------------------------------------
@dataclass
class Case:
    """One ``llmchat ask`` against ``target`` (a server's overrides, a peer's script, or a URL template)."""

    name: str
    code: int
    cause: str
    server: dict[str, Any] | None = None
    peer: list[P.Step] | None = None
    later: list[P.Step] | None = None
    url: str = "{url}"
    args: list[str] = field(default_factory=lambda: ["--model", MODEL])
    kept: str | None = None
    """A regex stdout must match (what arrived and was kept)."""
    env: dict[str, str] = field(default_factory=dict)


def _sse(*parts: bytes) -> list[P.Step]:
    return [P.SSE_HEAD, *parts]


_LIMITED = P.json_response(429, {"error": {"message": "Rate limit reached", "type": "requests"}},
                           headers={"retry-after-ms": "1000"})
_LIMITED_LONG = P.json_response(429, {"error": {"message": "Rate limit reached"}}, headers={"retry-after": "120"})
_ANSWER = _sse(P.event(P.delta("All ")), P.event(P.delta("good.", finish_reason="stop")), P.DONE, P.END)

ASK_CASES = [
    Case("refused", 1, r"connection refused by 127\.0\.0\.1:\d+", url="http://127.0.0.1:{free}/v1"),
    Case("refused during the model lookup", 1, r"connection refused by", url="http://127.0.0.1:{free}/v1", args=[]),
    Case("dns", 1, r"cannot resolve host llmchat-test\.invalid|connecting to .* timed out",
         url="http://llmchat-test.invalid/v1"),
    Case("tls not trusted", 1, r"TLS handshake with .* failed .*http\.verify", server={"tls": True},
         url="{url}"),
    Case("https to a plain server", 1, r"TLS handshake .* check base_url's scheme", server={},
         url="{https}"),
    Case("http to a TLS server", 1, r"closed a new connection without sending a response; if it serves HTTPS",
         server={"tls": True}, url="{http}", args=["--model", MODEL, "--http1"]),
    Case("401", 1, r"HTTP 401.*no key was sent: pass --api-key-env", server={"api_key": "sk-" + "k" * 30}),
    Case("404 model", 1, r"no model 'nope'.*available: llmchat-local", server={}, args=["--model", "nope"]),
    Case("404 base_url without /v1", 1, r"missing its /v1", server={}, url="{root}", args=[]),
    Case("429 under the cap", 0, r"^llmchat: retry 2/3 in 1\.0 s \(429, retry-after-ms\); Ctrl-C stops\n$",
         peer=[_LIMITED], later=_ANSWER, kept=r"^All good\.\n$"),
    Case("429 over the cap", 1, r"429.*120", peer=[_LIMITED_LONG]),
    Case("5xx", 1, r"HTTP 50\d.*the server's fault: try again later.*after 3 attempts", server={"error_rate": 1.0}),
    Case("html 502", 1, r'HTTP 502 with an HTML page \("502 Bad Gateway"\)', peer=[P.NGINX_502]),
    Case("drop mid-stream", 1, r"dropped mid-reply.*tokens? arrived and (is|are) kept",
         server={"drop_rate": 1.0, "profile": "instant"}, args=["--model", MODEL, "--http1"], kept=r"\S"),
    Case("stall", 1, r"stopped sending for 0\.5 s .*http\.read_timeout_s", peer=_sse(P.event(P.delta("Waiting"))),
         env={"LLMCHAT_HTTP__READ_TIMEOUT_S": "0.5"}, kept=r"^Waiting\n$"),
    Case("in-stream error line", 1, r"reported an error mid-stream: context overflow",
         peer=_sse(P.event(P.delta("Part")), P.raw_line('error: {"message": "context overflow"}'), P.END),
         kept=r"^Part\n$"),
    Case("split surrogate escape", 0, r".", server={"split_surrogates": True, "profile": "instant"},
         args=["--model", MODEL, "--max-tokens", "400"], kept=r"Emoji stay whole: 🚀 ⚡ 🎉"),
    Case("raw U+2028 in a delta", 0, r".", peer=_sse(P.event(P.delta("a\u2028b\u2029c\x85d", finish_reason="stop")),
                                                     P.DONE, P.END), kept="^a\u2028b\u2029c\x85d\n$"),
    Case("a lone surrogate", 0, r"1 character that is not valid Unicode .*shown as U\+FFFD",
         peer=[P.SSE_HEAD, P.chunk(b'data: {"choices":[{"index":0,"delta":{"content":"x\\ud83d"}}]}\n\n'),
               P.chunk(b'data: {"choices":[{"index":0,"delta":{"content":"y"},"finish_reason":"stop"}]}\n\n'),
               P.DONE, P.END], kept="^x\ufffdy\n$"),
    Case("refusal", 1, r"the model refused to answer \(finish_reason refusal\); rephrase the prompt",
         server={"refuse": True, "profile": "instant"}, kept=r"^\[refused: I'm sorry, .*\]\n$"),
    Case("temperature nan", 2, r"--temperature: must be a finite number from 0 to 2, got nan", server={},
         args=["--model", MODEL, "--temperature", "nan"]),
    Case("max tokens negative", 2, r"--max-tokens: must be a whole number \(at least 1\), got -5", server={},
         args=["--model", MODEL, "--max-tokens", "-5"]),
]


@pytest.mark.parametrize("case", ASK_CASES, ids=[c.name for c in ASK_CASES])
def test_ask(case: Case, server_factory: Factory, peer: Callable[..., P.Peer]) -> None:
    url = case.url
    if case.server is not None:
        server = server_factory(**case.server)
        root = server.base_url.removesuffix("/v1")
        scheme_swapped = root.replace("https://", "http://") if root.startswith("https") else root.replace(
            "http://", "https://")
        url = url.format(url=server.base_url, root=root, https=scheme_swapped + "/v1", http=scheme_swapped + "/v1")
    elif case.peer is not None:
        url = url.format(url=peer(case.peer, then="keep", later=case.later).base_url)
    else:
        url = url.format(free=free_port())
    run = llmchat("ask", "hello", "--base-url", url, *case.args, env=case.env)
    if case.code == 0:
        assert run.code == 0 and "Traceback" not in run.err, run.err
        assert all(line.startswith("llmchat: ") for line in run.err.splitlines()), run.err
        if case.cause != ".":
            assert re.search(case.cause, run.err), run.err
    else:
        clean_failure(run, case.code, case.cause)
    if case.kept is not None:
        assert re.search(case.kept, run.text, re.S), repr(run.text)


# -- ask: input the user gives -------------------------------------------------------------------------------
def test_stdin_that_is_not_utf8(local_server: RunningServer) -> None:
    noise = bytes(range(128, 256)) * 40  # not one valid UTF-8 sequence
    run = llmchat("ask", "-", "--base-url", local_server.base_url, "--model", MODEL, "--max-tokens", "4",
                  "--json", stdin=b"caf\xe9 " + noise)
    assert run.code == 0, run.err
    assert re.fullmatch(r"llmchat: stdin had \d+ bytes that are not UTF-8; sent as U\+FFFD\n", run.err), run.err
    assert json.loads(run.out)["error"] is None


def test_argv_that_is_not_utf8(local_server: RunningServer) -> None:
    done = subprocess.run([os.fsencode(LLMCHAT), b"ask", b"caf\xe9", b"--base-url", local_server.base_url.encode(),
                           b"--model", MODEL.encode(), b"--max-tokens", b"4"],
                          capture_output=True, timeout=BOUND_S, env={**os.environ, **FAST})
    assert done.returncode == 0, done.stderr
    assert done.stderr.decode() == "llmchat: the prompt had 1 byte that is not UTF-8; sent as U+FFFD\n"


@pytest.mark.parametrize(("text", "cause"), [
    ("[http\nmax_connections = 3\n", r"config\.toml: invalid TOML at line 1"),
    ("[http]\nmax_conections = 3\n", r"unknown key http\.max_conections \(did you mean http\.max_connections\?\)"),
    ("[http]\nmax_connections = \"many\"\n", r"http\.max_connections must be a positive integer"),
    ('[ui]\ntheme = 3\n', r"ui\.theme must be"),
], ids=["broken", "unknown key", "mistyped", "wrong type"])
def test_a_bad_config(tmp_path: Path, text: str, cause: str) -> None:
    config = tmp_path / "config.toml"
    config.write_text(text, encoding="utf-8")
    for argv in (["ask", "hi", "--config", str(config)], ["--config", str(config), "config", "check"]):
        clean_failure(llmchat(*argv), 2, cause)


def test_a_closed_pipe_ends_quietly(server_factory: Factory) -> None:
    server = server_factory(profile="chat")
    process = subprocess.Popen([LLMCHAT, "ask", "hello", "--base-url", server.base_url, "--model", MODEL],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **FAST})
    assert process.stdout is not None and process.stderr is not None
    head = process.stdout.read(5)  # `| head -c 5`
    process.stdout.close()
    code = process.wait(BOUND_S)
    err = process.stderr.read().decode()
    process.stderr.close()
    assert len(head) == 5 and err == "" and code == 141


_KEPT_THEN_HANG = [P.SSE_HEAD, P.event(P.delta("Kept"))]


def test_sigint_during_ask_keeps_what_arrived(peer: Callable[..., P.Peer]) -> None:
    p = peer(_KEPT_THEN_HANG, then="hang")
    process = subprocess.Popen([LLMCHAT, "ask", "hello", "--base-url", p.base_url, "--model", MODEL],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **FAST})
    assert process.stdout is not None
    try:
        assert process.stdout.read(4) == b"Kept"  # on screen: the reply is streaming
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=BOUND_S)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130 and "Traceback" not in err.decode(), err
    assert out == b"\n"  # the partial line is ended; nothing else is printed


def test_sigint_during_ask_json_prints_the_partial_record(peer: Callable[..., P.Peer]) -> None:
    p = peer(_KEPT_THEN_HANG, then="hang")
    process = subprocess.Popen([LLMCHAT, "ask", "hello", "--base-url", p.base_url, "--model", MODEL, "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **FAST})
    try:
        _wait_until(lambda: p.requests == 1, process)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=BOUND_S)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130 and "Traceback" not in err.decode(), (process.returncode, err)
    obj = json.loads(out)
    assert obj["cancelled"] is True and obj["error"] == "cancelled (Ctrl-C)" and obj["error_kind"] == "cancelled"
    assert obj["reply"] in ("", "Kept") and obj["total_ms"] is not None  # whatever had arrived, and its record


def _wait_until(condition: Callable[[], bool], process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline and process.poll() is None:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"condition not met in time (the child exited {process.poll()})")


# -- batch ---------------------------------------------------------------------------------------------------
def _jobs(path: Path, n: int, **extra: Any) -> Path:
    path.write_text("".join(json.dumps({"id": f"j{i}", "prompt": f"job {i}", "max_tokens": 4, **extra}) + "\n"
                            for i in range(n)), encoding="utf-8")
    return path


def _results(path: Path) -> list[dict[str, Any]]:
    data = path.read_bytes().decode("utf-8")
    assert data == "" or data.endswith("\n")
    return [json.loads(line) for line in data.split("\n") if line]


@pytest.mark.parametrize(("output", "cause"), [
    ("/nonexistent-llmchat/dir/o.jsonl", r"the folder /nonexistent-llmchat/dir does not exist"),
    ("{tmp}", r"is a folder; name a file inside it"),
], ids=["missing folder", "a folder"])
def test_batch_an_unusable_output_is_one_line_before_any_request(
    tmp_path: Path, peer: Callable[..., P.Peer], output: str, cause: str
) -> None:
    p = peer([P.json_response(200, P.completion("never"))], then="keep")
    run = llmchat("batch", str(_jobs(tmp_path / "in.jsonl", 2)), "-o", output.format(tmp=tmp_path),
                  "--base-url", p.base_url, "--model", MODEL, "--quiet")
    clean_failure(run, 2, cause)
    assert p.requests == 0


@pytest.mark.parametrize(("name", "cause"), [("missing.jsonl", r"cannot read .*missing\.jsonl \(No such file"),
                                             (".", r"is a folder; name the JSONL file")], ids=["missing", "folder"])
def test_batch_an_unreadable_input_is_one_line(tmp_path: Path, name: str, cause: str) -> None:
    run = llmchat("batch", str(tmp_path / name), "-o", str(tmp_path / "o.jsonl"), "--base-url",
                  "http://127.0.0.1:1/v1", "--quiet")
    clean_failure(run, 2, cause)


def test_batch_resume_keeps_replies_with_line_separators(tmp_path: Path, peer: Callable[..., P.Peer]) -> None:
    # JSON writes U+2028, U+2029 and U+0085 raw: a resume that split lines at them re-ran every such job.
    p = peer([P.json_response(200, P.completion("one\u2028two\u2029three\x85four"))], then="keep")
    jobs, out = _jobs(tmp_path / "in.jsonl", 3), tmp_path / "out.jsonl"
    first = llmchat("batch", str(jobs), "-o", str(out), "--base-url", p.base_url, "--model", MODEL, "--quiet")
    assert first.code == 0, first.err
    again = llmchat("batch", str(jobs), "-o", str(out), "--base-url", p.base_url, "--model", MODEL, "--quiet")
    assert again.code == 0 and re.search(r"skipped \(already done\)\s+3", again.err), again.err
    assert p.requests == 3  # nothing ran twice
    results = _results(out)
    assert sorted(r["id"] for r in results) == ["j0", "j1", "j2"]
    assert {r["reply"] for r in results} == {"one\u2028two\u2029three\x85four"}


def test_batch_two_runs_on_one_output_are_refused(tmp_path: Path, peer: Callable[..., P.Peer]) -> None:
    slow = peer([P.Pause(30.0)], then="hang")
    jobs, out = _jobs(tmp_path / "in.jsonl", 1), tmp_path / "out.jsonl"
    first = subprocess.Popen([LLMCHAT, "batch", str(jobs), "-o", str(out), "--base-url", slow.base_url, "--model",
                              MODEL, "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env={**os.environ, **FAST, "LLMCHAT_HTTP__READ_TIMEOUT_S": "30"})
    try:
        _wait_until(lambda: slow.requests == 1, first)  # the first run holds the file and is mid-request
        second = llmchat("batch", str(jobs), "-o", str(out), "--base-url", slow.base_url, "--model", MODEL, "--quiet")
        clean_failure(second, 2, rf"another llmchat batch \(pid {first.pid}\) is writing out\.jsonl; wait for it")
        assert slow.requests == 1
    finally:
        first.kill()
        first.wait(BOUND_S)


def test_batch_retry_failed_runs_the_failed_lines_again(tmp_path: Path, server_factory: Factory) -> None:
    failing, good = server_factory(error_rate=1.0, profile="instant"), server_factory(profile="instant")
    jobs, out = _jobs(tmp_path / "in.jsonl", 3), tmp_path / "out.jsonl"
    run = llmchat("batch", str(jobs), "-o", str(out), "--base-url", failing.base_url, "--model", MODEL, "--quiet",
                  env={"LLMCHAT_RETRY__MAX_ATTEMPTS": "1"})
    assert run.code == 1 and all(r["error"] for r in _results(out))
    again = llmchat("batch", str(jobs), "-o", str(out), "--base-url", good.base_url, "--model", MODEL, "--quiet")
    assert again.code == 0
    assert "3 jobs failed in an earlier run and were skipped; add --retry-failed to run them again" in again.err
    retried = llmchat("batch", str(jobs), "-o", str(out), "--base-url", good.base_url, "--model", MODEL, "--quiet",
                      "--retry-failed")
    assert retried.code == 0, retried.err
    results = _results(out)
    assert sorted(r["id"] for r in results) == ["j0", "j1", "j2"]  # one line per id: the failed ones replaced
    assert all(r["error"] is None and r["reply"] for r in results)


def test_batch_sigint_then_kill_then_resume_loses_nothing(tmp_path: Path, counted_peer: Any) -> None:
    jobs, out = _jobs(tmp_path / "in.jsonl", 6), tmp_path / "out.jsonl"
    for stop in (signal.SIGINT, signal.SIGKILL):
        process = subprocess.Popen([LLMCHAT, "batch", str(jobs), "-o", str(out), "--base-url", counted_peer.base_url,
                                    "--model", MODEL, "--quiet", "--concurrency", "1"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, **FAST})
        done_before = len(_results(out)) if out.exists() else 0

        def more_done(n: int = done_before) -> bool:
            return out.exists() and len(_results(out)) > n

        _wait_until(more_done, process)
        process.send_signal(stop)
        process.wait(BOUND_S)
        err = process.stderr.read().decode() if process.stderr else ""
        if process.stderr:
            process.stderr.close()
        assert "Traceback" not in err
        if stop == signal.SIGINT:
            assert process.returncode == 130 and "run the same command again to resume" in err, err
    final = llmchat("batch", str(jobs), "-o", str(out), "--base-url", counted_peer.base_url, "--model", MODEL,
                    "--quiet")
    assert final.code == 0, final.err
    results = _results(out)
    assert sorted(r["id"] for r in results) == [f"j{i}" for i in range(6)]  # each once, whole


@pytest.fixture
def counted_peer(peer: Callable[..., P.Peer]) -> P.Peer:
    """A peer whose whole replies take 0.2 s each: slow enough to stop a batch between two of them."""
    return peer([P.Pause(0.2), P.json_response(200, P.completion("done"))], then="keep")


# -- the cache on a full disk --------------------------------------------------------------------------------
def test_cache_clear_works_on_a_full_disk(tmp_path: Path) -> None:
    # A real full disk: a 600 KiB tmpfs in a mount namespace of the child's own (gone when it exits).
    if os.geteuid() != 0 or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs root and mount namespaces (unshare -m) to make a small full filesystem")
    script = f"""
set -u
mount -t tmpfs -o size=600k tmpfs "{tmp_path}" || exit 77
export LLMCHAT_CACHE__PATH="{tmp_path}/cache"
"{sys.executable}" - <<'PY'
import asyncio, os
from llmchat.core import CacheSettings
from llmchat.core.policy._cache import ReplyCache
async def fill():
    cache = ReplyCache(CacheSettings(path=os.environ["LLMCHAT_CACHE__PATH"], policy="always"))
    for i in range(400):
        await cache.put_chat(f"{{i:064x}}", {{"text": "x" * 3000}})
    await cache.aclose()
asyncio.run(fill())
PY
df --output=avail "{tmp_path}" | tail -1
"{LLMCHAT}" cache clear; echo "exit=$?"
df --output=avail "{tmp_path}" | tail -1
"""
    done = subprocess.run(["unshare", "-m", "bash", "-c", script], capture_output=True, text=True, timeout=BOUND_S)
    if done.returncode == 77:
        pytest.skip("tmpfs cannot be mounted here")
    lines = done.stdout.split()
    assert int(lines[0]) == 0, "the filesystem was not full"
    assert re.search(r"removed \d+ entr", done.stdout) and "exit=0" in done.stdout, (done.stdout, done.stderr)
    assert int(lines[-1]) > 400, "clearing freed no space"
    assert "Traceback" not in done.stderr


# -- the chat app, in a real terminal ------------------------------------------------------------------------
def _app_config(server: RunningServer) -> str:
    return f'[providers.local]\nbase_url = "{server.base_url}"\nmodel = "{MODEL}"\nhttp = {{ http2 = "h2c" }}\n'


def _toast(screen: str) -> str:
    """The text of the notices on ``screen`` (right of their ``▌`` edge), rows joined as one: a path that
    wraps reads whole again."""
    return "".join(row.split("▌", 1)[1].strip() for row in screen.splitlines() if "▌" in row)


def _chat_once(t: Terminal, prompt: str, answer: str) -> str:
    t.write(prompt)
    t.wait_for(lambda s: prompt in s, 10.0, what="the prompt in the input")
    t.press("enter")
    return t.wait_for(answer, 20.0, what="the reply on screen")


def test_app_on_a_split_surrogate_stream_shows_the_emoji(terminals: TerminalSession, server_factory: Factory) -> None:
    server = server_factory(split_surrogates=True, profile="instant")
    terminals.write_config(_app_config(server))
    t = terminals.start()
    t.wait_for("Ask anything", 30.0, what="the app ready")
    screen = _chat_once(t, "show me emoji", "Emoji stay whole")
    assert "Traceback" not in screen
    t.wait_for(lambda s: "TTFT" in s, 20.0, what="the reply finished")  # its footer line
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(terminals.history_path.as_uri() + "?mode=ro", uri=True)) as db:
        ((reply, status),) = db.execute("SELECT content, status FROM messages WHERE role = 'assistant'").fetchall()
    assert status == "done" and "🚀 ⚡ 🎉" in reply


@pytest.mark.parametrize("state", ["read-only", "damaged"])
def test_app_on_an_unusable_history_chats_and_says_so(
    terminals: TerminalSession, server_factory: Factory, state: str
) -> None:
    import asyncio

    from history_files import file_state, make_history, overwrite_pages, read_only

    server = server_factory(profile="instant")
    terminals.write_config(_app_config(server))
    db = terminals.history_path
    asyncio.run(make_history(db, conversations=3))
    if state == "damaged":
        overwrite_pages(db)
    before = file_state(db)

    def chat() -> str:
        t = terminals.start()
        t.wait_for("Ask anything", 30.0, what="the app ready")
        said = ("history is read-only",) if state == "read-only" else ("damaged", "with `mv", "history.sqlite3'")
        # The whole notice, read from the toast with its wrapping undone (where a path wraps depends on how
        # long the temporary folder's name is); a loaded machine can draw a frame before the toast is whole.
        notice = t.wait_for(lambda s: all(w in _toast(s) for w in said), 10.0,
                            what="the one line about the history")
        screen = _chat_once(t, "still there?", "You asked")
        assert "Traceback" not in screen
        return notice

    if state == "read-only":
        with read_only(db.parent):
            chat()
    else:
        notice = chat()
        assert "with `mv" in _toast(notice)  # the command that sets the file aside
    assert file_state(db) == before  # nothing was written to the file it could not use


# -- a gateway that retires connections (nginx's GOAWAY after 1,000 requests), under load --------------------
@pytest.mark.parametrize("tls", [False, True], ids=["h2c", "tls-h2"])
def test_bench_through_connections_the_server_retires_loses_nothing(
    server_factory: Factory, tls: bool, tmp_path: Path
) -> None:
    # 600 streams from 20 users through a server that sends GOAWAY every 100 requests, as nginx does every
    # 1,000: several connections retired mid-run, and not one request may fail.
    server = server_factory(profile="instant", max_requests_per_connection=100, tls=tls)
    env = {"LLMCHAT_HTTP__HTTP2": "true" if tls else "h2c", "LLMCHAT_HTTP__MAX_REQUESTS_PER_CONNECTION": "0"}
    if tls:
        env["SSL_CERT_FILE"] = str(server.cert_path)
    out = tmp_path / "run.jsonl"
    run = llmchat("bench", "--base-url", server.base_url, "--model", MODEL, "--users", "20", "--requests", "600",
                  "--max-tokens", "8", "--quiet", "--json", str(out), env=env)
    assert run.code == 0 and "Traceback" not in run.err, run.err
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    requests = [line for line in lines if line["type"] == "request"]
    assert len(requests) == 600 and all(r["error"] is None for r in requests)
    assert {r["http_version"] for r in requests} == {"HTTP/2"}
    assert sum(r["retries"] for r in requests) >= 1  # the server did retire connections under the run


@pytest.mark.parametrize(("argv", "cause"), [
    (["export", "last", "-o", "/nonexistent-llmchat/x.md"], r"cannot write /nonexistent-llmchat/x\.md"),
    (["export", "99999"], r"no conversation 99999 in the history"),
    (["--config", "/tmp", "ask", "hi"], r"config file /tmp is a directory; name the TOML file inside it"),
], ids=["export to a missing folder", "export an unknown id", "config is a folder"])
def test_a_bad_file_argument_is_one_line(argv: list[str], cause: str, tmp_path: Path) -> None:
    import asyncio

    from history_files import make_history

    from llmchat.core.history._file import default_history_path

    asyncio.run(make_history(default_history_path(os.environ), conversations=1))
    clean_failure(llmchat(*argv), 2, cause)
