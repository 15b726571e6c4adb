"""How fast the chat app paints a streamed reply, against Textual's own Markdown, in one run.

    /work/venv/bin/python benchmarks/render.py [--quick]

Headless (``App.run_test(size=(120, 40))``), one approach after another, each in a child process of
its own (no run inherits another's heap, caches or garbage) and a fresh app whose conversation already
holds 30 finished messages (questions, and replies with prose, code and tables) as ``UserMessage`` and
``ChatMessage``; the approaches differ only in the reply being streamed.

(a) A 4,000-token reply (prose, a 160-line code block, a table, a list) streamed as fast as the loop
    goes: the producer hands over one token and yields (``await asyncio.sleep(0)``). Printed: tokens
    per second from the first token to the final frame on screen, and the event loop's lag p99 (how
    late a 10 ms asyncio sleep wakes up) over that time. Approaches:
      - ``ChatMessage``: coalesced frames, settled blocks rendered once, code highlighted in slices;
      - plain ``Markdown.get_stream()`` (``await stream.write(token)``);
      - naive: ``await Markdown.update(full_text)`` on every token.
    The two Textual approaches are slow, so each is fed for a bounded time (20 s and 10 s) and its
    rate is taken over the tokens it got through, which are the reply's first ones. Their cost per
    token grows with the text, so that rate flatters them: the ratios printed are under-estimates.
(b) A 1,000-token reply paced at 70 and at 100 tokens/s (a fast hosted model, and a faster one):
    render lag (``ChatMessage.RenderLag``: a frame's oldest token arriving to that frame written to
    the terminal) p50/p90/p99, and the CPU share of one core (``time.process_time()`` over wall
    time), for
      - ``ChatMessage`` at 15 frames/s, the frame rate the app used before: the baseline;
      - ``ChatMessage`` as the app uses it now (up to 60 frames/s, fewer when frames cost more than
        their share of a core), labelled with the model and with its state line (``streaming · 42
        tokens · TTFT 212 ms · 3.1 s``, read from the request's record 10 times a second);
      - the same without the state line: what the state line costs is the difference;
      - ``ChatMessage`` under a ``ThinkingBlock``, as the app streams a reasoning model's reply
        (``ReplyExtras``): the first third of the same number of tokens is thinking, streamed into the
        block above the reply, which folds when the answer begins; the rest is the answer;
      - plain ``get_stream()`` (at 100 tokens/s only), and the paced producer with no reply at all
        (the floor: producer, lag probe and an idle app).
(c) The first token after a pause: 20 times, 10 tokens at 70 tokens/s, 300 ms of nothing, then one
    token; its render lag (the frame holds that token alone), p50 and max, for both frame rates.

Screen updates are encoded to terminal bytes (then dropped) as a terminal run would do; headless
Textual skips that step. Goals: (a) >= 5,000 tokens/s with lag p99 <= 50 ms and >= 10x the naive
approach; (b) render lag p50 <= 25 ms and p99 <= 50 ms at 70 tokens/s, <= 15 % of one core at 100
tokens/s; (c) the first token after a pause on screen within a frame (16 ms). Ratios are against the
15 frames/s baseline of the same run. ``--quick`` is a shorter run (about a minute). The load average
is printed first: other work on the machine slows every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import gc
import json
import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import RenderableType
from textual.app import App, ComposeResult
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Markdown

from llmchat.core import TimingRecord
from llmchat.tui.request_state import RequestWatch
from llmchat.tui.widgets.chat import ChatMessage, Conversation, ReplyExtras, UserMessage

SIZE = (120, 40)
LAG_TICK_S = 0.010
WORDS = (
    "the latency of a streamed reply depends on the network the server and how fast the client renders "
    "each token so we measure every stage separately and report the slowest one with its share of the total"
).split()


def reply(tokens: int, seed: int = 7) -> list[str]:
    """A reply of ``tokens`` word-sized tokens: headings, prose with inline styles, CJK and emoji, a code
    block, a table and a list, in the proportions of a long technical answer."""
    rnd = random.Random(seed)

    def sentence(words: int) -> str:
        body = " ".join(rnd.choice(WORDS) for _ in range(words)).capitalize()
        return f"{body}. **Bold**, `inline code` and *emphasis*, 日本語のテキスト and emoji 🚀✨."

    parts = ["# Streaming report\n\n"]
    parts += [sentence(50) + "\n\n" for _ in range(max(1, tokens // 700))]
    parts.append("## Code\n\n```python\n")
    for i in range(max(1, tokens // 100)):
        parts.append(
            f"def handler_{i}(request: Request) -> Response:\n"
            f"    total = sum(x * {i} for x in range(100))  # 合計\n"
            f'    return Response(total, note="""ok""")\n\n'
        )
    parts.append("```\n\n## Numbers\n\n| Stage | p50 ms | p99 ms | Note |\n|---|---:|---:|---|\n")
    parts += [
        f"| stage {i} | {i * 1.5:.1f} | {i * 3.2:.1f} | ok ✅ 中文 |\n" for i in range(max(3, tokens // 100))
    ]
    parts.append("\n")
    parts += ["- " + sentence(16) + "\n" for _ in range(max(2, tokens // 400))]
    parts.append("\n")
    while len(re.findall(r"\S+\s*", "".join(parts))) < tokens:
        parts.append(sentence(50) + "\n\n")
    return re.findall(r"\S+\s*|\s+", "".join(parts))[:tokens]


def history() -> list[Widget]:
    """30 earlier messages: 15 questions and 15 finished replies of about 250 tokens each."""
    messages: list[Widget] = []
    for index in range(15):
        messages.append(UserMessage(f"Question {index}: how fast is it? 速度 🚀"))
        messages.append(
            ChatMessage("".join(reply(250, seed=index)), status="done", note="TTFT 212 ms · 70 tok/s")
        )
    return messages


class BenchApp(App[None]):
    """The conversation alone, at the size of a terminal, with its screen updates encoded to bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.render_lags: list[float] = []
        self.pause_lags: list[float] = []

    def compose(self) -> ComposeResult:
        yield Conversation()

    def _display(self, screen: Screen[Any], renderable: RenderableType | None) -> None:
        # Headless Textual skips encoding updates to terminal bytes; a terminal run pays for it.
        render_segments = getattr(renderable, "render_segments", None)
        if render_segments is not None:
            render_segments(self.console)
        super()._display(screen, renderable)

    def on_chat_message_render_lag(self, event: ChatMessage.RenderLag) -> None:
        self.render_lags.append(event.ms)


