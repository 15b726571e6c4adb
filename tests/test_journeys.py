"""User journeys through the installed `llmchat` in a real pseudo-terminal, its screen read by pyte.

Pilot hands the app one key at a time; a terminal hands it whatever arrived in one read. These journeys type
the way terminals deliver it (tests/terminal.py): a whole prompt and its Enter in one write, a bracketed paste
and Enter, keys typed while a reply streams, Esc, Ctrl+B, Ctrl+Q. Each asserts on what the screen shows and on
what the history file holds (read-only, straight from SQLite). Where a step is not the point of the journey,
it is typed as a person types it: the text, then Enter once the text shows in the input.

The servers are `llmchat serve` child processes on 127.0.0.1 with isolated config: ``quick`` answers at once
with a one-block reply (so a whole conversation fits on the screen), ``slow`` streams for about half a minute
(so a reply is still streaming when the journey needs it to be). Journeys reach them through a provider in the
isolated config file, as a user would configure one, except the two that test ``--base-url`` itself.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import peers as P
import pytest
from terminal import PASTE_END, PASTE_START, Terminal, TerminalSession, group_alive

from llmchat.core.server import start_subprocess
from llmchat.core.server._subprocess import SubprocessServer

#: Bounds. Start-up covers a cold interpreter and, offline, the local server's own start on a busy 2-core box.
START_S = 30.0
REPLY_S = 15.0
OFFLINE_REPLY_S = 30.0  # the offline default streams ~300 tokens at ~70 tokens/s
STEP_S = 10.0

PLACEHOLDER = "Ask anything"
HUD_EDGE = "▏"  # the HUD's left border: everything left of it is the chat column
STILL_COMING = "a reply is still coming"


# -- servers -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SubprocessServer]:
    """Answers at once; a reply is one block (heading, a line that echoes the prompt, two sentences)."""
    with _serve(tmp_path_factory, ["--profile", "instant"], LLMCHAT_SERVER__DEFAULT_MAX_TOKENS="24") as s:
        yield s


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SubprocessServer]:
    """Streams ~300 tokens at 12 tokens/s: still streaming half a minute after the first token. Not
    ``--profile slow``: its 9 s cold start would only make every journey wait."""
    with _serve(tmp_path_factory, ["--ttft-ms", "200", "--tokens-per-s", "12"]) as server:
        yield server


def _serve(tmp_path_factory: pytest.TempPathFactory, flags: list[str], **env: str) -> SubprocessServer:
    # start_subprocess hands the child this process's environment: give it an empty config of its own
    # (module fixtures run before conftest's per-test isolation) and the [server] keys the flags lack.
    with pytest.MonkeyPatch.context() as mp:
        for var in os.environ:
            if var.startswith(("OPENAI_", "LLMCHAT_")):
                mp.delenv(var)
        mp.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("serve-config")))
        for var, value in env.items():
            mp.setenv(var, value)
        return start_subprocess(flags)


def provider_config(server: SubprocessServer, extra: str = "") -> str:
    """A config file with one provider, llmchat's own server (which speaks h2c), as README shows."""
    return f'[providers.local]\nbase_url = "{server.base_url}"\nhttp = {{ http2 = "h2c" }}\n{extra}'


# -- the history file ----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Stored:
    conversation: int
    role: str
    content: str
    status: str
    mode: str
    provider: str
    record: dict[str, Any] | None


def stored(path: Path) -> list[Stored]:
    """Every message in the history file, in the order saved; [] before the file exists. Read-only."""
    if not path.exists():
        return []
    with closing(sqlite3.connect(path.as_uri() + "?mode=ro", uri=True, timeout=5)) as db:
        rows = db.execute("SELECT conversation_id, role, content, status, mode, provider, record "
                          "FROM messages ORDER BY id").fetchall()
    return [Stored(conv, role, content, status, mode, provider, json.loads(record) if record else None)
            for conv, role, content, status, mode, provider, record in rows]


