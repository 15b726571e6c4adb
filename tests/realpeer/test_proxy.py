"""llmchat through a real forward proxy (tinyproxy, ``forward_proxy`` in proxy_fixture.py) to ``llmchat serve``.

The proxy's own log is the witness: a request it forwarded or a tunnel it opened is a line there, so "the
proxy saw it" is read, never assumed. Over plain http the request goes to the proxy in absolute form
(HTTP/1.1); over https through a CONNECT tunnel, with h2 negotiated by ALPN with the server inside it, and
the transport's own connection classes speaking on it. ``llmchat ask`` runs as the user runs it, with
HTTPS_PROXY / HTTP_PROXY / NO_PROXY in its environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from proxy_fixture import TinyProxy, start_proxy

import llmchat.core.http._transport as T
from llmchat.core import ChatClient, HttpSettings, RetrySettings, Settings
from llmchat.core.errors import ConnectError
from llmchat.core.server import RunningServer

pytestmark = pytest.mark.realpeer

MODEL = "llmchat-local"
ASK_S = 60.0
_PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in _PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    yield


def _ask(server: RunningServer, tmp_path: Path, **env: str) -> tuple[int, dict[str, Any], str]:
    """``llmchat ask --json`` against ``server`` with ``env`` added to a clean environment: (exit status,
    the JSON it printed or {}, stderr)."""
    child = {k: v for k, v in os.environ.items() if k.lower() not in {n.lower() for n in _PROXY_VARS}}
    child.update(env)
    args = [sys.executable, "-m", "llmchat.tui.cli", "ask", "--base-url", server.base_url, "--model", MODEL,
            "--json", "--max-tokens", "4", "proxied?"]
    if server.cert_path:
        child["LLMCHAT_HTTP__VERIFY"] = server.cert_path
    done = subprocess.run(args, capture_output=True, text=True, timeout=ASK_S, env=child, cwd=tmp_path)
    try:
        out = json.loads(done.stdout) if done.stdout.strip() else {}
    except json.JSONDecodeError:
        out = {}
    return done.returncode, out, done.stderr


def _new_lines(proxy: TinyProxy, before: int) -> list[str]:
    return proxy.requests()[before:]


def test_an_http_target_is_forwarded_through_http_proxy(
    forward_proxy: TinyProxy, local_server: RunningServer, tmp_path: Path
) -> None:
    before = len(forward_proxy.requests())
    status, out, err = _ask(local_server, tmp_path, HTTP_PROXY=forward_proxy.url)
    assert status == 0, err
    seen = _new_lines(forward_proxy, before)
    assert f"POST {local_server.base_url}/chat/completions" in seen, forward_proxy.log_text()[-2000:]
    assert out["proxy"] == forward_proxy.url and out["http_version"] == "HTTP/1.1"


def test_an_https_target_tunnels_through_https_proxy_with_h2_by_alpn(
    forward_proxy: TinyProxy, tls_server: RunningServer, tmp_path: Path
) -> None:
    before = len(forward_proxy.requests())
    status, out, err = _ask(tls_server, tmp_path, HTTPS_PROXY=forward_proxy.url)
    assert status == 0, err
    assert f"CONNECT 127.0.0.1:{tls_server.port}" in _new_lines(forward_proxy, before)
    assert out["proxy"] == forward_proxy.url
    assert out["http_version"] == "HTTP/2"  # ALPN with the server itself, end to end through the tunnel


def test_no_proxy_sends_the_target_past_the_proxy(
    forward_proxy: TinyProxy, tls_server: RunningServer, tmp_path: Path
) -> None:
    before = len(forward_proxy.requests())
    status, out, err = _ask(tls_server, tmp_path, HTTPS_PROXY=forward_proxy.url, NO_PROXY="127.0.0.1")
    assert status == 0, err
    assert out["proxy"] is None and out["http_version"] == "HTTP/2"
    assert _new_lines(forward_proxy, before) == []


def _settings(server: RunningServer, **http: Any) -> Settings:
    base = HttpSettings(warmup=False, verify=server.cert_path or True)
    return replace(Settings(), http=replace(base, **http))


async def test_the_tunnel_keeps_the_transport_s_own_connections(
    forward_proxy: TinyProxy, tls_server: RunningServer
) -> None:
    # GOAWAY handling and rotation live in _H2Connection: a tunnelled connection must be one, too.
    settings = _settings(tls_server, proxy=forward_proxy.url)
    async with ChatClient(settings, base_url=tls_server.base_url, model=MODEL, use_cache=False) as client:
        streams = [client.stream([{"role": "user", "content": "tunnel"}], max_tokens=8) for _ in range(3)]
        for stream in streams:
            async for _ in stream:
                pass
        pool = client.transport._clients[0]._transport._pool  # type: ignore[attr-defined]
        connections = list(pool.connections)
    assert connections and all(type(c) is T._TunnelConnection for c in connections)
    assert {type(c._connection) for c in connections} == {T._H2Connection}
    assert all(s.record.http_version == "HTTP/2" and s.record.proxy == forward_proxy.url for s in streams)
    # The tunnel's set-up is the record's connect, its TLS is the handshake with the server.
    first = streams[0].record
    assert first.connect_ms is not None and first.tls_ms is not None


async def test_proxy_credentials_are_sent_and_never_shown(
    tls_server: RunningServer, local_server: RunningServer, tmp_path: Path
) -> None:
    secret = "pr0xy-s3cret"
    proxy = start_proxy(tmp_path / "auth", connect_ports=(tls_server.port,), basic_auth=("alice", secret))
    try:
        wrong = _settings(tls_server, proxy=proxy.auth_url("alice", "wrong-one"))
        async with ChatClient(wrong, base_url=tls_server.base_url, model=MODEL, use_cache=False,
                              retry=RetrySettings(max_attempts=1)) as client:
            with pytest.raises(ConnectError) as caught:
                await client.complete([{"role": "user", "content": "hi"}], max_tokens=2)
        assert str(caught.value).startswith(
            f"the proxy http://alice:***@127.0.0.1:{proxy.port} (http.proxy) refused the request to "
            f"127.0.0.1:{tls_server.port} (401 Unauthorized); put the proxy's user and password in http.proxy")
        assert "wrong-one" not in str(caught.value)  # tinyproxy answers a CONNECT it will not take with 401

        right = _settings(tls_server, proxy=proxy.auth_url("alice", secret))
        async with ChatClient(right, base_url=tls_server.base_url, model=MODEL, use_cache=False) as client:
            reply = await client.complete([{"role": "user", "content": "hi"}], max_tokens=2)
        assert reply.record.http_version == "HTTP/2"
        assert reply.record.proxy == f"http://alice:***@127.0.0.1:{proxy.port}"
        assert secret not in json.dumps(reply.record.summary())
        assert f"CONNECT 127.0.0.1:{tls_server.port}" in proxy.requests()

        forward = _settings(local_server, proxy=proxy.auth_url("alice", secret), http2=False)
        async with ChatClient(forward, base_url=local_server.base_url, model=MODEL, use_cache=False) as client:
            reply = await client.complete([{"role": "user", "content": "hi"}], max_tokens=2)
        assert reply.text and f"POST {local_server.base_url}/chat/completions" in proxy.requests()
        assert secret not in proxy.log_text()  # nor did the proxy log what it checked
    finally:
        proxy.close()


async def test_a_port_the_proxy_does_not_allow_is_one_line_naming_the_proxy(
    forward_proxy: TinyProxy, local_server: RunningServer
) -> None:
    # forward_proxy allows CONNECT to the TLS server's port only (ConnectPort), as a corporate proxy would.
    settings = _settings(local_server, proxy=forward_proxy.url)
    url = local_server.base_url.replace("http://", "https://")
    async with ChatClient(settings, base_url=url, model=MODEL, use_cache=False,
                          retry=RetrySettings(max_attempts=1)) as client:
        with pytest.raises(ConnectError) as caught:
            await client.complete([{"role": "user", "content": "hi"}], max_tokens=2)
    message = str(caught.value)
    assert message.startswith(f"the proxy {forward_proxy.url} (http.proxy) refused the request to "
                              f"127.0.0.1:{local_server.port} (403 ")
    assert "\n" not in message
