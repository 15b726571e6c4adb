"""Every core: one load test split across worker processes, every request merged into one result.

One process follows a few hundred requests/s, or some 40-50 streams at 70 tokens/s, on one core (issue 17);
``WorkerRun`` runs the same ``LoadRun`` in ``workers`` processes, each with its own event loop and its own
pools, and the parent merges every request's record into its tallies as if one process had sent them all, so
percentiles are over all requests (never averages of percentiles), and the figures, ``on_sample`` (the --json
lines, the progress line) and the exit status are exactly those of one process.

How the load is split (``split``): a closed loop's users, an open loop's rate (each worker a Poisson process
at R/N with its own seeded arrivals: merged, a Poisson process at R), the in-flight cap, and the request
budget, each evenly with the remainder to the first workers; a duration is every worker's. Worker ``i`` of N
numbers its requests ``i, i + N, i + 2N ...``, so the prompts are the ones one process would send for those
numbers, and no two requests of a slice share one.

The parent runs the slices: every worker runs slice ``s`` of configuration ``c`` when the parent says go,
and the parent says go to the next one once every worker has finished the last, so configurations never
overlap (``--compare``) and a slice's wall time is from the first worker's start to the last one's end
(starting the workers, a fresh interpreter each, is not in it). A worker sends its finished requests in
batches (every ``BATCH_S`` or ``BATCH_MAX`` requests, pickled over a pipe): the records only; their
attribution (with the parent's cold-start detector) and tallies are made in the parent.

Workers start with the "spawn" context (never a fork of a process with a live event loop) and with Ctrl-C
ignored: the parent stops them (it sends stop, collects what they finished, and ends any that does not exit
within ``STOP_S``). A worker that fails says so in one line (``WorkerError``); one that dies, too, from its
exit code. A worker whose parent died sees its pipe close and stops.

The default count (``default_workers``): the machine's cores, capped by the load: never more workers than
users, and in an open loop one per started ``RATE_PER_WORKER`` requests/s (a slower rate never needs a second
process); a run of fewer than ``MIN_REQUESTS`` requests a worker, or shorter than ``MIN_DURATION_S``, stays in
one process (starting a worker, a fresh interpreter, takes a second or so). One worker is ``LoadRun`` itself,
nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import multiprocessing
import os
import random
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from llmchat.core.client import ChatClient
from llmchat.core.errors import ConfigError, LLMChatError, UsageError
from llmchat.core.load._prompts import PromptPlan
from llmchat.core.load._run import LoadRun, Scenario, Target, interleave
from llmchat.core.observe import RequestDone, RequestStarted

RATE_PER_WORKER = 100.0
"""Open loop: a worker per started this many requests/s by default (one process keeps up with that)."""
MIN_REQUESTS = 100
"""Requests per worker below which the default stays in one process."""
MIN_DURATION_S = 3.0
"""A --duration below which the default stays in one process."""
BATCH_S = 0.05
BATCH_MAX = 256
STOP_S = 5.0
"""How long stopping waits for the workers' last requests before ending them."""


class WorkerError(LLMChatError):
    """A worker process failed or died: one line naming it and why."""


def available_cores() -> int:
    """The cores this process may run on (``os.process_cpu_count`` where Python has it)."""
    count = getattr(os, "process_cpu_count", None)
    if count is not None:
        n = count()
    elif hasattr(os, "sched_getaffinity"):
        n = len(os.sched_getaffinity(0))
    else:
        n = os.cpu_count()
    return max(1, n or 1)


