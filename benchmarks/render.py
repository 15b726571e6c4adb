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
(b) A 1,000-token reply paced at 100 tokens/s: CPU share of one core (``time.process_time()`` over
    wall time) for ``ChatMessage`` and for plain ``get_stream()``, and for the paced producer with no
    reply at all (the floor: producer, lag probe and an idle app).

Screen updates are encoded to terminal bytes (then dropped) as a terminal run would do; headless
Textual skips that step. Goals: (a) >= 5,000 tokens/s with lag p99 <= 50 ms and >= 10x the naive
approach; (b) <= 15 % of one core. ``--quick`` is a shorter run (about 25 s). The load average is
printed first: other work on the machine slows every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
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

from llmchat.tui.widgets.chat import ChatMessage, Conversation, UserMessage

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


async def measure(body: Body) -> Run:
    """Run ``body`` in a fresh app holding the history; time it and sample the loop's lag meanwhile."""
    app = BenchApp()
    async with app.run_test(size=SIZE) as pilot:
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
    return Run(tokens, wall, cpu, lags, app.render_lags)


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


def widget_stream(tokens: list[str], rate: float | None) -> Body:
    async def body(conversation: Conversation) -> int:
        message = conversation.add_assistant()
        count = await feed(tokens, rate, message.append, float("inf"))
        message.finish(status="done", note="bench")
        await asyncio.wait_for(message.wait_final(), 60)
        await painted(message)
        return count

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
        "paced-ours": lambda: widget_stream(slow, 100.0),
        "paced-get_stream": lambda: textual_stream(slow, 100.0, float("inf")),
    }
    return bodies[name]()


def run_child(name: str, quick: bool) -> Run:
    """Measure ``name`` in a fresh interpreter, so no run inherits another's heap, caches or garbage."""
    command = [sys.executable, __file__, "--child", name] + (["--quick"] if quick else [])
    out = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    if out.returncode != 0:
        raise SystemExit(f"benchmark run {name} failed:\n{out.stderr.strip()}")
    return Run(**json.loads(out.stdout.strip().splitlines()[-1]))


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

    print(f"\n(b) a {paced_tokens:,}-token reply at 100 tokens/s: share of one core")
    floor, ours_paced, plain_paced = (
        run_child(name, quick) for name in ("paced-floor", "paced-ours", "paced-get_stream")
    )
    print(f"{'approach':<44}{'CPU %':>7}{'lag p99 ms':>12}{'wall s':>8}")
    for name, run in (
        ("no reply (producer, probe, idle app: floor)", floor),
        ("ChatMessage (this app)", ours_paced),
        ("Markdown.get_stream()", plain_paced),
    ):
        print(f"{name:<44}{run.share * 100:>7.1f}{run.lag_p99:>12.1f}{run.wall_s:>8.2f}")
    lag_p50, lag_p99 = percentile(ours_paced.render_lags_ms, 0.5), percentile(ours_paced.render_lags_ms, 0.99)
    print(
        f"ChatMessage: {(ours_paced.share - floor.share) * 100:.1f} % above the floor; render lag p50 "
        f"{lag_p50:.0f} ms, p99 {lag_p99:.0f} ms over {len(ours_paced.render_lags_ms)} frames "
        "(at 15 frames/s a token waits up to 67 ms for its frame)"
    )

    checks = (
        ("(a) >= 5,000 tokens/s", f"{ours.rate:,.0f} tokens/s", ours.rate >= 5000),
        ("(a) event loop lag p99 <= 50 ms", f"{ours.lag_p99:.1f} ms", ours.lag_p99 <= 50),
        ("(a) >= 10x the naive approach", f"{ours.rate / naive.rate:,.0f}x", ours.rate >= 10 * naive.rate),
        (
            "(b) <= 15 % of one core at 100 tokens/s",
            f"{ours_paced.share * 100:.1f} %",
            ours_paced.share <= 0.15,
        ),
    )
    print(f"\n{'goal':<44}{'figure':<18}verdict")
    for goal, figure, met in checks:
        print(f"{goal:<44}{figure:<18}{'met' if met else 'NOT met'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="Streamed reply rendering: this app against Textual's Markdown."
    )
    parser.add_argument("--quick", action="store_true", help="a shorter run, about 25 s")
    parser.add_argument("--child", metavar="RUN", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(dataclasses.asdict(asyncio.run(measure(body_for(args.child, args.quick))))))
    else:
        main(args.quick)
