"""The conversation widgets in a tiny app (Pilot): streaming replies, frames, following, the prompt.

Streams here append a burst and then wait for the frame that paints it (the ``RenderLag`` message, or
``wait_final``), so the app goes idle between steps; every wait has a timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from time import perf_counter_ns, thread_time_ns

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.cells import cell_len
from rich.segment import Segment
from rich.text import Text
from textual.app import App, ComposeResult
from textual.strip import Strip

from llmchat.tui.widgets.chat import ChatMessage, Conversation, PromptInput, UserMessage
from llmchat.tui.widgets.chat._blocks import BlockStream, new_parser, split_blocks
from llmchat.tui.widgets.chat._document import MarkdownDocument
from llmchat.tui.widgets.chat._lines import Line, text_of
from llmchat.tui.widgets.chat._message import _MAX_FRAME_SHARE
from llmchat.tui.widgets.chat._render import MarkdownRenderer, Palette

WAIT_S = 10.0

REPLY = """# Report 日本語

Streaming **works** with `inline code`, *emphasis*, emoji 🚀✨ and CJK 中文字符 in one paragraph that is
long enough to wrap at the widths these tests use, so wrapping is exercised too.

```python
def handler(request):
    note = '''spans
two lines'''
    return {"ok": True, "note": note}
```

| Stage | p50 ms | Note |
|---|---:|---|
| connect | 12.5 | fast ✅ |
| first token | 212.0 | 速い |

- one item
- two items with `code`

