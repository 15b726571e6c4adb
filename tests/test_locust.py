"""The Locust user: a headless Locust run against the local server, and the events one request becomes.

Locust monkey-patches the standard library for gevent when imported, so it only ever runs in a child process
here; ``report`` (the record -> events mapping) lives apart from it and is tested in this process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from llmchat.core import CacheSettings, ChatClient, RetrySettings, ServerError, Settings, TimingRecord
from llmchat.core.load._locust_report import REQUEST_TYPE, report
from llmchat.core.server import RunningServer

LLMCHAT = Path(sys.executable).parent / "llmchat"
MODEL = "llmchat-local"
needs_locust = pytest.mark.skipif(importlib.util.find_spec("locust") is None,
                                  reason="locust is not installed (pip install 'llmchat[locust]')")


@needs_locust
def test_a_headless_locust_run_reports_ttft_ttfb_and_end_to_end(
    local_server: RunningServer, tmp_path: Path
) -> None:
    out = tmp_path / "stats.json"
    # As installed: the console script runs Locust with the locustfile shipped in the package, from a folder
    # that holds no checkout.
    command = [
        str(LLMCHAT), "locust", "--headless", "-u", "4", "-r", "4", "-t", "2s",
        "--host", local_server.base_url, "--json-file", str(tmp_path / "stats"), "--only-summary",
        "--loglevel", "WARNING",
    ]
    env = {**os.environ, "LLMCHAT_HTTP2": "h2c", "LLMCHAT_MAX_TOKENS": "50", "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=90,
                          stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    rows = {row["name"]: row for row in json.loads(out.read_text(encoding="utf-8"))}
    assert set(rows) == {"ttfb", "ttft", "e2e"}
    counts = {name: row["num_requests"] for name, row in rows.items()}
    assert counts["e2e"] > 4 and counts == dict.fromkeys(rows, counts["e2e"])
    for name, row in rows.items():
        assert row["method"] == REQUEST_TYPE and row["num_failures"] == 0, name
        assert row["total_content_length"] == 50 * row["num_requests"]  # output tokens, per request
        assert 0 < row["min_response_time"] <= row["max_response_time"]
    # Averages in the order the phases happen: headers, first token, end.
    mean = {name: row["total_response_time"] / row["num_requests"] for name, row in rows.items()}
    assert mean["ttfb"] <= mean["ttft"] <= mean["e2e"]


# Run in a child process (importing the user patches the standard library for gevent). The loop stands still
# while this greenlet runs, so each check waits on a condition with a deadline, yielding to the hub.
_ENGINE_STOPS = """
import asyncio, sys, gevent
from llmchat.core.load.locust_user import _Engine

def until(condition):
    deadline = gevent.get_hub().loop.now() + 10
    while not condition():
        assert gevent.get_hub().loop.now() < deadline, "timed out"
        gevent.sleep(0.01)

state = {"started": 0, "unwound": 0}

async def request():
    state["started"] += 1
    try:
        await asyncio.sleep(60)
    finally:
        await asyncio.sleep(0)  # unwinding takes loop turns, as closing a connection does
        state["unwound"] += 1

engine = _Engine()
# Killed before the loop got to the request: it never starts.
unstarted = request()
user = gevent.spawn(engine.run, unstarted)
gevent.sleep(0)
user.kill(block=True)
until(lambda: unstarted.cr_frame is None or state["started"])  # closed unstarted, or (wrongly) started
assert state == {"started": 0, "unwound": 0}, state
# Killed mid-request: by the time the kill returns, the request has unwound on the loop.
user = gevent.spawn(engine.run, request())
until(lambda: state["started"] == 1)
user.kill(block=True)
assert state == {"started": 1, "unwound": 1}, state
# Stopped with a request still on the loop: it is cancelled and unwinds before the loop closes.
engine.loop.call_soon_threadsafe(lambda: engine.loop.create_task(request()))
until(lambda: state["started"] == 2)
engine.stop()
assert engine.loop.is_closed() and state == {"started": 2, "unwound": 2}, state
print("ok")
"""


@needs_locust
def test_a_stopped_user_or_engine_leaves_no_request_running_on_the_loop() -> None:
    done = subprocess.run([sys.executable, "-c", _ENGINE_STOPS], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr[-3000:]


class Recorder:
    """Stands in for Locust's ``events.request`` hook: keeps what was fired."""

    def __init__(self) -> None:
        self.fired: list[dict[str, Any]] = []

    def fire(self, **kwargs: Any) -> None:
        self.fired.append(kwargs)


async def test_report_fires_one_event_per_figure_and_a_failure_once(
    local_server: RunningServer, server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    settings = Settings(cache=CacheSettings(path=str(tmp_path / "cache")),
                        retry=RetrySettings(max_attempts=1))
    async with ChatClient(settings, base_url=local_server.base_url, model=MODEL, use_cache=False) as client:
        stream = client.stream([{"role": "user", "content": "hi"}], max_tokens=12)
        async for _ in stream:
            pass
        batch = (await client.complete([{"role": "user", "content": "hi"}], max_tokens=7)).record
    failing = server_factory(profile="instant", error_rate=1.0)
    async with ChatClient(settings, base_url=failing.base_url, model=MODEL, use_cache=False) as client:
        with pytest.raises(ServerError) as caught:
            await client.complete([{"role": "user", "content": "hi"}])
    failed = caught.value.record
    assert isinstance(failed, TimingRecord)

    hook = Recorder()
    report(hook, stream.record, {"user": 1})
    assert [e["name"] for e in hook.fired] == ["ttfb", "ttft", "e2e"]
    r = stream.record
    assert [e["response_time"] for e in hook.fired] == [r.ttfb_ms, r.ttft_ms, r.total_ms]
    assert all(e["response_length"] == 12 and e["exception"] is None for e in hook.fired)
    assert all(e["request_type"] == REQUEST_TYPE for e in hook.fired)
    assert hook.fired[0]["context"] == {"user": 1, "request_id": r.request_id, "http_version": r.http_version,
                                        "connection_reused": r.connection_reused, "retries": 0}

    hook = Recorder()
    report(hook, batch)
    assert [(e["name"], e["response_length"]) for e in hook.fired] == [("ttfb", 7), ("e2e", 7)]

    hook = Recorder()
    report(hook, failed)
    (event,) = hook.fired
    assert event["name"] == "e2e" and event["response_time"] == failed.total_ms
    assert str(event["exception"]) == failed.error and "\n" not in str(event["exception"])


def test_importing_the_engine_never_imports_locust_or_gevent() -> None:
    # Locust's import monkey-patches sockets and threads for the whole process: only a locustfile may do it.
    import llmchat.core
    import llmchat.tui.cli  # noqa: F401

    assert "locust" not in llmchat.core.__all__
    assert not {"locust", "gevent", "llmchat.core.load.locust_user"} & set(sys.modules)


def test_the_locustfile_ships_in_the_package(capsys: pytest.CaptureFixture[str]) -> None:
    from llmchat.tui.cli import main

    assert main(["locust", "--path"]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path.name == "locustfile.py" and path.is_file()
    from llmchat.tui.commands.locust import MODULE

    assert path == Path(importlib.util.find_spec(MODULE).origin)  # type: ignore[arg-type, union-attr]
    assert MODULE.startswith("llmchat.core.")  # in the engine's package, so every install has it
    assert "class ChatUser(LLMChatUser)" in path.read_text(encoding="utf-8")
