"""nginx retires a connection after ``keepalive_requests`` (100 here): over HTTP/2 with a GOAWAY that lets the
streams it accepted finish, over HTTP/1.1 with ``Connection: close``. A bench run that crosses the limit
several times on each protocol loses no reply: every request a server accepted is answered whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from nginx_peer import KEEPALIVE_REQUESTS, Nginx

LLMCHAT = str(Path(sys.executable).with_name("llmchat"))
REQUESTS = 5 * KEEPALIVE_REQUESTS


@pytest.mark.parametrize(
    ("listener", "http2"), [("tls_url", "true"), ("h2c_url", "h2c"), ("h1_url", "false")]
)
def test_no_reply_is_cut_when_nginx_retires_a_connection(
    nginx: Nginx, tmp_path: Path, listener: str, http2: str
) -> None:
    out = tmp_path / "run.jsonl"
    env = {**os.environ, "LLMCHAT_HTTP__HTTP2": http2, "SSL_CERT_FILE": nginx.ca_file}
    done = subprocess.run(
        [LLMCHAT, "bench", "--base-url", getattr(nginx, listener), "--model", "tiny", "--users", "20",
         "--requests", str(REQUESTS), "--max-tokens", "8", "--workers", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=240, env=env, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    summary = next(line for line in lines if line["type"] == "summary")["configs"][0]
    requests = [line for line in lines if line["type"] == "request"]
    assert len(requests) == REQUESTS
    cut = [r["error"] for r in requests if r["error"]]
    assert summary["failed"] == 0 and not cut, cut[:3]
    assert all(r["finish_reason"] == "length" and r["output_tokens"] == 8 for r in requests)
    # The run crossed nginx's limit: every retired connection was replaced by a new one.
    assert summary["connections_opened"] >= REQUESTS // KEEPALIVE_REQUESTS
