"""`llmchat serve` as a user runs it: flags, the ready line, clean shutdown on signals, one-line errors."""

from __future__ import annotations

import argparse
import signal
import socket
import ssl
import time
from pathlib import Path

import httpx
import pytest

from llmchat.core.errors import LLMChatError
from llmchat.core.server import start_subprocess
from llmchat.core.server._cli import flag_values
from llmchat.tui.cli import build_parser, main

UNUSED_TLS = (
    ssl.create_default_context()
)  # one TLS context for all clients: httpx builds one per client otherwise


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *argv])


def test_flags_win_over_the_profile() -> None:
    from llmchat.core.server import resolve_settings

    args = parse(
        "--profile",
        "slow",
        "--ttft-ms",
        "5",
        "--model",
        "a",
        "--model",
        "b",
        "--close-after-stream",
        "--port",
        "0",
        "--api-key",
        "k",
        "--max-requests-per-connection",
        "0",
    )
    settings = resolve_settings(flag_values(args))
    assert settings.profile == "slow" and settings.ttft_ms == 5.0 and settings.tokens_per_s == 15.0
    assert settings.models == ["a", "b"] and settings.close_after_stream and settings.port == 0
    assert settings.api_key == "k" and settings.tls is False and settings.max_requests_per_connection == 0
    assert flag_values(parse()) == {}


def test_help_lists_every_profile(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    for name in ("instant", "chat", "slow", "flaky"):
        assert f"  {name} " in out
    assert "--tokens-per-s" in out and "unlimited" in out and "server_timing" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--error-rate", "2"], "server.error_rate must be a probability between 0 and 1, got 2.0"),
        (["--drop-rate", "-0.5"], "server.drop_rate must be a probability between 0 and 1"),
        (["--ttft-ms", "-5"], "server.ttft_ms must be a non-negative number, got -5.0"),
        (["--stall-ms", "inf"], "server.stall_ms must be a non-negative number, got inf"),
        (["--port", "70000"], "server.port must be an integer from 0 to 65535, got 70000"),
        (["--embedding-dim", "0"], "server.embedding_dim must be an integer from 1"),
        (["--max-requests-per-connection", "-1"],
         "server.max_requests_per_connection must be an integer from 0 to 100000000, got -1"),
        (["--keyfile", "k.pem"], "server.keyfile is set but server.certfile is not"),
        (["--certfile", "/nonexistent/c.pem", "--keyfile", "/nonexistent/k.pem"], "does not exist"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--port", "0", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("llmchat: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_a_port_in_use_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"llmchat: cannot listen on 127.0.0.1:{port}") and err.count("\n") == 1


def test_subprocess_prints_the_ready_line_serves_and_stops_on_sigterm() -> None:
    with start_subprocess(["--profile", "instant"]) as server:
        assert server.base_url.startswith("http://127.0.0.1:") and server.base_url.endswith("/v1")
        assert server.cert_path is None
        with httpx.Client(base_url=server.base_url, timeout=10, verify=UNUSED_TLS) as c:
            assert c.post(
                "/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
            ).is_success
            # An idle keep-alive connection must not hold the shutdown up.
            started = time.perf_counter_ns()
            assert server.terminate(timeout=10) == 0
        assert (time.perf_counter_ns() - started) / 1e9 < 5
        assert server.stderr == ""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_mid_stream_finishes_the_stream_and_exits_cleanly(sig: signal.Signals) -> None:
    server = start_subprocess(["--tokens-per-s", "20"])
    try:
        with httpx.Client(base_url=server.base_url, timeout=10, verify=UNUSED_TLS) as c:
            body = {"messages": [{"role": "user", "content": "x"}], "stream": True, "max_tokens": 200}
            with c.stream("POST", "/chat/completions", json=body) as r:
                lines = r.iter_lines()
                next(lines)  # under way: 200 tokens at 20/s would take ten seconds
                started = time.perf_counter_ns()
                server.process.send_signal(sig)
                rest = [line for line in lines if line]
        # Replies in flight are finished at once, unpaced, rather than cut.
        assert rest[-1] == "data: [DONE]" and len(rest) == 200 + 1
        assert (time.perf_counter_ns() - started) / 1e9 < 5
        assert server.process.wait(10) == 0
    finally:
        server.terminate()
    assert server.stderr == ""


def test_tls_subprocess_names_its_certificate_and_removes_it_on_exit() -> None:
    with start_subprocess(["--tls"]) as server:
        assert server.base_url.startswith("https://127.0.0.1:")
        assert server.cert_path is not None and Path(server.cert_path).is_file()
        context = ssl.create_default_context(cafile=server.cert_path)
        with httpx.Client(http2=True, verify=context, timeout=10) as c:
            r = c.get(server.url + "/health")
        assert r.status_code == 200 and r.http_version == "HTTP/2"
        assert server.terminate() == 0
    assert not Path(server.cert_path).exists()


def test_subprocess_that_cannot_start_says_why() -> None:
    with pytest.raises(
        LLMChatError, match=r"exit status 2\): llmchat: server.error_rate must be a probability"
    ):
        start_subprocess(["--error-rate", "5"])