@dataclass
class Run:
    tokens: int
    wall_s: float
    cpu_s: float
    lags_ms: list[float] = field(default_factory=list)
    render_lags_ms: list[float] = field(default_factory=list)
    """What ``ChatMessage.RenderLag`` reported: arrival of a frame's oldest token to that frame on screen."""
    pause_lags_ms: list[float] = field(default_factory=list)
    """The render lag of each first token after a pause."""

    @property
    def rate(self) -> float:
        return self.tokens / self.wall_s

    @property
    def share(self) -> float:
        return self.cpu_s / self.wall_s

    @property
    def lag_p99(self) -> float:
        return percentile(self.lags_ms, 0.99)


def percentile(samples: list[float], q: float) -> float:
    """The q-quantile by nearest rank (0 for no samples)."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


async def painted(widget: Widget) -> None:
    """Return once the screen has been refreshed after everything queued so far."""
    done = asyncio.Event()
    widget.call_after_refresh(done.set)
    await asyncio.wait_for(done.wait(), 120)


Body = Callable[[Conversation], Awaitable[int]]
BASELINE_FPS = 15.0
RATES = (70.0, 100.0)
"""The frame rate ChatMessage streamed at before its pacing followed the cost of a frame."""
PAUSES, PAUSE_S, BURST = 20, 0.3, 10


async def measure(body: Body) -> Run:
    """Run ``body`` in a fresh app holding the history; time it and sample the loop's lag meanwhile."""
    app = BenchApp()
    async with app.run_test(size=SIZE) as pilot:
        # As the app does after its first frame (tui/app.py): start-up objects out of the collector's reach.
        await painted(app.screen)
        gc.freeze()
        conversation = app.query_one(Conversation)
        await conversation.add_history(history())
        # Earlier messages far from the end are rendered in the background after a resume; let that
        # finish, so only the reply under test is measured.
        while any(message.deferred for message in conversation.messages()):
            await pilot.pause(0.02)
        await painted(conversation)
        await asyncio.sleep(0.2)
        lags: list[float] = []
        stop = asyncio.Event()

        async def probe() -> None:
            while not stop.is_set():
                start = time.perf_counter_ns()
                await asyncio.sleep(LAG_TICK_S)
                lags.append((time.perf_counter_ns() - start) / 1e6 - LAG_TICK_S * 1000)

        prober = asyncio.create_task(probe())
        cpu, wall = time.process_time(), time.perf_counter()
        tokens = await body(conversation)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        stop.set()
        await prober
    return Run(tokens, wall, cpu, lags, app.render_lags, app.pause_lags)


