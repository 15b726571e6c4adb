"""llama.cpp's own llama-server for the real-peer tier, built here from source and run on 127.0.0.1.

The sources are the llama.cpp tree that the llama-cpp-python sdist vendors (``vendor/llama.cpp``, with
``tools/server``), so the one package registry this machine reaches is enough: the sdist is downloaded with
pip, only the server target is built (CPU, no native tuning, no curl/OpenSSL, no web UI download), and the
binary, llama.cpp's own ``gguf-py`` and one vocab file are kept in a cache folder keyed by the version.
A file lock makes parallel test workers (or a test and ``scripts/build-llama-server``) build it once.

The model is made here too (``tiny_model.py``): random weights around one of llama.cpp's vocab files, a chat
template set, small enough to answer in milliseconds on one core.

Everything that cannot be had raises :class:`PeerUnavailable` with one line naming the part and the fix;
the tier's fixtures turn that into a failed test, never a skip.

As a script (``scripts/build-llama-server``, which puts ``tests/`` on the path for ``processes``), ``build``
builds (or finds) the server and the model and prints their paths.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from processes import last_line, stop, wait_started

#: The llama-cpp-python release whose vendored llama.cpp is built. Raising it rebuilds into a new folder.
LLAMA_CPP_PYTHON = "0.3.36"
#: The vocab llama.cpp ships for its own tokenizer tests: SentencePiece, 32,000 tokens (a 17 MB model).
VOCAB = "ggml-vocab-llama-spm.gguf"
#: Configure flags: a portable CPU build of the server alone; nothing fetched from the network at build time
#: (no curl, no prebuilt web UI), so it builds where only the package registries are reachable.
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DGGML_OPENMP=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
)


class PeerUnavailable(RuntimeError):
    """A real part of the tier could not be had; the message is one line naming it and the fix."""


def cache_root() -> Path:
    """Where built peers are kept: ``$LLMCHAT_PEERS_CACHE``, else ``~/.cache/llmchat-peers``.

    Not ``$XDG_CACHE_HOME``: the suite points that at a temporary folder per test, and a build is per machine.
    """
    configured = os.environ.get("LLMCHAT_PEERS_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "llmchat-peers"


@dataclass(frozen=True)
class Build:
    """A built llama-server and what making its model needs."""

    folder: Path

    @property
    def server(self) -> Path:
        return self.folder / "llama-server"

    @property
    def gguf_py(self) -> Path:
        return self.folder / "gguf-py"

    @property
    def vocab(self) -> Path:
        return self.folder / VOCAB

    @property
    def stamp(self) -> Path:
        return self.folder / "built.json"

    def ready(self) -> bool:
        return self.stamp.is_file() and self.server.is_file() and self.vocab.is_file()

    def model(self) -> Path:
        return self.folder / "tiny-model.gguf"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run(argv: list[str], log: Path, what: str, cwd: Path | None = None) -> None:
    with open(log, "a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        done = subprocess.run(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
        raise PeerUnavailable(f"llama-server: {what} failed (exit {done.returncode}; log {log}): {tail[0][:200]}")


def _download_sdist(python: str, into: Path, log: Path) -> Path:
    _run(
        [python, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
         f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(into)],
        log, f"downloading the llama-cpp-python {LLAMA_CPP_PYTHON} sdist with pip",
    )
    found = sorted(into.glob("llama_cpp_python-*.tar.gz"))
    if not found:
        raise PeerUnavailable(f"llama-server: pip left no llama-cpp-python sdist in {into} (log {log})")
    return found[0]


def _extract_llama_cpp(sdist: Path, into: Path) -> Path:
    """Unpack only ``vendor/llama.cpp`` of the sdist (as data: no links out of the folder, no devices)."""
    prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp/"
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if m.name.startswith(prefix)]
        if not members:
            raise PeerUnavailable(f"llama-server: {sdist.name} has no vendor/llama.cpp")
        archive.extractall(into, members=members, filter="data")
    return into / prefix


def ensure_built(python: str = sys.executable) -> Build:
    """Build llama-server once per machine (under a lock) and return it; quick when already built.

    Raises :class:`PeerUnavailable` when cmake or a C++ compiler is missing, the download or the build fails.
    """
    build = Build(cache_root() / f"llama-cpp-python-{LLAMA_CPP_PYTHON}")
    if build.ready():
        return build
    for tool, package in (("cmake", "cmake"), ("c++", "g++")):
        if shutil.which(tool) is None:
            raise PeerUnavailable(f"llama-server: {tool} is missing to build it: apt-get install {package}")
    with _locked(build.folder.parent / f"{build.folder.name}.lock"):
        if build.ready():  # another worker built it while this one waited
            return build
        build.folder.mkdir(parents=True, exist_ok=True)
        log = build.folder / "build.log"
        log.write_text("")
        with tempfile.TemporaryDirectory(prefix="llama-build-", dir=build.folder.parent) as scratch:
            work = Path(scratch)
            source = _extract_llama_cpp(_download_sdist(python, work / "sdist", log), work / "src")
            out = work / "build"
            _run(["cmake", "-S", str(source), "-B", str(out), *CMAKE_FLAGS], log, "cmake's configure")
            jobs = str(os.cpu_count() or 2)
            _run(["cmake", "--build", str(out), "--target", "llama-server", "-j", jobs], log, "the build")
            shutil.copy2(out / "bin" / "llama-server", build.server)
            if build.gguf_py.exists():
                shutil.rmtree(build.gguf_py)
            shutil.copytree(source / "gguf-py", build.gguf_py)
            shutil.copy2(source / "models" / VOCAB, build.vocab)
        build.stamp.write_text(json.dumps({"llama-cpp-python": LLAMA_CPP_PYTHON, "cmake": CMAKE_FLAGS}))
    return build


def ensure_model(build: Build, python: str = sys.executable) -> Path:
    """Make the tiny model beside the build once (under the same lock); return its path."""
    model = build.model()
    if model.is_file():
        return model
    with _locked(build.folder.parent / f"{build.folder.name}.lock"):
        if model.is_file():
            return model
        env = {**os.environ, "PYTHONPATH": str(build.gguf_py)}
        script = Path(__file__).with_name("tiny_model.py")
        done = subprocess.run(
            [python, str(script), str(build.vocab), str(model)],
            env=env, capture_output=True, text=True, check=False, timeout=300,
        )
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or [""])[-1]
            missing = re.search(r"No module named '([^']+)'", done.stderr)
            if missing:
                raise PeerUnavailable(f"llama-server's model: the module {missing[1]} is missing (gguf-py needs it): "
                                      "pip install '.[peers]'")
            raise PeerUnavailable(f"llama-server's model could not be made: {last[:200]}")
    return model


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LlamaServer:
    """A running llama-server on 127.0.0.1; :meth:`close` stops it.

    ``root`` is the server's own root (``/props``, ``/health``, ``/tokenize``, ``/metrics``, ``/slots``);
    ``base_url`` is the OpenAI-compatible one (``root + "/v1"``). ``model`` is the name it answers to.
    """

    model = "tiny"

    def __init__(self, build: Build, model: Path, log: Path, *, n_ctx: int = 512, parallel: int = 2,
                 extra: tuple[str, ...] = (), ready_s: float = 60.0) -> None:
        self.port = free_port()
        self.n_ctx = n_ctx
        self.log = log
        argv = [
            str(build.server), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port),
            "--alias", self.model, "-c", str(n_ctx * parallel), "-np", str(parallel), "-t", "1",
            "--no-webui", "--metrics", "--slots", "--seed", "1", *extra,
        ]
        self._log_file = open(log, "ab")
        self.process = subprocess.Popen(argv, stdout=self._log_file, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL)
        try:
            self._wait_ready(ready_s)
        except BaseException:
            self.close()
            raise

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root}/v1"

    def log_text(self) -> str:
        self._log_file.flush()
        return self.log.read_text(errors="replace")

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.root}/health", timeout=2) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def _wait_ready(self, ready_s: float) -> None:
        self._log_file.flush()
        failed = wait_started(self.process, self._healthy, "llama-server", lambda: last_line(self.log), ready_s)
        if failed:
            raise PeerUnavailable(f"{failed} (log {self.log})")

    def close(self) -> None:
        stop(self.process)
        self._log_file.close()


def main(argv: list[str]) -> int:
    if argv != ["build"]:
        print("usage: llamacpp.py build", file=sys.stderr)
        return 2
    try:
        build = ensure_built()
        model = ensure_model(build)
    except PeerUnavailable as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"llama-server: {build.server}\nmodel: {model}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