> a quote at the end
"""


def tokens(text: str, size: int = 3) -> list[str]:
    """``text`` cut into deltas of ``size`` characters (cuts land inside words, fences and table rows)."""
    return [text[i : i + size] for i in range(0, len(text), size)]


class ChatApp(App[None]):
    """A conversation and a prompt, recording the messages the widgets post."""

    def __init__(self) -> None:
        super().__init__()
        self.lags: list[float] = []
        self.lag_posted = asyncio.Event()
        self.submitted: list[str] = []
        self.refused = 0

    def compose(self) -> ComposeResult:
        yield Conversation()
        yield PromptInput()

    def on_chat_message_render_lag(self, event: ChatMessage.RenderLag) -> None:
        self.lags.append(event.ms)
        self.lag_posted.set()

    def on_prompt_input_submitted(self, event: PromptInput.Submitted) -> None:
        self.submitted.append(event.text)

    def on_prompt_input_held(self, event: PromptInput.Held) -> None:
        self.refused += 1

    async def next_frame(self) -> None:
        """Wait until a reply reports a painted frame."""
        self.lag_posted.clear()
        await asyncio.wait_for(self.lag_posted.wait(), WAIT_S)


async def until(condition: Callable[[], bool], pilot: object) -> None:
    """Let the app run until ``condition()`` holds; fail after WAIT_S."""

    async def poll() -> None:
        while not condition():
            await pilot.pause(0.01)  # type: ignore[attr-defined]

    await asyncio.wait_for(poll(), WAIT_S)


async def stream(message: ChatMessage, text: str, size: int = 3) -> None:
    for delta in tokens(text, size):
        message.append(delta)
        await asyncio.sleep(0)


# -- streaming and the final render


async def test_streamed_reply_shows_everything_and_matches_a_reply_rendered_whole() -> None:
    app = ChatApp()
    async with app.run_test(size=(90, 60)) as pilot:
        conversation = app.query_one(Conversation)
        streamed = conversation.add_assistant()
        await pilot.pause()
        await stream(streamed, REPLY)
        streamed.finish(status="done", note="TTFT 212 ms · 70 tok/s · HTTP/2")
        whole = conversation.add_assistant(REPLY, status="done", note="TTFT 212 ms · 70 tok/s · HTTP/2")
        await asyncio.wait_for(streamed.wait_final(), WAIT_S)
        await asyncio.wait_for(whole.wait_final(), WAIT_S)
        await pilot.pause()
        text = streamed.rendered_text()
        for expected in (
            "Report 日本語",
            "inline code",
            "🚀✨",
            "中文字符",
            "def handler(request):",
            "two lines'''",
            'return {"ok": True, "note": note}',
            "first token",
            "速い",
            "two items with code",
            "a quote at the end",
            "TTFT 212 ms · 70 tok/s · HTTP/2",
        ):
            assert expected in text, expected
        assert "```" not in text and "|---" not in text
        assert streamed.text == REPLY
        width = streamed.inner_width
        assert streamed.lines_for(width) == whole.lines_for(width)
        assert streamed.renders >= 1


async def test_a_stream_cut_mid_fence_ends_as_a_correct_code_block() -> None:
    cut = "Here is the start:\n\n```python\nx = '''first\nsecond'''\ny = 2"
    app = ChatApp()
    async with app.run_test(size=(70, 30)) as pilot:
        conversation = app.query_one(Conversation)
        message = conversation.add_assistant()
        await pilot.pause()
        # One delta per line, each painted, so the fence is highlighted in batches that split the string.
        for line in cut.splitlines(keepends=True):
            message.append(line)
            await app.next_frame()
        message.finish(status="cancelled", note="2 tokens")
        reference = conversation.add_assistant(cut + "\n```\n", status="cancelled", note="2 tokens")
        await asyncio.wait_for(message.wait_final(), WAIT_S)
        await asyncio.wait_for(reference.wait_final(), WAIT_S)
        await pilot.pause()
        width = message.inner_width
        lines = message.lines_for(width)
        assert lines == reference.lines_for(width)
        texts = [text_of(line).rstrip() for line in lines]
        assert texts[-1] == "cancelled · 2 tokens"
        second = next(line for line in lines if "second'''" in text_of(line))
        first = next(line for line in lines if "'''first" in text_of(line))
        code_background = message.renderer.code_background.bgcolor
        assert all(
            segment.style is not None and segment.style.bgcolor == code_background for segment in second
        )
        # The string's second line is coloured like its first: the code was lexed as one piece.
        assert _style_of(second, "second") == _style_of(first, "first")


def _style_of(line: Line, word: str) -> object:
    for segment in line:
        if word in segment.text:
            return segment.style
    raise AssertionError(f"{word!r} not in {text_of(line)!r}")


def _width(line: Line) -> int:
    return sum(cell_len(segment.text) for segment in line)


async def test_a_burst_of_appends_is_painted_in_few_frames_with_a_lag_for_each() -> None:
    app = ChatApp()
    async with app.run_test(size=(80, 30)) as pilot:
        message = app.query_one(Conversation).add_assistant()
        await pilot.pause()
        for index in range(1000):
            message.append(f"w{index} ")
            if index % 10 == 9:
                await asyncio.sleep(0)
        message.finish()
        await asyncio.wait_for(message.wait_final(), WAIT_S)
        await until(lambda: len(app.lags) >= message.renders, pilot)
        assert 1 <= message.renders < 50
        assert len(app.lags) == message.renders
        assert all(lag >= 0 for lag in app.lags)
        assert "w0 w1 w2" in message.rendered_text() and "w999" in message.rendered_text()


async def test_render_lag_counts_from_when_the_delta_arrived() -> None:
    app = ChatApp()
    async with app.run_test(size=(80, 20)) as pilot:
        message = app.query_one(Conversation).add_assistant()
        await pilot.pause()
        message.append("late ", arrived_ns=perf_counter_ns() - 250_000_000)
        message.append("and later", arrived_ns=perf_counter_ns())
        await app.next_frame()
        assert app.lags[-1] >= 250.0


async def test_deltas_after_finish_are_ignored_and_finishing_twice_changes_only_the_status() -> None:
    app = ChatApp()
    async with app.run_test(size=(80, 20)) as pilot:
        message = app.query_one(Conversation).add_assistant()
        await pilot.pause()
        message.append("partial answer")
        message.finish(status="cancelled")
        message.append(" that arrived too late")
        await asyncio.wait_for(message.wait_final(), WAIT_S)
        assert message.text == "partial answer"
        assert message.has_class("-cancelled") and not message.has_class("-streaming")
        message.finish(status="error", note="the server closed the stream")
        await pilot.pause()
        assert message.rendered_text().splitlines()[-1] == "error: the server closed the stream"
        assert message.has_class("-error") and not message.has_class("-cancelled")
        with pytest.raises(ValueError):
            message.finish(status="lost")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("status", "note", "last_line"),
    [
        ("cancelled", "TTFT 212 ms", "cancelled · TTFT 212 ms"),
        ("error", "HTTP 500 from the server", "error: HTTP 500 from the server"),
        ("cached", "0.4 ms", "from cache · 0.4 ms"),
        ("done", "TTFT 212 ms · 70 tok/s · HTTP/2", "TTFT 212 ms · 70 tok/s · HTTP/2"),
        ("done", "", "The answer."),
    ],
)
async def test_the_status_line_under_a_finished_reply(status: str, note: str, last_line: str) -> None:
    app = ChatApp()
    async with app.run_test(size=(80, 20)) as pilot:
        message = app.query_one(Conversation).add_assistant()
        await pilot.pause()
        message.append("The answer.")
        message.finish(status=status, note=note)  # type: ignore[arg-type]
        await asyncio.wait_for(message.wait_final(), WAIT_S)
        await pilot.pause()
        assert message.rendered_text().splitlines()[-1] == last_line
        assert message.status == status and message.has_class(f"-{status}")


async def test_code_blocks_lists_every_block_nested_ones_too() -> None:
    text = (
        "Two blocks:\n\n```python\nprint(1)\n```\n\n- item\n\n  ```sh\n  ls -l\n  ```\n\n"
        "After the list.\n\n    indented\n"
    )
    message = ChatMessage(text, status="done")
    assert message.code_blocks() == ["print(1)", "ls -l", "indented"]
    assert ChatMessage("no code here", status="done").code_blocks() == []


async def test_wide_characters_and_emoji_never_overflow_the_width() -> None:
    text = (
        "日本語のテキスト🚀 " * 30
        + "\n\n| 列 | 🚀 |\n|---|---|\n| 中文 | ✨ |\n\n```\n"
        + "漢字" * 50
        + "\n```\n"
    )
    app = ChatApp()
    async with app.run_test(size=(41, 40)) as pilot:
        message = app.query_one(Conversation).add_assistant(text, status="done")
        await asyncio.wait_for(message.wait_final(), WAIT_S)
        await pilot.pause()
        width = message.inner_width
        lines = message.lines_for(width)
        assert lines and all(_width(line) == width for line in lines)
        joined = "".join(text_of(line) for line in lines)
        assert joined.count("🚀") == 31 and "中文" in joined
        assert joined.count("漢") == joined.count("字") == 50


async def test_a_resize_renders_again_at_the_new_width() -> None:
    app = ChatApp()
    async with app.run_test(size=(100, 40)) as pilot:
        message = app.query_one(Conversation).add_assistant(REPLY, status="done")
        await asyncio.wait_for(message.wait_final(), WAIT_S)
        await pilot.pause()
        wide = message.inner_width
        wide_height = len(message.lines_for(wide))
        await pilot.resize_terminal(50, 40)
        await until(lambda: message.inner_width < wide, pilot)
        narrow = message.inner_width
        assert all(_width(line) == narrow for line in message.lines_for(narrow))
        assert len(message.lines_for(narrow)) > wide_height
        assert message.size.height == len(message.lines_for(narrow))


async def test_a_theme_change_repaints_in_the_new_colours() -> None:
    app = ChatApp()
    async with app.run_test(size=(80, 30)) as pilot:
        message = app.query_one(Conversation).add_assistant("```python\nx = 1\n```", status="done")
        await asyncio.wait_for(message.wait_final(), WAIT_S)
        await pilot.pause()
        dark = message.lines_for(message.inner_width)
        app.theme = "textual-light"
        await pilot.pause()
        light = message.lines_for(message.inner_width)
        assert [text_of(line) for line in dark] == [text_of(line) for line in light]
        assert _backgrounds(dark) != _backgrounds(light)


def _backgrounds(lines: list[Line]) -> set[object]:
    return {segment.style.bgcolor for line in lines for segment in line if segment.style is not None}


# -- frame pacing


class PacedMessage(ChatMessage):
    """A reply that records when each frame taking in new text started, and may make frames costly."""

    def __init__(self, *, frame_rate: float = 60.0, burn_ms: float = 0.0) -> None:
        super().__init__(frame_rate=frame_rate)
        self.frame_starts: list[int] = []
        self.burn_ns = int(burn_ms * 1e6)

    def _frame(self) -> None:
        started, renders = perf_counter_ns(), self.renders
        super()._frame()
        if self.renders > renders:
            self.frame_starts.append(started)

    def build_lines(self, width: int) -> list[Line]:
        # CPU time, so the cost is the same on a fast machine and on a busy one.
        until_ns = thread_time_ns() + self.burn_ns
        while thread_time_ns() < until_ns:
            pass
        return super().build_lines(width)


async def mount_reply(app: App[None], pilot: object, message: ChatMessage) -> None:
    """Mount ``message`` at the end of the conversation and let it settle."""
    await app.query_one(Conversation).mount(message)
    await pilot.pause()  # type: ignore[attr-defined]


async def test_the_first_delta_after_a_pause_is_painted_on_the_next_turn_of_the_loop() -> None:
    app = ChatApp()
    async with app.run_test(size=(80, 20)) as pilot:
        message = PacedMessage(frame_rate=20.0)
        await mount_reply(app, pilot, message)
        message.append("First ")
        await asyncio.sleep(0)  # one turn of the loop: not a frame interval, not even a timer's 1 ms
        assert message.renders == 1
        await app.next_frame()
        message.append("soon after ")
        await asyncio.sleep(0)
        assert message.renders == 1  # within the frame interval: it waits for the next frame
        await app.next_frame()
        assert message.renders == 2
        # A pause longer than the interval (and than the frames' cost allows): painted at once again.
        await until(lambda: perf_counter_ns() > message._next_frame_ns, pilot)
        message.append("after a pause")
        await asyncio.sleep(0)
        assert message.renders == 3
        await app.next_frame()
        assert message.rendered_text() == "First soon after after a pause"


async def test_deltas_faster_than_frames_are_coalesced_one_frame_interval_apart() -> None:
    app = ChatApp()
    async with app.run_test(size=(80, 30)) as pilot:
        message = PacedMessage(frame_rate=30.0)
        await mount_reply(app, pilot, message)
        deltas = 0
        while len(message.frame_starts) < 4:
            message.append(f"w{deltas} ")
            deltas += 1
            await asyncio.sleep(0.002)
        await until(lambda: len(app.lags) >= message.renders, pilot)
        assert message.renders == len(message.frame_starts) < deltas
        gaps = [b - a for a, b in zip(message.frame_starts, message.frame_starts[1:], strict=False)]
        interval_ns = 1e9 / 30.0
        assert all(gap >= interval_ns - 1e6 for gap in gaps), gaps  # 1 ms for the recording itself


async def test_costly_frames_are_spaced_by_their_cost_over_the_frame_share() -> None:
    app = ChatApp()
    async with app.run_test(size=(80, 30)) as pilot:
        message = PacedMessage(burn_ms=15.0)
        await mount_reply(app, pilot, message)
        while len(message.frame_starts) < 3:
            message.append("word ")
            await asyncio.sleep(0.005)
        gaps = [b - a for a, b in zip(message.frame_starts, message.frame_starts[1:], strict=False)]
        # 15 ms of CPU a frame at most 10 % of a core: 150 ms apart, not 1/60 s.
        assert all(gap >= 15e6 / _MAX_FRAME_SHARE for gap in gaps), gaps


class Busy(ChatMessage):
    """Another widget on screen whose next repaint is slow (a chart, say)."""

    burn_ns = 0

    def render_line(self, y: int) -> Strip:
        until_ns, Busy.burn_ns = thread_time_ns() + Busy.burn_ns, 0
        while thread_time_ns() < until_ns:
            pass
        return super().render_line(y)

    @classmethod
    def slow_next_repaint(cls, app: App[None]) -> None:
        """Make the next repaint of the one on screen take 50 ms of CPU."""
        cls.burn_ns = 50_000_000
        app.query_one(cls).refresh()


async def with_busy_neighbour(app: App[None], pilot: object) -> PacedMessage:
    """A finished reply that can be made slow to repaint, and a streaming one after it."""
    await mount_reply(app, pilot, Busy("a finished reply", status="done"))
    message = PacedMessage()
    await mount_reply(app, pilot, message)
    return message


async def test_a_slow_first_paint_does_not_hold_back_the_frames_after_it() -> None:
    # A reply's first frame also lays it out: that is not what its next frames will cost.
    app = ChatApp()
    async with app.run_test(size=(80, 30)) as pilot:
        message = await with_busy_neighbour(app, pilot)
        message.append("first ")
        Busy.slow_next_repaint(app)
        await app.next_frame()
        assert max(message._frame_costs) >= 50_000_000
        assert message._next_frame_ns - message.frame_starts[0] < 50_000_000 / _MAX_FRAME_SHARE


async def test_other_work_before_a_frame_is_on_screen_is_not_charged_to_the_frames_after_it() -> None:
    app = ChatApp()
    async with app.run_test(size=(80, 30)) as pilot:
        message = await with_busy_neighbour(app, pilot)
        for index in range(5):
            await until(lambda: perf_counter_ns() > message._next_frame_ns, pilot)
            message.append(f"word{index} ")
            await app.next_frame()
        usual = max(message._frame_costs)
        await until(lambda: perf_counter_ns() > message._next_frame_ns, pilot)
        message.append("slow ")
        Busy.slow_next_repaint(app)  # painted in the same screen update as that frame
        await app.next_frame()
        assert max(message._frame_costs) >= 50_000_000  # the frame's window held the slow repaint...
        assert message._frame_cost_ns <= usual  # ...but the frames after it keep their usual pace
        assert message._next_frame_ns - message.frame_starts[-1] < 50_000_000 / _MAX_FRAME_SHARE


async def test_render_lag_is_reported_once_the_frame_was_written_to_the_terminal() -> None:
    class DisplayApp(ChatApp):
        def __init__(self) -> None:
            super().__init__()
            self.displays: list[int] = []
            self.seen_at_lag: list[tuple[int, int]] = []

        def post_display_hook(self) -> None:
            self.displays.append(perf_counter_ns())

        def on_chat_message_render_lag(self, event: ChatMessage.RenderLag) -> None:
            assert isinstance(event.chat_message, RowsMessage)
            self.seen_at_lag.append((event.chat_message.last_row_painted, self.displays[-1]))
            super().on_chat_message_render_lag(event)

    class RowsMessage(ChatMessage):
        last_row_painted = 0

        def render_line(self, y: int) -> Strip:
            strip = super().render_line(y)
            if "words" in strip.text:
                RowsMessage.last_row_painted = perf_counter_ns()
            return strip

    app = DisplayApp()
    async with app.run_test(size=(80, 20)) as pilot:
        message = RowsMessage()
        await mount_reply(app, pilot, message)
        appended = perf_counter_ns()
        message.append("the words of the reply")
        await app.next_frame()
        painted, displayed = app.seen_at_lag[-1]
        # The row holding the text was rendered for the screen, and the update written, before the lag.
        assert appended < painted < displayed


async def test_an_error_in_a_frame_reaches_textual_not_the_event_loop() -> None:
    class Broken(ChatMessage):
        def build_lines(self, width: int) -> list[Line]:
            if self.text:
                raise ZeroDivisionError("a bug in rendering")
            return super().build_lines(width)

    app = ChatApp()
    with pytest.raises(ZeroDivisionError):
        async with app.run_test(size=(80, 20)) as pilot:
            message = Broken()
            await mount_reply(app, pilot, message)
            message.append("boom")
            await pilot.pause(0.2)


async def test_a_reply_removed_while_a_frame_is_due_renders_no_more() -> None:
    app = ChatApp()
    async with app.run_test(size=(80, 20)) as pilot:
        conversation = app.query_one(Conversation)
        message = PacedMessage(frame_rate=2.0)
        await conversation.mount(message)
        await pilot.pause()
        message.append("one ")
        await app.next_frame()
        message.append("two")  # due in half a second
        await conversation.clear()
        # Whatever a loaded machine let through before the removal, nothing renders after it: neither the
        # frame that was due nor one for a late token.
        at_removal = message.renders
        await pilot.pause(0.7)
        message.append(" and a late one")
        await pilot.pause(0.7)
        assert message.renders == at_removal <= 2


# -- the conversation


async def _fill(conversation: Conversation, replies: int) -> None:
    await conversation.add_history(
        widget
        for index in range(replies)
        for widget in (
            UserMessage(f"question {index}"),
            ChatMessage(f"Answer {index}.\n\n" + "text " * 60, status="done"),
        )
    )


async def _all_rendered(conversation: Conversation, pilot: object) -> None:
    await until(lambda: not any(m.deferred for m in conversation.messages()), pilot)
    await pilot.pause()  # type: ignore[attr-defined]


async def test_the_view_follows_new_text_only_while_at_the_bottom() -> None:
    app = ChatApp()
    async with app.run_test(size=(60, 20)) as pilot:
        conversation = app.query_one(Conversation)
        await _fill(conversation, 6)
        await _all_rendered(conversation, pilot)
        message = conversation.add_assistant()
        await pilot.pause()
        message.append("line\n\n" * 10)
        await app.next_frame()
        assert conversation.following and conversation.scroll_y == conversation.max_scroll_y > 0

        conversation.scroll_to(y=3, animate=False)  # applied after the next refresh
        await until(lambda: conversation.scroll_y == 3, pilot)
        assert not conversation.following
        bottom = conversation.max_scroll_y
        message.append("more\n\n" * 20)
        await app.next_frame()
        await pilot.pause()
        assert conversation.max_scroll_y > bottom
        assert conversation.scroll_y == 3

        conversation.scroll_end(animate=False)
        await until(lambda: conversation.following, pilot)
        message.append("even more\n\n" * 20)
        await app.next_frame()
        await pilot.pause()
        assert conversation.scroll_y == conversation.max_scroll_y


async def test_scrolling_down_at_the_bottom_keeps_following() -> None:
    app = ChatApp()
    async with app.run_test(size=(60, 20)) as pilot:
        conversation = app.query_one(Conversation)
        await _fill(conversation, 6)
        await _all_rendered(conversation, pilot)
        message = conversation.add_assistant()
        await pilot.pause()
        assert conversation.scroll_y == conversation.max_scroll_y
        conversation.scroll_down(animate=False)  # cannot move: already at the bottom
        await pilot.pause()
        await until(lambda: conversation.following, pilot)
        message.append("new text\n\n" * 20)
        await app.next_frame()
        await pilot.pause()
        assert conversation.scroll_y == conversation.max_scroll_y


async def test_resuming_200_messages_mounts_them_all_and_shows_the_end() -> None:
    app = ChatApp()
    async with app.run_test(size=(80, 30)) as pilot:
        conversation = app.query_one(Conversation)
        await _fill(conversation, 100)
        await pilot.pause()
        messages = conversation.messages()
        assert len(messages) == 200
        assert conversation.scroll_y == conversation.max_scroll_y > 0
        last = conversation.last_reply()
        assert last is not None and last.text.startswith("Answer 99.")
        await conversation.clear()
        assert conversation.messages() == [] and conversation.following


async def test_a_long_history_mounts_on_estimates_then_renders_for_real_in_the_background() -> None:
    app = ChatApp()
    async with app.run_test(size=(80, 30)) as pilot:
        conversation = app.query_one(Conversation)
        history = [ChatMessage(REPLY, status="done", note=f"reply {index}") for index in range(40)]
        await conversation.add_history(history)
        assert history[0].deferred and not history[-1].deferred
        await _all_rendered(conversation, pilot)
        for message in history:
            width = message.inner_width
            assert message.size.height == len(message.lines_for(width))
        assert conversation.scroll_y == conversation.max_scroll_y


async def test_background_rendering_keeps_a_scrolled_up_view_on_the_same_text() -> None:
    app = ChatApp()
    async with app.run_test(size=(80, 30)) as pilot:
        conversation = app.query_one(Conversation)
        history = [ChatMessage(REPLY + "\n" + "wide " * 40, status="done") for _ in range(60)]
        target = history[30]
        deferred_above: list[int] = []

        def scroll_up() -> None:
            # Runs after the first layout, before the first slice of background rendering.
            conversation.scroll_to(y=target.virtual_region.y + 2, animate=False)
            deferred_above.append(sum(message.deferred for message in history[:30]))

        mounting = conversation.add_history(history)
        conversation.call_after_refresh(scroll_up)
        await mounting
        await _all_rendered(conversation, pilot)
        assert deferred_above and deferred_above[0] > 20
        assert not conversation.following
        assert conversation.scroll_y - target.virtual_region.y == 2


# -- the prompt


async def test_enter_sends_and_the_newline_keys_do_not() -> None:
    app = ChatApp()
    async with app.run_test(size=(60, 20)) as pilot:
        prompt = app.query_one(PromptInput)
        prompt.focus()
        await pilot.press("h", "i", "enter")
        assert app.submitted == ["hi"] and prompt.text == ""
        await pilot.press("a", "ctrl+j", "b", "alt+enter", "c", "shift+enter", "d")
        assert prompt.text == "a\nb\nc\nd" and app.submitted == ["hi"]
        await pilot.press("enter")
        assert app.submitted == ["hi", "a\nb\nc\nd"] and prompt.text == ""
        await pilot.press("space", "enter")
        assert app.submitted == ["hi", "a\nb\nc\nd"]


async def test_the_prompt_acts_on_the_keys_it_is_given() -> None:
    app = ChatApp()
    async with app.run_test(size=(60, 20)) as pilot:
        prompt = app.query_one(PromptInput)
        prompt.focus()
        prompt.use_keys(send="ctrl+s", newline="ctrl+j,question_mark")
        await pilot.press("x", "enter", "y", "?", "z", "ctrl+s")
        assert app.submitted == ["x\ny\nz"]


async def test_a_held_prompt_keeps_its_text_and_says_so() -> None:
    app = ChatApp()
    async with app.run_test(size=(60, 20)) as pilot:
        prompt = app.query_one(PromptInput)
        prompt.focus()
        prompt.hold_on_send = True
        await pilot.press("a", "enter", "b", "enter")
        assert app.submitted == ["a"] and prompt.text == "b" and prompt.held and app.refused == 1
        prompt.held = False
        await pilot.press("enter")
        assert app.submitted == ["a", "b"] and prompt.text == ""


async def test_restore_puts_the_prompt_back_after_an_error() -> None:
    app = ChatApp()
    async with app.run_test(size=(60, 20)) as pilot:
        prompt = app.query_one(PromptInput)
        prompt.focus()
        await pilot.press("a", "s", "k", "enter")
        assert prompt.text == ""
        prompt.restore(app.submitted[-1])
        assert prompt.text == "ask" and prompt.cursor_location == (0, 3)
        await pilot.press("!")
        assert prompt.text == "ask!"
        prompt.restore("older")
        assert prompt.text == "older\nask!"


# -- the incremental renderer on its own (no app)


def _renderer() -> MarkdownRenderer:
    return MarkdownRenderer(Palette.from_variables({}, dark=True))


def _streamed_lines(text: str, cuts: list[int], width: int) -> list[Line]:
    document = MarkdownDocument()
    renderer = _renderer()
    document.bind(renderer)
    start = 0
    for cut in sorted(cuts) + [len(text)]:
        document.append(text[start:cut])
        start = cut
        document.sync()
        document.work(perf_counter_ns() + 2_000_000)
        document.lines(width)
    document.finish()
    while document.busy:
        document.work(perf_counter_ns() + 2_000_000)
    return document.lines(width)


TRICKY = """Setext heading
==============