def prompts(path: Path) -> list[str]:
    return [m.content for m in stored(path) if m.role == "user"]


def wait_stored(t: Terminal, path: Path, check: Callable[[list[Stored]], bool], what: str,
                timeout: float = REPLY_S) -> list[Stored]:
    """Wait until ``check`` holds for the history; the messages then. On timeout the AssertionError carries
    the last screen and what the history held."""
    found: list[Stored] = []

    def holds(_screen: str) -> bool:
        found[:] = stored(path)
        return check(found)

    try:
        t.wait_for(holds, timeout, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nthe history holds: {_brief(stored(path))}") from None
    return found


def sent(n: int) -> Callable[[list[Stored]], bool]:
    """``n`` prompts stored (the app saves a prompt before its request goes out)."""
    return lambda messages: sum(m.role == "user" for m in messages) == n


def replies_ended(n: int) -> Callable[[list[Stored]], bool]:
    """``n`` prompts stored, each followed by a reply that is no longer streaming."""
    def check(messages: list[Stored]) -> bool:
        users = [m for m in messages if m.role == "user"]
        ended = [m for m in messages if m.role == "assistant" and m.status != "streaming"]
        return len(users) == n and len(ended) == n
    return check


def _brief(messages: list[Stored]) -> str:
    return "; ".join(f"{m.role} {m.status}: {m.content[:60]!r}" for m in messages) or "nothing"


# -- the screen ----------------------------------------------------------------------------------------------
def chat_column(screen: str) -> list[str]:
    return [line.partition(HUD_EDGE)[0].rstrip() for line in screen.splitlines()]


def badge(screen: str) -> str:
    """The right of the line above the conversation: where answers come from, the model, stream or batch."""
    return re.split(r"\s{2,}", chat_column(screen)[0].strip())[-1]


def title(screen: str) -> str:
    """The left of the line above the conversation: the conversation's title."""
    return re.split(r"\s{2,}", chat_column(screen)[0].strip())[0]


def prompt_input(screen: str) -> str:
    """What the prompt input holds ("" when it shows its placeholder): the rows inside its ▊ ... ▎ frame,
    up to a notification drawn over its right end (behind its own ▌ bar)."""
    rows = [re.split("[▎▌]", line[1:], maxsplit=1)[0].strip() for line in chat_column(screen)
            if line.startswith("▊") and not line.startswith(("▊▔", "▊▁"))]
    text = "\n".join(rows)
    return "" if text.startswith(PLACEHOLDER) else text


def user_rows(screen: str) -> list[str]:
    """The rows of the user's messages in the conversation, each drawn behind a ▌ bar and one space."""
    return [line[2:] for line in chat_column(screen) if line.startswith("▌")]


def letters(text: str) -> str:
    """Only the word characters: what Markdown rendering, wrapping and table borders leave alone."""
    return "".join(re.findall(r"\w", text))


def shows(screen: str, content: str, tail: int = 0) -> bool:
    """The chat column shows ``content`` (its last ``tail`` word characters, or all), as rendered."""
    want = letters(content)
    return (want[-tail:] if tail else want) in letters("\n".join(chat_column(screen)))


def start_ready(terminals: TerminalSession, *args: str) -> Terminal:
    """Start ``llmchat *args`` and wait until the prompt has the focus (its Send key is in the footer)."""
    t = terminals.start(*args)
    # The prompt has the focus from the first frame; start-up is over when the badge and the welcome (or the
    # resumed conversation) are drawn too.
    t.wait_for(lambda s: "⏎ Send" in s and PLACEHOLDER in s and badge(s).endswith(("· stream", "· batch")),
               START_S, what="the app ready for a prompt")
    return t


def start_with(terminals: TerminalSession, server: SubprocessServer, extra_config: str = "") -> Terminal:
    """Start ``llmchat`` with ``server`` as its one configured provider, ready for a prompt."""
    terminals.write_config(provider_config(server, extra_config))
    return start_ready(terminals)


def start_streaming(terminals: TerminalSession, server: SubprocessServer, prompt: str) -> Terminal:
    """Start ``llmchat`` against ``server``, send ``prompt`` and return once its reply is streaming."""
    t = start_with(terminals, server)
    type_prompt(t, prompt)
    t.wait_for("You asked", REPLY_S, what="the reply streaming")
    return t


def type_prompt(t: Terminal, text: str) -> None:
    """Type ``text`` as a person does: the text, then Enter once the text shows in the input."""
    t.write(text)
    t.wait_for(lambda s: prompt_input(s) == text, STEP_S, what=f"{text!r} in the input")
    t.press("enter")


def quit_app(t: Terminal) -> None:
    t.press("ctrl+q")
    assert t.wait_exit() == 0, t.dump()


# -- journeys ------------------------------------------------------------------------------------------------
def test_first_launch_offline_answers_from_the_local_server_it_started(terminals: TerminalSession) -> None:
    t = start_ready(terminals)
    assert badge(t.screen_text()) == "local server (offline demo) · llmchat-local · stream", t.dump()
    assert title(t.screen_text()) == "new conversation", t.dump()
    assert "Talking to the built-in local server (offline demo)" in t.screen_text(), t.dump()

    prompt = "What does time to first token measure?"
    type_prompt(t, prompt)
    messages = wait_stored(t, terminals.history_path, replies_ended(1), "the reply to end", OFFLINE_REPLY_S)
    user, reply = messages
    assert (user.role, user.content) == ("user", prompt)
    assert (reply.role, reply.status, reply.mode, reply.provider) == ("assistant", "done", "stream", "local")
    assert reply.record is not None and reply.record["http_version"] == "HTTP/2"  # h2c to its own server
    assert f"You asked: *{prompt}*" in reply.content
    screen = t.wait_for(lambda s: "llmchat-local · HTTP/2 · TTFT" in s and "1 request · 0 in flight" in s,
                        STEP_S, what="the reply's timing line and the HUD counting it")
    assert prompt in user_rows(screen), t.dump()
    assert shows(screen, reply.content, tail=60), t.dump()  # the end of the reply, as streamed
    assert title(screen) == prompt and "Talking to the built-in" not in screen, t.dump()

    quit_app(t)
    assert t.process is not None
    assert not group_alive(t.process.pid)  # the app stopped the local server it started before it ended


@pytest.mark.parametrize(("burst", "prompt"), [
    pytest.param("Explain why HTTP/2 multiplexing helps a chat client\r",
                 "Explain why HTTP/2 multiplexing helps a chat client", id="long-prompt-and-enter"),
    pytest.param("Tell me about latency\r", "Tell me about latency", id="short-prompt-and-enter"),
    pytest.param(PASTE_START + "Review this function:\ndef double(x):\n    return x * 2" + PASTE_END + "\r",
                 "Review this function:\ndef double(x):\n    return x * 2", id="paste-and-enter"),
])
def test_a_prompt_and_its_enter_in_one_read_arrive_whole(
    terminals: TerminalSession, quick: SubprocessServer, burst: str, prompt: str
) -> None:
    t = start_with(terminals, quick)
    t.write(burst)  # one write: the app reads text and Enter together, as after a fast typist or a paste
    wait_stored(t, terminals.history_path, sent(1), "the prompt sent", STEP_S)
    messages = wait_stored(t, terminals.history_path, replies_ended(1), "the reply")
    assert messages[0].content == prompt, f"the prompt arrived cut\n{t.dump()}"
    screen = t.wait_for(lambda s: prompt_input(s) == "" and shows(s, messages[1].content), STEP_S,
                        what="the input emptied and the reply on screen")
    assert user_rows(screen) == prompt.splitlines(), t.dump()


TEN = [
    "What is TTFB?",
    "And TTFT?",
    "Why does HTTP/2 need only one connection?",
    "How does a connection pool fill up?",
    "When should a client retry a 429?",
    "What is full jitter?",
    "Which replies may a cache keep?",
    "How is tokens per second measured?",
    "What does a cold start cost?",
    "Summarise all of that in one line",
]


def test_ten_prompts_in_a_row_each_in_one_read_are_stored_whole_in_order(
    terminals: TerminalSession, quick: SubprocessServer
) -> None:
    t = start_with(terminals, quick)
    for n, prompt in enumerate(TEN, 1):
        t.write(prompt + "\r")  # the next prompt as soon as the last reply has ended, in one burst
        wait_stored(t, terminals.history_path, sent(n), f"prompt {n} ({prompt!r}) sent", STEP_S)
        wait_stored(t, terminals.history_path, replies_ended(n), f"reply {n}")
        assert prompts(terminals.history_path) == TEN[:n], f"prompt {n} did not arrive whole\n{t.dump()}"
    # Stored is not yet painted: wait for the screen to show the last prompt (and the input empty).
    t.wait_for(lambda s: prompt_input(s) == "" and TEN[-1] in user_rows(s), STEP_S,
               what="the last prompt on screen and the input empty")
    assert len({m.conversation for m in stored(terminals.history_path)}) == 1


def test_a_prompt_typed_in_one_read_while_a_reply_streams_stays_whole_in_the_input(
    terminals: TerminalSession, slow: SubprocessServer
) -> None:
    t = start_streaming(terminals, slow, "Explain connection reuse")

    t.write("Tell me about latency\r")  # typed ahead, Enter included, while the reply streams
    screen = t.wait_for(STILL_COMING, STEP_S, what="the app answering the Enter with a warning")
    assert prompt_input(screen) == "Tell me about latency", f"the prompt typed ahead was split\n{t.dump()}"
    history = stored(terminals.history_path)
    assert [m.role for m in history] == ["user", "assistant"] and history[1].status == "streaming", t.dump()

    t.press("esc")
    t.wait_for("cancelled ·", STEP_S, what="the reply cancelled")
    assert prompt_input(t.screen_text()) == "Tell me about latency", t.dump()
    t.press("enter")
    wait_stored(t, terminals.history_path, sent(2), "the second prompt sent", STEP_S)
    assert prompts(terminals.history_path) == ["Explain connection reuse", "Tell me about latency"]


def test_esc_cancels_a_reply_and_keeps_what_arrived_on_screen_in_history_and_after_continue(
    terminals: TerminalSession, slow: SubprocessServer
) -> None:
    t = start_streaming(terminals, slow, "Walk me through a TLS handshake")
    t.press("esc")
    messages = wait_stored(t, terminals.history_path, replies_ended(1), "the reply to end", STEP_S)
    partial = messages[1]
    assert partial.status == "cancelled", _brief(messages)
    assert partial.content.startswith("## On ") and "You asked:" in partial.content, _brief(messages)
    assert partial.record is not None and partial.record["cancelled"], partial.record
    screen = t.wait_for(lambda s: "cancelled ·" in s and "1 cancelled" in s, STEP_S,
                        what="the reply marked cancelled and the HUD counting it")
    assert shows(screen, partial.content), t.dump()  # all that arrived is still there

    quit_app(t)
    again = start_ready(terminals, "--continue")
    screen = again.wait_for("cancelled ·", STEP_S, what="the cancelled reply reloaded")
    assert "Walk me through a TLS handshake" in user_rows(screen), again.dump()
    assert shows(screen, partial.content), again.dump()
    assert stored(terminals.history_path) == messages  # reopening changed nothing


def test_ctrl_b_switches_to_batch_mode_and_the_same_prompt_comes_from_the_cache(
    terminals: TerminalSession, quick: SubprocessServer
) -> None:
    # The default policy "deterministic" caches only requests with temperature 0 or a seed, and none is set by
    # default: "always" caches every batch request (with temperature 0 the default policy does: see below).
    t = start_with(terminals, quick, '[cache]\npolicy = "always"\n')
    assert badge(t.screen_text()).endswith("· stream"), t.dump()
    t.press("ctrl+b")
    t.wait_for(lambda s: badge(s).endswith("· batch"), STEP_S, what="the badge saying batch")

    prompt = "What is a cache hit?"
    type_prompt(t, prompt)
    first = wait_stored(t, terminals.history_path, replies_ended(1), "the first reply")[1]
    assert (first.mode, first.status) == ("batch", "done")
    assert first.record is not None and not first.record["cache_hit"]

    t.press("ctrl+n")  # a new conversation: the same messages, so the same cache key
    t.wait_for(lambda s: not user_rows(s), STEP_S, what="the conversation cleared")
    type_prompt(t, prompt)
    second = wait_stored(t, terminals.history_path, replies_ended(2), "the second reply")[3]
    assert (second.mode, second.status, second.content) == ("batch", "done", first.content)
    assert second.record is not None and second.record["cache_hit"]
    t.wait_for(lambda s: "from cache" in s and "cache 1 hit · 1 miss" in s, STEP_S,
               what="the reply marked as from the cache and the HUD counting the hit")
    assert any(terminals.cache_folder.iterdir())


def test_quit_with_ctrl_q_and_continue_shows_the_whole_conversation(
    terminals: TerminalSession, quick: SubprocessServer
) -> None:
    t = start_with(terminals, quick)
    for n, prompt in enumerate(["What is pool wait?", "And connect time?"], 1):
        type_prompt(t, prompt)
        wait_stored(t, terminals.history_path, replies_ended(n), f"reply {n}")
    quit_app(t)
    conversation = stored(terminals.history_path)

    again = start_ready(terminals, "--continue")
    screen = again.wait_for(lambda s: len(user_rows(s)) == 2, STEP_S, what="the conversation reloaded")
    assert user_rows(screen) == ["What is pool wait?", "And connect time?"], again.dump()
    for message in conversation:
        assert shows(screen, message.content), again.dump()

    type_prompt(again, "And TLS?")  # it goes on in the same conversation
    now = wait_stored(again, terminals.history_path, replies_ended(3), "reply 3")
    assert {m.conversation for m in now} == {conversation[0].conversation}
    assert [m.content for m in now[:4]] == [m.content for m in conversation]


@pytest.mark.parametrize("command", [pytest.param(["chat"], id="llmchat-chat"),
                                     pytest.param([], id="llmchat")])
def test_base_url_talks_to_the_server_it_names(
    terminals: TerminalSession, quick: SubprocessServer, command: list[str]
) -> None:
    # README: `llmchat` takes --base-url as `llmchat chat` does.
    t = start_ready(terminals, *command, "--base-url", quick.base_url)
    hostport = quick.url.removeprefix("http://")
    assert badge(t.screen_text()) == f"custom · {hostport} · default model · stream", t.dump()
    type_prompt(t, "Which server answers this?")
    reply = wait_stored(t, terminals.history_path, replies_ended(1), "the reply")[1]
    assert (reply.status, reply.provider) == ("done", "custom")
    assert reply.record is not None and reply.record["host"] == hostport
    screen = t.wait_for(lambda s: shows(s, reply.content), STEP_S, what="the reply on screen")
    assert "Which server answers this?" in user_rows(screen), t.dump()



# -- each conversation keeps its settings --------------------------------------------------------------------
REMOTE_MODEL = "llama3.1-70b"


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SubprocessServer]:
    """A second quick server that offers only REMOTE_MODEL: a request meant for it that reaches the other one
    (or asks another model) fails."""
    with _serve(tmp_path_factory, ["--profile", "instant", "--model", REMOTE_MODEL],
                LLMCHAT_SERVER__DEFAULT_MAX_TOKENS="24") as server:
        yield server


