"""The micro-batcher on its own: when a batch goes out, how many run at once, and what one caller's failure or
cancellation does to the others. Pure asyncio; every wait is bounded so a bug fails instead of hanging."""

from __future__ import annotations

import asyncio

import pytest

from llmchat.core import BatchSettings, MicroBatcher

BOUND_S = 5.0
"""Every wait in this file; far above what any of them needs."""
NEVER_MS = 600_000.0
"""A window no test waits for: a flush that happens anyway proves another trigger fired."""


async def spin(turns: int = 20) -> None:
    """Let every ready callback and task run a few rounds (no time passes)."""
    for _ in range(turns):
        await asyncio.sleep(0)


async def test_a_full_batch_goes_out_at_once_without_waiting_for_the_window() -> None:
    seen: list[int] = []

    async def handler(item: int) -> int:
        seen.append(item)
        return item * 10

    settings = BatchSettings(max_size=3, window_ms=NEVER_MS, concurrency=10)
    async with MicroBatcher(handler, settings) as batcher:
        async with asyncio.timeout(BOUND_S):
            results = await asyncio.gather(*(batcher.submit(i) for i in range(3)))
    assert results == [0, 10, 20]
    assert sorted(seen) == [0, 1, 2]
    assert batcher.sizes == [3]


async def test_max_size_splits_a_burst_into_full_batches_and_the_window_sends_the_rest() -> None:
    async def handler(item: int) -> int:
        return item

    async with MicroBatcher(handler, BatchSettings(max_size=4, window_ms=20, concurrency=10)) as batcher:
        async with asyncio.timeout(BOUND_S):
            results = await asyncio.gather(*(batcher.submit(i) for i in range(10)))
    assert results == list(range(10))
    assert batcher.sizes == [4, 4, 2]


async def test_the_window_sends_a_partial_batch_and_not_before() -> None:
    loop = asyncio.get_running_loop()
    started: list[float] = []

    async def handler(item: str) -> str:
        started.append(loop.time())
        return item.upper()

    window_ms = 50.0
    batcher: MicroBatcher[str, str] = MicroBatcher(handler, BatchSettings(max_size=100, window_ms=window_ms))
    queued_at = loop.time()
    callers = [asyncio.create_task(batcher.submit(x)) for x in ("a", "b")]
    await spin()
    assert started == []  # queued, waiting for more or for the window
    async with asyncio.timeout(BOUND_S):
        assert await asyncio.gather(*callers) == ["A", "B"]
    assert batcher.sizes == [2]
    # call_later never fires early on the loop's own clock.
    assert min(started) - queued_at >= window_ms / 1000.0
    await batcher.aclose()


async def test_concurrency_is_a_limit_across_batches() -> None:
    limit = 3
    in_flight = 0
    peak = 0
    full = asyncio.Event()
    release = asyncio.Event()

    async def handler(item: int) -> int:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        if in_flight == limit:
            full.set()
        try:
            await release.wait()
        finally:
            in_flight -= 1
        return item

    # max_size 4 makes three batches of one burst; the limit must hold across them, not per batch.
    settings = BatchSettings(max_size=4, window_ms=1, concurrency=limit)
    async with MicroBatcher(handler, settings) as batcher:
        callers = asyncio.gather(*(batcher.submit(i) for i in range(10)))
        async with asyncio.timeout(BOUND_S):
            await full.wait()
        async with asyncio.timeout(BOUND_S):
            while sum(batcher.sizes) < 10:  # every batch flushed, its items waiting for a slot
                await asyncio.sleep(0.001)
        await spin()
        assert in_flight == limit
        release.set()
        async with asyncio.timeout(BOUND_S):
            assert await callers == list(range(10))
    assert peak == limit
    assert sum(batcher.sizes) == 10 and len(batcher.sizes) >= 3


async def test_one_callers_exception_reaches_only_that_caller() -> None:
    async def handler(item: int) -> int:
        await asyncio.sleep(0)
        if item == 2:
            raise ValueError("item 2 is bad")
        return item

    async with MicroBatcher(handler, BatchSettings(max_size=5, window_ms=NEVER_MS)) as batcher:
        async with asyncio.timeout(BOUND_S):
            results = await asyncio.gather(*(batcher.submit(i) for i in range(5)), return_exceptions=True)
    assert [r for i, r in enumerate(results) if i != 2] == [0, 1, 3, 4]
    assert isinstance(results[2], ValueError) and str(results[2]) == "item 2 is bad"


async def test_a_caller_cancelled_while_queued_never_reaches_the_handler() -> None:
    seen: list[str] = []

    async def handler(item: str) -> str:
        seen.append(item)
        return item

    async with MicroBatcher(handler, BatchSettings(max_size=2, window_ms=NEVER_MS)) as batcher:
        doomed = asyncio.create_task(batcher.submit("doomed"))
        await spin()
        doomed.cancel()
        await spin()
        async with asyncio.timeout(BOUND_S):
            # The cancelled item no longer counts: it takes two live callers to fill a batch of two.
            assert list(await asyncio.gather(batcher.submit("b"), batcher.submit("c"))) == ["b", "c"]
    assert doomed.cancelled()
    assert seen == ["b", "c"]
    assert batcher.sizes == [2]


async def test_a_caller_cancelled_while_running_cancels_its_handler_only() -> None:
    running = asyncio.Event()
    outcome: dict[str, str] = {}

    async def handler(item: str) -> str:
        if item == "slow":
            running.set()
            try:
                await asyncio.sleep(BOUND_S * 10)
            except asyncio.CancelledError:
                outcome[item] = "cancelled"
                raise
        outcome[item] = "done"
        return item

    async with asyncio.timeout(BOUND_S):
        async with MicroBatcher(handler, BatchSettings(max_size=1, window_ms=NEVER_MS)) as batcher:
            slow = asyncio.create_task(batcher.submit("slow"))
            await running.wait()
            slow.cancel()
            assert await batcher.submit("fast") == "fast"
    # aclose() returned: the cancelled handler ended, it did not run on to its end.
    assert outcome == {"slow": "cancelled", "fast": "done"}
    assert slow.cancelled()


async def test_aclose_sends_what_is_queued_then_refuses_new_items() -> None:
    seen: list[int] = []

    async def handler(item: int) -> int:
        seen.append(item)
        return item

    batcher: MicroBatcher[int, int] = MicroBatcher(handler, BatchSettings(max_size=10, window_ms=NEVER_MS))
    callers = [asyncio.create_task(batcher.submit(i)) for i in range(3)]
    await spin()
    assert seen == []
    async with asyncio.timeout(BOUND_S):
        await batcher.aclose()
        assert await asyncio.gather(*callers) == [0, 1, 2]
    with pytest.raises(RuntimeError, match="closed"):
        await batcher.submit(99)


@pytest.mark.parametrize("fail", [False, True])
async def test_each_caller_gets_its_own_result_under_load(fail: bool) -> None:
    async def handler(item: int) -> int:
        await asyncio.sleep(0)
        if fail and item % 7 == 0:
            raise KeyError(item)
        return item * item

    async with MicroBatcher(handler, BatchSettings(max_size=8, window_ms=5, concurrency=4)) as batcher:
        async with asyncio.timeout(BOUND_S):
            results = await asyncio.gather(*(batcher.submit(i) for i in range(100)), return_exceptions=True)
    for i, result in enumerate(results):
        if fail and i % 7 == 0:
            assert isinstance(result, KeyError) and result.args == (i,)
        else:
            assert result == i * i