1. first
2. second, then a nested fence:

   ```sh
   echo "in a list"
   ```

3. third

Para then a table with no blank line
| a | b |
|---|---|
| 1 | 2 |
***
> quoted `code`
lazy continuation line

    indented code
    after a paragraph

- a loose item

  still the same item
| not | a table |

Para closed by a blank line

    indented code after it

Last line without a newline"""


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([REPLY, TRICKY]), st.lists(st.floats(min_value=0, max_value=1), max_size=40))
def test_any_way_of_cutting_a_stream_ends_as_the_whole_render(text: str, fractions: list[float]) -> None:
    parser = new_parser()
    expected = _renderer().blocks(split_blocks(parser, text), 72, parser)
    assert _streamed_lines(text, [int(f * len(text)) for f in fractions], 72) == expected


def test_a_partial_line_never_settles_the_block_before_it() -> None:
    stream = BlockStream()
    stream.append("A paragraph line\n#")
    stream.sync()
    assert stream.settled == []  # "#" alone is a heading; "#include" will not be
    stream.append("include <stdio.h>\n")
    stream.sync()
    assert stream.settled == [] and [block.kind for block in stream.tail] == ["paragraph_open"]
    stream.append("\nNext paragraph\n")
    stream.sync()
    assert [block.kind for block in stream.settled] == ["paragraph_open"]
    assert stream.settled[0].tokens(stream.parser)[1].content == "A paragraph line\n#include <stdio.h>"


class ParsingStream(BlockStream):
    """A block stream that parses its tail again on every sync: the reference for the shortcut."""

    def _lengthen_paragraph(self) -> bool:
        return False


def _blocks_of(stream: BlockStream) -> list[dict[str, object]]:
    """The stream's blocks as comparable dicts: lines, source and every token."""
    return [
        {
            "span": (b.start, b.end),
            "source": b.source,
            "tokens": [t.as_dict() for t in b.tokens(stream.parser)],
        }
        for b in stream.settled + stream.tail
    ]


