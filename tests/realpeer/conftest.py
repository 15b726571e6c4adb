"""The real-peer tier: llmchat against parts nobody here wrote, each started on 127.0.0.1 and stopped after.

Run it with ``scripts/realpeer`` (what CI runs after README's test command), or ``pytest tests/realpeer``
once the parts are on the machine; a run that names no file or folder in here leaves the tier out
(tests/conftest.py), so README's test command does not build a C++ server.

- ``llama_server``: llama.cpp's own llama-server (built from source by ``llamacpp.py``, cached per machine)
  with a tiny random-weight model; ``.root``, ``.base_url``, ``.model``, ``.n_ctx`` (512 tokens a slot, two
  slots), ``.log_text()``. One for the session: tests that need other options use ``llama_factory``.
- ``llama_factory``: ``make(n_ctx=..., parallel=..., extra=(...)) -> LlamaServer``, stopped at teardown.
- ``nginx``: nginx in front of ``llama_server`` on three listeners (``.tls_url`` h2 by ALPN, ``.h2c_url``,
  ``.h1_url``, ``.ca_file``, ``.access_log_text()``): see ``nginx_peer.py``.
- ``nginx_factory``: ``make(server) -> Nginx`` in front of another llama-server (``llama_factory``'s).
- ``forward_proxy``: tinyproxy on 127.0.0.1 (``.url``, ``.log_text()``, ``.requests()``), tunnelling only to the
  session's ``tls_server``: see ``proxy_fixture.py``.

A part that cannot be had fails the test that needs it with one line naming the part and the fix; nothing
here skips.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from llamacpp import Build, LlamaServer, PeerUnavailable, ensure_built, ensure_model
from nginx_peer import Nginx
from proxy_fixture import forward_proxy

__all__ = ["forward_proxy"]  # tinyproxy, session-wide (proxy_fixture.py), for every test of the tier


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.realpeer)


def _need(make: Callable[[], Any]) -> Any:
    try:
        return make()
    except PeerUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def llama_build() -> tuple[Build, Path]:
    build: Build = _need(ensure_built)
    model: Path = _need(lambda: ensure_model(build))
    return build, model


@pytest.fixture(scope="session")
def llama_server(
    llama_build: tuple[Build, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LlamaServer]:
    build, model = llama_build
    log = tmp_path_factory.mktemp("llama") / "server.log"
    server: LlamaServer = _need(lambda: LlamaServer(build, model, log))
    yield server
    server.close()


@pytest.fixture
def llama_factory(
    llama_build: tuple[Build, Path], tmp_path: Path
) -> Iterator[Callable[..., LlamaServer]]:
    build, model = llama_build
    started: list[LlamaServer] = []

    def make(**options: Any) -> LlamaServer:
        log = tmp_path / f"llama-{len(started)}.log"
        server: LlamaServer = _need(lambda: LlamaServer(build, model, log, **options))
        started.append(server)
        return server

    yield make
    for server in started:
        server.close()


@pytest.fixture(scope="session")
def nginx(llama_server: LlamaServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nginx]:
    prefix = tmp_path_factory.mktemp("nginx")
    proxy: Nginx = _need(lambda: Nginx(prefix, f"127.0.0.1:{llama_server.port}"))
    yield proxy
    proxy.close()


@pytest.fixture
def nginx_factory(tmp_path: Path) -> Iterator[Callable[[LlamaServer], Nginx]]:
    started: list[Nginx] = []

    def make(upstream: LlamaServer) -> Nginx:
        prefix = tmp_path / f"nginx-{len(started)}"
        proxy: Nginx = _need(lambda: Nginx(prefix, f"127.0.0.1:{upstream.port}"))
        started.append(proxy)
        return proxy

    yield make
    for proxy in started:
        proxy.close()