async def feed(tokens: list[str], rate: float | None, sink: Callable[[str], object], budget_s: float) -> int:
    """Hand tokens to ``sink`` as fast as the loop allows (yielding after each) or ``rate`` a second,
    until all are given or ``budget_s`` has passed; returns how many were given."""
    start = time.perf_counter()
    for index, token in enumerate(tokens):
        if time.perf_counter() - start > budget_s:
            return index
        result = sink(token)
        if isinstance(result, Awaitable):
            await result
        if rate is None:
            await asyncio.sleep(0)
        else:
            await asyncio.sleep(max(0.0, start + (index + 1) / rate - time.perf_counter()))
    return len(tokens)


def add_reply(conversation: Conversation, fps: float | None) -> ChatMessage:
    """A streaming reply as the app makes it, or at ``fps`` frames a second."""
    return conversation.add_assistant() if fps is None else conversation.add_assistant(frame_rate=fps)


def stamping(message: ChatMessage, live: bool) -> Callable[[str], None]:
    """A sink that stamps a TimingRecord for each token as the client does (for every approach alike), and
    hands the token to ``message``; with ``live`` the message is labelled and follows the record's state as
    the app's replies do."""
    record = TimingRecord(mode="stream", model="llmchat-local")
    if live:
        message.set_label("llmchat-local")
        watch = RequestWatch(stall_s=3.0, cancel_key="Esc", label="llmchat-local")
        watch.record = record  # what follow() takes for a stream, without a bus to listen to
        message.follow(watch)

    def sink(token: str) -> None:
        now = time.perf_counter_ns()
        if record.first_token_ns is None:
            record.first_token_ns = now
        record.last_token_ns = now
        record.content_chunks += 1
        message.append(token, now)

    return sink


def widget_stream(tokens: list[str], rate: float | None, fps: float | None = None, live: bool = True) -> Body:
    async def body(conversation: Conversation) -> int:
        message = add_reply(conversation, fps)
        sink = stamping(message, live and fps is None)
        count = await feed(tokens, rate, sink, float("inf"))
        message.finish(status="done", note="bench")
        await asyncio.wait_for(message.wait_final(), 60)
        await painted(message)
        return count

    return body


def thinking_stream(thoughts: list[str], answer: list[str], rate: float) -> Body:
    """``thoughts`` into a thinking block above the reply, then ``answer`` into the reply, paced at ``rate``,
    through ``ReplyExtras`` as the app does it."""

    async def body(conversation: Conversation) -> int:
        message = add_reply(conversation, None)
        extras = ReplyExtras(message, None, keep_open=False, toggle_key="Ctrl+T")
        start = time.perf_counter_ns()
        count = await feed(thoughts, rate, lambda token: extras.reasoning(token, time.perf_counter_ns()),
                           float("inf"))

        def answer_token(token: str) -> None:
            if extras.thinking:
                extras.answer_started((time.perf_counter_ns() - start) / 1e6)
            message.append(token)

        count += await feed(answer, rate, answer_token, float("inf"))
        extras.finish(None, [])
        message.finish(status="done", note="bench")
        await asyncio.wait_for(message.wait_final(), 60)
        await painted(message)
        return count

    return body