PROSE = (
    "A *first* paragraph with **bold**, `code` and a [link](https://example.org) that wraps. "
    "Then more words, 日本語 and émoji 🚀 after it  \nand a second line.\n\n"
    "Second _paragraph_ goes on and on with plain words only, then ends.\n"
)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([REPLY, TRICKY, PROSE]), st.lists(st.integers(min_value=1, max_value=12), max_size=80))
def test_lengthening_a_paragraph_without_parsing_gives_the_blocks_a_parse_gives(
    text: str, sizes: list[int]
) -> None:
    # Deltas of a few characters to a dozen, as word pieces arrive: most of them go through the
    # shortcut, and after each the blocks must be exactly those of parsing everything so far.
    stream, reference, start = BlockStream(), ParsingStream(), 0
    for size in [*sizes, len(text)]:
        for each in (stream, reference):
            each.append(text[start : start + size])
            each.sync()
        start += size
        assert _blocks_of(stream) == _blocks_of(reference)
        if start >= len(text):
            break
    stream.finish()
    reference.finish()
    assert _blocks_of(stream) == _blocks_of(reference)


def test_a_word_added_to_a_paragraph_is_not_parsed_again() -> None:
    stream = BlockStream()
    stream.append("Some words *emphasised* then more ")
    stream.sync()
    before = stream.tail[0].tokens(stream.parser)
    stream.append("plain words")
    stream.sync()
    after = stream.tail[0].tokens(stream.parser)
    assert after[0] is before[0] and after[1] is not before[1]  # reused, not parsed again
    assert after[1].content == "Some words *emphasised* then more plain words"
    stream.append(" and *more")  # markup: parsed again
    stream.sync()
    assert stream.tail[0].tokens(stream.parser)[0] is not before[0]


