"""Conversation history: an async store over one SQLite file, and a writer that saves a reply as it streams.

Every SQLite call runs on the store's own single thread (a sqlite3 connection belongs to its thread, and the
event loop must never wait on the disk); calls run in the order they were made. A user message is saved before
its request goes out; a reply is saved at least every ``flush_s`` while it streams and once more when it ends,
so a killed process loses at most the last ``flush_s`` of a reply (left "streaming": it reads as interrupted),
and closing the store mid-reply saves all of it as "interrupted".

A store opened with ``fallback=True`` (the chat app's) keeps working on any file: read-only, damaged or
failing mid-session, it holds the history in memory and says so in ``state`` and ``problem``.

Usage::

    async with HistoryStore() as store:
        conv = await store.new_conversation(system_prompt="Be brief.", generation=Generation(temperature=0))
        await store.add_user_message(conv, prompt)
        writer = store.reply_writer(await store.start_reply(conv, provider="local", model=m, mode="stream"))
        async for delta in stream:
            writer.append(delta)
        await writer.finish(status="done", record=stream.record.summary())
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

from llmchat.core.history._db import MIGRATIONS, ConversationNotFoundError, Database
from llmchat.core.history._file import HistoryError, HistoryState, default_history_path
from llmchat.core.history._model import (
    ORIGINS,
    Conversation,
    ConversationInfo,
    Generation,
    Message,
    Origin,
    export_markdown,
    export_records_json,
    nest_headings,
    one_line,
    storable_url,
    timing_line,
)
from llmchat.core.history._search import SearchHit

__all__ = [
    "MIGRATIONS",
    "Conversation",
    "ConversationInfo",
    "ConversationNotFoundError",
    "Generation",
    "HistoryError",
    "HistoryState",
    "HistoryStore",
    "Message",
    "ORIGINS",
    "Origin",
    "ReplyWriter",
    "SearchHit",
    "default_history_path",
    "export_markdown",
    "export_records_json",
    "nest_headings",
    "storable_url",
    "timing_line",
]

log = logging.getLogger("llmchat.history")

T = TypeVar("T")
FinalStatus = Literal["done", "cancelled", "interrupted", "error", "refused"]
_FINAL: tuple[str, ...] = get_args(FinalStatus)

#: The longest ``aclose`` waits for the last writes: quitting must not hang on a disk that stopped answering.
CLOSE_TIMEOUT_S = 10.0


class HistoryStore:
    """The chat history in ``path``: by default ``$XDG_DATA_HOME/llmchat/history.sqlite3``, folder 0700,
    file 0600.

    Use as ``async with HistoryStore() as store`` or ``await open()`` / ``await aclose()``. Every method may
    raise :class:`HistoryError` (one line: the file, the cause, the fix); a method given an unknown
    conversation id raises :class:`ConversationNotFoundError`. Calling one before ``open()`` is a
    ``RuntimeError``.

    ``read_only=True`` never writes the file (SQLite's ``mode=ro``): for reading a history one may not write,
    e.g. ``llmchat export``. The chat app opens with ``open(fallback=True)``, which never fails for the file:
    see :attr:`state`.
    """

    def __init__(self, path: Path | None = None, *, env: Mapping[str, str] | None = None,
                 read_only: bool = False) -> None:
        self.path = path if path is not None else default_history_path(os.environ if env is None else env)
        # Only llmchat's own data folder is made private; a folder the caller named is theirs to set.
        self._db = Database(self.path, private_folder=path is None, read_only=read_only)
        self._executor: ThreadPoolExecutor | None = None
        self._writers: set[ReplyWriter] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_change: Callable[[], None] | None = None

    @property
    def state(self) -> HistoryState:
        """How the history is held: "ok" (the file, read and written), "read-only" (the file's conversations,
        copied into memory: this session's changes are not saved) or "in-memory" (the file is not used: an
        empty history in memory). Only a store opened with ``fallback=True`` leaves "ok" by itself."""
        return self._db.state

    @property
    def problem(self) -> str:
        """One line for the user when :attr:`state` is a fallback: what is wrong with the file, what is (not)
        saved, and the command that fixes it. "" when there is nothing to say."""
        return self._db.problem

    # -- lifecycle -------------------------------------------------------------------------------------------
    async def open(self, *, fallback: bool = False, on_change: Callable[[], None] | None = None) -> None:
        """Opens the file, creating it, checks it (``PRAGMA quick_check``, bounded) and brings its schema up
        to date (each migration once). Opening an open store does nothing.

        Without ``fallback``, raises HistoryError for a file from a newer llmchat (left untouched), a damaged
        file or one that cannot be opened or created. With ``fallback``, never raises for the file: a file
        that can be read but not written opens as "read-only", one that cannot be used at all as "in-memory"
        (:attr:`state`, :attr:`problem`); a write refused later (the file became read-only, the disk filled
        up) or damage found later falls back the same way, the call that met it is retried on the fallback,
        and ``on_change()`` is called on this event loop. A locked file is never a fallback: that call raises.
        """
        if self._executor is not None:
            return
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmchat-history")
        self._executor = executor
        self._loop, self._on_change = asyncio.get_running_loop(), on_change
        self._db.on_change = self._changed_on_thread
        try:
            await self._run(self._db.open_best if fallback else self._db.open)
        except BaseException:
            self._executor = None
            executor.submit(self._db.close)
            executor.shutdown(wait=False)
            raise

    def _changed_on_thread(self) -> None:
        loop, callback = self._loop, self._on_change
        if loop is None or callback is None:
            return
        try:
            loop.call_soon_threadsafe(callback)
        except RuntimeError:  # the loop is closed: nobody is left to tell
            pass

    async def aclose(self) -> None:
        """Finishes every unfinished reply writer as "interrupted", with all it holds (its reply can no longer
        end), then closes. Waits at most ``CLOSE_TIMEOUT_S`` for those writes (SQLite itself gives up on a
        lock after 5 s).

        A failed save is logged, not raised: closing must always release the file. Closing twice is fine.
        """
        if self._executor is None:
            return
        try:
            try:
                await asyncio.wait_for(self._finish_writers(), CLOSE_TIMEOUT_S)
            except TimeoutError:
                log.warning("history %s did not answer in %.0f s; the last reply may be saved only as far as"
                            " its last flush", self.path, CLOSE_TIMEOUT_S)
                self._executor.submit(self._db.close)
                return
            await self._run(self._db.close)
        finally:
            executor, self._executor = self._executor, None
            executor.shutdown(wait=False)

    async def _finish_writers(self) -> None:
        for writer in list(self._writers):
            try:
                await writer.finish(status="interrupted")
            except HistoryError as exc:
                log.warning("%s", exc)
            writer._detach()
        self._writers.clear()

    async def __aenter__(self) -> HistoryStore:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        if self._executor is None:
            raise RuntimeError("HistoryStore is not open: await store.open() first")
        return self._executor.submit(self._db.guard, fn, *args)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.wrap_future(self._submit(fn, *args))

    # -- conversations ---------------------------------------------------------------------------------------
    async def new_conversation(self, *, title: str = "", system_prompt: str = "", provider: str = "",
                               model: str = "", origin: Origin = "", base_url: str = "",
                               generation: Generation | None = None) -> int:
        """Creates a conversation and returns its id. An empty title is filled from the first user message.

        ``origin`` and ``base_url`` say how it reaches ``provider`` (see :data:`Origin`); the URL is kept
        without credentials (:func:`storable_url`), and not at all for the offline demo. ``generation`` is
        what every request of it sends."""
        return await self._run(self._db.new_conversation, title, system_prompt, provider, model, origin,
                               base_url, generation or Generation())

    async def set_endpoint(self, conv_id: int, *, provider: str, model: str, origin: Origin = "",
                           base_url: str = "") -> None:
        """The conversation goes on with this provider and model (reached as ``origin`` says, at
        ``base_url``, kept without credentials). ConversationNotFoundError for an unknown id."""
        await self._run(self._db.set_endpoint, conv_id, provider, model, origin, base_url)

    async def set_generation(self, conv_id: int, generation: Generation) -> None:
        """Sets the generation settings every request of the conversation sends. ConversationNotFoundError
        for an unknown id."""
        await self._run(self._db.set_generation, conv_id, generation)

    async def list_conversations(self, limit: int = 200) -> list[ConversationInfo]:
        """Up to ``limit`` conversations, the most recently active first (activity order, not wall clock)."""
        return await self._run(self._db.list_conversations, limit)

    async def last_conversation_id(self) -> int | None:
        """The most recently active conversation (what ``llmchat --continue`` reopens), or None."""
        return await self._run(self._db.last_conversation_id)

    async def rename(self, conv_id: int, title: str) -> None:
        """Sets the title (made one line, at most 200 characters). ConversationNotFoundError if unknown."""
        await self._run(self._db.rename, conv_id, title)

    async def delete(self, conv_id: int) -> None:
        """Deletes the conversation and all its messages. ConversationNotFoundError for an unknown id."""
        await self._run(self._db.delete, conv_id)

    async def set_system_prompt(self, conv_id: int, text: str) -> None:
        """Sets the conversation's system prompt ("" for none). ConversationNotFoundError if unknown."""
        await self._run(self._db.set_system_prompt, conv_id, text)

    async def load(self, conv_id: int) -> Conversation:
        """The conversation, its system prompt and messages in order. ConversationNotFoundError if unknown."""
        return await self._run(self._db.load, conv_id)

    # -- messages -------------------------------------------------------------------------------------------
    async def add_user_message(self, conv_id: int, text: str, *, alternative_to: int | None = None) -> int:
        """Saves a user message (call it before the request goes out) and returns its id. It follows the
        current branch's last message, or, with ``alternative_to``, is an alternative of that (earlier) user
        message: an edit, which starts a branch. Either way the branch ending with it is now current.

        Gives an untitled conversation a title from it. ConversationNotFoundError for an unknown id,
        ValueError for an ``alternative_to`` that is not in the conversation.
        """
        return await self._run(self._db.add_message, conv_id, "user", text, alternative_to)

    async def start_reply(self, conv_id: int, *, provider: str, model: str, mode: str, origin: Origin = "",
                          base_url: str = "", alternative_to: int | None = None) -> int:
        """Adds an empty assistant message with status "streaming" and returns its id; the conversation now
        goes on with this provider and model, reached as ``origin`` and ``base_url`` say (as in
        :meth:`set_endpoint`). With ``alternative_to`` (a reply's id) the new reply is a regenerated
        alternative of that one, which is kept; the branch ending with the new reply is now current.
        ConversationNotFoundError for an unknown id, ValueError for an ``alternative_to`` not in it."""
        return await self._run(self._db.start_reply, conv_id, provider, model, mode, origin, base_url,
                               alternative_to)

    async def select(self, conv_id: int, msg_id: int) -> Conversation:
        """Makes the branch through ``msg_id`` current (switching to an alternative, opening a search hit)
        and returns the conversation as it now loads. A message on the current branch changes nothing; else
        the branch goes on below it by the newest reply at each step. ConversationNotFoundError for an
        unknown conversation, ValueError for a message not in it."""
        await self._run(self._db.select, conv_id, msg_id)
        return await self.load(conv_id)

    async def records(self, ids: Sequence[int]) -> dict[int, dict[str, Any] | None]:
        """The stored timing record of each message in ``ids`` (a reply's alternatives, to compare them)."""
        return await self._run(self._db.records, list(ids))

    async def search(self, text: str, *, limit: int = 50) -> list[SearchHit]:
        """Up to ``limit`` messages of any conversation (every branch) that hold every word of ``text``, the
        last word as a prefix, best match (BM25) first, each with a highlighted snippet. [] for text
        without a word."""
        return await self._run(self._db.search, text, limit)

    def reply_writer(self, msg_id: int, *, flush_s: float = 1.0) -> ReplyWriter:
        """A writer that saves the reply ``msg_id`` (from :meth:`start_reply`) as it streams.

        Call from the event loop. Raises ValueError for a ``flush_s`` that is not positive and RuntimeError
        when the store is not open (a writer could never save).
        """
        if not flush_s > 0:
            raise ValueError(f"flush_s must be positive, got {flush_s!r}")
        if self._executor is None:
            raise RuntimeError("HistoryStore is not open: await store.open() first")
        writer = ReplyWriter(self, msg_id, flush_s, asyncio.get_running_loop())
        self._writers.add(writer)
        return writer


class ReplyWriter:
    """Keeps a streaming reply in memory and saves all of it at least every ``flush_s`` while it grows.

    :meth:`append` is cheap enough to call per delta: it stores the string and, when nothing was waiting to be
    saved, arms one timer. No timer runs while nothing changes. The save itself happens on the store's thread.
    """

    __slots__ = ("_store", "msg_id", "_flush_s", "_loop", "_parts", "_reasoning", "_timer", "_finished",
                 "_flushes")

    def __init__(self, store: HistoryStore, msg_id: int, flush_s: float,
                 loop: asyncio.AbstractEventLoop) -> None:
        self._store = store
        self.msg_id = msg_id
        self._flush_s = flush_s
        self._loop = loop
        self._parts: list[str] = []
        self._reasoning: list[str] = []
        self._timer: asyncio.TimerHandle | None = None
        self._finished = False
        self._flushes = 0

    @property
    def text(self) -> str:
        """The reply so far."""
        return "".join(self._parts)

    @property
    def flush_pending(self) -> bool:
        """Whether text is waiting for the next timed save (a timer is armed)."""
        return self._timer is not None

    @property
    def flushes(self) -> int:
        """How many saves this writer has started, timed and explicit (finish excluded)."""
        return self._flushes

    def append(self, text: str) -> None:
        """Adds a delta. Never blocks or raises; a delta after finish() is dropped (the row is final)."""
        if self._finished or not text:
            return
        self._parts.append(text)
        if self._timer is None:
            self._timer = self._loop.call_later(self._flush_s, self._flush_in_background)

    def append_reasoning(self, text: str) -> None:
        """Adds a delta of thinking, kept apart from the reply's text and saved with it, as :meth:`append`."""
        if self._finished or not text:
            return
        self._reasoning.append(text)
        if self._timer is None:
            self._timer = self._loop.call_later(self._flush_s, self._flush_in_background)

    def reclaim(self) -> None:
        """The text so far was thinking (``ChatStream.on_reclaim``): it moves to the reasoning, saved so at the
        next flush; the reply's text starts again empty. Never blocks or raises."""
        if self._finished or not self._parts:
            return
        self._reasoning[:0] = self._parts
        self._parts = []
        if self._timer is None:
            self._timer = self._loop.call_later(self._flush_s, self._flush_in_background)

    @property
    def reasoning(self) -> str:
        """The thinking so far."""
        return "".join(self._reasoning)

    def _take_reasoning(self) -> str:
        text = "".join(self._reasoning)
        self._reasoning = [text] if text else []
        return text

    def _take_text(self) -> str:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        text = "".join(self._parts)
        # Keep the join: the next save starts from one string, not thousands of deltas.
        self._parts = [text] if text else []
        return text

    def _flush_in_background(self) -> None:
        self._timer = None
        if self._finished:
            return
        self._flushes += 1
        future = self._store._submit(self._store._db.save_reply_text, self.msg_id, self._take_text(),
                                     self._take_reasoning())
        future.add_done_callback(_log_failure)

    def _detach(self) -> None:
        """Stops saving (the store is closing): no timer left behind on the loop."""
        self._finished = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def flush(self) -> None:
        """Saves the text so far now and waits for it. Raises HistoryError when the save fails."""
        if self._finished:
            return
        self._flushes += 1
        await self._store._run(self._store._db.save_reply_text, self.msg_id, self._take_text(),
                               self._take_reasoning())

    async def finish(self, *, status: FinalStatus, error: str | None = None,
                     record: Mapping[str, Any] | None = None, text: str | None = None,
                     tool_calls: Sequence[Mapping[str, Any]] = (), refusal: str = "") -> None:
        """Writes the final text, the status, the error line and the timing record; the writer stops.

        ``status``: "done", "cancelled" (the user stopped it), "interrupted" (the program quit or closed the
        history mid-reply), "error" or "refused" (the model declined: ``refusal`` holds its words, kept apart
        from the text). ``text`` replaces what :meth:`append` collected when given (e.g. the
        client's final text). ``tool_calls``: the calls the reply asked for, in OpenAI's shape. The thinking
        collected by :meth:`append_reasoning` is saved apart. A reply that did not finish keeps its partial
        text. Finishing twice does nothing. Raises ValueError for an unknown status and HistoryError when the
        write fails. A reply whose conversation was deleted is not an error.
        """
        if status not in _FINAL:
            raise ValueError(f"status must be one of {', '.join(_FINAL)}, got {status!r}")
        if self._finished:
            return
        final = self._take_text()
        reasoning = self._take_reasoning()
        self._finished = True
        self._store._writers.discard(self)
        record_json = None if record is None else json.dumps(dict(record), ensure_ascii=False, default=str)
        calls_json = json.dumps([dict(c) for c in tool_calls], ensure_ascii=False) if tool_calls else None
        await self._store._run(self._store._db.finish_reply, self.msg_id, final if text is None else text,
                               status, one_line(error) if error else None, record_json, reasoning, calls_json,
                               refusal)


def _log_failure(future: Future[None]) -> None:
    # Runs on the store's thread. A timed save that fails is not fatal: the next one or finish() tries again.
    exc = None if future.cancelled() else future.exception()
    if exc is not None:
        log.warning("%s", exc)
