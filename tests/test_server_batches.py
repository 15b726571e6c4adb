"""The local server's Batch API over real sockets: /v1/files (upload by httpx's own multipart encoder,
retrieve, content, delete, list in pages) and /v1/batches (create, retrieve, cancel, list), its lines answered
by the live reply path, with its turnaround, failed share and expiry, and its model and usage."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from llmchat.core.errors import UsageError
from llmchat.core.server import RunningServer, resolve_settings
from llmchat.core.server._cli import flag_values

Factory = Callable[..., RunningServer]
BOUND_S = 15.0


def chat_line(custom_id: str, prompt: str, **body: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "llmchat-local",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 8,
            **body,
        },
    }


def upload(client: httpx.Client, lines: list[Any], purpose: str = "batch") -> dict[str, Any]:
    data = "".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines).encode()
    resp = client.post(
        "/files", data={"purpose": purpose}, files={"file": ("in.jsonl", data, "application/jsonl")}
    )
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


def create(client: httpx.Client, file_id: str, **extra: Any) -> dict[str, Any]:
    resp = client.post(
        "/batches",
        json={
            "input_file_id": file_id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            **extra,
        },
    )
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


def wait_for(client: httpx.Client, batch_id: str, statuses: tuple[str, ...]) -> dict[str, Any]:
    deadline = time.monotonic() + BOUND_S
    while True:
        batch: dict[str, Any] = client.get(f"/batches/{batch_id}").json()
        if batch["status"] in statuses:
            return batch
        assert time.monotonic() < deadline, f"batch still {batch['status']} after {BOUND_S} s"
        time.sleep(0.02)


def lines_of(client: httpx.Client, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    resp = client.get(f"/files/{file_id}/content")
    assert resp.status_code == 200
    return [json.loads(line) for line in resp.text.splitlines()]


def test_a_file_goes_up_as_multipart_and_comes_back_byte_for_byte(http: Callable[..., httpx.Client]) -> None:
    client = http()
    raw = json.dumps(chat_line("a", "héllo \u2028 there")) + "\r\n\n"
    stored = upload(client, [raw])
    assert stored["object"] == "file" and stored["purpose"] == "batch" and stored["filename"] == "in.jsonl"
    assert stored["bytes"] == len((raw + "\n").encode())
    assert client.get(f"/files/{stored['id']}").json() == stored
    assert client.get(f"/files/{stored['id']}/content").content == (raw + "\n").encode()
    missing = client.get("/files/file-nope/content")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "file_not_found"


def test_uploads_without_a_purpose_or_file_or_as_json_are_refused(http: Callable[..., httpx.Client]) -> None:
    client = http()
    bad_purpose = client.post("/files", data={"purpose": "poems"}, files={"file": ("a.jsonl", b"{}\n")})
    assert bad_purpose.status_code == 400 and bad_purpose.json()["error"]["param"] == "purpose"
    no_file = client.post("/files", data={"purpose": "batch"}, files={"other": ("a.jsonl", b"{}\n")})
    assert no_file.status_code == 400 and no_file.json()["error"]["param"] == "file"
    as_json = client.post("/files", json={"purpose": "batch"})
    assert as_json.status_code == 400 and "multipart/form-data" in as_json.json()["error"]["message"]


def test_a_batch_answers_each_line_as_the_live_endpoint_does(http: Callable[..., httpx.Client]) -> None:
    client = http()
    lines = [chat_line(f"q{i}", f"question {i}", seed=i) for i in range(20)]
    batch = create(client, upload(client, lines)["id"], metadata={"run": "t"})
    assert batch["status"] == "validating" and batch["metadata"] == {"run": "t"}
    assert batch["expires_at"] - batch["created_at"] == 24 * 3600
    done = wait_for(client, batch["id"], ("completed",))
    assert done["request_counts"] == {"total": 20, "completed": 20, "failed": 0}
    assert done["error_file_id"] is None and done["completed_at"] >= done["in_progress_at"]
    out = lines_of(client, done["output_file_id"])
    assert [o["custom_id"] for o in out] == [f"q{i}" for i in range(20)]  # input order
    for line, result in zip(lines, out, strict=True):
        live = client.post("/chat/completions", json=line["body"]).json()
        body = result["response"]["body"]
        assert result["response"]["status_code"] == 200 and result["error"] is None
        assert body["choices"][0]["message"] == live["choices"][0]["message"]
        assert body["usage"] == live["usage"]


def test_lines_the_reply_path_refuses_go_to_the_error_file_with_their_status(
    http: Callable[..., httpx.Client],
) -> None:
    client = http()
    lines = [
        chat_line("ok", "fine"),
        chat_line("nomodel", "x", model="no-such-model"),
        chat_line("streamed", "x", stream=True),
    ]
    done = wait_for(client, create(client, upload(client, lines)["id"])["id"], ("completed",))
    assert done["request_counts"] == {"total": 3, "completed": 1, "failed": 2}
    errors = {e["custom_id"]: e["response"] for e in lines_of(client, done["error_file_id"])}
    assert errors["nomodel"]["status_code"] == 404
    assert errors["nomodel"]["body"]["error"]["code"] == "model_not_found"
    assert (
        errors["streamed"]["status_code"] == 400 and errors["streamed"]["body"]["error"]["param"] == "stream"
    )
    assert [o["custom_id"] for o in lines_of(client, done["output_file_id"])] == ["ok"]


def test_an_input_file_in_the_wrong_format_fails_the_batch_naming_each_line(
    http: Callable[..., httpx.Client],
) -> None:
    client = http()
    lines = [
        chat_line("a", "x"),
        "not json",
        chat_line("a", "again"),
        {**chat_line("b", "x"), "url": "/v1/embeddings"},
    ]
    done = wait_for(client, create(client, upload(client, lines)["id"])["id"], ("failed",))
    problems = {(e["line"], e["code"]) for e in done["errors"]["data"]}
    assert problems == {(2, "invalid_json_line"), (3, "duplicate_custom_id"), (4, "mismatched_endpoint")}
    assert done["output_file_id"] is None and done["failed_at"] is not None


def test_create_refuses_what_it_cannot_run(http: Callable[..., httpx.Client]) -> None:
    client = http()
    file_id = upload(client, [chat_line("a", "x")])["id"]
    other = upload(client, [chat_line("a", "x")], purpose="user_data")["id"]
    cases = [
        ({"input_file_id": "file-missing"}, 404, "input_file_id"),
        ({"input_file_id": other}, 400, "input_file_id"),
        ({"input_file_id": file_id, "endpoint": "/v1/moderations"}, 400, "endpoint"),
        ({"input_file_id": file_id, "completion_window": "soon"}, 400, "completion_window"),
    ]
    for extra, status, param in cases:
        body = {"endpoint": "/v1/chat/completions", "completion_window": "24h", **extra}
        resp = client.post("/batches", json=body)
        assert (resp.status_code, resp.json()["error"]["param"]) == (status, param), extra


def test_turnaround_spreads_the_lines_and_cancel_keeps_what_finished(
    server_factory: Factory, http: Callable[..., httpx.Client]
) -> None:
    server = server_factory(profile="instant", batch_turnaround_s=3.0)
    client = http(server)
    batch = create(client, upload(client, [chat_line(f"q{i}", f"q{i}") for i in range(30)])["id"])
    deadline = time.monotonic() + BOUND_S
    while (seen := client.get(f"/batches/{batch['id']}").json())["request_counts"]["completed"] < 3:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert seen["status"] == "in_progress" and seen["request_counts"]["completed"] < 30  # spread, not at once
    cancelling = client.post(f"/batches/{batch['id']}/cancel").json()
    assert cancelling["status"] in ("cancelling", "cancelled")
    done = wait_for(client, batch["id"], ("cancelled",))
    kept = lines_of(client, done["output_file_id"])
    assert 3 <= len(kept) == done["request_counts"]["completed"] < 30
    assert [k["custom_id"] for k in kept] == [f"q{i}" for i in range(len(kept))]
    again = client.post(f"/batches/{batch['id']}/cancel")
    assert again.status_code == 200 and again.json()["status"] == "cancelled"


def test_fail_share_and_expiry_write_the_error_file_as_openai_does(
    server_factory: Factory, http: Callable[..., httpx.Client]
) -> None:
    server = server_factory(profile="instant", batch_fail_share=0.25, batch_expire=True, seed=3)
    client = http(server)
    done = wait_for(
        client,
        create(client, upload(client, [chat_line(f"q{i}", "x") for i in range(40)])["id"])["id"],
        ("expired",),
    )
    counts = done["request_counts"]
    errors = lines_of(client, done["error_file_id"])
    expired = [e for e in errors if e["error"] is not None]
    failed = [e for e in errors if e["response"] is not None]
    assert len(expired) == 20 and {e["error"]["code"] for e in expired} == {"batch_expired"}
    assert {e["custom_id"] for e in expired} == {f"q{i}" for i in range(20, 40)}
    # The failed share is of every line (10 of 40), chosen by the seed; those in the half that ran are 500s.
    assert all(e["response"]["status_code"] == 500 for e in failed) and 0 < len(failed) <= 10
    assert counts == {"total": 40, "completed": 20 - len(failed), "failed": 20 + len(failed)}
    assert len(lines_of(client, done["output_file_id"])) == counts["completed"]
    assert client.post(f"/batches/{done['id']}/cancel").status_code == 409


def test_list_is_newest_first_and_pages_with_after(
    server_factory: Factory, http: Callable[..., httpx.Client]
) -> None:
    client = http(server_factory(profile="instant"))
    file_id = upload(client, [chat_line("a", "x")])["id"]
    ids = [create(client, file_id)["id"] for _ in range(3)]
    first = client.get("/batches", params={"limit": 2}).json()
    assert [b["id"] for b in first["data"]] == ids[::-1][:2] and first["has_more"] is True
    rest = client.get("/batches", params={"limit": 2, "after": first["last_id"]}).json()
    assert [b["id"] for b in rest["data"]] == [ids[0]] and rest["has_more"] is False
    assert client.get("/batches", params={"limit": 0}).status_code == 400
    assert client.get("/batches/batch_nope").status_code == 404


def test_a_deleted_file_is_gone_and_a_second_delete_is_404(http: Callable[..., httpx.Client]) -> None:
    client = http()
    stored = upload(client, [chat_line("a", "x")])
    gone = client.delete(f"/files/{stored['id']}")
    assert gone.status_code == 200
    assert gone.json() == {"id": stored["id"], "object": "file", "deleted": True}
    assert client.get(f"/files/{stored['id']}").status_code == 404
    again = client.delete(f"/files/{stored['id']}")
    assert again.status_code == 404 and again.json()["error"]["code"] == "file_not_found"
    assert stored["id"] not in [f["id"] for f in client.get("/files").json()["data"]]


def test_the_file_list_pages_with_limit_and_after_and_names_its_first_and_last(
    server_factory: Factory, http: Callable[..., httpx.Client]
) -> None:
    client = http(server_factory(profile="instant"))
    ids = [upload(client, [chat_line(str(i), "x")])["id"] for i in range(3)]
    other = upload(client, [chat_line("u", "x")], purpose="user_data")["id"]
    whole = client.get("/files").json()
    assert [f["id"] for f in whole["data"]] == [other, *ids[::-1]]  # newest first by default
    assert whole["first_id"] == other and whole["last_id"] == ids[0] and whole["has_more"] is False
    first = client.get("/files", params={"limit": 2, "purpose": "batch"}).json()
    assert [f["id"] for f in first["data"]] == [ids[2], ids[1]]
    assert (first["object"], first["first_id"], first["last_id"], first["has_more"]) == ("list", ids[2], ids[1], True)
    rest = client.get("/files", params={"limit": 2, "purpose": "batch", "after": first["last_id"]}).json()
    assert [f["id"] for f in rest["data"]] == [ids[0]] and rest["has_more"] is False
    oldest = client.get("/files", params={"order": "asc", "limit": 1}).json()
    assert oldest["data"][0]["id"] == ids[0] and oldest["has_more"] is True
    for bad in ({"limit": 0}, {"limit": 10_001}, {"order": "sideways"}):
        error = client.get("/files", params=bad).json()["error"]
        assert error["param"] == next(iter(bad)) and "\n" not in error["message"]


def test_a_batch_names_its_model_and_sums_its_lines_usage(
    server_factory: Factory, http: Callable[..., httpx.Client]
) -> None:
    client = http(server_factory(profile="instant", reasoning_tokens=3))
    lines = [chat_line(f"q{i}", f"question {i}") for i in range(3)]
    batch = create(client, upload(client, lines)["id"])
    assert batch["model"] == "llmchat-local"
    assert batch["usage"]["total_tokens"] == 0  # nothing answered yet
    done = wait_for(client, batch["id"], ("completed",))
    usages = [o["response"]["body"]["usage"] for o in lines_of(client, done["output_file_id"])]
    prompt = sum(u["prompt_tokens"] for u in usages)
    completion = sum(u["completion_tokens"] for u in usages)
    assert done["model"] == "llmchat-local"
    assert done["usage"] == {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 9},
        "total_tokens": prompt + completion,
    }
    assert prompt > 0 and completion > 9


def test_the_batch_endpoints_need_the_key_like_the_others(
    server_factory: Factory, http: Callable[..., httpx.Client]
) -> None:
    client = http(server_factory(profile="instant", api_key="sekrit"))
    assert client.get("/batches").status_code == 401
    assert client.post("/files", data={"purpose": "batch"}, files={"file": ("a", b"{}")}).status_code == 401
    assert client.get("/batches", headers={"Authorization": "Bearer sekrit"}).status_code == 200


def test_the_serve_flags_and_their_ranges() -> None:
    from llmchat.core.server._cli import add_arguments
    from llmchat.tui.commands._options import Parser

    parser = Parser(prog="serve")
    add_arguments(parser)
    args = parser.parse_args(["--batch-turnaround-s", "2.5", "--batch-fail-share", "0.1", "--batch-expire"])
    assert flag_values(args) == {"batch_turnaround_s": 2.5, "batch_fail_share": 0.1, "batch_expire": True}
    with pytest.raises(UsageError, match="batch_fail_share must be a probability"):
        resolve_settings({"batch_fail_share": 1.5})
    with pytest.raises(UsageError, match="batch_turnaround_s must be a non-negative"):
        resolve_settings({"batch_turnaround_s": -1})