def test_a_block_closed_by_a_blank_line_settles_before_the_next_line_is_complete() -> None:
    # A prose paragraph is one long line: waiting for the next complete line to settle the one
    # before it would render both again with every token.
    stream = BlockStream()
    stream.append("# Title\n\nFirst paragraph.\n\nSecond, still stre")
    stream.sync()
    assert [block.kind for block in stream.settled] == ["heading_open", "paragraph_open"]
    assert [block.source for block in stream.tail] == ["Second, still stre"]
    stream.append("aming.\n\n- a list item\n\n")
    stream.sync()
    # A list can go on after a blank line (a loose item, or text indented under it): it waits.
    assert [block.kind for block in stream.settled][-1] == "paragraph_open"
    assert [block.kind for block in stream.tail] == ["bullet_list_open"]


def test_a_link_reference_defined_later_is_applied_at_the_end() -> None:
    text = "See [the docs][d] first.\n\nMore text here.\n\n[d]: https://example.org/docs\n"
    lines = _streamed_lines(text, [30, 50], 60)
    assert any("https://example.org/docs" in text_of(line) for line in lines)
    parser = new_parser()
    assert lines == _renderer().blocks(split_blocks(parser, text), 60, parser)


def test_highlighting_in_slices_always_has_one_line_per_source_line() -> None:
    code = "\n".join(f"value_{index} = '''a\nb''' + {index}" for index in range(60))
    fence = _renderer().fence_highlight("python")
    fence.set_code(code, final=True)
    assert len(fence.lines()) == code.count("\n") + 1
    slices = 0
    while fence.busy:
        fence.work(perf_counter_ns())  # a deadline already past still makes progress
        slices += 1
        if slices % 5 == 0:
            assert len(fence.lines()) == code.count("\n") + 1
    assert slices > 1 and fence.exact
    plain = {segment.style for segments, _ in fence.lines() for segment in segments}
    assert len(plain) > 2  # coloured, not plain text


