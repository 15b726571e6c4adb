"""Which proxy the transport uses (``resolve_proxy``), and what a user sees when one is in the way.

Resolution is a unit: environment against ``http.proxy`` against ``NO_PROXY`` against ``http.trust_env``,
read as httpx reads it (a parity table against httpx's own mounts). The rest uses scripted peers on
127.0.0.1 standing in for a proxy (tests/peers.py): a forward proxy that answers, one that asks for
credentials, a CONNECT that is refused, a port where nothing listens. The real proxy (tinyproxy) is in
tests/realpeer/test_proxy.py.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import httpx
import peers as P
import pytest

from llmchat.core import ChatClient, HttpSettings, RetrySettings, Settings
from llmchat.core.config import load_settings
from llmchat.core.diagnose import Context
from llmchat.core.diagnose._findings import Report
from llmchat.core.diagnose._path import proxy_route
from llmchat.core.diagnose._prescribe import prescribe
from llmchat.core.errors import ConfigError, ConnectError, TimeoutError
from llmchat.core.http import MockResponse, MockTransport, ProxyRoute, resolve_proxy

PeerMaker = Callable[..., P.Peer]
_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "REQUEST_METHOD")
ONE_TRY = RetrySettings(max_attempts=1)
SECRET = "s3cr3t-pw"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


def _env(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    for name, value in values.items():
        monkeypatch.setenv(name, value)


def _http(**kw: Any) -> HttpSettings:
    return HttpSettings(warmup=False, **kw)


# -- resolution --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "http", "url", "expected"),
    [
        ({}, {}, "https://api.example.com/v1", (None, "", "")),
        ({"HTTPS_PROXY": "http://p:3128"}, {}, "https://api.example.com/v1", ("http://p:3128", "HTTPS_PROXY", "")),
        # HTTPS_PROXY is for https:// targets only; an http:// one takes HTTP_PROXY, else ALL_PROXY.
        ({"HTTPS_PROXY": "http://p:3128"}, {}, "http://api.example.com/v1", (None, "", "")),
        ({"HTTP_PROXY": "http://h:1", "ALL_PROXY": "http://a:2"}, {}, "http://x.example/v1",
         ("http://h:1", "HTTP_PROXY", "")),
        ({"ALL_PROXY": "http://a:2"}, {}, "https://x.example/v1", ("http://a:2", "ALL_PROXY", "")),
        # Lower-case works, and wins over its upper-case twin (the standard library's rule).
        ({"https_proxy": "http://low:1"}, {}, "https://x.example/v1", ("http://low:1", "HTTPS_PROXY", "")),
        ({"https_proxy": "http://low:1", "HTTPS_PROXY": "http://up:2"}, {}, "https://x.example/v1",
         ("http://low:1", "HTTPS_PROXY", "")),
        # A bare host:port is an http:// proxy, as httpx reads it.
        ({"HTTPS_PROXY": "p.corp:8080"}, {}, "https://x.example/v1", ("http://p.corp:8080", "HTTPS_PROXY", "")),
        # http.proxy wins over the environment...
        ({"HTTPS_PROXY": "http://env:1"}, {"proxy": "http://mine:2"}, "https://x.example/v1",
         ("http://mine:2", "http.proxy", "")),
        # ... NO_PROXY still sends a host past it ...
        ({"NO_PROXY": "x.example"}, {"proxy": "http://mine:2"}, "https://x.example/v1", (None, "", "x.example")),
        # ... and trust_env = false takes nothing from the environment, NO_PROXY included.
        ({"HTTPS_PROXY": "http://env:1"}, {"trust_env": False}, "https://x.example/v1", (None, "", "")),
        ({"NO_PROXY": "*"}, {"proxy": "http://mine:2", "trust_env": False}, "https://x.example/v1",
         ("http://mine:2", "http.proxy", "")),
        # NO_PROXY: *, hosts, domains, subdomains only, ports, IPv4, IPv6, localhost, schemes.
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "*"}, {}, "https://x.example/v1", (None, "", "*")),
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "other.org, example.com"}, {}, "https://api.example.com/v1",
         (None, "", "example.com")),
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "example.com"}, {}, "https://example.com/v1",
         (None, "", "example.com")),
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "example.com"}, {}, "https://badexample.com/v1",
         ("http://p:1", "HTTPS_PROXY", "")),
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": ".example.com"}, {}, "https://example.com/v1",
         ("http://p:1", "HTTPS_PROXY", "")),
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": ".example.com"}, {}, "https://a.example.com/v1",
         (None, "", ".example.com")),
        ({"HTTP_PROXY": "http://p:1", "NO_PROXY": "127.0.0.1"}, {}, "http://127.0.0.1:8000/v1",
         (None, "", "127.0.0.1")),
        ({"HTTP_PROXY": "http://p:1", "NO_PROXY": "127.0.0.1"}, {}, "http://127.0.0.2:8000/v1",
         ("http://p:1", "HTTP_PROXY", "")),
        ({"HTTP_PROXY": "http://p:1", "NO_PROXY": "::1"}, {}, "http://[::1]:8000/v1", (None, "", "::1")),
        ({"HTTP_PROXY": "http://p:1", "NO_PROXY": "localhost"}, {}, "http://localhost:8000/v1",
         (None, "", "localhost")),
        ({"HTTP_PROXY": "http://p:1", "NO_PROXY": "example.com:8000"}, {}, "http://example.com:8000/v1",
         (None, "", "example.com:8000")),
        ({"HTTP_PROXY": "http://p:1", "NO_PROXY": "example.com:8000"}, {}, "http://example.com:9000/v1",
         ("http://p:1", "HTTP_PROXY", "")),
        # A port is the target's effective one: 443 is https://example.com's (httpx never matches this).
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "example.com:443"}, {}, "https://example.com/v1",
         (None, "", "example.com:443")),
        ({"ALL_PROXY": "http://p:1", "NO_PROXY": "http://example.com"}, {}, "https://example.com/v1",
         ("http://p:1", "ALL_PROXY", "")),
        ({"ALL_PROXY": "http://p:1", "NO_PROXY": "http://example.com"}, {}, "http://example.com/v1",
         (None, "", "http://example.com")),
        # An empty variable is unset.
        ({"HTTPS_PROXY": ""}, {}, "https://x.example/v1", (None, "", "")),
    ],
)
def test_the_route_comes_from_no_proxy_then_http_proxy_then_the_environment(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], http: dict[str, Any], url: str,
    expected: tuple[str | None, str, str],
) -> None:
    _env(monkeypatch, **env)
    route = resolve_proxy(_http(**http), url)
    assert (route.url, route.source, route.bypassed_by) == expected


#: (NO_PROXY, target): the cases where llmchat reads NO_PROXY exactly as httpx does.
_PARITY = [
    (no_proxy, url)
    for no_proxy in ("", "*", "example.com", ".example.com", "api.example.com", "127.0.0.1", "::1", "localhost",
                     "example.com:8443", "other.org,example.com", "http://example.com", "10.0.0.0/8", " example.com ")
    for url in ("https://example.com/v1", "https://api.example.com/v1", "http://example.com/v1",
                "https://badexample.com/v1", "http://127.0.0.1:8000/v1", "http://[::1]:8000/v1",
                "http://localhost:8000/v1", "https://example.com:8443/v1", "http://10.0.0.0/v1")
]


@pytest.mark.parametrize(("no_proxy", "url"), _PARITY)
def test_no_proxy_reads_as_httpx_reads_it(monkeypatch: pytest.MonkeyPatch, no_proxy: str, url: str) -> None:
    # httpx left to itself (no transport= given) mounts the environment's proxies: what it picks for the URL
    # is the reference. Its private _transport_for_url is the one name this reads; a release that drops it
    # fails here, not in llmchat.
    _env(monkeypatch, ALL_PROXY="http://proxy.invalid:3128", NO_PROXY=no_proxy)
    reference = httpx.AsyncClient(trust_env=True)
    assert hasattr(reference, "_transport_for_url"), "httpx.AsyncClient has no _transport_for_url any more"
    via_proxy = reference._transport_for_url(httpx.URL(url)) is not reference._transport
    route = resolve_proxy(_http(), url)
    assert (route.url is not None) == via_proxy, (no_proxy, url)


def test_a_route_never_shows_the_proxy_password() -> None:
    route = ProxyRoute(url=f"http://alice:{SECRET}@proxy.corp:3128", source="HTTPS_PROXY")
    assert route.shown == "http://alice:***@proxy.corp:3128"
    assert SECRET not in repr(route) and SECRET not in route.describe()
    assert route.credentials == ("alice", SECRET)
    assert (route.host, route.port, route.scheme) == ("proxy.corp", 3128, "http")
    encoded = ProxyRoute(url="http://a%40b:p%3Aw@p:1", source="http.proxy")
    assert encoded.credentials == ("a@b", "p:w")  # percent-decoded, as the proxy expects them
    assert ProxyRoute(bypassed_by="127.0.0.1").describe() == "none (NO_PROXY has 127.0.0.1)"


def test_a_socks_proxy_from_the_environment_is_one_line_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, ALL_PROXY=f"socks5://u:{SECRET}@127.0.0.1:1080")
    with pytest.raises(ConfigError) as caught:
        resolve_proxy(_http(), "https://x.example/v1")
    message = str(caught.value)
    assert message.startswith("ALL_PROXY names a SOCKS proxy (socks5://u:***@127.0.0.1:1080)")
    assert "http.trust_env to false" in message and SECRET not in message and "\n" not in message


def test_http_proxy_is_validated_and_its_password_never_shown() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(env={"LLMCHAT_HTTP__PROXY": f"socks5://u:{SECRET}@127.0.0.1:1080"})
    message = str(caught.value)
    assert "LLMCHAT_HTTP__PROXY must be an http:// proxy URL" in message
    assert SECRET not in message and "u:***@" in message
    ok = load_settings(env={"LLMCHAT_HTTP__PROXY": "http://127.0.0.1:3128"})
    assert ok.http.proxy == "http://127.0.0.1:3128"


# -- through a proxy: scripted peers on 127.0.0.1 ------------------------------------------------------------


def _dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed again: nothing listens there


def _client(base_url: str, proxy: str, **http: Any) -> ChatClient:
    settings = replace(Settings(), http=_http(proxy=proxy, **http))
    return ChatClient(settings, base_url=base_url, model="m", use_cache=False, retry=ONE_TRY)


@pytest.mark.parametrize("where", ["HTTP_PROXY", "http.proxy"])
async def test_an_http_target_goes_to_the_proxy_in_absolute_form(
    peer: PeerMaker, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    # The target's port has nothing on it: only a request that went to the proxy can be answered.
    proxy = peer([P.json_response(200, P.completion("via the proxy"))], then="keep")
    target = f"http://127.0.0.1:{_dead_port()}/v1"
    url = f"http://127.0.0.1:{proxy.port}"
    if where == "HTTP_PROXY":
        _env(monkeypatch, HTTP_PROXY=url)
    async with _client(target, url if where == "http.proxy" else "", http2=False) as client:
        reply = await client.complete([{"role": "user", "content": "hi"}], max_tokens=2)
    assert reply.text == "via the proxy" and proxy.requests == 1
    summary = reply.record.summary()
    assert summary["proxy"] == f"http://127.0.0.1:{proxy.port}" and summary["http_version"] == "HTTP/1.1"
    json.dumps(summary)  # the field is JSON as it is


async def test_a_refused_proxy_is_one_line_naming_it_masked() -> None:
    port = _dead_port()
    async with _client("https://api.example.com/v1", f"http://bob:{SECRET}@127.0.0.1:{port}") as client:
        with pytest.raises(ConnectError) as caught:
            await client.complete([{"role": "user", "content": "hi"}], max_tokens=2)
    message = str(caught.value)
    assert message.startswith(f"connection refused by the proxy http://bob:***@127.0.0.1:{port} (http.proxy)")
    assert "check http.proxy" in message and SECRET not in message and "\n" not in message
    assert "llmchat serve" not in message  # not the target's advice: the target was never reached


async def test_a_tunnel_the_proxy_refuses_names_the_proxy_and_the_fix(
    peer: PeerMaker, monkeypatch: pytest.MonkeyPatch
) -> None:
    refusal = b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n"
    proxy = peer([refusal])
    _env(monkeypatch, HTTPS_PROXY=f"http://bob:{SECRET}@127.0.0.1:{proxy.port}")
    settings = replace(Settings(), http=_http())
    async with ChatClient(settings, base_url="https://api.example.com/v1", model="m", use_cache=False) as client:
        with pytest.raises(ConnectError) as caught:
            await client.complete([{"role": "user", "content": "hi"}], max_tokens=2)
    message = str(caught.value)
    assert message == (
        f"the proxy http://bob:***@127.0.0.1:{proxy.port} (HTTPS_PROXY) refused the request to "
        "api.example.com:443 (407 Proxy Authentication Required); put the proxy's user and password in "
        "HTTPS_PROXY (http://user:password@host:port)"
    )
    assert proxy.requests == 1  # wrong credentials are not tried again (retries are on by default)


async def test_a_forward_proxy_asking_for_credentials_says_so(peer: PeerMaker) -> None:
    refusal = b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n"
    proxy = peer([refusal], then="keep")
    async with _client("http://api.example.com/v1", f"http://127.0.0.1:{proxy.port}", http2=False) as client:
        with pytest.raises(ConnectError) as caught:
            await client.complete([{"role": "user", "content": "hi"}], max_tokens=2)
    assert "(407 Proxy Authentication Required); put the proxy's user and password in http.proxy" in str(
        caught.value)


async def test_a_proxy_that_never_opens_the_tunnel_is_a_connect_timeout_naming_it(peer: PeerMaker) -> None:
    proxy = peer([], then="hang")
    async with _client("https://api.example.com/v1", f"http://127.0.0.1:{proxy.port}",
                       connect_timeout_s=0.3) as client:
        with pytest.raises(TimeoutError) as caught:
            await client.complete([{"role": "user", "content": "hi"}], max_tokens=2)
    assert caught.value.phase == "connect"
    assert str(caught.value).startswith(
        f"connecting to the proxy http://127.0.0.1:{proxy.port} (http.proxy) timed out after 0.3 s")


async def test_the_record_names_the_transport_s_proxy() -> None:
    transport = MockTransport(lambda request: MockResponse.json(P.completion("ok")))
    transport.proxy = "http://u:***@proxy:3128"
    async with ChatClient(transport=transport, model="m", use_cache=False) as client:
        reply = await client.complete([{"role": "user", "content": "hi"}])
    assert reply.record.summary()["proxy"] == "http://u:***@proxy:3128"


# -- the doctor reports the transport's route ------------------------------------------------------------------


def _ctx(url: str, **http: Any) -> Context:
    ctx = Context(settings=replace(Settings(), http=_http(**http)), base_url=url, model="m")
    ctx.describe(ctx.client())
    return ctx


def test_the_doctor_reports_the_proxy_the_transport_uses(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, HTTPS_PROXY=f"http://u:{SECRET}@proxy.corp:3128", NO_PROXY="127.0.0.1")
    through = proxy_route(_ctx("https://api.example.com/v1"))
    assert through == {"proxy": "http://u:***@proxy.corp:3128", "source": "HTTPS_PROXY", "bypassed_by": None}
    # NO_PROXY wins for the local server; HTTPS_PROXY is not even the variable for an http:// target.
    assert proxy_route(_ctx("https://127.0.0.1:8443/v1"))["bypassed_by"] == "127.0.0.1"
    assert proxy_route(_ctx("http://api.example.com/v1"))["proxy"] is None
    assert proxy_route(_ctx("https://api.example.com/v1", trust_env=False))["proxy"] is None


def test_the_doctor_s_finding_says_which_proxy_and_where_it_came_from(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, HTTPS_PROXY=f"http://u:{SECRET}@proxy.corp:3128")
    report = Report(target="https://api.example.com/v1", provider="p", model="m")
    report.measurements["path"]["proxy"] = proxy_route(_ctx("https://api.example.com/v1"))
    findings = [f for f in prescribe(report, Settings(), scheme="https", http2_setting=True)
                if f.check == "path.proxy"]
    assert [f.title for f in findings] == ["requests go through the proxy http://u:***@proxy.corp:3128 (HTTPS_PROXY)"]
    assert SECRET not in json.dumps([f.to_dict() for f in findings])


def test_the_metrics_scrape_goes_through_the_provider_s_proxy() -> None:
    from llmchat.core.client._server_metrics import metrics_transport

    transport = metrics_transport("http://gpu.corp:8000/metrics", _http(proxy="http://proxy.corp:3128"))
    assert transport.route.url == "http://proxy.corp:3128" and transport.proxy == "http://proxy.corp:3128"
