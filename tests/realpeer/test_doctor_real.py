"""`llmchat doctor` straight against llama.cpp's llama-server (issue 21): llama-server answers the h2c
preface with HTTP/1.1 400 and closes its connection after every stream. The installed ``llmchat doctor
--yes --json`` must finish well inside its 120 s budget, say there is no h2c, name the close after every
stream, and give no advice its own figures or the other advice contradict."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.realpeer

LLMCHAT = str(Path(sys.executable).with_name("llmchat"))
#: Generous against the h2c probe's own 3 s bound and a tiny model's replies; main took its whole 120 s.
DEADLINE_S = 90.0


def test_doctor_against_llama_server(llama_server: Any) -> None:
    done = subprocess.run(
        [LLMCHAT, "doctor", "--base-url", llama_server.base_url, "--yes", "--json"],
        capture_output=True, text=True, timeout=DEADLINE_S, check=False,
    )
    assert done.returncode in (0, 1), done.stderr  # 1: it found something, as it should here
    assert "Traceback" not in done.stderr
    data = json.loads(done.stdout)
    assert data["elapsed_s"] < 60, data["elapsed_s"]
    path = data["measurements"]["path"]
    assert path.get("h2c") is False, path
    findings = {f["check"]: f for f in data["findings"]}
    keepalive = findings["connection.keepalive"]
    assert keepalive["mark"] in ("warn", "fail") and "after every stream" in keepalive["title"], keepalive
    assert findings["connection.http2"]["title"] == "the server offers no HTTP/2"
    assert data["contradictions"] == []  # the doctor's own check of its advice against its figures
    assert not any("http2" in keys for keys in data["changes"].values())  # nothing to speak HTTP/2 with
    http = data["changes"].get("http", {})
    if http.get("max_requests_per_connection") == 1:
        assert "keepalive_ping_s" not in http and "warmup" not in http
    assert http.get("warmup") is not True  # the default already
    marks = [f["mark"] for f in data["findings"] if f["check"] == "connection.keepalive"]
    assert len(marks) == 1  # one behaviour, one verdict
