"""`llmchat doctor` never contradicts itself (issue 21): every recommendation rests on figures the report
prints, nothing already in force or made unneeded is prescribed, one behaviour gets one verdict; it probes
with the provider's own [http] settings; and a server that answers the h2c preface in HTTP/1.1 (llama-server)
costs it seconds, not its whole budget.

The figures are read back from what the doctor prints (``--json``), independently of its own self-check
(``_consistency.contradictions``), which has unit tests of its own below."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

import peers as P
import pytest

from llmchat.core.config import HttpSettings, ProviderSettings, Settings
from llmchat.core.diagnose import Context, Finding, Report, run_battery
from llmchat.core.diagnose._consistency import contradictions, reconcile
from llmchat.core.server import RunningServer
from llmchat.tui.cli import main

Factory = Callable[..., RunningServer]
_MS = r"(\d+(?:\.\d+)?) ms"
#: Keys at their default value: prescribing one of them changes nothing.
_DEFAULTS = {"http": HttpSettings()}


def _json_doctor(capsys: pytest.CaptureFixture[str], base_url: str, *extra: str) -> dict[str, Any]:
    main(["doctor", "--base-url", base_url, "--yes", "--json", *extra])
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def _check_against_printed_figures(data: dict[str, Any]) -> list[str]:
    """What the printed report says against itself, read from its text alone."""
    wrong: list[str] = []
    findings = {f["check"]: f for f in data["findings"]}
    h2 = findings.get("connection.http2")
    if h2 is not None:
        m = re.search(rf"HTTP/1\.1 opened \d+ connections \({_MS} setup, {_MS} wall\), HTTP/2 \d+ \({_MS}, {_MS}",
                      h2["evidence"])
        assert m, h2["evidence"]
        h1_wall, h2_wall = float(m.group(2)), float(m.group(4))
        if "recommended" in h2["title"] or h2["changes"]:
            if not h2_wall < h1_wall:
                wrong.append(f"HTTP/2 recommended at {h2_wall} ms wall against HTTP/1.1's {h1_wall} ms")
            if h2["effect_ms"] is not None and round(h2["effect_ms"]) != round(h1_wall - h2_wall):
                wrong.append(f"HTTP/2 costs ~{h2['effect_ms']} ms, the printed difference is {h1_wall - h2_wall}")
    cost = findings.get("connection.new_cost")
    if cost is not None and cost["effect_ms"] is not None:
        m = re.search(rf"fastest {_MS} new vs {_MS} reused", cost["evidence"])
        assert m, cost["evidence"]
        if round(cost["effect_ms"]) != round(float(m.group(1)) - float(m.group(2))):
            wrong.append(f"a new connection costs ~{cost['effect_ms']} ms against {m.group(0)}")
    cold = findings.get("server.cold_start")
    if cold is not None and cold["mark"] == "warn":
        m = re.search(rf"first token {_MS} on the first request against a median {_MS}", cold["evidence"])
        load = re.search(rf"model load of {_MS}", cold["evidence"])
        assert m, cold["evidence"]
        said = {round(float(m.group(1)) - float(m.group(2)))} | ({round(float(load.group(1)))} if load else set())
        if round(cold["effect_ms"]) not in said:
            wrong.append(f"cold start costs ~{cold['effect_ms']} ms, the printed figures say {said}")
    for table, keys in data["changes"].items():
        section = table.rsplit(".", 1)[-1]
        for key, value in keys.items():
            default = _DEFAULTS.get(section)
            if default is not None and getattr(default, key, object()) == value:
                wrong.append(f"prescribes {table}.{key} = {value!r}, the default")
        if keys.get("max_requests_per_connection") == 1:
            for other in ("keepalive_ping_s", "warmup", "http2"):
                if other in keys:
                    wrong.append(f"prescribes max_requests_per_connection = 1 beside {other}")
    verdicts = [f["mark"] for f in data["findings"] if f["check"].startswith("connection.")
                and ("keep" in f["title"] or "closes the connection" in f["title"] or "survives" in f["title"])]
    if "pass" in verdicts and ({"warn", "fail"} & set(verdicts)):
        wrong.append(f"keep-alive is both [ ok ] and a failure: {verdicts}")
    return wrong


def test_every_recommendation_agrees_with_the_printed_figures(
    server_factory: Factory, capsys: pytest.CaptureFixture[str]
) -> None:
    server = server_factory(rtt_ms=40.0, cold_start_ms=400.0, close_after_stream=True)
    data = _json_doctor(capsys, server.base_url)
    assert _check_against_printed_figures(data) == []
    assert data["contradictions"] == []
    findings = {f["check"]: f for f in data["findings"]}
    # The faults are still each named: the close after every stream, the cold start, the costly connection.
    assert findings["connection.keepalive"]["mark"] == "warn"
    assert "3 of 3 streams" in findings["connection.keepalive"]["evidence"]
    assert findings["server.cold_start"]["mark"] == "warn"
    # The transport opens a fresh connection per request once it learnt the close: nothing to set for it.
    assert data["changes"] == {}


# -- a server that answers h2c in HTTP/1.1 and closes after every response, as llama-server does --------------
class _LlamaLike:
    """Raw asyncio HTTP/1.1 on 127.0.0.1: the h2c preface gets ``HTTP/1.1 400 Bad Request`` at once and the
    connection is held open (the client hears nothing it can read as HTTP/2 until its own timeout: main's
    doctor waited its whole 120 s there); every other request gets one answer (GET /models, a streamed or
    whole chat completion) and its connection is closed without a ``Connection: close`` header, as
    llama-server does after a stream. Bounded: a held connection ends when the client goes or at HOLD_CAP_S."""

    HOLD_CAP_S = 130.0

    def __init__(self) -> None:
        self.port = 0
        self.prefaces = 0
        self.requests = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True, name="llama-like-peer")
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()
        self._loop.run_until_complete(server.wait_closed())
        self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            if head.startswith(b"PRI * HTTP/2.0"):
                self.prefaces += 1
                writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
                await asyncio.wait_for(reader.read(), self.HOLD_CAP_S)  # until the client gives up
                return
            length = next((int(v) for k, _, v in (line.partition(b":") for line in head.split(b"\r\n")[1:])
                           if k.strip().lower() == b"content-length"), 0)
            body = await asyncio.wait_for(reader.readexactly(length), 5.0) if length else b""
            self.requests += 1
            writer.write(self._answer(head.split(b" ", 2)[1], body))
            await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _shutdown(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5.0)

    @staticmethod
    def _answer(path: bytes, body: bytes) -> bytes:
        if path.endswith(b"/models"):
            return P.json_response(200, {"object": "list", "data": [{"id": "peer-model", "object": "model"}]})
        if json.loads(body or b"{}").get("stream"):
            chunks = [P.event(P.delta(role="assistant", content="")),
                      *(P.event(P.delta(w)) for w in ("Hello", " there", "!")),
                      P.event(P.delta(finish_reason="stop")), P.event(P.usage_chunk(5, 3)), P.DONE, P.END]
            return P.SSE_HEAD + b"".join(chunks)
        return P.json_response(200, P.completion("Hi"))

    def __enter__(self) -> _LlamaLike:
        self._thread.start()
        assert self._ready.wait(5.0), "the peer did not start listening within 5 s"
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5.0)


@pytest.fixture
def llama_like() -> Iterator[_LlamaLike]:
    with _LlamaLike() as peer:
        yield peer


def _keepalive(report: Report) -> Finding:
    found = [f for f in report.findings if f.check == "connection.keepalive"]
    assert len(found) == 1, [f.check for f in report.findings]
    return found[0]


def test_an_h2c_preface_answered_in_http1_costs_seconds_not_the_budget(llama_like: _LlamaLike) -> None:
    ctx = Context(Settings(), base_url=llama_like.base_url)
    # Generous: main spent its whole 120 s budget on the h2c probe here.
    report = asyncio.run(asyncio.wait_for(run_battery(ctx), 60))
    assert llama_like.prefaces == 1 and report.elapsed_s < 60 and not report.interrupted
    path = report.measurements["path"]
    assert path["h2c"] is False and "h2c_error" in path
    f = _keepalive(report)
    assert f.mark in ("warn", "fail") and "closes the connection after every stream" in f.title
    assert report.measurements["streaming"]["succeeded"] == 4  # HTTP/1.1 went on and measured the streams
    assert not any("http2" in keys for keys in report.changes().values())
    assert report.contradictions == []


def test_a_configured_h2c_the_server_lacks_is_named_and_the_rest_measured_over_http1(
    llama_like: _LlamaLike,
) -> None:
    settings = Settings(http=HttpSettings(http2="h2c"))
    report = asyncio.run(asyncio.wait_for(run_battery(Context(settings, base_url=llama_like.base_url)), 60))
    h2c = next(f for f in report.findings if f.check == "path.h2c")
    assert h2c.mark == "fail" and h2c.changes == {("http",): {"http2": False}}
    assert llama_like.prefaces == 1  # one probe; every later request went out over HTTP/1.1
    assert report.measurements["streaming"]["succeeded"] == 4 and report.contradictions == []


# -- the provider's own [http] table --------------------------------------------------------------------------
def test_the_providers_own_http_table_reaches_every_probe(tls_server: RunningServer) -> None:
    assert tls_server.cert_path is not None
    settings = Settings(providers={"local": ProviderSettings(
        name="local", base_url=tls_server.base_url, http={"verify": tls_server.cert_path})})
    ctx = Context(settings, provider="local")
    assert ctx.http.verify == tls_server.cert_path  # as ChatClient resolves it, not global [http]'s True
    report = asyncio.run(asyncio.wait_for(run_battery(ctx), 60))
    path = report.measurements["path"]
    assert "tls_error" not in path and path["alpn"] == "h2", path
    tls = next(f for f in report.findings if f.check == "path.tls")
    assert tls.mark == "pass" and "HTTP/2 offered" in tls.title
    burst = report.measurements["connection"]["burst"]
    assert burst["http2"]["http_version"] == "HTTP/2" and burst["http2"]["connections_opened"] == 1


# -- the self-check and the reconciling, as units -------------------------------------------------------------
def _report(*findings: Finding) -> Report:
    report = Report(target="http://127.0.0.1:1/v1", provider="custom", model="m")
    report.findings = list(findings)
    return report


def test_the_self_check_catches_a_recommendation_its_figures_contradict() -> None:
    slower = Finding("connection", "connection.http2", "warn", "HTTP/2 recommended",
                     "HTTP/1.1 opened 4 connections (10 ms setup, 93 ms wall), HTTP/2 1 (1.0 ms, 277 ms wall)",
                     effect_ms=124.0, changes={("http",): {"http2": "h2c"}},
                     figures={"http1_wall_ms": 93.0, "http2_wall_ms": 277.0})
    found = contradictions(_report(slower), Settings(), HttpSettings())
    assert any("figures say otherwise" in line for line in found)
    assert any("costs ~124 ms but its figures differ by -184 ms" in line for line in found)
    unprinted = Finding("connection", "connection.new_cost", "warn", "a new connection costs 41 ms more",
                        "fastest 85 ms new vs 44 ms reused", effect_ms=41.0,
                        figures={"new_min_ms": 86.0, "reused_min_ms": 44.0})
    assert any("new_min_ms (86 ms) is not printed" in line
               for line in contradictions(_report(unprinted), Settings(), HttpSettings()))
    norule = Finding("path", "path.new", "warn", "something", effect_ms=5.0)
    assert contradictions(_report(norule), Settings(), HttpSettings()) == [
        "path.new: recommends with no rule to check it against its figures"]


def test_the_self_check_catches_two_verdicts_and_changes_in_force() -> None:
    ok = Finding("connection", "connection.keepalive", "pass", "keep-alive honoured")
    closes = Finding("connection", "connection.close_after_stream", "fail", "closes after every stream")
    warm = Finding("server", "server.idle", "warn", "cold again", "first token 900 ms, 800 ms over",
                   effect_ms=800.0, changes={("http",): {"warmup": True}}, figures={"extra_ms": 800.0})
    found = contradictions(_report(ok, closes, warm), Settings(), HttpSettings())
    assert any(line.startswith("keep-alive: both [ ok ]") for line in found)
    assert "prescribes http.warmup = true, already in force" in found


def test_reconcile_drops_defaults_and_what_another_change_makes_unneeded() -> None:
    close = Finding("connection", "connection.keepalive", "fail", "closes",
                    changes={("http",): {"max_requests_per_connection": 1}})
    cost = Finding("connection", "connection.new_cost", "warn", "costly",
                   changes={("http",): {"warmup": True, "keepalive_ping_s": 15.0}})
    out = reconcile([close, cost], Settings(), HttpSettings())
    assert out[0].changes == {("http",): {"max_requests_per_connection": 1}}
    assert out[1].changes == {}
    assert "warmup = true is already in force" in out[1].advice and "not keepalive_ping_s" in out[1].advice
    # HTTP/2 prescribed beside it: the retirement after each request is the one not needed.
    h2 = Finding("connection", "connection.http2", "warn", "HTTP/2", changes={("http",): {"http2": "h2c"}})
    close2 = Finding("connection", "connection.keepalive", "fail", "closes",
                     changes={("http",): {"max_requests_per_connection": 1}})
    out = reconcile([close2, h2], Settings(), HttpSettings())
    assert out[0].changes == {} and out[1].changes == {("http",): {"http2": "h2c"}}
    # A provider's own table: compared with the provider's effective settings, not global [http]'s.
    ping = Finding("server", "server.idle", "warn", "cold",
                   changes={("providers", "p", "http"): {"keepalive_ping_s": 5.0}})
    assert reconcile([ping], Settings(), HttpSettings(keepalive_ping_s=5.0))[0].changes == {}
