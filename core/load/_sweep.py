"""Load sweeps: one scenario at rising levels of load, each in turn, and where the server stops keeping up.

A sweep varies users (closed loop) or the arrival rate (open loop) over a list of levels, or doubles it from a
start until a stop condition (``auto``): the level after the knee, a server error rate of ``STOP_ERROR_RATE``
or more, a level that misses the SLO given, or ``max_levels``. Each level is a ``LoadRun`` of its own (its own
pool, sized for that level), so nothing of one level's connections carries into the next.

From the levels' figures:

- the **knee**: the last level before throughput stops growing while latency climbs, i.e. the first step up
  where requests/s grew by less than ``KNEE_GAIN`` of the load's own growth (1 is linear, 0 flat) while p50
  latency (TTFT when streaming, else end-to-end) rose by ``KNEE_LATENCY`` or more;
- the **highest level meeting the SLO**: the highest level, below any that misses, at which at least
  ``SLO_SHARE`` of the requests met every objective given (``SLO.met``) — so its p95 is within the objective;
- **saturation**: the first level at which the server queued requests: the p90 of the server's reported queue
  time (attribution's ``server_queue``) at ``QUEUE_MS`` or more, or the server's /metrics showing requests
  waiting.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from llmchat.core.errors import UsageError
from llmchat.core.load._run import LoadRun, Sample, Scenario, Target
from llmchat.core.load._stats import SLO, ConfigStats
from llmchat.core.observe import ColdStartDetector

Axis = Literal["users", "rate"]

KNEE_GAIN = 0.5
KNEE_LATENCY = 0.2
SLO_SHARE = 0.95
QUEUE_MS = 10.0
STOP_ERROR_RATE = 0.05
MAX_LEVELS = 8


@dataclass(frozen=True, kw_only=True)
class Sweep:
    """Which load to vary and over what: ``levels`` in order, or (``auto``) doubling from ``start``."""

    axis: Axis
    levels: tuple[float, ...] = ()
    auto: bool = False
    start: float = 1.0
    max_levels: int = MAX_LEVELS

    @classmethod
    def parse(cls, text: str, *, users: int | None, rate: float | None,
              max_levels: int = MAX_LEVELS) -> Sweep:
        """``users:1,2,4``, ``rate:5,10,20``, ``users:auto`` or ``rate:auto`` (doubling from ``--users`` /
        ``--rate``, else 1). Raises UsageError naming ``--sweep`` for anything else."""
        axis, sep, rest = text.partition(":")
        axis = axis.strip()
        if not sep or axis not in ("users", "rate"):
            raise UsageError(f"--sweep must be users:LIST, rate:LIST, users:auto or rate:auto, got {text!r} "
                             "(e.g. --sweep rate:5,10,20)")
        if max_levels < 2:
            raise UsageError(f"--sweep-max must be at least 2, got {max_levels}")
        if axis == "users" and rate is not None:
            raise UsageError("--sweep users:... varies the closed loop's users; drop --rate")
        if axis == "rate" and users is not None:
            raise UsageError("--sweep rate:... varies the open loop's rate; drop --users")
        if rest.strip() == "auto":
            start = float((users if axis == "users" else rate) or 1)
            return cls(axis=axis, auto=True, start=start, max_levels=max_levels)  # type: ignore[arg-type]
        try:
            levels = tuple(float(v) for v in rest.split(",") if v.strip())
        except ValueError:
            raise UsageError(f"--sweep: {rest!r} is not a comma-separated list of numbers "
                             "(e.g. --sweep rate:5,10,20)") from None
        if len(levels) < 2:
            raise UsageError("--sweep needs at least two levels, e.g. --sweep users:1,2,4 (or users:auto)")
        if any(not v > 0 for v in levels) or any(b <= a for a, b in zip(levels, levels[1:], strict=False)):
            raise UsageError(f"--sweep: levels must be positive and rising, got {rest}")
        if axis == "users" and any(v != int(v) for v in levels):
            raise UsageError(f"--sweep users: levels must be whole numbers of users, got {rest}")
        return cls(axis=axis, levels=levels, max_levels=max(max_levels, len(levels)))  # type: ignore[arg-type]

    def level(self, i: int) -> float:
        """The i-th level (0-based): from the list, or the start doubled i times."""
        if self.auto:
            v = self.start * 2**i
            return float(round(v)) if self.axis == "users" else v
        return self.levels[i]

    @property
    def count(self) -> int:
        """How many levels at most."""
        return self.max_levels if self.auto else len(self.levels)

    def scenario(self, base: Scenario, level: float) -> Scenario:
        """``base`` at ``level``: so many users, or so many requests/s."""
        if self.axis == "users":
            return dataclasses.replace(base, users=int(level), rate=0.0)
        return dataclasses.replace(base, rate=level)

    def label(self, level: float) -> str:
        return f"{int(level)} users" if self.axis == "users" else f"{level:g}/s"

    def to_json(self) -> dict[str, Any]:
        return {"axis": self.axis, "levels": list(self.levels), "auto": self.auto, "start": self.start,
                "max_levels": self.max_levels}


@dataclass(slots=True)
class Level:
    """One level of a sweep: its load, its figures, and the server's /metrics over it (``summarize_snapshots``
    of the scrapes, None without a metrics_url)."""

    level: float
    stats: ConfigStats
    waiting_max: float | None = None

    def latency_p50(self, mode: str) -> float | None:
        return self.stats.latency["ttft" if mode == "stream" else "e2e"]["p50"]

    @property
    def slo_share(self) -> float | None:
        """The share of the level's requests that met every objective; None with no SLO given."""
        s = self.stats
        if not s.slo.given:
            return None
        return s.good / s.requests if s.requests else 0.0

    @property
    def meets_slo(self) -> bool | None:
        share = self.slo_share
        return None if share is None else share >= SLO_SHARE

    @property
    def queue_p90_ms(self) -> float | None:
        part = self.stats.attribution.get("server_queue")
        return None if part is None else part.get("p90")

    @property
    def queued(self) -> bool:
        """Whether the server's reported queue time p90 reached ``QUEUE_MS``."""
        q = self.queue_p90_ms
        return q is not None and q >= QUEUE_MS

    @property
    def saturated(self) -> bool:
        """Whether the server queued requests at this level (its reported queue time, or its /metrics)."""
        return self.queued or (self.waiting_max is not None and self.waiting_max > 0)

    def to_json(self, mode: str) -> dict[str, Any]:
        share = self.slo_share
        return {"level": self.level, "figures": self.stats.to_json(),
                "slo_share": None if share is None else round(share, 4), "meets_slo": self.meets_slo,
                "server_queue_p90_ms": self.queue_p90_ms, "server_waiting_max": self.waiting_max,
                "saturated": self.saturated}