def palette_run(t: Terminal, query: str, title: str) -> None:
    """Ctrl+P, type ``query``, and once the palette shows ``title`` as its only hit, Enter runs it."""
    t.press("ctrl+p")
    t.wait_for("Search for commands", STEP_S, what="the command palette")
    t.write(query)
    t.wait_for(title, STEP_S, what=f"{title!r} in the palette")
    t.press("enter")
    t.wait_for(lambda s: "Search for commands" not in s, STEP_S, what="the palette closed")


def test_quit_then_continue_talks_to_the_same_provider_and_model(
    terminals: TerminalSession, quick: SubprocessServer, remote: SubprocessServer
) -> None:
    terminals.write_config(
        f'default_provider = "local"\n{provider_config(quick)}\n'
        f'[providers.remote]\nbase_url = "{remote.base_url}"\nhttp = {{ http2 = "h2c" }}\n')
    far = remote.url.removeprefix("http://")
    t = start_ready(terminals)
    assert badge(t.screen_text()).startswith("local · "), t.dump()
    palette_run(t, "llama3.1", f"Model: remote / {REMOTE_MODEL}")
    t.wait_for(lambda s: badge(s) == f"remote · {far} · {REMOTE_MODEL} · stream", STEP_S,
               what="the badge naming the remote provider and its model")
    type_prompt(t, "Which server answers this?")
    first = wait_stored(t, terminals.history_path, replies_ended(1), "the reply")[1]
    assert (first.status, first.provider) == ("done", "remote"), _brief(stored(terminals.history_path))
    quit_app(t)

    # A new run starts on default_provider "local"; the conversation was held with "remote".
    again = start_ready(terminals, "--continue")
    again.wait_for(lambda s: badge(s) == f"remote · {far} · {REMOTE_MODEL} · stream", STEP_S,
                   what="the resumed conversation back on the remote provider and model")
    type_prompt(again, "And this one?")
    messages = wait_stored(again, terminals.history_path, replies_ended(2), "the second reply")
    second = messages[3]
    assert (second.status, second.provider, second.conversation) == ("done", "remote", first.conversation)
    assert second.record is not None
    assert (second.record["host"], second.record["model"]) == (far, REMOTE_MODEL)
    assert "held with" not in again.screen_text(), again.dump()