def after_pauses(tokens: list[str], fps: float | None) -> Body:
    """``PAUSES`` times: ``BURST`` tokens at 70 a second, ``PAUSE_S`` of nothing, one token."""

    async def body(conversation: Conversation) -> int:
        app = conversation.app
        assert isinstance(app, BenchApp)
        message = add_reply(conversation, fps)
        sink = stamping(message, fps is None)
        given = 0
        for _ in range(PAUSES):
            given += await feed(tokens[given : given + BURST], 70.0, sink, float("inf"))
            await asyncio.sleep(PAUSE_S)
            frames = len(app.render_lags)
            sink(tokens[given])
            given += 1
            while len(app.render_lags) == frames:
                await asyncio.wait_for(painted(message), 10)
            app.pause_lags.append(app.render_lags[frames])
        message.finish(status="done", note="bench")
        await asyncio.wait_for(message.wait_final(), 60)
        await painted(message)
        return given

    return body


def textual_stream(tokens: list[str], rate: float | None, budget_s: float) -> Body:
    async def body(conversation: Conversation) -> int:
        markdown = Markdown()
        await conversation.mount(markdown)
        stream = Markdown.get_stream(markdown)
        count = await feed(tokens, rate, stream.write, budget_s)
        await stream.stop()
        await painted(markdown)
        return count

    return body


def naive_stream(tokens: list[str], budget_s: float) -> Body:
    async def body(conversation: Conversation) -> int:
        markdown = Markdown()
        await conversation.mount(markdown)
        text: list[str] = []

        async def update(token: str) -> None:
            text.append(token)
            await markdown.update("".join(text))

        count = await feed(tokens, None, update, budget_s)
        await painted(markdown)
        return count

    return body


def idle(tokens: list[str], rate: float) -> Body:
    async def body(conversation: Conversation) -> int:
        return await feed(tokens, rate, lambda token: None, float("inf"))

    return body


