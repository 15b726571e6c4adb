"""Shared fixtures: the local server, in this process on a real socket on 127.0.0.1.

- ``local_server``: one server for the whole session, profile ``instant``, plain http (HTTP/1.1 and h2c).
  Stateless enough to share: no rate limit, no faults, no cold start.
- ``tls_server``: the same over https with a self-signed certificate; ``.cert_path`` is the PEM to trust.
- ``server_factory``: ``make(**overrides) -> RunningServer`` for a server with its own settings
  (ServerSettings field names, ``profile`` included; the port defaults to 0); all are closed at teardown.
- ``http``: ``make(server=local_server) -> httpx.Client`` on a server's base URL, closed at teardown.
- ``sigint_inheritable``: a child process started in the test sees Ctrl-C (SIGINT handled, not ignored).
- ``terminals``: the installed ``llmchat`` in pseudo-terminals read by a terminal emulator
  (tests/terminal.py).

The real-peer tier (tests/realpeer: llama-server, nginx, a forward proxy, OpenAI's SDK) is collected only when
the command line names it or something in it (``pytest tests/realpeer``, ``scripts/realpeer``): a plain run,
README's test command, leaves it out, since its parts are built or installed first.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import peers as P
import pytest

from llmchat.core.server import RunningServer, resolve_settings, start_in_thread

if TYPE_CHECKING:
    from terminal import TerminalSession


_REALPEER = Path(__file__).parent / "realpeer"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if collection_path != _REALPEER:
        return None
    base = config.invocation_params.dir
    for arg in config.args:
        named = (base / arg.split("::", 1)[0]).resolve()
        if named == _REALPEER or _REALPEER in named.parents:
            return None
    return True


@pytest.fixture(autouse=True)
def _no_user_state(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reads or writes the real user's config, cache, history or state (cold-start baselines), or
    sees a real API key."""
    home = tmp_path_factory.mktemp("xdg")
    for var in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
        monkeypatch.setenv(var, str(home / var.lower()))
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "LLMCHAT_CONFIG", "LLMCHAT_DEFAULT_PROVIDER"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="session")
def local_server() -> Iterator[RunningServer]:
    with start_in_thread(resolve_settings({"port": 0, "profile": "instant"})) as server:
        yield server


@pytest.fixture(scope="session")
def tls_server() -> Iterator[RunningServer]:
    with start_in_thread(resolve_settings({"port": 0, "profile": "instant", "tls": True})) as server:
        yield server


@pytest.fixture
def server_factory() -> Iterator[Callable[..., RunningServer]]:
    servers: list[RunningServer] = []

    def make(**overrides: Any) -> RunningServer:
        server = start_in_thread(resolve_settings({"port": 0, **overrides}))
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


@pytest.fixture
def http(local_server: RunningServer) -> Iterator[Callable[..., httpx.Client]]:
    """``make(server=local_server) -> httpx.Client``: a plain client on a server's base URL (10 s timeout),
    for tests that read serve's wire as it is; every client is closed at teardown."""
    made: list[httpx.Client] = []

    def make(server: RunningServer = local_server) -> httpx.Client:
        client = httpx.Client(base_url=server.base_url, timeout=10.0)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


@pytest.fixture
def peer() -> Iterator[Callable[..., P.Peer]]:
    """``make(steps, **kw) -> Peer``: a scripted raw HTTP/1.1 peer (tests/peers.py), closed at teardown."""
    made: list[P.Peer] = []

    def make(steps: list[P.Step], **kw: Any) -> P.Peer:
        p = P.Peer(steps, **kw).start()
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


@pytest.fixture
def terminals(tmp_path: Path) -> Iterator[TerminalSession]:
    """A TerminalSession (tests/terminal.py): the installed `llmchat` in pseudo-terminals read by pyte, with
    XDG folders of its own under tmp_path; every terminal is closed and its processes reaped at teardown."""
    from terminal import TerminalSession

    session = TerminalSession(tmp_path / "xdg")
    yield session
    session.close()


@pytest.fixture
def sigint_inheritable() -> Iterator[None]:
    # A child inherits an *ignored* SIGINT (a shell's background job has one) and would then never see Ctrl-C;
    # a handled one is reset to the default at exec, which is what the child must start with.
    previous = signal.getsignal(signal.SIGINT)
    if previous == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    if previous == signal.SIG_IGN:
        signal.signal(signal.SIGINT, previous)