def test_temperature_0_from_the_palette_makes_the_same_batch_prompt_a_cache_hit(
    terminals: TerminalSession, quick: SubprocessServer
) -> None:
    t = start_with(terminals, quick)  # default settings: cache policy "deterministic", no temperature
    palette_run(t, "temperature", "Set temperature")
    t.wait_for("Temperature for this conversation", STEP_S, what="the temperature box")
    t.write("0\r")  # the value and its Enter in one read: the box takes them in the order typed
    t.wait_for("this conversation sends temperature 0", STEP_S, what="the setting confirmed")
    t.press("ctrl+b")
    t.wait_for(lambda s: badge(s).endswith("· batch"), STEP_S, what="the badge saying batch")

    prompt = "What is a cache hit?"
    type_prompt(t, prompt)
    first = wait_stored(t, terminals.history_path, replies_ended(1), "the first reply")[1]
    assert first.record is not None and not first.record["cache_hit"]
    t.press("ctrl+n")
    t.wait_for(lambda s: not user_rows(s), STEP_S, what="the conversation cleared")
    type_prompt(t, prompt)
    second = wait_stored(t, terminals.history_path, replies_ended(2), "the second reply")[3]
    assert (second.mode, second.content) == ("batch", first.content)
    assert second.record is not None and second.record["cache_hit"]
    screen = t.wait_for(lambda s: "from cache" in s and "cache 1 hit · 1 miss" in s, STEP_S,
                        what="the reply marked as from the cache and the HUD counting the hit")
    [line] = [row.strip() for row in chat_column(screen) if "from cache" in row]
    assert re.fullmatch(r"from cache · llmchat-local · \d+ ms", line), t.dump()


