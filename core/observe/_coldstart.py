"""Spotting a cold start: a first token far slower than usual for this provider and model, right after idle.

Servers that load models on demand (Ollama, llama.cpp's router, serverless endpoints, ``llmchat serve
--cold-start-ms --idle-unload-s``) unload a model left idle and pay the load again on the next request. The
detector keeps, per (provider, model), a rolling window of time-to-first-token samples and the end of the
last request, and flags a request as a likely cold start when both hold:

- it began after at least ``idle_s`` of silence (no request of that provider and model ended in between), or
  it is the first since ``reset()``;
- its time to first token is at least ``factor`` times the median of the window, which needs at least
  ``MIN_SAMPLES`` samples.

A request whose server reported loading the model (llmchat serve's ``model_load_ns``) is a cold start
whatever the window says: the server knows.

A new process starts with no window, so its first request (the one most likely to be cold) could never be
flagged. ``baselines()`` exports each window with the wall-clock end of its last request, ``seed()`` takes
them into a new detector (``BaselineStore`` keeps them in a file between processes); a seeded track measures
its first silence on the records' wall clock (``wall_start``), since perf_counter stamps of another process
mean nothing here. A baseline also names the server's host:port: a seeded window is dropped when the first
request here goes elsewhere (``--base-url`` gives every URL the one provider name "custom").

The sample is the server's own time to first token when the server reports one (its queue plus prefill),
else the client's TTFT (stream mode) or total (batch mode); reported and measured samples are kept apart, so
one is never compared with the other. A flagged sample stays out of the window, so one cold start does not
raise the bar for spotting the next. Cache hits, cancelled and failed requests add no sample (a failed one
still counts as traffic). Pure: time comes from the records' own stamps, no clock is read.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from llmchat.core.observe._server_reports import ServerReport, read_server_report
from llmchat.core.observe._timing import TimingRecord

MIN_SAMPLES = 3
BASES = ("server", "client")
"""What a sample is measured from: the server's own report, or the client's clock."""
_NS_PER_MS = 1_000_000


@dataclass(frozen=True, slots=True)
class Baseline:
    """One provider and model's window, to outlive the process: the samples (ms) per basis, oldest first, and
    when the last request ended (``time.time()`` seconds; None when unknown)."""

    provider: str
    model: str
    samples: Mapping[str, tuple[float, ...]]
    last_end_wall: float | None = None
    host: str = ""
    """The server's host:port the samples came from ("" when unknown)."""


@dataclass(slots=True)
class _Track:
    window: int
    samples: dict[str, deque[float]] = field(default_factory=dict)
    last_end_ns: int | None = None
    last_end_wall: float | None = None
    """The wall-clock end of the last request; all a seeded track knows until its first request here."""
    host: str = ""

    def series(self, basis: str) -> deque[float]:
        found = self.samples.get(basis)
        if found is None:
            found = self.samples[basis] = deque(maxlen=self.window)
        return found


def ttft_sample(record: TimingRecord, report: ServerReport | None = None) -> tuple[str, float] | None:
    """The sample the detector uses for ``record``: ("server", ms) when the server reported its time to first
    token, else ("client", TTFT ms) in stream mode or ("client", total ms) otherwise; None when there is none.
    ``report``: ``read_server_report(record)``, when the caller has it already.
    """
    reported = (report or read_server_report(record)).ttft_ns
    if reported is not None:
        return "server", reported / _NS_PER_MS
    measured = record.ttft_ms if record.mode == "stream" else record.total_ms
    return None if measured is None else ("client", measured)