def test_lines_are_exactly_the_width_asked_for() -> None:
    parser = new_parser()
    lines = _renderer().blocks(split_blocks(parser, REPLY), 33, parser)
    assert lines and all(_width(line) == 33 for line in lines)
    assert all(isinstance(segment, Segment) for line in lines for segment in line)


def test_a_one_row_line_keeps_the_style_of_a_text_without_spans() -> None:
    """A label is a Text with a style and no spans: Rich's Text.render leaves that style to its caller."""
    renderer = _renderer()
    plain = renderer.line(Text("llmchat-local", style="status.label", end=""), 20)
    spans = renderer.line(Text.assemble(("llmchat-local", "status.label"), end=""), 20)
    assert plain == spans and _width(plain) == 20
    assert plain[0].style is not None and plain[0].style.bold


def test_a_document_rendered_again_at_another_width_matches_a_fresh_render() -> None:
    document = MarkdownDocument(REPLY)
    renderer = _renderer()
    document.bind(renderer)
    document.finish()
    while document.busy:
        document.work(perf_counter_ns() + 2_000_000)
    document.lines(72)
    document.lines(90)
    parser = new_parser()
    assert document.lines(41) == renderer.blocks(split_blocks(parser, REPLY), 41, parser)


def test_carriage_returns_do_not_shift_blocks_and_the_text_is_kept_as_given() -> None:
    text = "First paragraph.\r\n\r\n```python\r\nx = 1\r\n```\r\n\r\nLast one.\r\n"
    document = MarkdownDocument()
    document.bind(_renderer())
    for piece in tokens(text, 2):
        document.append(piece)
        document.sync()
    document.finish()
    assert document.text == text
    rendered = [text_of(line).strip() for line in document.lines(40)]
    assert "First paragraph." in rendered and "x = 1" in rendered and "Last one." in rendered