# -- what a pending reply is doing, at 90 columns (the HUD folded away) --------------------------------------
def peer_config(p: P.Peer, extra: str = "") -> str:
    """One provider, a scripted peer (HTTP/1.1 only); no warm-up, whose GET /models would be its first
    request."""
    return (f'[http]\nwarmup = false\n\n[providers.peer]\nbase_url = "{p.base_url}"\n'
            f'model = "llmchat-local"\nhttp = {{ http2 = false }}\n{extra}')


def start_narrow(terminals: TerminalSession, config: str) -> Terminal:
    """``llmchat`` at 90x30, ready for a prompt once the note about the folded HUD has gone."""
    terminals.write_config(config)
    t = terminals.start(cols=90, rows=30)
    t.wait_for(lambda s: "⏎ Send" in s and PLACEHOLDER in s, START_S, what="the app ready for a prompt")
    # The note comes up once the app has laid itself out, which can be after the prompt is drawn: waiting
    # only for it to be absent could pass before it appears, and it would then cover the reply's state line.
    t.wait_for(lambda s: "folds away" in s, STEP_S, what="the note about the folded HUD")
    t.wait_for(lambda s: "folds away" not in s, STEP_S + 6, what="the note about the folded HUD to go")
    return t


COUNTDOWN = re.compile(r"retry 2 of 4 in (\d+\.\d) s")


