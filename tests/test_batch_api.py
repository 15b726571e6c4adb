"""`llmchat batch --via batch-api` end to end against the local server's Batch API, over real sockets: the
same OUT.jsonl as the direct path, Ctrl-C and a rerun that resumes polling, --cancel, a failed share and
expiry, and every refusal as one line."""

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

import httpx
import pytest
from test_batch_cli import by_id, read_results, summary_of, write_jobs

from llmchat.core.load import batch_input, read_jobs, state_path
from llmchat.core.server import RunningServer
from llmchat.tui.cli import main

Factory = Callable[..., RunningServer]
BOUND_S = 20.0
COMPARED = ("reply", "finish_reason", "usage", "error")


@pytest.fixture(autouse=True)
def _fast_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMCHAT_BATCH__POLL_INTERVAL_S", "0.05")


def jobs(n: int, prefix: str = "job") -> list[dict[str, Any]]:
    return [{"id": f"{prefix}-{i:03d}", "prompt": f"question {i}", "max_tokens": 6} for i in range(n)]


def batch(inp: Path, out: Path, server: RunningServer, *extra: str) -> int:
    return main(["batch", str(inp), "-o", str(out), "--base-url", server.base_url, "--quiet", *extra])


def batches_at(server: RunningServer) -> list[dict[str, Any]]:
    resp = httpx.get(f"{server.base_url}/batches", params={"limit": 100}, timeout=10.0)
    assert resp.status_code == 200
    return list(resp.json()["data"])


def compared(path: Path) -> dict[str, tuple[Any, ...]]:
    return {i: tuple(r.get(k) for k in COMPARED) for i, r in by_id(read_results(path)).items()}