def test_rendering_against_a_deadline_goes_block_by_block_and_ends_complete() -> None:
    document = MarkdownDocument(REPLY * 3)
    renderer = _renderer()
    document.bind(renderer)
    document.finish()
    counts: list[int] = []
    while not counts or not document.complete(60):
        counts.append(len(document.lines(60, deadline_ns=perf_counter_ns())))  # a deadline already past
    assert len(counts) > 5 and counts == sorted(counts)
    while document.busy:
        document.work(perf_counter_ns() + 2_000_000)
    parser = new_parser()
    assert document.lines(60) == renderer.blocks(split_blocks(parser, REPLY * 3), 60, parser)


async def test_a_huge_burst_is_painted_in_slices_and_ends_whole() -> None:
    app = ChatApp()
    async with app.run_test(size=(80, 30)) as pilot:
        conversation = app.query_one(Conversation)
        message = conversation.add_assistant()
        await pilot.pause()
        message.append(REPLY * 20)
        message.finish(status="done", note="burst")
        reference = conversation.add_assistant(REPLY * 20, status="done", note="burst")
        await asyncio.wait_for(message.wait_final(), WAIT_S)
        await asyncio.wait_for(reference.wait_final(), WAIT_S)
        await until(lambda: len(app.lags) == 1, pilot)
        assert message.renders == 1
        assert message.lines_for(message.inner_width) == reference.lines_for(reference.inner_width)


