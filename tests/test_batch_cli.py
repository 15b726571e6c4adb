"""`llmchat batch` end to end: the real CLI (in process, and as a child for Ctrl-C) against the local server,
with temp config, cache and output files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from llmchat.core.server import RunningServer
from llmchat.tui.cli import main

Factory = Callable[..., RunningServer]
BOUND_S = 15.0


def write_jobs(path: Path, jobs: list[Any]) -> Path:
    lines = [(j if isinstance(j, str) else json.dumps(j)) + "\n" for j in jobs]
    path.write_text("".join(lines), encoding="utf-8")
    return path


def read_results(path: Path) -> list[dict[str, Any]]:
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), "the results file ends in a half-written line"
    return [json.loads(line) for line in data.decode("utf-8").splitlines()]


def by_id(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    ids = [r["id"] for r in results]
    assert len(ids) == len(set(ids)), f"an id appears twice: {sorted(ids)}"
    return {r["id"]: r for r in results}


def summary_of(stderr: str) -> dict[str, str]:
    rows = {}
    for line in stderr.splitlines():
        name, sep, value = line.partition("  ")
        if sep and not line.startswith("llmchat:"):
            rows[name.strip()] = value.strip()
    return rows


def batch(inp: Path, out: Path, server: RunningServer, *extra: str) -> int:
    return main(["batch", str(inp), "-o", str(out), "--base-url", server.base_url, "--quiet", *extra])


def test_every_job_gets_one_line_with_its_record_and_bad_lines_are_named(
    local_server: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inp = write_jobs(tmp_path / "jobs.jsonl", [
        {"id": "a", "prompt": "Say hello.", "max_tokens": 8},
        {"id": "b", "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 8},
        "this is not json",
        {"id": "c", "prompt": "With a system prompt.", "system": "Be brief.", "max_tokens": 8},
        {"id": "d", "max_tokens": 8},
        "",
        ["a", "list"],
        {"id": "a", "prompt": "the same id again"},
        {"id": 7, "prompt": "A numeric id.", "max_tokens": 4},
    ])
    out = tmp_path / "out.jsonl"
    assert batch(inp, out, local_server) == 0
    err = capsys.readouterr().err
    assert "jobs.jsonl:3: not JSON" in err
    assert "jobs.jsonl:5: no messages" in err
    assert "jobs.jsonl:7: not a JSON object" in err
    assert "jobs.jsonl:8: duplicate id 'a'" in err
    assert "Traceback" not in err
    results = by_id(read_results(out))
    assert sorted(results) == ["7", "a", "b", "c"]
    for line in results.values():
        assert isinstance(line["reply"], str) and line["reply"] and line["error"] is None
        record = line["record"]
        assert record["mode"] == "batch" and record["status"] == 200 and record["attempts"] == 1
        assert record["total_ms"] > 0 and record["cache_hit"] is False and record["error"] is None
        assert line["usage"]["completion_tokens"] == record["output_tokens"]
    assert results["7"]["usage"]["completion_tokens"] <= 4
    rows = summary_of(err)
    assert (rows["ok"], rows["failed"], rows["bad input lines"], rows["cache hits"]) == ("4", "0", "4", "0")
    assert rows["latency p50"].endswith(" ms") and rows["latency p99"].endswith(" ms")
    assert os.stat(out).st_mode & 0o077 == 0  # replies can be private: the file is the user's alone


def test_a_failed_job_is_written_with_its_error_and_the_run_goes_on(
    local_server: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inp = write_jobs(tmp_path / "jobs.jsonl", [
        {"id": "good-1", "prompt": "one", "max_tokens": 4},
        {"id": "bad", "prompt": "two", "model": "nope", "max_tokens": 4},
        {"id": "good-2", "prompt": "three", "max_tokens": 4},
    ])
    out = tmp_path / "out.jsonl"
    assert batch(inp, out, local_server) == 1
    results = by_id(read_results(out))
    assert sorted(results) == ["bad", "good-1", "good-2"]
    bad = results["bad"]
    assert bad["reply"] is None and "has no model 'nope'" in bad["error"] and "\n" not in bad["error"]
    assert bad["record"]["error_kind"] == "http_404" and bad["record"]["status"] == 404
    assert results["good-1"]["error"] is None and results["good-2"]["error"] is None
    rows = summary_of(capsys.readouterr().err)
    assert (rows["ok"], rows["failed"]) == ("2", "1")


def test_resume_runs_only_the_missing_ids_and_drops_a_half_written_line(
    local_server: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = [f"job-{i}" for i in range(6)]
    inp = write_jobs(tmp_path / "jobs.jsonl", [{"id": i, "prompt": f"p {i}", "max_tokens": 4} for i in ids])
    out = tmp_path / "out.jsonl"
    earlier = [{"id": i, "reply": "from the earlier run", "error": None} for i in ids[:3]]
    # A crash mid-write: job-3's line never got its end.
    out.write_text("".join(json.dumps(e) + "\n" for e in earlier) + '{"id": "job-3", "reply": "cut sh',
                   encoding="utf-8")
    assert batch(inp, out, local_server) == 0
    results = by_id(read_results(out))
    assert sorted(results) == ids
    assert [results[i]["reply"] for i in ids[:3]] == ["from the earlier run"] * 3  # kept, not rerun
    assert all(results[i]["reply"] != "from the earlier run" and results[i]["error"] is None for i in ids[3:])
    rows = summary_of(capsys.readouterr().err)
    assert (rows["ok"], rows["skipped (already done)"]) == ("3", "3")

    assert batch(inp, out, local_server) == 0  # everything done: nothing runs, nothing is added
    assert sorted(by_id(read_results(out))) == ids
    assert summary_of(capsys.readouterr().err)["skipped (already done)"] == "6"


def test_a_second_run_of_deterministic_jobs_is_answered_from_the_cache(
    local_server: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inp = write_jobs(tmp_path / "jobs.jsonl", [
        {"id": "zero", "prompt": "cached", "temperature": 0, "max_tokens": 6},
        {"id": "seeded", "prompt": "cached too", "temperature": 0.9, "seed": 11, "max_tokens": 6},
        {"id": "sampled", "prompt": "never cached", "temperature": 0.9, "max_tokens": 6},
    ])
    first_out, second_out = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    assert batch(inp, first_out, local_server) == 0
    assert summary_of(capsys.readouterr().err)["cache hits"] == "0"
    assert batch(inp, second_out, local_server) == 0
    assert summary_of(capsys.readouterr().err)["cache hits"] == "2"
    first, second = by_id(read_results(first_out)), by_id(read_results(second_out))
    assert {i: r["record"]["cache_hit"] for i, r in second.items()} == {
        "zero": True, "seeded": True, "sampled": False}
    assert second["zero"]["reply"] == first["zero"]["reply"]
    assert second["zero"]["record"]["attempts"] == 0


def test_retries_are_counted_per_line_and_in_the_summary(
    server_factory: Factory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = server_factory(profile="instant", error_rate=0.5, seed=4)
    config = tmp_path / "config.toml"
    config.write_text("[retry]\nmax_attempts = 8\nbase_delay_s = 0.01\nmax_delay_s = 0.05\n",
                      encoding="utf-8")
    jobs = [{"id": i, "prompt": f"p{i}", "max_tokens": 3} for i in range(12)]
    inp = write_jobs(tmp_path / "jobs.jsonl", jobs)
    out = tmp_path / "out.jsonl"
    status = main(["--config", str(config), "batch", str(inp), "-o", str(out), "--base-url", server.base_url,
                   "--quiet", "--concurrency", "3"])
    results = by_id(read_results(out))
    retries = sum(r["record"]["retries"] for r in results.values())
    assert len(results) == 12 and retries > 0  # half the requests fail: some job was retried
    assert all(len(r["record"]["retry_log"]) == r["record"]["retries"] for r in results.values())
    rows = summary_of(capsys.readouterr().err)
    assert rows["retries"] == str(retries)
    failed = sum(r["error"] is not None for r in results.values())
    assert rows["failed"] == str(failed) and status == (1 if failed else 0)


def test_an_input_file_that_cannot_be_read_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["batch", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "out.jsonl"),
                   "--base-url", "http://127.0.0.1:9/v1"])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("llmchat: cannot read") and err.count("\n") == 1


def test_ctrl_c_stops_at_once_with_whole_lines_and_a_rerun_finishes(
    server_factory: Factory, local_server: RunningServer, tmp_path: Path, sigint_inheritable: None,
    capsys: pytest.CaptureFixture[str]
) -> None:
    slow = server_factory(profile="instant", tokens_per_s=10)  # a 50-token reply takes five seconds
    ids = [f"job-{i:02d}" for i in range(12)]
    jobs = [{"id": ids[0], "prompt": "quick", "max_tokens": 2}]
    jobs += [{"id": i, "prompt": f"slow {i}", "max_tokens": 50} for i in ids[1:]]
    inp = write_jobs(tmp_path / "jobs.jsonl", jobs)
    out = tmp_path / "out.jsonl"
    dropped = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "LLMCHAT_CONFIG")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    child = subprocess.Popen(
        [sys.executable, "-m", "llmchat.tui", "batch", str(inp), "-o", str(out), "--base-url", slow.base_url,
         "--concurrency", "3", "--quiet"],
        cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + BOUND_S
        while not (out.exists() and out.read_bytes().count(b"\n") >= 1):
            assert child.poll() is None, f"the run ended before Ctrl-C: {child.communicate()}"
            assert time.monotonic() < deadline, "no result line within the bound"
            time.sleep(0.02)
        child.send_signal(signal.SIGINT)
        interrupted_at = time.monotonic()
        stdout, stderr = child.communicate(timeout=BOUND_S)
        stopped_after = time.monotonic() - interrupted_at
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    assert "interrupted after" in stderr and "run the same command again to resume" in stderr
    # The jobs in flight were cancelled, not waited for (each had seconds of its reply still to come).
    assert stopped_after < 4.0
    written = by_id(read_results(out))
    assert ids[0] in written and len(written) < len(ids)
    assert all(r["error"] is None for r in written.values())

    assert batch(inp, out, local_server) == 0
    assert sorted(by_id(read_results(out))) == ids
    assert summary_of(capsys.readouterr().err)["skipped (already done)"] == str(len(written))