def knee(levels: Sequence[Level], mode: str) -> int | None:
    """The index of the knee (see the module docstring), or None when throughput kept up at every step."""
    for i in range(1, len(levels)):
        a, b = levels[i - 1], levels[i]
        load_gain = b.level / a.level - 1.0
        if a.stats.rps <= 0 or load_gain <= 0:
            continue
        gain = (b.stats.rps / a.stats.rps - 1.0) / load_gain
        la, lb = a.latency_p50(mode), b.latency_p50(mode)
        climbed = la is not None and lb is not None and la > 0 and lb >= la * (1.0 + KNEE_LATENCY)
        if gain < KNEE_GAIN and climbed:
            return i - 1
    return None


def highest_meeting_slo(levels: Sequence[Level]) -> int | None:
    """The index of the highest level, below the first that misses, meeting the SLO; None when the first
    level misses it or no SLO was given."""
    best = None
    for i, lv in enumerate(levels):
        if not lv.meets_slo:
            break
        best = i
    return best


def first_saturated(levels: Sequence[Level]) -> int | None:
    return next((i for i, lv in enumerate(levels) if lv.saturated), None)


def should_stop(levels: Sequence[Level], mode: str) -> str | None:
    """Why an automatic sweep stops after the levels so far, or None to go on doubling."""
    last = levels[-1]
    if last.stats.requests and last.stats.server_error_rate >= STOP_ERROR_RATE:
        return f"server errors reached {last.stats.server_error_rate:.0%}"
    if last.meets_slo is False:
        return "the SLO was missed"
    k = knee(levels, mode)
    if k is not None and len(levels) - 1 > k:
        return "throughput stopped growing (the knee)"
    return None