async def test_a_streaming_reply_grows_in_steps_of_several_rows() -> None:
    app = ChatApp()
    async with app.run_test(size=(60, 30)) as pilot:
        message = app.query_one(Conversation).add_assistant()
        await pilot.pause()
        heights = []
        for index in range(40):
            message.append(f"row {index}\n\n")
            await app.next_frame()
            await pilot.pause()
            rows = len(message.lines_for(message.inner_width))
            assert message.size.height >= rows  # the text always fits
            heights.append(message.size.height)
        assert len(set(heights)) <= 40 * 2 // 4 + 1  # 80 rows of text, a height change per 4 rows or more
        message.finish()
        await asyncio.wait_for(message.wait_final(), WAIT_S)
        await pilot.pause()
        assert message.size.height == len(message.lines_for(message.inner_width))


async def _screen_after(streamed: bool, label: str | None = None) -> str:
    app = ChatApp()
    async with app.run_test(size=(70, 24)) as pilot:
        conversation = app.query_one(Conversation)
        conversation.add_user("Show me everything.")
        if streamed:
            message = conversation.add_assistant(label=label)
            if label is not None:
                # A state line that changes on every tick, and moves down with the text.
                message.follow(lambda now, _: (label, Text(f"streaming · {now % 997} · {message.renders}")))
            await pilot.pause()
            for line in REPLY.splitlines(keepends=True):
                message.append(line)
                await app.next_frame()
                if label is not None:
                    await pilot.pause(0.03)
            message.finish(status="done", note="TTFT 212 ms")
        else:
            message = conversation.add_assistant(REPLY, status="done", note="TTFT 212 ms", label=label)
        await asyncio.wait_for(message.wait_final(), WAIT_S)
        await pilot.pause()
        return app.export_screenshot()


async def test_a_streamed_reply_leaves_the_screen_as_a_reply_rendered_whole() -> None:
    # Rows painted during the stream are kept across height changes; none may be left stale.
    assert await _screen_after(streamed=True) == await _screen_after(streamed=False)


async def test_a_followed_reply_leaves_no_state_line_behind() -> None:
    # The state row moved down with the text and was repainted on its ticker: once finished, the screen is
    # that of the same reply rendered whole, label and all.
    assert await _screen_after(streamed=True, label="llmchat-local") == await _screen_after(
        streamed=False, label="llmchat-local")


async def test_a_followed_reply_shows_its_state_in_the_row_after_its_text() -> None:
    app = ChatApp()
    async with app.run_test(size=(60, 30)) as pilot:
        message = app.query_one(Conversation).add_assistant(label="")
        calls: list[int] = []

        def state(now: int, width: int) -> tuple[str, Text]:
            calls.append(width)
            return "model-x", Text(f"waiting · {len(calls)}")

        message.follow(state)
        await until(lambda: message.live_text.startswith("waiting"), pilot)
        assert message.label == "model-x" and message.rendered_text().splitlines()[0] == "model-x"
        assert message.size.height == 2  # the label and the state row: no rows held for text not yet here
        row = message.row_after_lines(0, message.inner_width)
        assert row is not None and text_of(row).rstrip() == message.live_text
        assert set(calls) == {message.inner_width}
        message.append("First words.\n\nA second paragraph.")
        await until(lambda: "A second paragraph." in message.rendered_text(), pilot)
        seen = message.live_repaints
        await until(lambda: message.live_repaints >= seen + 2, pilot)  # it keeps ticking, at most 10 a second
        lines = message.lines_for(message.inner_width)
        assert message.size.height > len(lines)  # the state row sits in the rows held below the text
        message.finish(status="done", note="done note")
        await asyncio.wait_for(message.wait_final(), WAIT_S)
        count = len(calls)
        await pilot.pause(0.25)
        assert len(calls) == count and message.live_text == ""  # the ticker stopped with the reply
        assert message.rendered_text().splitlines()[-1] == "done note"
        with pytest.raises(ValueError):
            message.follow(state, interval_s=0.01)
