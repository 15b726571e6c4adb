"""Bad input to the local server gets an OpenAI-shaped error with the right status, and never a traceback."""

from __future__ import annotations

import socket
import ssl
from collections.abc import AsyncIterator

import httpx
import pytest

from llmchat.core.server import RunningServer

MESSAGES = [{"role": "user", "content": "hi"}]
# httpx builds a TLS context per client unless given one (a quarter second each); plain http never uses it.
UNUSED_TLS = ssl.create_default_context()


@pytest.fixture(params=["http1", "h2c"])
async def c(request: pytest.FixtureRequest, local_server: RunningServer) -> AsyncIterator[httpx.AsyncClient]:
    h2c = request.param == "h2c"
    async with httpx.AsyncClient(
        base_url=local_server.base_url, http1=not h2c, http2=h2c, timeout=10, verify=UNUSED_TLS
    ) as client:
        yield client


def error_of(r: httpx.Response, status: int) -> dict[str, object]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"] and "\n" not in error["message"]
    assert "Traceback" not in r.text
    return dict(error)


@pytest.mark.parametrize("body", [b"{", b"not json", b"\xff\xfe", b'{"messages": [}', b""])
async def test_malformed_json_is_400(c: httpx.AsyncClient, body: bytes) -> None:
    error = error_of(await c.post("/chat/completions", content=body), 400)
    assert error["type"] == "invalid_request_error" and "JSON" in str(error["message"])


@pytest.mark.parametrize("body", [b"[1, 2]", b'"text"', b"null", b"3"])
async def test_json_that_is_not_an_object_is_400(c: httpx.AsyncClient, body: bytes) -> None:
    error_of(await c.post("/chat/completions", content=body), 400)


async def test_missing_messages_is_400(c: httpx.AsyncClient) -> None:
    error = error_of(await c.post("/chat/completions", json={"model": "llmchat-local"}), 400)
    assert error["param"] == "messages" and error["code"] == "missing_required_parameter"


async def test_unknown_model_is_404_model_not_found(c: httpx.AsyncClient) -> None:
    for path, body in (
        ("/chat/completions", {"model": "gpt-nope", "messages": MESSAGES}),
        ("/embeddings", {"model": "gpt-nope", "input": "x"}),
    ):
        error = error_of(await c.post(path, json=body), 404)
        assert error["code"] == "model_not_found" and "gpt-nope" in str(error["message"])


async def test_body_over_one_mib_is_413(c: httpx.AsyncClient) -> None:
    big = {"messages": [{"role": "user", "content": "x" * (1024 * 1024)}]}
    error = error_of(await c.post("/chat/completions", json=big), 413)
    assert error["code"] == "request_too_large"


async def test_body_over_one_mib_without_content_length_is_413(c: httpx.AsyncClient) -> None:
    async def pieces() -> AsyncIterator[bytes]:  # sent chunked (HTTP/1.1) or as bare DATA frames (h2)
        for _ in range(17):
            yield b"x" * 65536

    error_of(await c.post("/chat/completions", content=pieces()), 413)


async def test_a_body_of_exactly_one_mib_is_read(c: httpx.AsyncClient) -> None:
    prefix = b'{"messages": [{"role": "user", "content": "'
    suffix = b'"}], "max_tokens": 3}'
    body = prefix + b"y" * (1024 * 1024 - len(prefix) - len(suffix)) + suffix
    assert len(body) == 1024 * 1024
    r = await c.post("/chat/completions", content=body)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", "/chat/completions", "POST"),
        ("PUT", "/chat/completions", "POST"),
        ("DELETE", "/models", "GET, HEAD"),
        ("POST", "/models", "GET, HEAD"),
        ("GET", "/embeddings", "POST"),
    ],
)
async def test_wrong_method_is_405_with_allow(
    c: httpx.AsyncClient, method: str, path: str, allowed: str
) -> None:
    r = await c.request(method, path)
    error = error_of(r, 405)
    assert r.headers["allow"] == allowed and error["code"] == "method_not_allowed"


async def test_unknown_path_is_404(c: httpx.AsyncClient) -> None:
    error = error_of(await c.post("/completions/nope", json={}), 404)
    assert "/v1/completions/nope" in str(error["message"])


async def test_bad_requests_leave_the_connection_usable(c: httpx.AsyncClient) -> None:
    for _ in range(3):
        await c.post("/chat/completions", content=b"{")
        await c.post("/chat/completions", json={"model": "nope", "messages": MESSAGES})
    r = await c.post("/chat/completions", json={"messages": MESSAGES, "max_tokens": 2})
    assert r.status_code == 200


async def test_nothing_reaches_stderr(local_server: RunningServer, capfd: pytest.CaptureFixture[str]) -> None:
    async with httpx.AsyncClient(base_url=local_server.base_url, timeout=10, verify=UNUSED_TLS) as client:
        for body in (b"{", b"[]", b'{"messages": 1}', b'{"messages": [{"role": "user", "content": {}}]}'):
            await client.post("/chat/completions", content=body)
            await client.post("/embeddings", content=body)
        await client.post("/embeddings", json={"input": [[1, "a"]]})
        await client.post("/chat/completions", json={"messages": [{"role": "user", "content": [{"x": 1}]}]})
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == ""


def test_a_websocket_upgrade_is_refused_with_403(local_server: RunningServer) -> None:
    request = (
        b"GET /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Upgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", local_server.port), timeout=5) as sock:
        sock.sendall(request)
        assert sock.recv(64).startswith(b"HTTP/1.1 403")


def test_h2_a_body_sent_after_the_answer_leaves_the_connection_usable(local_server: RunningServer) -> None:
    # A POST to an unknown path is answered 404 before its body is read. hypercorn dropped the stream then, and
    # the body's frames that came after it raised KeyError and killed the connection with every stream on it
    # (pgjones/hypercorn#329); llmchat serve reads and drops them.
    import h2.config
    import h2.connection
    import h2.events

    host, port = local_server.base_url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()

    def headers(path: str) -> list[tuple[str, str]]:
        return [(":method", "POST"), (":scheme", "http"), (":authority", f"{host}:{port}"), (":path", path),
                ("content-type", "application/json")]

    def status(event: h2.events.ResponseReceived) -> str:
        return {str(k): str(v) for k, v in event.headers or []}.get(":status", "")

    def read_until(sock: socket.socket, stream_id: int) -> list[h2.events.Event]:
        seen: list[h2.events.Event] = []
        while not any(isinstance(e, h2.events.StreamEnded) and e.stream_id == stream_id for e in seen):
            data = sock.recv(65536)
            assert data, f"the server closed the connection before stream {stream_id} ended: {seen}"
            seen += conn.receive_data(data)
            sock.sendall(conn.data_to_send())
        return seen

    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(conn.data_to_send())
        conn.send_headers(1, headers("/api/v1/tokenize"))  # the body is still to come
        sock.sendall(conn.data_to_send())
        first = read_until(sock, 1)
        assert [status(e) for e in first if isinstance(e, h2.events.ResponseReceived)] == ["404"]
        conn.send_data(1, b'{"prompt": "late"}', end_stream=True)
        sock.sendall(conn.data_to_send())
        body = b'{"model": "llmchat-local", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
        conn.send_headers(3, headers("/v1/chat/completions"))
        conn.send_data(3, body, end_stream=True)
        sock.sendall(conn.data_to_send())
        second = read_until(sock, 3)
    assert [status(e) for e in second if isinstance(e, h2.events.ResponseReceived)] == ["200"]