@dataclass(slots=True)
class SweepResult:
    """A sweep's levels, in the order run, and what they show."""

    sweep: Sweep
    mode: str
    levels: list[Level]
    stopped: str | None = None
    """Why an automatic sweep stopped before ``max_levels`` (None: it ran them all, or was a list)."""

    @property
    def knee(self) -> int | None:
        return knee(self.levels, self.mode)

    @property
    def best(self) -> int | None:
        return highest_meeting_slo(self.levels)

    @property
    def saturated_at(self) -> int | None:
        return first_saturated(self.levels)

    def to_json(self) -> dict[str, Any]:
        def at(i: int | None) -> float | None:
            return None if i is None else self.levels[i].level

        return {"sweep": self.sweep.to_json(), "levels": [lv.to_json(self.mode) for lv in self.levels],
                "knee": at(self.knee), "highest_meeting_slo": at(self.best),
                "saturated_at": at(self.saturated_at), "stopped": self.stopped,
                "slo_share": SLO_SHARE}


def waiting_max(snapshots: Sequence[Mapping[str, float] | None]) -> float | None:
    """The most requests the server's /metrics showed waiting in ``snapshots``; None when none said."""
    values = [s["requests_waiting"] for s in snapshots if s is not None and "requests_waiting" in s]
    return max(values, default=None)


async def run_sweep(
    base: Scenario,
    sweep: Sweep,
    target: Target,
    *,
    slo: SLO | None = None,
    detector: ColdStartDetector | None = None,
    on_sample: Callable[[Sample], object] | None = None,
    on_level: Callable[[float, LoadRun], object] | None = None,
    levels: list[Level] | None = None,
    runner: Callable[..., LoadRun] = LoadRun,
) -> SweepResult:
    """Run ``base`` at each level of ``sweep`` in turn (one configuration, "base"), stopping an automatic sweep
    as ``should_stop`` says. ``on_level(level, run)`` as each level's run starts (clients built);
    ``on_sample`` gets each request with its ``config`` set to the level's label. Finished levels go into
    ``levels`` as they end (pass a list to keep them after a cancel). ``runner`` makes each level's run, as
``LoadRun`` takes its arguments (``_workers.workers_runner``: across processes). Raises as ``LoadRun.run`` does."""
    done = levels if levels is not None else []
    result = SweepResult(sweep, base.mode, done)
    for i in range(sweep.count):
        level = sweep.level(i)
        label = sweep.label(level)

        def tagged(sample: Sample, label: str = label) -> None:
            sample.config = label
            if on_sample is not None:
                on_sample(sample)

        def started(run: LoadRun, level: float = level) -> None:
            if on_level is not None:
                on_level(level, run)

        load = runner(sweep.scenario(base, level), ["base"], target, slo=slo, detector=detector,
                      on_sample=tagged, on_start=started)
        await load.run()
        stats = dataclasses.replace(load.tallies["base"].stats(load.walls_ns["base"]), name=label)
        done.append(Level(level, stats, waiting_max(load.server_snapshots["base"])))
        if sweep.auto:
            result.stopped = should_stop(done, base.mode)
            if result.stopped:
                break
    return result
