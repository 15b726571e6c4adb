"""A real forward proxy for the real-peer tier: tinyproxy (Debian's ``tinyproxy``) on 127.0.0.1.

- ``forward_proxy`` (session): one tinyproxy on a free port that forwards plain HTTP and opens CONNECT tunnels
  to the port of the session's ``tls_server`` (``ConnectPort``; any other port is refused with 403, as a
  corporate proxy refuses what it does not allow). ``.url``, ``.log_text()``, ``.requests()`` (the request
  lines it logged: ``"POST http://127.0.0.1:PORT/v1/chat/completions"``, ``"CONNECT 127.0.0.1:PORT"``).
- ``TinyProxy(prefix, connect_ports=..., basic_auth=(user, password))`` for a test that needs another one
  (with proxy authentication, say); ``close()`` stops it.

A missing binary fails the test that needs it with one line naming the package; nothing here skips.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from processes import last_line, listening, stop, wait_started

from llmchat.core.server import RunningServer

_CONFIG = """\
Port {port}
Listen 127.0.0.1
Timeout 30
MaxClients 50
LogFile "{log}"
LogLevel Info
PidFile "{pid}"
Allow 127.0.0.1
DisableViaHeader Yes
{extra}
"""
#: tinyproxy's line for each request it takes: "Request (file descriptor 7): CONNECT 127.0.0.1:4433 HTTP/1.1".
_REQUEST_LINE = re.compile(r"Request \(file descriptor \d+\): (\S+ \S+) HTTP/1\.[01]")


class ProxyUnavailable(Exception):
    """tinyproxy is not installed or did not start: the message says which, and what to do."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class TinyProxy:
    """A running tinyproxy in the foreground; ``connect_ports`` are the ports CONNECT may reach (none: CONNECT
    is refused everywhere), ``basic_auth`` a (user, password) it demands (407 without)."""

    def __init__(self, prefix: Path, *, connect_ports: Sequence[int] = (),
                 basic_auth: tuple[str, str] | None = None, ready_s: float = 15.0) -> None:
        binary = shutil.which("tinyproxy") or ("/usr/bin/tinyproxy" if Path("/usr/bin/tinyproxy").exists() else None)
        if binary is None:
            raise ProxyUnavailable("tinyproxy is missing: apt-get install tinyproxy (the Debian package)")
        prefix.mkdir(parents=True, exist_ok=True)
        self.prefix = prefix
        self.port = free_port()
        self.basic_auth = basic_auth
        # Without any ConnectPort line tinyproxy allows CONNECT to every port: a port nobody uses keeps it shut.
        lines = [f"ConnectPort {p}" for p in connect_ports] or ["ConnectPort 1"]
        if basic_auth is not None:
            lines.append(f"BasicAuth {basic_auth[0]} {basic_auth[1]}")
        self._log = prefix / "tinyproxy.log"
        self._log.touch()
        config = prefix / "tinyproxy.conf"
        config.write_text(_CONFIG.format(port=self.port, log=self._log, pid=prefix / "tinyproxy.pid",
                                         extra="\n".join(lines)))
        self._out = open(prefix / "stderr.log", "ab")  # noqa: SIM115  # closed in close()
        self.process = subprocess.Popen([binary, "-d", "-c", str(config)], stdout=self._out,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            self._wait_ready(ready_s)
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``, without the credentials (see ``auth_url``)."""
        return f"http://127.0.0.1:{self.port}"

    def auth_url(self, user: str, password: str) -> str:
        return f"http://{user}:{password}@127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self._log.read_text(errors="replace")

    def requests(self) -> list[str]:
        """The request lines tinyproxy logged, oldest first (method and target)."""
        return [str(line) for line in _REQUEST_LINE.findall(self.log_text())]

    def _wait_ready(self, ready_s: float) -> None:
        failed = wait_started(self.process, lambda: listening(self.port), "tinyproxy",
                              lambda: last_line(self.prefix / "stderr.log"), ready_s)
        if failed:
            raise ProxyUnavailable(f"{failed} (127.0.0.1:{self.port})")

    def close(self) -> None:
        stop(self.process)
        self._out.close()


def start_proxy(prefix: Path, **options: object) -> TinyProxy:
    """A ``TinyProxy`` (``options`` as its keywords), or the test fails with the one line that says why."""
    try:
        return TinyProxy(prefix, **options)  # type: ignore[arg-type]
    except ProxyUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def forward_proxy(tls_server: RunningServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyProxy]:
    proxy = start_proxy(tmp_path_factory.mktemp("tinyproxy"), connect_ports=(tls_server.port,))
    yield proxy
    proxy.close()
