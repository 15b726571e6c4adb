"""Cold-start baselines that outlive the process: a small JSON file in the XDG state folder.

A new process has no rolling window of first-token times, so the request most likely to be a cold start (the
first one, after the model sat idle) could never be flagged. ``BaselineStore`` keeps each provider and
model's window (``ColdStartDetector.baselines()``) in ``$XDG_STATE_HOME/llmchat/coldstart.json`` (default
``~/.local/state/llmchat/``), and the next process seeds its detector from it.

What the file holds: per provider name and model name, the server's host:port, the recent first-token
samples in milliseconds (server-reported and client-measured apart) and the wall-clock end of the last
request. Never a URL path, a header or a key. It is bounded (``MAX_TRACKS`` provider/model pairs, the
newest kept; ``MAX_SAMPLES`` samples each; names up to ``MAX_NAME`` characters), written atomically (a
temporary file in the same folder, then a rename, mode 0600), and merged on save with what another process
wrote meanwhile (per pair, the newer wins).

A missing file is an empty store. A corrupt, unreadable or unwritable one is ignored with one warning per
store, never an exception: a baseline is a hint, not worth a failed request. The file is read and written
synchronously; from an event loop use ``aload`` / ``asave``, which run in the default executor.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from llmchat.core.observe._coldstart import BASES, Baseline

log = logging.getLogger("llmchat.coldstart")

FILE_NAME = "coldstart.json"
VERSION = 1
MAX_TRACKS = 64
MAX_SAMPLES = 50
MAX_NAME = 200
#: A file bigger than this is not ours (the bounds above keep it under ~100 KiB).
MAX_BYTES = 1 << 20


def default_state_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_STATE_HOME/llmchat``, where an unset, empty or relative XDG_STATE_HOME means ``~/.local/state``
    as the XDG spec says. Pure: touches no file."""
    env = os.environ if env is None else env
    home = Path(env.get("HOME") or Path.home())
    xdg = env.get("XDG_STATE_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else home / ".local" / "state"
    return base / "llmchat"


class BaselineStore:
    """The baselines file at ``path`` (default: ``default_state_dir() / "coldstart.json"``).

    ``load()`` never raises and ``save()`` never raises; each warns at most once per store. Holds no state
    but the path and whether it has warned: the detector holds the windows.
    """

    def __init__(self, path: str | Path | None = None, *, env: Mapping[str, str] | None = None) -> None:
        self.path = Path(path) if path is not None else default_state_dir(env) / FILE_NAME
        self._warned = False

    def _warn(self, what: str, exc: BaseException | str) -> None:
        if not self._warned:
            self._warned = True
            reason = exc if isinstance(exc, str) else (getattr(exc, "strerror", None) or exc)
            if what == "ignored it":
                fix = "it is written anew at exit"
            else:
                fix = "check the folder's permissions, or point XDG_STATE_HOME at a writable one"
            log.warning("cold-start baselines %s: %s (%s), going on without them; %s",
                        self.path, what, reason, fix)

    def load(self) -> list[Baseline]:
        """The baselines in the file; [] when it is missing, and (with one warning) when it is unreadable or
        not a baselines file. Entries that do not make sense are skipped one by one."""
        raw = self._read()
        return [] if raw is None else _parse(raw)

    def _read(self) -> Any:
        try:
            with open(self.path, "rb") as f:
                data = f.read(MAX_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._warn("cannot read it", exc)
            return None
        if len(data) > MAX_BYTES:
            self._warn("ignored it", f"larger than {MAX_BYTES // 1024} KiB")
            return None
        try:
            raw = json.loads(data)
        except ValueError:
            self._warn("ignored it", "not JSON")
            return None
        ours = isinstance(raw, dict) and raw.get("version") == VERSION and isinstance(raw.get("tracks"), list)
        if not ours:
            self._warn("ignored it", f"not a version {VERSION} baselines file")
            return None
        return raw["tracks"]

    def save(self, baselines: Iterable[Baseline]) -> bool:
        """Write ``baselines`` merged with what the file holds now (per provider and model the one whose last
        request ended later wins), bounded. Returns whether the file was written; warns once if not."""
        merged: dict[tuple[str, str], Baseline] = {}
        on_disk = self._read()
        for baseline in [*(_parse(on_disk) if on_disk is not None else []), *baselines]:
            clean = _bounded(baseline)
            if clean is None:
                continue
            key = (clean.provider, clean.model)
            held = merged.get(key)
            if held is None or (clean.last_end_wall or 0.0) >= (held.last_end_wall or 0.0):
                merged[key] = clean
        newest = sorted(merged.values(), key=lambda b: b.last_end_wall or 0.0, reverse=True)[:MAX_TRACKS]
        text = json.dumps({"version": VERSION, "tracks": [_entry(b) for b in newest]},
                          separators=(",", ":"), allow_nan=False)
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".coldstart-", suffix=".tmp", dir=self.path.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(text)
                os.replace(tmp, self.path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as exc:
            self._warn("cannot write it", exc)
            return False
        return True

    async def aload(self) -> list[Baseline]:
        """``load`` in the default executor: the file never blocks an event loop."""
        return await asyncio.get_running_loop().run_in_executor(None, self.load)

    async def asave(self, baselines: Iterable[Baseline]) -> bool:
        """``save`` in the default executor."""
        snapshot = list(baselines)  # taken on the loop, where the detector lives
        return await asyncio.get_running_loop().run_in_executor(None, self.save, snapshot)


def _finite(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) and number >= 0 else None


def _parse(tracks: list[Any]) -> list[Baseline]:
    out = []
    for entry in tracks:
        if not isinstance(entry, dict):
            continue
        provider, model = entry.get("provider"), entry.get("model")
        if not isinstance(provider, str) or not isinstance(model, str):
            continue
        samples: dict[str, tuple[float, ...]] = {}
        for basis in BASES:
            values = entry.get(basis)
            if isinstance(values, list):
                kept = tuple(v for v in (_finite(x) for x in values) if v is not None)
                if kept:
                    samples[basis] = kept
        host = entry.get("host")
        baseline = _bounded(Baseline(provider, model, samples, _finite(entry.get("last_end")),
                                     host if isinstance(host, str) else ""))
        if baseline is not None:
            out.append(baseline)
    return out


def _bounded(baseline: Baseline) -> Baseline | None:
    """``baseline`` cut to the file's bounds; None when its names are too long or it says nothing."""
    if max(len(baseline.provider), len(baseline.model), len(baseline.host)) > MAX_NAME:
        return None
    samples = {b: tuple(baseline.samples[b][-MAX_SAMPLES:]) for b in BASES if baseline.samples.get(b)}
    if not samples and baseline.last_end_wall is None:
        return None
    return Baseline(baseline.provider, baseline.model, samples, baseline.last_end_wall, baseline.host)


def _entry(baseline: Baseline) -> dict[str, Any]:
    entry: dict[str, Any] = {"provider": baseline.provider, "model": baseline.model}
    if baseline.host:
        entry["host"] = baseline.host
    for basis, values in baseline.samples.items():
        entry[basis] = [round(v, 3) for v in values]
    if baseline.last_end_wall is not None:
        entry["last_end"] = round(baseline.last_end_wall, 3)
    return entry
