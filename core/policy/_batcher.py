"""The micro-batcher: requests queue and go out together, bounded in size, time and concurrency.

A batch is flushed when ``max_size`` requests are queued or when the oldest has waited ``window_ms``; its
requests then run concurrently over the shared pool, at most ``concurrency`` at once across all batches.
Each caller awaits its own result (or its own exception); a failure never touches another caller, and a caller
that is cancelled cancels its own request (queued: it never runs; in flight: the handler is cancelled).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from llmchat.core.config import BatchSettings

T = TypeVar("T")
R = TypeVar("R")


class MicroBatcher(Generic[T, R]):
    """Group calls to ``handler`` into micro-batches. Use as an async context manager, or call ``aclose()``.

    ``batches`` counts flushed batches and ``sizes`` records their sizes (for tests and the HUD).
    """

    def __init__(self, handler: Callable[[T], Awaitable[R]], settings: BatchSettings | None = None) -> None:
        self._handler = handler
        self.settings = settings or BatchSettings()
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._limit = asyncio.Semaphore(max(1, self.settings.concurrency))
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.sizes: list[int] = []

    @property
    def batches(self) -> int:
        return len(self.sizes)

    async def submit(self, item: T) -> R:
        """Queue ``item`` and wait for its result. Raises what the handler raised for this item.

        Cancelling the caller cancels the item: a queued one never reaches the handler, a running one has its
        handler cancelled. Raises ``RuntimeError`` after ``aclose()``.
        """
        if self._closed:
            raise RuntimeError("MicroBatcher is closed")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[R] = loop.create_future()
        self._pending.append((item, fut))
        if len(self._pending) >= self.settings.max_size:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.settings.window_ms / 1000.0, self._flush)
        try:
            return await fut
        except asyncio.CancelledError:
            # Still queued: leave the queue, so the item neither runs nor takes a place in the next batch.
            self._pending = [entry for entry in self._pending if entry[1] is not fut]
            raise

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._pending = self._pending, []
        # Callers cancelled while queued are dropped here, so they neither run nor count in a batch's size.
        batch = [(item, fut) for item, fut in batch if not fut.cancelled()]
        if not batch:
            return
        self.sizes.append(len(batch))
        loop = asyncio.get_running_loop()
        for item, fut in batch:
            task = loop.create_task(self._run(item, fut))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            # A caller that stops waiting (Ctrl-C, a timeout) stops its request too, instead of leaving it to
            # run, unseen, until aclose() waits for it.
            fut.add_done_callback(functools.partial(_cancel_with, task))

    async def _run(self, item: T, fut: asyncio.Future[R]) -> None:
        if fut.cancelled():  # the caller gave up while queued: don't spend a request on it
            return
        async with self._limit:
            if fut.cancelled():
                return
            try:
                result = await self._handler(item)
            except BaseException as exc:  # handed to the one caller it belongs to
                if not fut.done():
                    fut.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
            else:
                if not fut.done():
                    fut.set_result(result)

    async def aclose(self) -> None:
        """Flush what is queued and wait for every request in flight."""
        self._closed = True
        self._flush()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def __aenter__(self) -> MicroBatcher[T, R]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _cancel_with(task: asyncio.Task[None], fut: asyncio.Future[Any]) -> None:
    if fut.cancelled():
        task.cancel()