def _load_cap(scenario: Scenario) -> int:
    """The most workers the load can be split over: a user, an in-flight slot and a request a slice each."""
    cap = scenario.max_in_flight if scenario.open_loop else scenario.users
    if scenario.requests is not None:
        cap = min(cap, scenario.requests // scenario.slices)
    return max(1, cap)


def default_workers(scenario: Scenario, *, available: int | None = None) -> int:
    """The cores (``available``, else ``available_cores()``), capped by the load as the module docstring says."""
    n = min(available or available_cores(), _load_cap(scenario))
    if scenario.open_loop:
        n = min(n, math.ceil(scenario.rate / RATE_PER_WORKER))
    if scenario.requests is not None:
        n = min(n, scenario.requests // MIN_REQUESTS)
    if scenario.duration_s is not None and scenario.duration_s < MIN_DURATION_S:
        n = 1
    return max(1, n)


def _one_process_only(scenario: Scenario) -> str:
    """The flag that keeps ``scenario`` in one process ("" for none): a dataset, a shared prefix or a
    multi-turn replay, whose token counts are made before the run for the requests of one process."""
    if scenario.dataset is not None:
        return "--dataset"
    if scenario.prefix_share:
        return "--prefix-share"
    if scenario.turns == "all":
        return "--turns all"
    return ""


def choose_workers(scenario: Scenario, given: int | None, *, fit: bool = False,
                   rate_limited: bool = False) -> int:
    """How many workers run ``scenario``: ``given`` (``--workers``), else ``default_workers``. Raises
    UsageError, one line naming the flag, for a count below 1, more than the load splits over (unless
    ``fit``: then capped, as a sweep's low levels need), or several beside the client's own rate limiter."""
    one_process = _one_process_only(scenario)
    if given is None:
        return 1 if rate_limited or one_process else default_workers(scenario)
    if given < 1:
        raise UsageError(f"--workers must be at least 1, got {given}")
    if given > 1 and one_process:
        raise UsageError(f"{one_process} runs in one process (its prompts are counted, and its conversations "
                         "replayed, by the process that sends them); drop --workers or use --workers 1")
    if given > 1 and rate_limited:
        raise UsageError("--rate-limit-client holds requests in one process's limiter; drop it or use --workers 1")
    cap = _load_cap(scenario)
    if given <= cap or fit:
        return min(given, cap)
    if scenario.open_loop and cap == scenario.max_in_flight:
        what = f"--max-in-flight {scenario.max_in_flight}"
    elif not scenario.open_loop and cap == scenario.users:
        what = f"--users {scenario.users}"
    else:
        what = f"--requests {scenario.requests} over {scenario.slices} slices"
    raise UsageError(f"--workers {given} is more than {what} can be split over (a user, an in-flight slot and "
                     f"a request a slice each); use --workers {cap} or fewer")


def split(scenario: Scenario, workers: int) -> list[Scenario]:
    """Each worker's share of ``scenario`` (see the module docstring); their sum is ``scenario``."""

    def part(total: int, i: int) -> int:
        return total // workers + (1 if i < total % workers else 0)

    return [dataclasses.replace(
        scenario,
        users=part(scenario.users, i) if not scenario.open_loop else scenario.users,
        rate=scenario.rate / workers,
        requests=None if scenario.requests is None else part(scenario.requests, i),
        max_in_flight=part(scenario.max_in_flight, i) if scenario.open_loop else scenario.max_in_flight,
    ) for i in range(workers)]


def make_run(scenario: Scenario, configs: Sequence[str], target: Target, *, workers: int = 1,
             **kw: Any) -> LoadRun:
    """A ``LoadRun`` in this process for one worker, else a ``WorkerRun`` over ``workers`` processes."""
    if workers == 1:
        return LoadRun(scenario, configs, target, **kw)
    return WorkerRun(scenario, configs, target, workers=workers, **kw)


def workers_runner(given: int | None) -> Callable[..., LoadRun]:
    """``make_run`` with the worker count chosen per scenario (a sweep's levels): ``given`` or the default,
    capped by each level's load."""

    def make(scenario: Scenario, configs: Sequence[str], target: Target, **kw: Any) -> LoadRun:
        return make_run(scenario, configs, target, workers=choose_workers(scenario, given, fit=True), **kw)

    return make


@dataclass(frozen=True, kw_only=True)
class _Spec:
    """What a worker process is given: its share of the scenario and its place among the workers."""

    share: Scenario
    configs: tuple[str, ...]
    target: Target
    worker: int
    workers: int
    prompt_seed: int


class WorkerRun(LoadRun):
    """``LoadRun``'s result, made by ``workers`` processes (see the module docstring). ``pool_sizes`` are
    the sums of the workers' pools; everything else is as one process's."""

    def __init__(self, scenario: Scenario, configs: Sequence[str], target: Target, *, workers: int,
                 **kw: Any) -> None:
        super().__init__(scenario, configs, target, **kw)
        if workers < 1:
            raise UsageError(f"--workers must be at least 1, got {workers}")
        self.workers = workers
        self._conns: list[Connection] = []
        self._procs: list[Any] = []
        self._inbox: asyncio.Queue[tuple[int, tuple[Any, ...]]] = asyncio.Queue()
        self._ended: set[int] = set()
        self._backlog: list[tuple[int, tuple[Any, ...]]] = []

    async def run(self) -> None:
        """Start the workers, run every slice of every configuration across them, and stop them. Raises what
        a worker raised (UsageError, ConfigError, as ``LoadRun.run``), or WorkerError for one that failed
        otherwise or died."""
        loop = asyncio.get_running_loop()
        try:
            self._start(loop)
            started = await self._gather("started")
            info = started[0][1]
            self.model, self.base_url = info["model"], info["base_url"]
            self.metrics_url, self.metrics_interval_s = info["metrics"]
            self.pool_sizes = {c: sum(m[1]["pool_sizes"][c] for m in started) for c in self.configs}
            self.pool_size = sum(m[1]["pool_size"] for m in started)
            if self.on_start is not None:
                self.on_start(self)
            for slice_no, name in interleave(self.configs, self.scenario.slices, self.scenario.seed):
                self._running = name
                if self.on_slice is not None:
                    self.on_slice(slice_no, name)
                for conn in self._conns:
                    conn.send("go")
                sliced = await self._gather("sliced")
                self._sliced(name, sliced)
            await self._gather("done")
        finally:
            self._stop(loop)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        ctx = multiprocessing.get_context("spawn")
        # A worker never reads a key or a bus of ours: the parent publishes every record on its own bus.
        target = dataclasses.replace(self.target, bus=None, limits=None)
        shares = split(self.scenario, self.workers)
        # Children start with Ctrl-C ignored (an ignored signal stays ignored through exec, and Python then
        # installs no KeyboardInterrupt of its own): the terminal sends it to them too; the parent stops them.
        previous = _ignore_sigint()
        try:
            for i, share in enumerate(shares):
                mine, theirs = ctx.Pipe()
                spec = _Spec(share=share, configs=tuple(self.configs), target=target, worker=i,
                             workers=self.workers, prompt_seed=self.scenario.seed)
                proc = ctx.Process(target=_worker_main, args=(theirs, spec), name=f"llmchat-bench-worker-{i + 1}",
                                   daemon=True)
                proc.start()
                theirs.close()
                self._procs.append(proc)
                self._conns.append(mine)
                loop.add_reader(mine.fileno(), self._readable, i)
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)

    def _readable(self, i: int) -> None:
        conn = self._conns[i]
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            msg = ("eof",)
        except Exception as exc:  # a message that does not unpickle: the worker's fault, said in one line
            msg = ("error", "crash", f"{type(exc).__name__}: {exc}")
        if msg[0] == "samples":
            self._merge(msg[1])
            return
        if msg[0] in ("eof", "error", "done"):
            self._ended.add(i)
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(conn.fileno())
        self._inbox.put_nowait((i, msg))

    def _merge(self, batch: list[tuple[Any, ...]]) -> None:
        bus = self.target.bus
        for name, slice_no, index, long, record, due, start, tokens in batch:
            if bus is not None:  # what the workers' own clients would have published, for the exporter and log
                bus.publish(RequestStarted(record))
                bus.publish(RequestDone(record))
            self._count(name, slice_no, index, long, record, due, start, tokens)

    async def _gather(self, kind: str) -> list[tuple[Any, ...]]:
        """Wait until every worker has sent ``kind``; raise the error of one that failed or died first."""
        got: dict[int, Any] = {}
        backlog, held = self._backlog, []
        while len(got) < self.workers:
            i, msg = backlog.pop(0) if backlog else await self._inbox.get()
            if i in got:  # a worker already past this step: its next message waits for the next gather
                held.append((i, msg))
            elif msg[0] == kind:
                got[i] = msg
            elif msg[0] == "error":
                raise self._error(i, msg[1], msg[2])
            elif msg[0] == "eof" or (msg[0] == "done" and kind != "done"):
                proc = self._procs[i]
                await asyncio.get_running_loop().run_in_executor(None, proc.join, 1.0)
                raise WorkerError(f"bench worker {i + 1} of {self.workers} stopped unexpectedly (exit code "
                                  f"{proc.exitcode}); run with --workers 1 to see the cause in one process")
        self._backlog = held + backlog
        return [got[i] for i in sorted(got)]

    def _error(self, i: int, kind: str, line: str) -> LLMChatError:
        if kind == "usage":
            return UsageError(line)
        if kind == "config":
            return ConfigError(line)
        if kind == "error":
            return LLMChatError(line)
        return WorkerError(f"bench worker {i + 1} of {self.workers} failed: {line}; run with --workers 1 to see "
                           "it in one process")

    def _sliced(self, name: str, msgs: list[tuple[Any, ...]]) -> None:
        self.walls_ns[name] += max(m[2] for m in msgs) - min(m[1] for m in msgs)
        self.cap_hits += sum(m[3] for m in msgs)
        self.server_snapshots[name].extend(msgs[0][4])

    def _stop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Stop every worker still running, merge what they finished, and make sure each one has exited."""
        for i, conn in enumerate(self._conns):
            with contextlib.suppress(ValueError, OSError):
                loop.remove_reader(conn.fileno())
            if i not in self._ended:
                with contextlib.suppress(OSError):
                    conn.send("stop")
        deadline = time.monotonic() + STOP_S
        for i, conn in enumerate(self._conns):
            while i not in self._ended:
                left = deadline - time.monotonic()
                try:
                    if left <= 0 or not conn.poll(left):
                        break
                    msg = conn.recv()
                except Exception:  # closed, or garbled: nothing more to merge from it
                    break
                if msg[0] == "samples":
                    self._merge(msg[1])
                elif msg[0] == "sliced":
                    self._sliced(self._running, [msg])
                elif msg[0] in ("done", "error"):
                    break
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.terminate()
                proc.join(1.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self._conns:
            conn.close()


def _ignore_sigint() -> Any:
    """Ignore SIGINT, returning the handler to restore; None off the main thread (nothing to change)."""
    try:
        return signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:
        return None


class _ShareRun(LoadRun):
    """A worker's share: ``LoadRun`` whose slices wait for the parent's go and whose finished requests go to
    the parent in batches, untallied."""

    def __init__(self, spec: _Spec, conn: Connection) -> None:
        super().__init__(spec.share, list(spec.configs), spec.target, on_start=self._started)
        self.plan = PromptPlan(spec.prompt_seed, spec.share.long_ratio, spec.share.distinct_prompts)
        self.conn = conn
        self.worker = spec.worker
        self.workers = spec.workers
        self.go: asyncio.Queue[None] = asyncio.Queue()
        self.outbox: list[tuple[Any, ...]] = []
        self._cap_hits_sent = 0
        self._snapshots_sent = dict.fromkeys(self.configs, 0)

    def _started(self, run: LoadRun) -> None:
        self.conn.send(("started", {"model": self.model, "base_url": self.base_url,
                                    "pool_sizes": dict(self.pool_sizes), "pool_size": self.pool_size,
                                    "metrics": (self.metrics_url, self.metrics_interval_s)}))

    def _arrivals(self, slice_no: int) -> random.Random:
        # Each worker its own Poisson stream (the same under every configuration, as in one process).
        return random.Random(f"llmchat-bench-arrivals:{self.scenario.seed}:{slice_no}:worker:{self.worker}")

    async def _slice(self, client: ChatClient, name: str, slice_no: int) -> None:
        await self.go.get()
        start = time.perf_counter_ns()
        try:
            await super()._slice(client, name, slice_no)
        finally:
            end = time.perf_counter_ns()
            self.flush()
            snapshots: list[Any] = []
            if self.worker == 0:  # one worker's scrapes stand for the run's, as one process has one poller
                snapshots = self.server_snapshots[name][self._snapshots_sent[name]:]
                self._snapshots_sent[name] += len(snapshots)
            self.conn.send(("sliced", start, end, self.cap_hits - self._cap_hits_sent, snapshots))
            self._cap_hits_sent = self.cap_hits

    async def _send(self, client: ChatClient, name: str, slice_no: int, index: int, due: int | None,
                    start: int = 0) -> None:
        index = index * self.workers + self.worker
        record, long, tokens = await self._request(client, slice_no, index)
        self.outbox.append((name, slice_no, index, long, record, due, start, tokens))
        if len(self.outbox) >= BATCH_MAX:
            self.flush()

    def flush(self) -> None:
        if self.outbox:
            batch, self.outbox = self.outbox, []
            self.conn.send(("samples", batch))


def _worker_main(conn: Connection, spec: _Spec) -> None:
    """A worker process: run its share until done or told to stop; any failure is one line to the parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        asyncio.run(_work(conn, spec))
    except BaseException as exc:  # noqa: BLE001 - whatever it was, the parent says it in one line
        kind = ("usage" if isinstance(exc, UsageError) else "config" if isinstance(exc, ConfigError)
                else "error" if isinstance(exc, LLMChatError) else "crash")
        line = str(exc) if kind != "crash" else f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(Exception):
            conn.send(("error", kind, " ".join(line.split())))
    finally:
        conn.close()


async def _work(conn: Connection, spec: _Spec) -> None:
    run = _ShareRun(spec, conn)
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None

    def control() -> None:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the parent is gone: stop
            msg = "stop"
        if msg == "go":
            run.go.put_nowait(None)
            return
        loop.remove_reader(conn.fileno())
        main.cancel()

    async def flusher() -> None:
        while True:
            await asyncio.sleep(BATCH_S)
            run.flush()

    loop.add_reader(conn.fileno(), control)
    ticker = asyncio.create_task(flusher())
    try:
        await run.run()
    except asyncio.CancelledError:
        pass  # told to stop: what finished is sent below
    finally:
        ticker.cancel()
        run.flush()
    conn.send(("done",))