def test_a_rate_limit_counts_down_under_the_reply_at_90_columns(
    terminals: TerminalSession, peer: Callable[..., P.Peer]
) -> None:
    limited = P.json_response(429, {"error": {"message": "Rate limit reached"}}, headers={"retry-after": "4"})
    answer = [P.SSE_HEAD, P.event(P.delta("All ")), P.event(P.delta("good.", finish_reason="stop")),
              P.DONE, P.END]
    p = peer([limited], then="keep", later=answer, chat_only=True)
    t = start_narrow(terminals, peer_config(p))
    type_prompt(t, "Are you there?")
    seen: list[float] = []

    def counted(screen: str) -> bool:
        found = COUNTDOWN.search("\n".join(chat_column(screen)))
        if found and (not seen or float(found.group(1)) != seen[-1]):
            seen.append(float(found.group(1)))
        return len(seen) >= 3

    screen = t.wait_for(counted, STEP_S, what="the countdown under the reply")
    line = next(row for row in chat_column(screen) if COUNTDOWN.search(row))
    assert "rate limited" in line and "retry-after" not in screen.lower(), t.dump()
    assert seen == sorted(seen, reverse=True) and seen[0] > seen[-1], seen
    messages = wait_stored(t, terminals.history_path, replies_ended(1), "the reply after the wait")
    assert (messages[1].status, messages[1].content) == ("done", "All good.")
    t.wait_for(lambda s: not COUNTDOWN.search(s) and "All good." in s, STEP_S, what="the state line gone")
    assert p.requests == 2