def body_for(name: str, quick: bool) -> Body:
    """The measurement called ``name``, sized for a full or a ``--quick`` run."""
    fast_tokens, paced_tokens = (2000, 300) if quick else (4000, 1000)
    get_stream_s, naive_s = (5.0, 3.0) if quick else (20.0, 10.0)
    fast, slow = reply(fast_tokens), reply(paced_tokens, seed=11)
    bodies: dict[str, Callable[[], Body]] = {
        "fast-ours": lambda: widget_stream(fast, None),
        "fast-get_stream": lambda: textual_stream(fast, None, get_stream_s),
        "fast-naive": lambda: naive_stream(fast, naive_s),
        "paced-floor": lambda: idle(slow[: paced_tokens // 2], 100.0),
        "paced-get_stream": lambda: textual_stream(slow, 100.0, float("inf")),
        "pause-ours": lambda: after_pauses(slow, None),
        "pause-baseline": lambda: after_pauses(slow, BASELINE_FPS),
    }
    thoughts = reply(paced_tokens // 3, seed=5)
    for rate in RATES:
        bodies[f"paced-thinking-{rate:.0f}"] = functools.partial(
            thinking_stream, thoughts, slow[: paced_tokens - len(thoughts)], rate)
        bodies[f"paced-ours-{rate:.0f}"] = functools.partial(widget_stream, slow, rate)
        bodies[f"paced-nolive-{rate:.0f}"] = functools.partial(widget_stream, slow, rate, None, False)
        bodies[f"paced-baseline-{rate:.0f}"] = functools.partial(widget_stream, slow, rate, BASELINE_FPS)
    return bodies[name]()


def run_child(name: str, quick: bool) -> Run:
    """Measure ``name`` in a fresh interpreter, so no run inherits another's heap, caches or garbage."""
    command = [sys.executable, __file__, "--child", name] + (["--quick"] if quick else [])
    out = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    if out.returncode != 0:
        raise SystemExit(f"benchmark run {name} failed:\n{out.stderr.strip()}")
    return Run(**json.loads(out.stdout.strip().splitlines()[-1]))


def ratio(ours: list[float], baseline: list[float], q: float) -> str:
    """Our q-quantile over the baseline's, as "0.31x"."""
    base = percentile(baseline, q)
    return f"{percentile(ours, q) / base:.2f}x" if base else "n/a"


def lag_and_cpu(run: Run, baseline: Run) -> str:
    """Render lag p50 and p99 and the CPU share of ``run`` against ``baseline``, as ratios."""
    lags, base = run.render_lags_ms, baseline.render_lags_ms
    cpu = run.share / baseline.share
    return f"render lag p50 {ratio(lags, base, 0.5)}, p99 {ratio(lags, base, 0.99)}; CPU {cpu:.2f}x"


def main(quick: bool) -> None:
    fast_tokens, paced_tokens = (2000, 300) if quick else (4000, 1000)
    print(
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; terminal {SIZE[0]}x{SIZE[1]}; "
        "30 earlier messages in the conversation; each run in a process of its own"
    )
    chars = len("".join(reply(fast_tokens)))
    print(f"\n(a) a {fast_tokens:,}-token reply ({chars:,} characters) as fast as the loop goes")
    ours, plain, naive = (run_child(name, quick) for name in ("fast-ours", "fast-get_stream", "fast-naive"))
    print(
        f"{'approach':<34}{'tokens':>8}{'tokens/s':>10}{'lag p99':>9}{'lag max':>9}{'wall s':>8}{'CPU s':>7}"
    )
    for name, run in (
        ("ChatMessage (this app)", ours),
        ("Markdown.get_stream()", plain),
        ("Markdown.update() on every token", naive),
    ):
        lag_max = max(run.lags_ms, default=0)
        print(
            f"{name:<34}{run.tokens:>8,}{run.rate:>10,.0f}{run.lag_p99:>9.1f}{lag_max:>9.1f}"
            f"{run.wall_s:>8.2f}{run.cpu_s:>7.2f}"
        )
    lag_p50, lag_max = percentile(ours.render_lags_ms, 0.5), max(ours.render_lags_ms, default=0)
    print(
        f"ChatMessage: render lag (arrival -> on screen) p50 {lag_p50:.0f} ms, max {lag_max:.0f} ms over "
        f"{len(ours.render_lags_ms)} frames; {ours.rate / plain.rate:,.0f}x get_stream(), "
        f"{ours.rate / naive.rate:,.0f}x naive (both under-estimates)"
    )

    print(
        f"\n(b) a {paced_tokens:,}-token reply paced: render lag (arrival -> on screen) and share of one core"
    )
    header = ("tok/s", 6), ("CPU %", 7), ("p50 ms", 8), ("p90 ms", 8), ("p99 ms", 8), ("frames", 8)
    print(f"{'approach':<44}" + "".join(f"{title:>{width}}" for title, width in header) + f"{'loop p99':>9}")
    floor = run_child("paced-floor", quick)
    paced: dict[tuple[str, float], Run] = {}
    for rate in RATES:
        for approach in ("baseline", "nolive", "ours", "thinking"):
            paced[approach, rate] = run_child(f"paced-{approach}-{rate:.0f}", quick)
    plain_paced = run_child("paced-get_stream", quick)
    rows: list[tuple[str, float, Run]] = [("no reply (producer, probe, idle app: floor)", 100.0, floor)]
    for rate in RATES:
        rows.append((f"ChatMessage at {BASELINE_FPS:.0f} frames/s (baseline)", rate, paced["baseline", rate]))
        rows.append(("ChatMessage, no state line", rate, paced["nolive", rate]))
        rows.append(("ChatMessage (this app, with its state line)", rate, paced["ours", rate]))
        rows.append(("  ... a third of it thinking, above it", rate, paced["thinking", rate]))
    rows.append(("Markdown.get_stream()", 100.0, plain_paced))
    for name, rate, run in rows:
        # Only ChatMessage reports render lag; the others have none to print.
        lags = run.render_lags_ms
        figures = "".join(f"{percentile(lags, q):>8.1f}" if lags else f"{'-':>8}" for q in (0.5, 0.9, 0.99))
        frames = f"{len(lags):>8}" if lags else f"{'-':>8}"
        print(f"{name:<44}{rate:>6.0f}{run.share * 100:>7.1f}{figures}{frames}{run.lag_p99:>9.1f}")
    for rate in RATES:
        base, bare, ours_rate = paced["baseline", rate], paced["nolive", rate], paced["ours", rate]
        print(
            f"at {rate:.0f} tokens/s, this app against the baseline: {lag_and_cpu(ours_rate, base)} "
            f"({(ours_rate.share - floor.share) * 100:.1f} % above the floor, baseline "
            f"{(base.share - floor.share) * 100:.1f} %)"
        )
        print(f"at {rate:.0f} tokens/s, with the state line against without: {lag_and_cpu(ours_rate, bare)}")
    for rate in RATES:
        plain_run, thinking = paced["ours", rate], paced["thinking", rate]
        print(
            f"at {rate:.0f} tokens/s, a thinking block above the reply against the reply alone: render lag p50 "
            f"{ratio(thinking.render_lags_ms, plain_run.render_lags_ms, 0.5)}, p99 "
            f"{ratio(thinking.render_lags_ms, plain_run.render_lags_ms, 0.99)}; "
            f"CPU {thinking.share / plain_run.share:.2f}x"
        )

    print(f"\n(c) the first token after {PAUSE_S * 1000:.0f} ms of nothing, {PAUSES} times: its render lag")
    print(f"{'approach':<44}{'p50 ms':>8}{'max ms':>8}")
    paused = {approach: run_child(f"pause-{approach}", quick) for approach in ("baseline", "ours")}
    for approach, name in (
        ("baseline", f"ChatMessage at {BASELINE_FPS:.0f} frames/s (baseline)"),
        ("ours", "ChatMessage (this app)"),
    ):
        lags = paused[approach].pause_lags_ms
        print(f"{name:<44}{percentile(lags, 0.5):>8.1f}{max(lags, default=0):>8.1f}")
    print(
        f"this app against the baseline: p50 "
        f"{ratio(paused['ours'].pause_lags_ms, paused['baseline'].pause_lags_ms, 0.5)}, max "
        f"{ratio(paused['ours'].pause_lags_ms, paused['baseline'].pause_lags_ms, 1.0)}"
    )

    at70, at100 = paced["ours", 70.0], paced["ours", 100.0]
    first = max(paused["ours"].pause_lags_ms, default=0)
    checks = (
        ("(a) >= 5,000 tokens/s", f"{ours.rate:,.0f} tokens/s", ours.rate >= 5000),
        ("(a) event loop lag p99 <= 50 ms", f"{ours.lag_p99:.1f} ms", ours.lag_p99 <= 50),
        ("(a) >= 10x the naive approach", f"{ours.rate / naive.rate:,.0f}x", ours.rate >= 10 * naive.rate),
        (
            "(b) render lag p50 <= 25 ms at 70 tokens/s",
            f"{percentile(at70.render_lags_ms, 0.5):.1f} ms",
            percentile(at70.render_lags_ms, 0.5) <= 25,
        ),
        (
            "(b) render lag p99 <= 50 ms at 70 tokens/s",
            f"{percentile(at70.render_lags_ms, 0.99):.1f} ms",
            percentile(at70.render_lags_ms, 0.99) <= 50,
        ),
        ("(b) <= 15 % of one core at 100 tokens/s", f"{at100.share * 100:.1f} %", at100.share <= 0.15),
        ("(c) first token after a pause <= 16 ms", f"{first:.1f} ms (max)", first <= 16),
    )
    print(f"\n{'goal':<44}{'figure':<18}verdict")
    for goal, figure, met in checks:
        print(f"{goal:<44}{figure:<18}{'met' if met else 'NOT met'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="Streamed reply rendering: this app against Textual's Markdown."
    )
    parser.add_argument("--quick", action="store_true", help="a shorter run, about a minute")
    parser.add_argument("--child", metavar="RUN", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(dataclasses.asdict(asyncio.run(measure(body_for(args.child, args.quick))))))
    else:
        main(args.quick)