class ColdStartDetector:
    """Flags likely cold starts per (provider, model); see the module docstring for the rule.

    ``window``: samples kept per provider and model; ``factor``: how many times the rolling median a first
    token must take; ``idle_s``: the silence that lets a model be unloaded. Raises ValueError for a window
    under ``MIN_SAMPLES``, a factor not above 1 or a negative idle time.
    """

    def __init__(self, window: int = 20, factor: float = 3.0, idle_s: float = 60.0) -> None:
        if window < MIN_SAMPLES:
            raise ValueError(f"window must be at least {MIN_SAMPLES}, got {window}")
        if not factor > 1.0:
            raise ValueError(f"factor must be above 1, got {factor}")
        if idle_s < 0:
            raise ValueError(f"idle_s must be non-negative, got {idle_s}")
        self.window = window
        self.factor = factor
        self.idle_s = idle_s
        self._tracks: dict[tuple[str, str], _Track] = {}

    def observe(self, record: TimingRecord) -> bool:
        """Take a finished request into account; True when it looks like a cold start. Never raises.

        Call it once per record, in the order requests finish.
        """
        if record.cache_hit or record.end_ns is None:
            return False
        key = (record.provider, record.model)
        track = self._tracks.get(key)
        if track is None:
            track = self._tracks[key] = _Track(self.window)
        if track.last_end_ns is not None:
            after_idle = record.t0_ns - track.last_end_ns >= self.idle_s * 1e9
        else:
            if track.host and record.host and track.host != record.host:
                track = self._tracks[key] = _Track(self.window)  # seeded from another server: not ours
            after_idle = track.last_end_wall is None or record.wall_start - track.last_end_wall >= self.idle_s
        track.host = record.host or track.host
        track.last_end_ns = max(track.last_end_ns or 0, record.end_ns)
        end_wall = record.wall_start + (record.end_ns - record.t0_ns) / 1e9
        track.last_end_wall = max(track.last_end_wall or 0.0, end_wall)
        if record.error or record.cancelled:
            return False
        report = read_server_report(record)
        if report.load_ns:
            return True  # the server says it loaded the model; the sample stays out of the window
        sample = ttft_sample(record, report)
        if sample is None:
            return False
        basis, value = sample
        series = track.series(basis)
        cold = after_idle and len(series) >= MIN_SAMPLES and value >= self.factor * statistics.median(series)
        if not cold:
            series.append(value)
        return cold

    def median(self, provider: str, model: str, basis: str = "server") -> float | None:
        """The rolling median TTFT (ms) of ``basis`` ("server" or "client") samples; None without samples."""
        track = self._tracks.get((provider, model))
        series = None if track is None else track.samples.get(basis)
        return statistics.median(series) if series else None

    def reset(self, provider: str | None = None, model: str | None = None) -> None:
        """Forget when the last request ended (for one provider and model, or all), keeping the samples: the
        next request counts as coming after idle, e.g. after the user restarted or switched the server."""
        for (p, m), track in self._tracks.items():
            if (provider is None or p == provider) and (model is None or m == model):
                track.last_end_ns = None
                track.last_end_wall = None

    def baselines(self) -> list[Baseline]:
        """Every provider and model's window and last end, to seed a detector in another process."""
        return [
            Baseline(p, m, {b: tuple(s) for b, s in t.samples.items() if s}, t.last_end_wall, t.host)
            for (p, m), t in self._tracks.items()
            if any(t.samples.values()) or t.last_end_wall is not None
        ]

    def seed(self, baselines: Iterable[Baseline]) -> None:
        """Take in windows from another process (``baselines()`` there, kept by a ``BaselineStore``). A
        provider and model this detector has already seen a request of keeps its own; the newest ``window``
        samples of the others are kept, and an unknown basis or a non-finite or negative sample is skipped."""
        for baseline in baselines:
            key = (baseline.provider, baseline.model)
            if key in self._tracks and self._tracks[key].last_end_ns is not None:
                continue
            track = self._tracks[key] = _Track(self.window, last_end_wall=baseline.last_end_wall,
                                               host=baseline.host)
            for basis in BASES:
                values = [v for v in baseline.samples.get(basis, ()) if 0 <= v < float("inf")]
                if values:
                    track.series(basis).extend(values[-self.window:])
