"""The command line the way people type it: options before or after the command, bare `llmchat` with the chat
app's flags, `--api-key-env`, and a model lookup that never hides the failure or the cost it had.

Commands run in-process through ``main()`` against the project's own server (and misbehaving peers) on
127.0.0.1; each asserts the exit status, one clear line on stderr and what reached stdout.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path

import peers as P
import pytest

from llmchat.core.server import RunningServer
from llmchat.tui.cli import main, parse_args

MODEL = "llmchat-local"
KEY_ENV = "LLMCHAT_TEST_KEY"
KEY = "sk-test-" + "clicliclicliclicliclicli"

Factory = Callable[..., RunningServer]


@pytest.fixture(autouse=True)
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMCHAT_RETRY__MAX_ATTEMPTS", "2")
    monkeypatch.setenv("LLMCHAT_RETRY__BASE_DELAY_S", "0.01")
    monkeypatch.setenv("LLMCHAT_HTTP__READ_TIMEOUT_S", "5")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmchat: ") and "Traceback" not in err, err
    return lines[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- options where people put them ---------------------------------------------------------------------------
def test_the_chat_apps_flags_work_on_bare_llmchat() -> None:
    args = parse_args(["--base-url", "https://host.example/v1", "--model", "m", "--api-key-env", "K",
                       "--continue", "--metrics-port", "0", "--config", "c.toml"])
    assert args.command is None
    assert (args.base_url, args.model, args.api_key_env, args.continue_last, args.metrics_port, args.config) == (
        "https://host.example/v1", "m", "K", True, 0, "c.toml")
    # The same through `llmchat chat`, options on either side of the command.
    args = parse_args(["--config", "c.toml", "chat", "--base-url", "https://host.example/v1", "--continue"])
    assert (args.command, args.config, args.base_url, args.continue_last, args.model) == (
        "chat", "c.toml", "https://host.example/v1", True, None)


@pytest.mark.parametrize("argv", [
    ["--config", "{c}", "ask", "hi", "--base-url", "{u}"],
    ["ask", "hi", "--base-url", "{u}", "--config", "{c}"],
    ["--base-url", "{u}", "ask", "hi", "--config", "{c}"],
    ["ask", "--config", "{c}", "--base-url", "{u}", "hi"],
], ids=["config-first", "config-last", "url-first", "interleaved"])
def test_options_before_or_after_the_command_mean_the_same(
    capsys: pytest.CaptureFixture[str], local_server: RunningServer, tmp_path: Path, argv: list[str]
) -> None:
    # The config names the model; if it were not read, the model lookup would pick the server's first model.
    config = tmp_path / "c.toml"
    config.write_text("[cache]\npolicy = \"off\"\n[ui]\nstall_s = 2\n", encoding="utf-8")
    argv = [a.format(c=config, u=local_server.base_url) for a in argv]
    status, out, err = run(capsys, *argv, "--model", "llmchat-local-large", "--json", "--max-tokens", "4")
    assert status == 0, err
    assert json.loads(out)["model"] == "llmchat-local-large"


def test_a_broken_config_named_after_the_command_is_read(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[http]\nmax_connections = \"many\"\n", encoding="utf-8")
    for argv in (["ask", "hi", "--config", str(config)], ["config", "check", "--config", str(config)],
                 ["--config", str(config), "config", "check"], ["cache", "path", "--config", str(config)]):
        status, _, err = run(capsys, *argv)
        assert status == 2, argv
        assert "max_connections" in one_line(err)


def test_a_shared_option_the_command_does_not_take_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(capsys, "--metrics-port", "9100", "ask", "hi")
    assert status == 2
    assert one_line(err) == "llmchat: --metrics-port does not apply to `llmchat ask`; see `llmchat ask --help`"
    status, _, err = run(capsys, "--base-url", "http://127.0.0.1:1/v1", "serve")
    assert status == 2 and "--base-url does not apply to `llmchat serve`" in one_line(err)


def test_metrics_port_before_the_command_reaches_bench_and_serve() -> None:
    assert parse_args(["--metrics-port", "0", "bench", "--requests", "1"]).metrics_port == 0
    assert parse_args(["--metrics-port", "0", "serve"]).metrics_port == 0
    assert parse_args(["serve", "--metrics-port", "7"]).metrics_port == 7
    assert parse_args(["serve"]).metrics_port is None


# -- --api-key-env -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["ask", "batch", "bench"])
def test_api_key_env_sends_the_key_with_base_url(
    capsys: pytest.CaptureFixture[str], server_factory: Factory, monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path, command: str,
) -> None:
    server = server_factory(profile="instant", api_key=KEY)
    monkeypatch.setenv(KEY_ENV, KEY)
    jobs = tmp_path / "in.jsonl"
    jobs.write_text('{"id": "1", "prompt": "hi"}\n', encoding="utf-8")
    argv = {
        "ask": ["ask", "hi", "--json"],
        "batch": ["batch", str(jobs), "-o", str(tmp_path / "out.jsonl"), "--quiet"],
        "bench": ["bench", "--requests", "2", "--users", "1", "--quiet"],
    }[command]
    status, out, err = run(capsys, *argv, "--base-url", server.base_url, "--model", MODEL, "--api-key-env", KEY_ENV)
    assert status == 0, err
    assert KEY not in out + err
    if command == "batch":
        assert json.loads((tmp_path / "out.jsonl").read_text().splitlines()[0])["error"] is None


def test_a_401_says_which_flag_would_send_a_key_and_never_the_key(
    capsys: pytest.CaptureFixture[str], server_factory: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = server_factory(profile="instant", api_key=KEY)
    # OPENAI_API_KEY is set but is (by design) not sent to a URL given with --base-url.
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    status, out, err = run(capsys, "ask", "hi", "--base-url", server.base_url, "--model", MODEL)
    assert status == 1 and out == ""
    line = one_line(err)
    assert "HTTP 401" in line and "no key was sent: pass --api-key-env VAR" in line
    # A wrong key in the named variable: the message names the variable, never the key.
    monkeypatch.setenv(KEY_ENV, "sk-wrong-" + "x" * 24)
    status, out, err = run(capsys, "ask", "hi", "--base-url", server.base_url, "--model", MODEL,
                           "--api-key-env", KEY_ENV)
    assert status == 1
    line = one_line(err)
    assert f"the key came from env {KEY_ENV} (--api-key-env)" in line and "x" * 24 not in line and KEY not in line


def test_api_key_env_naming_an_unset_variable_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "ask", "hi", "--base-url", "http://127.0.0.1:1/v1", "--api-key-env", "NOPE_UNSET")
    assert status == 2 and out == ""
    assert "--api-key-env NOPE_UNSET: that environment variable is not set" in one_line(err)


# -- the model lookup never hides a failure --------------------------------------------------------------------
def test_lookup_refused_is_the_refusal(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    status, out, err = run(capsys, "ask", "hi", "--base-url", f"http://127.0.0.1:{port}/v1")
    assert status == 1 and out == ""
    assert f"connection refused by 127.0.0.1:{port}" in one_line(err)


def test_lookup_401_is_the_401(capsys: pytest.CaptureFixture[str], server_factory: Factory) -> None:
    server = server_factory(profile="instant", api_key=KEY)
    status, _, err = run(capsys, "ask", "hi", "--base-url", server.base_url)
    assert status == 1
    line = one_line(err)
    assert "HTTP 401" in line and "--api-key-env" in line and "lists none" not in line


def test_lookup_html_502_is_the_html_page(capsys: pytest.CaptureFixture[str], peer: Callable[..., P.Peer]) -> None:
    p = peer([P.NGINX_502], then="keep")
    status, _, err = run(capsys, "ask", "hi", "--base-url", p.base_url)
    assert status == 1
    line = one_line(err)
    assert "HTTP 502" in line and P.NGINX_502_TITLE in line and "lists none" not in line


def test_lookup_404_says_base_url_lacks_v1_and_asks_once(
    capsys: pytest.CaptureFixture[str], peer: Callable[..., P.Peer]
) -> None:
    not_found = P.json_response(404, {"error": {"message": "not found"}})
    p = peer([not_found], then="keep")
    status, _, err = run(capsys, "ask", "hi", "--base-url", p.base_url)
    assert status == 1
    line = one_line(err)
    assert "HTTP 404" in line and "missing its /v1" in line
    assert p.requests == 1  # the 404 of the listing never asks for the listing again


def test_lookup_lists_none_only_when_the_list_is_empty(
    capsys: pytest.CaptureFixture[str], peer: Callable[..., P.Peer]
) -> None:
    p = peer([P.json_response(200, {"object": "list", "data": []})], then="keep")
    status, _, err = run(capsys, "ask", "hi", "--base-url", p.base_url)
    assert status == 2
    assert "its /models lists none; pass --model" in one_line(err)


def test_the_first_request_counts_the_lookup_and_the_connection_it_opened(
    capsys: pytest.CaptureFixture[str], local_server: RunningServer
) -> None:
    status, out, err = run(capsys, "ask", "hello", "--base-url", local_server.base_url, "--json", "--http1")
    assert status == 0, err
    obj = json.loads(out)
    # One process, one request: it opened its connection (in the lookup), so it never claims a reused one.
    assert obj["connection_reused"] is False and obj["connect_ms"] is not None
    assert obj["model_lookup_ms"] is not None and obj["model_lookup_ms"] > 0
    parts = {p["key"]: p for p in obj["attribution"]["parts"]}
    assert parts["model_lookup"]["group"] == "network+server" and "connect" in parts
    # The lookup is inside the request's total: the parts still sum to it.
    assert abs(sum(p["ms"] for p in parts.values()) - obj["attribution"]["total_ms"]) < 0.01
    assert obj["total_ms"] >= obj["model_lookup_ms"]
    status, _, err = run(capsys, "ask", "hello", "--base-url", local_server.base_url, "--stats", "--http1")
    assert status == 0
    assert "(new conn)" in err.splitlines()[-1]


def test_ask_json_says_when_the_transport_learnt_that_the_host_closes_after_each_response(
    capsys: pytest.CaptureFixture[str], peer: Callable[..., P.Peer]
) -> None:
    # llama-server's habit: it answers the model lookup, then closes the connection without Connection: close.
    # The request after the lookup is where the transport learns it, and its record says so.
    models = P.json_response(200, {"object": "list", "data": [{"id": "peer-model", "object": "model"}]})
    stream = [P.SSE_HEAD, P.event(P.delta("Hello", role="assistant")), P.event(P.delta(finish_reason="stop")),
              P.DONE, P.END]
    p = peer([models], then="close", later=stream)
    status, out, err = run(capsys, "ask", "hello", "--base-url", p.base_url, "--json", "--http1")
    assert status == 0, err
    obj = json.loads(out)
    assert obj["reply"] == "Hello" and obj["model"] == "peer-model"
    assert obj["closes_after_response"] is True

    p = peer([models], then="keep", later=stream)
    status, out, err = run(capsys, "ask", "hello", "--base-url", p.base_url, "--json", "--http1")
    assert status == 0, err
    assert json.loads(out)["closes_after_response"] is False  # a host that keeps its connection: never said