def start_and_interrupt(inp: Path, out: Path, server: RunningServer, tmp_path: Path) -> tuple[int, str]:
    """Run the batch in a child, Ctrl-C it once its batch is created (the id is on disk), and return its exit
    status and stderr."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "LLMCHAT_CONFIG")
    }
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmchat.tui",
            "batch",
            str(inp),
            "-o",
            str(out),
            "--base-url",
            server.base_url,
            "--via",
            "batch-api",
            "--quiet",
        ],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + BOUND_S
        while not state_path(out).exists():
            assert child.poll() is None, f"the run ended before Ctrl-C: {child.communicate()}"
            assert time.monotonic() < deadline, "no batch created within the bound"
            time.sleep(0.02)
        child.send_signal(signal.SIGINT)
        _, stderr = child.communicate(timeout=BOUND_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    return child.returncode, stderr


def test_several_hundred_jobs_through_the_batch_api_give_the_direct_paths_output(
    local_server: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inp = write_jobs(tmp_path / "jobs.jsonl", [*jobs(300), "not json", {"id": "job-000", "prompt": "again"}])
    direct, via = tmp_path / "direct.jsonl", tmp_path / "via.jsonl"
    before = {b["id"] for b in batches_at(local_server)}
    assert batch(inp, direct, local_server) == 0
    capsys.readouterr()
    assert batch(inp, via, local_server, "--via", "batch-api") == 0
    err = capsys.readouterr().err
    assert compared(via) == compared(direct) and len(compared(via)) == 300
    assert [r["id"] for r in read_results(via)] == [j["id"] for j in jobs(300)]  # input order
    assert all(r["error"] is None and r["batch"]["id"].startswith("batch_") for r in read_results(via))
    rows = summary_of(err)
    assert rows["ok"] == "300" and rows["failed"] == "0" and rows["bad input lines"] == "2"
    assert "jobs.jsonl:301: not JSON" in err and "Traceback" not in err
    made = [b for b in batches_at(local_server) if b["id"] not in before]
    assert len(made) == 1 and made[0]["request_counts"]["total"] == 300
    assert f"batch {made[0]['id']} created" in err
    assert not state_path(via).exists()
    # A rerun has nothing left to send: no second batch.
    assert batch(inp, via, local_server, "--via", "batch-api") == 0
    assert summary_of(capsys.readouterr().err)["skipped (already done)"] == "300"
    assert len([b for b in batches_at(local_server) if b["id"] not in before]) == 1


def test_ctrl_c_leaves_the_batch_running_and_a_rerun_resumes_it_without_resubmitting(
    server_factory: Factory,
    local_server: RunningServer,
    tmp_path: Path,
    sigint_inheritable: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = server_factory(profile="instant", batch_turnaround_s=3.0)
    inp = write_jobs(tmp_path / "jobs.jsonl", jobs(200))
    out = tmp_path / "out.jsonl"
    status, stderr = start_and_interrupt(inp, out, server, tmp_path)
    assert status == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    (remote,) = batches_at(server)
    assert f"batch {remote['id']} keeps running" in stderr and "--cancel" in stderr
    assert remote["status"] in ("validating", "in_progress")  # Ctrl-C did not cancel it
    assert json.loads(state_path(out).read_text())["batch_id"] == remote["id"]

    assert batch(inp, out, server, "--via", "batch-api") == 0
    err = capsys.readouterr().err
    assert f"resuming batch {remote['id']}" in err
    assert [b["id"] for b in batches_at(server)] == [remote["id"]]  # polled again, never resubmitted
    direct = tmp_path / "direct.jsonl"
    assert batch(inp, direct, local_server) == 0
    assert compared(out) == compared(direct) and len(compared(out)) == 200
    assert not state_path(out).exists()


def test_cancel_keeps_what_the_batch_finished_and_a_rerun_sends_the_rest(
    server_factory: Factory, tmp_path: Path, sigint_inheritable: None, capsys: pytest.CaptureFixture[str]
) -> None:
    server = server_factory(profile="instant", batch_turnaround_s=3.0)
    inp = write_jobs(tmp_path / "jobs.jsonl", jobs(100))
    out = tmp_path / "out.jsonl"
    assert start_and_interrupt(inp, out, server, tmp_path)[0] == 130
    (remote,) = batches_at(server)
    deadline = time.monotonic() + BOUND_S
    while httpx.get(f"{server.base_url}/batches/{remote['id']}").json()["request_counts"]["completed"] < 5:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert batch(inp, out, server, "--cancel") == 0
    err = capsys.readouterr().err
    assert f"cancelling batch {remote['id']}" in err
    kept = by_id(read_results(out))
    assert 5 <= len(kept) < 100 and all(r["error"] is None for r in kept.values())
    assert f"batch {remote['id']} cancelled with {len(kept)} of 100 jobs done" in err
    assert f"send the other {100 - len(kept)}" in err
    assert batches_at(server)[0]["status"] == "cancelled" and not state_path(out).exists()

    assert batch(inp, out, server, "--via", "batch-api") == 0
    assert sorted(by_id(read_results(out))) == [j["id"] for j in jobs(100)]
    second = batches_at(server)[0]
    assert len(batches_at(server)) == 2 and second["request_counts"]["total"] == 100 - len(kept)
    capsys.readouterr()
    assert batch(inp, out, server, "--cancel") == 2
    assert "no batch is running for" in capsys.readouterr().err


def test_a_failed_share_and_an_expiry_keep_every_result_and_say_what_to_run(
    server_factory: Factory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = server_factory(profile="instant", batch_fail_share=0.1, seed=1)
    inp = write_jobs(tmp_path / "jobs.jsonl", jobs(60))
    out = tmp_path / "out.jsonl"
    assert batch(inp, out, server, "--via", "batch-api") == 1
    results = by_id(read_results(out))
    failed = {i for i, r in results.items() if r["error"] is not None}
    assert len(results) == 60 and len(failed) == 6
    assert all("HTTP 500" in results[i]["error"] and results[i]["reply"] is None for i in failed)
    assert summary_of(capsys.readouterr().err)["failed"] == "6"

    expiring = server_factory(profile="instant", batch_expire=True)
    out2 = tmp_path / "out2.jsonl"
    assert batch(inp, out2, expiring, "--via", "batch-api") == 1
    err = capsys.readouterr().err
    results = by_id(read_results(out2))
    expired = sorted(i for i, r in results.items() if r["error"] is not None)
    assert len(results) == 60 and expired == [j["id"] for j in jobs(60)[30:]]
    assert all("expired before this job ran" in results[i]["error"] for i in expired)
    bid = batches_at(expiring)[0]["id"]
    lines = [ln for ln in err.splitlines() if ln.startswith("llmchat:") and "expired" in ln]
    assert lines == [
        f"llmchat: batch {bid} expired (completion window 24h) with 30 of 60 jobs answered; every "
        "result is in out2.jsonl: add --retry-failed to send the others again"
    ]
    # --retry-failed sends exactly the expired ones, in a batch of their own, to a server that runs them all.
    assert batch(inp, out2, server, "--via", "batch-api", "--retry-failed") in (0, 1)
    assert batches_at(server)[0]["request_counts"]["total"] == 30
    assert len(by_id(read_results(out2))) == 60


def test_an_upload_the_provider_refuses_is_one_line_and_nothing_is_recorded(
    server_factory: Factory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = server_factory(profile="instant", api_key="right-key")
    monkeypatch.setenv("WRONG_KEY", "wrong-key")
    inp = write_jobs(tmp_path / "jobs.jsonl", jobs(3))
    out = tmp_path / "out.jsonl"
    assert (
        batch(
            inp, out, server, "--via", "batch-api", "--api-key-env", "WRONG_KEY", "--model", "llmchat-local"
        )
        == 1
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "rejected the API key (HTTP 401" in err and "wrong-key" not in err
    assert not state_path(out).exists() and out.read_bytes() == b""


def test_a_batch_that_failed_at_the_provider_is_one_line_naming_the_job(
    server_factory: Factory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = server_factory(profile="instant")
    inp = write_jobs(tmp_path / "jobs.jsonl", jobs(3))
    parsed, _ = read_jobs(inp.read_text().splitlines())
    # The provider's own check fails the batch: here the second line's url is one this batch does not call.
    lines = [json.loads(line) for line in batch_input(parsed, "llmchat-local").splitlines()]
    lines[1]["url"] = "/v1/embeddings"
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    client = httpx.Client(base_url=server.base_url, timeout=10.0)
    file_id = client.post("/files", data={"purpose": "batch"}, files={"file": ("in.jsonl", data)}).json()[
        "id"
    ]
    remote = client.post(
        "/batches",
        json={"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"},
    ).json()
    client.close()
    out = tmp_path / "out.jsonl"
    state_path(out).write_text(json.dumps({"batch_id": remote["id"], "ids": [j.id for j in parsed]}))
    assert batch(inp, out, server, "--via", "batch-api") == 1
    err = capsys.readouterr().err
    assert f"llmchat: batch {remote['id']} failed before any job ran:" in err
    assert "(job 'job-001')" in err and "--via direct" in err and "Traceback" not in err
    assert out.read_bytes() == b"" and not state_path(out).exists()
    assert batch(inp, out, server, "--via", "batch-api") == 0  # the next run sends them in a new batch
    assert len(by_id(read_results(out))) == 3


def test_a_recorded_batch_blocks_the_direct_path_and_an_unknown_one_says_what_to_delete(
    local_server: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inp = write_jobs(tmp_path / "jobs.jsonl", jobs(2))
    out = tmp_path / "out.jsonl"
    state = state_path(out)
    state.write_text(json.dumps({"batch_id": "batch_gone", "ids": ["job-000", "job-001"]}))
    assert batch(inp, out, local_server) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "batch batch_gone is still recorded" in err and "--via batch-api" in err
    assert batch(inp, out, local_server, "--via", "batch-api") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "knows no batch batch_gone (HTTP 404" in err and f"delete {state}" in err
    state.write_text("{garbled")
    assert batch(inp, out, local_server, "--via", "batch-api") == 2
    assert "is not a batch record llmchat wrote; delete it" in capsys.readouterr().err


def test_a_completion_window_the_config_cannot_mean_is_refused_before_anything_is_sent(
    local_server: RunningServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LLMCHAT_BATCH__COMPLETION_WINDOW", "a day")
    inp = write_jobs(tmp_path / "jobs.jsonl", jobs(1))
    assert batch(inp, tmp_path / "out.jsonl", local_server, "--via", "batch-api") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "COMPLETION_WINDOW" in err and '"24h"' in err and "a day" in err


def test_the_progress_bar_shows_the_providers_counts_and_the_batchs_status(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from llmchat.tui.commands.batch import Progress

    progress = Progress(0, enabled=True)
    progress.show(0, 0, 40, "validating")
    progress.show(30, 2, 40, "in_progress")
    progress.close()
    drawn = capsys.readouterr().err.split("\r")
    assert "0/40" in drawn[1] and drawn[1].rstrip().endswith("failed 0 validating")
    assert "[######################--------] 30/40" in drawn[2]
    assert drawn[2].rstrip().endswith("failed 2 in_progress")