def test_a_stall_says_so_under_the_reply_at_90_columns(
    terminals: TerminalSession, peer: Callable[..., P.Peer]
) -> None:
    stalling = [P.SSE_HEAD, P.event(P.delta("Kept so far")), P.Pause(4.0),
                P.event(P.delta(", then the rest.", finish_reason="stop")), P.DONE, P.END]
    p = peer(stalling, then="keep", chat_only=True)
    t = start_narrow(terminals, peer_config(p, "\n[ui]\nstall_s = 1.0\n"))
    type_prompt(t, "Take your time")
    screen = t.wait_for(lambda s: "stalled: no token for" in s, STEP_S, what="the stall under the reply")
    line = next(row for row in chat_column(screen) if "stalled: no token for" in row)
    assert "so far" in line and "Esc cancels" in line, t.dump()
    messages = wait_stored(t, terminals.history_path, replies_ended(1), "the reply after the stall")
    assert (messages[1].status, messages[1].content) == ("done", "Kept so far, then the rest.")
    t.wait_for(lambda s: "stalled" not in s and "then the rest." in s, STEP_S, what="the stall gone")


def test_quit_mid_reply_then_continue_shows_it_cut_off_under_its_model_and_title(
    terminals: TerminalSession, slow: SubprocessServer
) -> None:
    prompt = "Tell me the long story of a request"
    t = start_streaming(terminals, slow, prompt)
    quit_app(t)  # Ctrl+Q while the reply is still coming
    messages = stored(terminals.history_path)
    cut = messages[1]
    assert (cut.role, cut.status) == ("assistant", "interrupted") and cut.content, _brief(messages)

    again = start_ready(terminals, "--continue")
    screen = again.wait_for(lambda s: "interrupted: the reply was cut off" in "\n".join(chat_column(s)),
                            STEP_S, what="the cut-off reply reloaded and marked so")
    chat = "\n".join(chat_column(screen))
    assert title(screen) == prompt and "cancelled" not in chat, again.dump()  # nobody stopped it
    assert "llmchat-local" in [row.strip() for row in chat_column(screen)], again.dump()  # its label row
    assert shows(screen, cut.content), again.dump()  # all that arrived, and no more
    assert stored(terminals.history_path) == messages  # reopening changed nothing


