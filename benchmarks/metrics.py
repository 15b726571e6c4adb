"""What the HUD costs: the metrics pipeline per request, and one HUD repaint per frame, each against a
baseline measured in the same run.

1. Pipeline, per streamed request of 64 chunks. Baseline: building the TimingRecord alone, as the client does
   (t0, phases, first and last token, 64 chunk stamps, end). Measured, on top of that, what the client
   publishes: on a Bus nobody listens to; on a Bus ``Metrics.subscribe(bus)`` listens to (the default: no
   Chunk subscription, so the client builds no per-token events); and with ``subscribe(bus, chunks=True)``,
   where each of the 64 Chunk events is built and published to a subscriber that only counts (the
   observe_started + 64 chunks + observe_done of the brief). Also one ``percentiles`` read after a change.
2. HUD repaint, per frame, in a headless app: the work on the event loop, i.e. the update call itself plus
   Textual's screen refresh that lays out (if asked) and renders what changed (``Screen._on_timer_update``,
   timed around every call). Message dispatch between the two is not counted. Baseline: a bare
   ``Static.update(text)`` (Textual's default, which re-lays out the screen). Measured: a HUD frame after a
   request finished (every part repainted: four sparklines, their labels, the waterfall, the stats, the
   render-lag line) and a HUD frame while streaming (the pending timer and render-lag line).

Runs are interleaved. Each figure is the best of its repetitions (of a per-run mean for the pipeline, of a
per-run median frame for the HUD): other processes only ever add time, so the best run is the closest to
the code's own cost. Every clock read is ``time.perf_counter_ns()``.

Run: ``/work/venv/bin/python benchmarks/metrics.py``
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import time
from collections.abc import Callable

from textual.app import App, ComposeResult
from textual.containers import Horizontal
from textual.pilot import Pilot
from textual.screen import Screen
from textual.widgets import Static

from llmchat.core.observe import (
    Bus,
    Chunk,
    FirstToken,
    Metrics,
    Phases,
    RequestDone,
    RequestStarted,
    TimingRecord,
)
from llmchat.tui.widgets.hud import Hud

CHUNKS = 64
REQUESTS = 2_000
REPETITIONS = 7
FRAMES = 200


# --- 1. the pipeline --------------------------------------------------------------------------------------


def _build(now: Callable[[], int]) -> TimingRecord:
    """A streamed request's record, stamped the way the client stamps it."""
    record = TimingRecord(mode="stream", provider="local", model="llmchat-local", host="127.0.0.1:8000")
    p = Phases(start_ns=now())
    p.send_start_ns = now()
    p.send_end_ns = now()
    p.headers_ns = now()
    record.phases = p
    record.http_version = "HTTP/2"
    record.status = 200
    return record


def _stream(record: TimingRecord, bus: Bus | None, now: Callable[[], int]) -> None:
    """The client's per-request publishes and per-chunk stamping; ``bus`` None is the baseline."""
    if bus is not None:
        bus.publish(RequestStarted(record))
    for _ in range(CHUNKS):
        t = now()
        if record.first_token_ns is None:
            record.first_token_ns = t
            if bus is not None:
                bus.publish(FirstToken(record))
        record.last_token_ns = t
        record.chunk_ns.append(t)
        record.content_chunks += 1
        if bus is not None and bus.wants(Chunk):
            bus.publish(Chunk(record, "tok", t))
    record.end_ns = now()
    record.output_tokens = record.content_chunks
    if bus is not None:
        bus.publish(RequestDone(record))


def _time_requests(bus: Bus | None) -> float:
    now = time.perf_counter_ns
    gc.collect()
    start = now()
    for _ in range(REQUESTS):
        _stream(_build(now), bus, now)
    return (now() - start) / REQUESTS


def pipeline() -> dict[str, float]:
    """Median ns per request for the baseline, a bus nobody hears, and the Metrics pipeline both ways."""
    metrics, counting, subscribed, silent, counted = Metrics(), Metrics(), Bus(), Bus(), Bus()
    metrics.subscribe(subscribed)
    counting.subscribe(counted, chunks=True)
    runs: dict[str, list[float]] = {
        "record alone": [], "bus, no listener": [], "Metrics pipeline": [], "Metrics counting chunks": [],
    }
    for _ in range(REPETITIONS):
        runs["record alone"].append(_time_requests(None))
        runs["bus, no listener"].append(_time_requests(silent))
        runs["Metrics pipeline"].append(_time_requests(subscribed))
        runs["Metrics counting chunks"].append(_time_requests(counted))
    for m in (metrics, counting):
        assert m.requests == REPETITIONS * REQUESTS and m.chunks == m.requests * CHUNKS
    sorts = []
    for _ in range(REQUESTS):
        metrics.observe_render_lag(1.0)  # any change drops the cache, so the next read sorts
        t = time.perf_counter_ns()
        metrics.percentiles("render_lag")
        sorts.append(time.perf_counter_ns() - t)
    result = {name: min(values) for name, values in runs.items()}
    result["percentiles read after a change"] = statistics.median(sorts)
    return result


# --- 2. the HUD repaint -----------------------------------------------------------------------------------


class _BenchApp(App[None]):
    CSS = "#chat { width: 1fr; }"

    def __init__(self) -> None:
        super().__init__()
        self.metrics = Metrics()

    def compose(self) -> ComposeResult:
        with Horizontal():
            yield Static("chat", id="chat")
            yield Hud(metrics=self.metrics, id="hud")


