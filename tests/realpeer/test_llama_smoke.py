"""The everyday path against llama.cpp's own server, straight and behind nginx on each protocol: the installed
``llmchat ask --json`` gets a reply, and the record names the protocol the wire really carried."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from llamacpp import LlamaServer
from nginx_peer import Nginx

LLMCHAT = str(Path(sys.executable).with_name("llmchat"))


def ask(base_url: str, *args: str, env: dict[str, str] | None = None, timeout: float = 60.0) -> dict[str, object]:
    done = subprocess.run(
        [LLMCHAT, "ask", "Say something.", "--base-url", base_url, "--model", "tiny", "--max-tokens", "12",
         "--json", *args],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    record: dict[str, object] = json.loads(done.stdout)
    return record


def test_ask_straight_to_llama_server(llama_server: LlamaServer) -> None:
    record = ask(llama_server.base_url, "--http1")
    assert record["status"] == 200 and record["error"] is None
    assert isinstance(record["reply"], str) and record["reply"]
    assert record["http_version"] == "HTTP/1.1"
    assert record["output_tokens"] == 12, "llama.cpp reports its own count in usage"


@pytest.mark.parametrize(
    ("listener", "http2", "protocol"),
    [("tls_url", "true", "HTTP/2"), ("h2c_url", "h2c", "HTTP/2"), ("h1_url", "false", "HTTP/1.1")],
)
def test_ask_through_nginx(nginx: Nginx, listener: str, http2: str, protocol: str) -> None:
    env = {"LLMCHAT_HTTP__HTTP2": http2, "SSL_CERT_FILE": nginx.ca_file}
    before = len(nginx.access_log_text().splitlines())
    record = ask(getattr(nginx, listener), env=env)
    assert record["status"] == 200 and record["error"] is None and record["reply"]
    assert record["http_version"] == protocol
    lines = nginx.access_log_text().splitlines()[before:]
    wire = "HTTP/2.0" if protocol == "HTTP/2" else "HTTP/1.1"
    assert any(f'{wire} "POST /v1/chat/completions' in line for line in lines), lines