# -- typed while the app starts -----------------------------------------------------------------------------
def test_a_prompt_typed_as_soon_as_the_app_shows_is_kept_and_sent(terminals: TerminalSession) -> None:
    """A person who types the moment the screen appears: the app's first frame is drawn while it is still
    starting (history, server signals, the conversation to resume), and keys that came then went to no
    widget until the prompt took the focus at the end of start-up, so the line was lost."""
    t = start_ready(terminals)  # nothing configured: the offline demo, whose local server starts with it
    type_prompt(t, "First question")
    wait_stored(t, terminals.history_path, replies_ended(1), "the first reply")
    quit_app(t)
    again = terminals.start("--continue")
    again.wait_for(lambda s: bool(s.strip()), START_S, what="the app's first frame")
    again.write("Typed while it starts\r")  # the line and its Enter in one read, as a paste arrives
    messages = wait_stored(again, terminals.history_path, replies_ended(2), "the reply to the early prompt")
    assert (messages[2].role, messages[2].content) == ("user", "Typed while it starts"), _brief(messages)
    assert messages[3].status == "done" and messages[3].conversation == messages[0].conversation


# -- a refusal -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def refusing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SubprocessServer]:
    """Answers every chat at once with a refusal, as OpenAI sends one (`llmchat serve --refuse`)."""
    with _serve(tmp_path_factory, ["--profile", "instant", "--refuse"]) as server:
        yield server


def test_a_refusal_shows_under_the_reply_as_one_and_again_after_continue(
    terminals: TerminalSession, refusing: SubprocessServer
) -> None:
    refused = "refused: the model declined:"
    t = start_with(terminals, refusing)
    type_prompt(t, "Tell me a secret")
    messages = wait_stored(t, terminals.history_path, replies_ended(1), "the refused reply")
    assert (messages[1].status, messages[1].content) == ("refused", ""), _brief(messages)
    screen = t.wait_for(lambda s: refused in "\n".join(chat_column(s)), STEP_S, what="the refusal on screen")
    assert shows(screen, "I'm sorry, but I can't help with that request."), t.dump()
    quit_app(t)

    again = start_ready(terminals, "--continue")
    screen = again.wait_for(lambda s: refused in "\n".join(chat_column(s)), STEP_S,
                            what="the refusal reloaded and marked so")
    assert shows(screen, "I'm sorry, but I can't help with that request."), again.dump()