def _finished(i: int) -> TimingRecord:
    record = TimingRecord(mode="stream", provider="local", model="llmchat-local", host="127.0.0.1:8000",
                          t0_ns=10**12)
    ms = 1_000_000
    record.phases = Phases(start_ns=10**12, send_start_ns=10**12 + ms, send_end_ns=10**12 + 2 * ms,
                           headers_ns=10**12 + (20 + i % 7) * ms)
    record.first_token_ns = 10**12 + (40 + i % 13) * ms
    record.last_token_ns = 10**12 + (300 + i % 31) * ms
    record.end_ns = record.last_token_ns + ms
    record.output_tokens = 64
    record.http_version = "HTTP/2"
    return record


class _RefreshClock:
    """Times every ``Screen._on_timer_update`` (the screen's layout and render of what changed)."""

    spent_ns = 0

    @classmethod
    def install(cls) -> None:
        original = Screen._on_timer_update

        def timed(screen: Screen[object]) -> None:
            t = time.perf_counter_ns()
            try:
                original(screen)
            finally:
                cls.spent_ns += time.perf_counter_ns() - t

        Screen._on_timer_update = timed  # type: ignore[method-assign,assignment]


async def _frames(pilot: Pilot[None], step: Callable[[int], None]) -> float:
    """Median ns of ``step(i)`` plus the screen refresh work that renders it."""
    samples = []
    for i in range(FRAMES):
        _RefreshClock.spent_ns = 0
        t = time.perf_counter_ns()
        step(i)
        own = time.perf_counter_ns() - t
        # Twice: the first lets the widgets post their updates to the screen, the second renders the rest.
        await pilot.pause(0)
        await pilot.pause(0)
        samples.append(own + _RefreshClock.spent_ns)
    return statistics.median(samples)


async def hud_frames() -> dict[str, float]:
    """Median ns per frame: empty refresh, bare Static.update, and the HUD's two kinds of frame."""
    _RefreshClock.install()
    app = _BenchApp()
    async with app.run_test(size=(120, 50), headless=True) as pilot:
        hud, chat, metrics = app.query_one(Hud), app.query_one("#chat", Static), app.metrics
        metrics.observe_many(_finished(i) for i in range(60))
        hud.paint()
        await pilot.pause()
        streaming = _finished(0)

        def nothing(i: int) -> None:
            pass

        def bare_update(i: int) -> None:
            chat.update(f"chat {i}")

        def bare_update_no_layout(i: int) -> None:
            chat.update(f"chat {i}", layout=False)

        def request_done(i: int) -> None:
            finished = _finished(i)
            metrics.observe_started(finished)
            metrics.observe_done(finished)
            metrics.observe_render_lag(float(i % 9))
            hud.paint()

        def while_streaming(i: int) -> None:
            metrics.observe_render_lag(float(i % 9))
            hud.paint()

        runs: dict[str, list[float]] = {
            "empty refresh": [], "bare Static.update()": [], "Static.update(layout=False)": [],
            "HUD frame, request done": [], "HUD frame, streaming": [],
        }
        for _ in range(3):
            runs["empty refresh"].append(await _frames(pilot, nothing))
            runs["bare Static.update()"].append(await _frames(pilot, bare_update))
            runs["Static.update(layout=False)"].append(await _frames(pilot, bare_update_no_layout))
            runs["HUD frame, request done"].append(await _frames(pilot, request_done))
            metrics.observe_started(streaming)
            runs["HUD frame, streaming"].append(await _frames(pilot, while_streaming))
            metrics.observe_done(streaming)
            hud.paint()
            await pilot.pause()
        # The HUD's own Python (building Content, assigning sparkline data) without Textual's refresh.
        paint_only = []
        for i in range(FRAMES):
            metrics.observe_many([_finished(i)])
            t = time.perf_counter_ns()
            hud.paint()
            paint_only.append(time.perf_counter_ns() - t)
        await pilot.pause()
    result = {name: min(values) for name, values in runs.items()}
    result["HUD paint() alone, request done"] = statistics.median(paint_only)
    return result


def main() -> None:
    runs = f"best of {REPETITIONS} runs of {REQUESTS}"
    print(f"metrics pipeline, per streamed request of {CHUNKS} chunks ({runs}):")
    p = pipeline()
    base = p["record alone"]
    for name, ns in p.items():
        ratio = f"  x{ns / base:.2f} of the record alone" if name != "percentiles read after a change" else ""
        print(f"  {name:<34}{ns / 1000:9.2f} µs{ratio}")
    for name in ("Metrics pipeline", "Metrics counting chunks"):
        extra = p[name] - base
        print(f"  {name} over the record: {extra / 1000:.2f} µs a request ({extra / CHUNKS:.0f} ns a chunk)")

    print(f"\nHUD repaint, event-loop work per frame, headless 120x50 app (best of 3 medians of {FRAMES}):")
    f = asyncio.run(hud_frames())
    alone = f.pop("HUD paint() alone, request done")
    bare = f["bare Static.update()"]
    for name, ns in f.items():
        print(f"  {name:<30}{ns / 1000:9.1f} µs   x{ns / bare:.2f} of a bare Static.update()")
    label = "HUD paint() alone, done"
    print(f"  {label:<30}{alone / 1000:9.1f} µs   (its own Python, before Textual renders)")
    done, streaming = f["HUD frame, request done"], f["HUD frame, streaming"]
    print(f"  at its 10 Hz cap: {streaming * 10 / 1e7:.2f} % of a core while a reply streams, "
          f"{done * 10 / 1e7:.2f} % if every part changed every frame")


if __name__ == "__main__":
    main()
