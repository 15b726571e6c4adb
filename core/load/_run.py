"""Load tests through the engine: one scenario, run under each client configuration, interleaved.

A *scenario* is the traffic: a closed loop (``users`` tasks, each sending its next request as soon as the
last one ends, their starts spread over ``ramp_s``) or an open loop (Poisson arrivals at ``rate`` requests/s,
seeded, each request in its own task whatever is in flight, up to ``max_in_flight``), stopping after
``requests`` or ``duration_s`` per configuration. A *configuration* is how the client talks (:data:`CONFIGS`):
each gets its own ``ChatClient`` with its own connection pool and cache folder, since the pool is what is
compared.

Each pool is sized for the load unless ``Target.max_connections`` says otherwise: one connection per user in a
closed loop, the in-flight cap in an open one (HTTP/1.1 slots open lazily, so only as many connections open as
requests are ever in flight at once; HTTP/2 multiplexes them all on one connection whatever the size). A pool
timeout is then the bench's own doing, never the server's: it fails the request once, as a client error,
instead of going back into the same queue as a retry (``_OwnPoolTransport``).

Nothing of a finished request is kept: its record and attribution go to ``on_sample`` (``llmchat bench``
streams them to ``--json``) and into the configuration's ``Tally``, which keeps counters and bounded
distributions (:mod:`llmchat.core.load._stats`), so memory stays flat however long the run.

To let machine noise hit every configuration alike, the run is cut into ``slices``: each round runs one slice
of every configuration, in an order shuffled per round (seeded). Slice ``s`` sends the same prompts and, in an
open loop, the same arrival times under every configuration. One slice's requests all finish before the next
slice starts, so configurations never overlap. The figures are in :mod:`llmchat.core.load._stats`.

Prompts are synthetic (``_prompts``) or a dataset's (``--dataset``, ``_dataset``): its first human turns, or
with ``turns="all"`` each conversation's human turns in order, each request carrying the history so far with
this run's own replies as the assistant turns (one conversation is one unit of the loop: a closed-loop user
sends its turns back to back, an open-loop arrival starts one; ``requests`` still counts requests, and a turn
starts only within the budget). Dataset and shared-prefix runs count their prompts with the server's
tokenizer first (``_tokens``), on a client of their own.

When the provider names a ``metrics_url``, a ``ServerMetricsPoller`` scrapes it every ``metrics_interval_s``
for the whole run (its own connection, never a configuration's pool): each request carries the latest
snapshot, and ``server_snapshots`` keeps them per configuration (the one whose slice was running).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from llmchat.core.client import ChatClient, ServerMetricsPoller, endpoint_from_settings
from llmchat.core.config import Http2Mode, Settings
from llmchat.core.errors import APIError, LLMChatError, UsageError
from llmchat.core.errors import TimeoutError as APITimeoutError
from llmchat.core.http import Pools, Transport, WireResponse
from llmchat.core.load._dataset import Dataset, load_dataset
from llmchat.core.load._prompts import PromptPlan
from llmchat.core.load._schedule import from_schedule, schedule_lag_ms
from llmchat.core.load._stats import SLO, Tally
from llmchat.core.load._tokens import MAX_COUNTED, PromptCounter, ReplyProbe, RequestTokens
from llmchat.core.observe import Attribution, Bus, ColdStartDetector, Phases, TimingRecord, attribute
from llmchat.core.policy import RateLimits

Mode = Literal["stream", "batch"]
Turns = Literal["first", "all"]

#: The configurations ``--compare`` knows; join several with "+" (``h1+noretry``).
CONFIGS: dict[str, str] = {
    "base": "the settings as they are",
    "h2": "HTTP/2: h2c with prior knowledge on http://, ALPN h2 on https://",
    "h1": "HTTP/1.1 only, pooled keep-alive connections",
    "nopool": "HTTP/1.1 with a new connection per request and no connection limit (the naive baseline)",
    "nocache": "the reply cache off",
    "noretry": "no retries (max_attempts 1)",
}
MAX_IN_FLIGHT = 1000


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """The traffic of a load test, the same under every configuration. See the module docstring."""

    mode: Mode = "stream"
    users: int = 10
    rate: float = 0.0
    """Open loop at this many requests/s when > 0; else a closed loop of ``users``."""
    requests: int | None = None
    """Requests per configuration; with ``duration_s`` too, whichever ends first."""
    duration_s: float | None = None
    """Seconds per configuration during which new requests start (those in flight then finish)."""
    ramp_s: float = 0.0
    long_ratio: float = 0.0
    distinct_prompts: int = 0
    max_tokens: int = 64
    temperature: float | None = None
    seed: int = 0
    model: str | None = None
    slices: int = 1
    max_in_flight: int = MAX_IN_FLIGHT
    dataset: str | None = None
    """A ShareGPT JSON or JSONL file of prompts (``_dataset``); None: synthetic prompts."""
    turns: Turns = "first"
    """A dataset's first human turn of each conversation, or all of them with their history."""
    prefix_share: float = 0.0
    """A shared system-prompt prefix of this share of each prompt's words (``_prompts``)."""
    chunk_usage: bool = False
    """Ask for usage on every chunk (vLLM's ``continuous_usage_stats``), for ITL per token."""

    @property
    def open_loop(self) -> bool:
        return self.rate > 0

    @property
    def concurrency(self) -> int:
        """The most requests in flight at once: the users of a closed loop, the cap of an open one."""
        return self.max_in_flight if self.open_loop else self.users

    def validate(self) -> None:
        """Raise UsageError, one line naming the flag, for a value out of range."""
        if self.mode not in ("stream", "batch"):
            raise UsageError(f"--mode must be stream or batch, got {self.mode!r}")
        if not self.open_loop and self.users < 1:
            raise UsageError(f"--users must be at least 1, got {self.users}")
        if self.rate < 0:
            raise UsageError(f"--rate must be a positive number of requests per second, got {self.rate:g}")
        if self.requests is None and self.duration_s is None:
            raise UsageError("give --requests N or --duration S (or both: whichever ends first)")
        if self.requests is not None and self.requests < 1:
            raise UsageError(f"--requests must be at least 1, got {self.requests}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise UsageError(f"--duration must be a positive number of seconds, got {self.duration_s:g}")
        if self.ramp_s < 0:
            raise UsageError(f"--ramp-s must not be negative, got {self.ramp_s:g}")
        if not 0.0 <= self.long_ratio <= 1.0:
            raise UsageError(f"--long-ratio must be between 0 and 1, got {self.long_ratio:g}")
        if self.distinct_prompts < 0:
            raise UsageError(f"--prompts must not be negative, got {self.distinct_prompts}")
        if self.max_tokens < 1:
            raise UsageError(f"--max-tokens must be at least 1, got {self.max_tokens}")
        if self.max_in_flight < 1:
            raise UsageError(f"--max-in-flight must be at least 1, got {self.max_in_flight}")
        if self.slices < 1:
            raise UsageError(f"--slices must be at least 1, got {self.slices}")
        if self.requests is not None and self.requests < self.slices:
            raise UsageError(f"--requests {self.requests} is fewer than --slices {self.slices}; "
                             "send at least one request per slice")
        if self.turns not in ("first", "all"):
            raise UsageError(f"--turns must be first or all, got {self.turns!r}")
        if self.turns == "all" and self.dataset is None:
            raise UsageError("--turns all replays a dataset's conversations; give --dataset FILE (synthetic "
                             "prompts have one turn)")
        if not 0.0 <= self.prefix_share <= 1.0:
            raise UsageError(f"--prefix-share must be between 0 and 1, got {self.prefix_share:g}")
        if self.dataset is not None and self.long_ratio:
            raise UsageError("--long-ratio shapes synthetic prompts; drop it with --dataset (the file's prompts "
                             "are sent as they are)")
        if self.dataset is not None:
            self.load_dataset()

    def load_dataset(self) -> Dataset | None:
        """The dataset ``dataset`` names (read once per file), or None; UsageError for a bad file."""
        return None if self.dataset is None else load_dataset(self.dataset)

    def plan(self) -> PromptPlan:
        """The prompts of every request."""
        return PromptPlan(self.seed, self.long_ratio, self.distinct_prompts, dataset=self.load_dataset(),
                          prefix_share=self.prefix_share)

    def params(self) -> dict[str, Any]:
        """The generation parameters every request sends."""
        p: dict[str, Any] = {"max_tokens": self.max_tokens}
        if self.temperature is not None:
            p["temperature"] = self.temperature
        if self.chunk_usage and self.mode == "stream":
            p["stream_options"] = {"continuous_usage_stats": True}
        return p

    def slice_budget(self, slice_no: int) -> tuple[int | None, float | None]:
        """``(requests, seconds)`` of one slice: the totals split evenly, the remainder to the first."""
        n = None
        if self.requests is not None:
            n = self.requests // self.slices + (1 if slice_no < self.requests % self.slices else 0)
        d = None if self.duration_s is None else self.duration_s / self.slices
        return n, d

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def parse_configs(text: str) -> list[str]:
    """``"h2,h1,nopool"`` -> the names in order. Raises UsageError for an unknown or repeated name."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UsageError("--compare needs at least one configuration, e.g. --compare h2,h1,nopool")
    for name in names:
        for part in name.split("+"):
            if part not in CONFIGS:
                raise UsageError(f"--compare: unknown configuration {part!r}; pick from {', '.join(CONFIGS)} "
                                 "(join with + to combine, e.g. h1+noretry)")
    if len(set(names)) != len(names):
        raise UsageError(f"--compare names a configuration twice: {text}")
    return names


def interleave(configs: Sequence[str], slices: int, seed: int) -> list[tuple[int, str]]:
    """The running order: ``slices`` rounds, each running every configuration once in a seeded shuffle."""
    order: list[tuple[int, str]] = []
    for s in range(slices):
        round_ = list(configs)
        if len(round_) > 1:
            random.Random(f"llmchat-bench-order:{seed}:{s}").shuffle(round_)
        order.extend((s, name) for name in round_)
    return order


@dataclass(frozen=True, kw_only=True)
class Target:
    """Where the load goes, as ``ChatClient`` takes it (``http2`` from the offline default, else None)."""

    settings: Settings = field(default_factory=Settings)
    provider: str | None = None
    base_url: str | None = None
    http2: Http2Mode | None = None
    model: str | None = None
    max_connections: int | None = None
    """Size every pool to this many connections, kept alive alike (nopool keeps none and has no limit); None
    sizes it for the scenario (``Scenario.concurrency``)."""
    bus: Bus | None = None
    """One bus for every configuration's client (``--metrics-port`` watches it); None gives each its own."""
    api_key_env: str | None = None
    """Send the key held in this environment variable (``--api-key-env``)."""
    limits: RateLimits | None = None
    """The client-side rate limiter every configuration's client shares (``--rate-limit-client``); None sends
    at the load's own pace, into the provider's limit if it has one (a load test may want to hit it)."""


@dataclass(slots=True)
class Sample:
    """One finished request of a load test, as ``on_sample`` gets it: its configuration, slice, place in the
    slice, timing record and attribution. LoadRun keeps none of it once the callback returns."""

    config: str
    slice: int
    index: int
    long: bool
    record: TimingRecord
    lag_ms: float = 0.0
    """Open loop: how late the request went out after its scheduled arrival (the in-flight cap, a busy
    loop)."""
    attribution: Attribution | None = None
    due_ns: int | None = None
    """Open loop: the scheduled start (perf_counter_ns); its JSON then has the latencies counted from it."""
    tokens: RequestTokens | None = None
    """Its turn, counted prompt length and per-chunk tokens (``_tokens``)."""

    def to_json(self) -> dict[str, Any]:
        """The record's summary (no text, no secrets), the chunk gaps, the request's place in the run, and
        its attribution when it has one."""
        data = {
            "type": "request",
            "config": self.config,
            "slice": self.slice,
            "index": self.index,
            "long_prompt": self.long,
            "lag_ms": round(self.lag_ms, 3),
            **self.record.summary(),
            "itl_ms": [round(v, 3) for v in self.record.itl_ms],
        }
        if self.due_ns is not None:
            # Counted from the scheduled start: the lag plus the record's own (coordinated omission).
            ttft, e2e = from_schedule(self.record, self.due_ns)
            data["scheduled_ttft_ms"] = None if ttft is None else round(ttft, 3)
            data["scheduled_e2e_ms"] = None if e2e is None else round(e2e, 3)
        if self.attribution is not None:
            data["attribution"] = self.attribution.to_dict()
        data.update((self.tokens or RequestTokens()).to_json(self.record))
        return data


class _OwnPoolTransport(Transport):
    """A configuration's pool, as the bench uses it: a request that finds no free connection in time fails
    once with its pool timeout (``timeout_pool``, a client error), not retried. The wait was in the bench's
    own queue: a retry would put it at the back of the same queue and count the client's shortfall as a
    failure the server had (the app's pools do retry it: there a connection frees up once a reply ends)."""

    @asynccontextmanager
    async def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        phases: Phases,
        stream: bool = False,
        extra_headers: Mapping[str, str] | None = None,
    ) -> AsyncIterator[WireResponse]:
        async with AsyncExitStack() as stack:
            try:
                response = await stack.enter_async_context(super().request(
                    method, path, body=body, phases=phases, stream=stream, extra_headers=extra_headers))
            except APITimeoutError as exc:
                if exc.phase == "pool":
                    exc.retryable = False
                raise
            yield response


def make_client(name: str, target: Target, cache_dir: str, pools: Pools, *,
                connections: int | None = None) -> ChatClient:
    """A ChatClient for configuration ``name`` (see CONFIGS) with a pool of its own, opened in ``pools``
    (which the caller closes: ``bench_pools()``), and a fresh cache folder.

    The pool holds ``target.max_connections`` connections, else ``connections``, else http.max_connections
    (nopool: no limit); a pool timeout in it is not retried (``_OwnPoolTransport``). Raises UsageError for an
    unknown name, ConfigError / UsageError as ChatClient does for the target.
    """
    parts = set(name.split("+"))
    unknown = parts - set(CONFIGS)
    if unknown:
        raise UsageError(f"unknown configuration {sorted(unknown)[0]!r}; pick from {', '.join(CONFIGS)}")
    settings = target.settings
    cache = dataclasses.replace(settings.cache, path=cache_dir)
    if "nocache" in parts:
        cache = dataclasses.replace(cache, policy="off")
    settings = dataclasses.replace(settings, cache=cache)
    retry = dataclasses.replace(settings.retry, max_attempts=1) if "noretry" in parts else None
    endpoint, model = endpoint_from_settings(settings, target.provider, base_url=target.base_url,
                                             api_key_env=target.api_key_env, http2=target.http2)
    http = endpoint.http
    size = target.max_connections if target.max_connections is not None else connections
    if size is not None:
        http = dataclasses.replace(http, max_connections=size, max_keepalive_connections=size)
    if "h2" in parts:
        tls = endpoint.base_url.startswith("https")
        http = dataclasses.replace(http, http2=True if tls else "h2c")
    if "h1" in parts:
        http = dataclasses.replace(http, http2=False)
    if "nopool" in parts:
        # HTTP/1.1, since concurrent requests would share one HTTP/2 connection; no limit, as a bare loop of
        # one-off clients has none.
        http = dataclasses.replace(http, http2=False, max_keepalive_connections=0,
                                   max_connections=max(MAX_IN_FLIGHT, http.max_connections))
    # Changed on the endpoint, not the settings, so a provider's own [providers.X.http] cannot undo it; and a
    # transport of its own (pools.open, never shared), because the pool is what is compared.
    endpoint = dataclasses.replace(endpoint, http=http)
    return ChatClient(settings, model=target.model or model, retry=retry, bus=target.bus,
                      transport=pools.open(endpoint), limits=target.limits)


def bench_pools() -> Pools:
    """The pools a load run owns: each configuration's, made by ``make_client``, whose pool timeouts are not
    retried (``_OwnPoolTransport``). Close them when the run ends."""
    return Pools(factory=_OwnPoolTransport)


async def request_once(client: ChatClient, messages: list[dict[str, str]], *, mode: Mode, model: str,
                       params: dict[str, Any], probe: ReplyProbe | None = None) -> TimingRecord:
    """Send one request, read the whole reply, and return its record; an APIError ends up in the record
    (``error``, ``error_kind``), anything else (a ConfigError, say) raises. ``probe`` gets the reply's text
    and per-chunk usage."""
    if mode == "stream":
        stream = client.stream(messages, model=model, **params)
        if probe is not None:
            probe.watch(stream)
        try:
            async for _ in stream:
                pass
        except APIError:
            pass
        if probe is not None and probe.keep_text:
            probe.done(stream.text)
        return stream.record
    try:
        reply = await client.complete(messages, model=model, **params)
        if probe is not None:
            probe.done(reply.text)
        return reply.record
    except APIError as exc:
        if isinstance(exc.record, TimingRecord):
            return exc.record
        raise


class LoadRun:
    """Run ``scenario`` under each configuration, interleaved, tallying each request as it ends.

    ``on_start(run)`` is called once the clients are built and the model known (``base_url``, ``model`` and
    ``pool_sizes`` are set), ``on_slice(round, config)`` as each slice starts and ``on_sample(sample)`` as
    each request ends, with its record and attribution (all on the event loop: keep them quick). Each
    request's attribution is made once, with ``detector`` when given (fed every record in the order they
    finish), and counted in its configuration's ``tallies`` entry (goodput against ``slo``); the request
    itself is not kept. ``tallies``, ``walls_ns`` (per configuration, the sum of its slices), ``done``,
    ``failed`` and ``cap_hits`` hold what was done so far, also after a cancel.
    """

    def __init__(
        self,
        scenario: Scenario,
        configs: Sequence[str],
        target: Target,
        *,
        slo: SLO | None = None,
        detector: ColdStartDetector | None = None,
        on_sample: Callable[[Sample], object] | None = None,
        on_slice: Callable[[int, str], object] | None = None,
        on_start: Callable[[LoadRun], object] | None = None,
    ) -> None:
        scenario.validate()
        self.scenario = scenario
        self.configs = list(configs)
        self.target = target
        self.detector = detector
        self.on_sample = on_sample
        self.on_slice = on_slice
        self.on_start = on_start
        self.plan = scenario.plan()
        self.counter: PromptCounter | None = None
        """The prompts' token counts (dataset and shared-prefix runs), made before the first slice."""
        self._budget: int | None = None
        """Multi-turn: the running slice's requests not yet started (None: no count)."""
        self._deadline: int | None = None
        self.tallies: dict[str, Tally] = {c: Tally(c, slo=slo) for c in self.configs}
        self.done = 0
        """Requests finished, every configuration."""
        self.failed = 0
        self.first_error: str | None = None
        """The one-line error of the first request that failed."""
        self.walls_ns: dict[str, int] = dict.fromkeys(self.configs, 0)
        self.cap_hits = 0
        self.model = scenario.model or target.model or ""
        self.base_url = ""
        self.pool_sizes: dict[str, int] = {}
        """Each configuration's http.max_connections, as its client was built."""
        self.pool_size = scenario.concurrency if target.max_connections is None else target.max_connections
        """The pool of every configuration but nopool: ``--max-connections``, else sized for the scenario."""
        self.server_snapshots: dict[str, list[Mapping[str, float] | None]] = {c: [] for c in self.configs}
        """Per configuration, the provider's /metrics scraped while its slices ran (None: a failed scrape)."""
        self.metrics_url = ""
        self.metrics_interval_s = 0.0
        self._running = self.configs[0] if self.configs else ""

    async def run(self) -> None:
        """Run every slice of every configuration. Raises UsageError when no model is given and the server
        lists none, the APIError of that listing when it fails, and any non-API error a request raises
        (ConfigError for a bad CA bundle, say); the APIErrors of the requests themselves are samples."""
        loop = asyncio.get_running_loop()
        cache_root = await loop.run_in_executor(None, lambda: tempfile.mkdtemp(prefix="llmchat-bench-"))
        clients: dict[str, ChatClient] = {}
        poller: ServerMetricsPoller | None = None
        pools = bench_pools()
        try:
            for name in self.configs:
                clients[name] = make_client(name, self.target, f"{cache_root}/{len(clients)}", pools,
                                            connections=self.pool_size)
                self.pool_sizes[name] = clients[name].endpoint.http.max_connections
            first = clients[self.configs[0]]
            self.base_url = first.endpoint.base_url
            self.model = self.model or first.model or await _first_model(self.target, f"{cache_root}/models",
                                                                         pools)
            if self.plan.dataset is not None or self.plan.prefix_share:
                self.counter = await _count_prompts(self, f"{cache_root}/tokenize", pools)
            poller = self._poller(first, list(clients.values()))
            if self.on_start is not None:
                self.on_start(self)
            for slice_no, name in interleave(self.configs, self.scenario.slices, self.scenario.seed):
                self._running = name
                if self.on_slice is not None:
                    self.on_slice(slice_no, name)
                await self._slice(clients[name], name, slice_no)
        finally:
            if poller is not None:
                await poller.aclose()
            for client in clients.values():
                await client.aclose()
            await pools.aclose()
            await loop.run_in_executor(None, lambda: shutil.rmtree(cache_root, ignore_errors=True))

    def _poller(self, first: ChatClient, clients: list[ChatClient]) -> ServerMetricsPoller | None:
        """The provider's metrics poller, watching every configuration's bus, started; None without a URL."""
        poller = ServerMetricsPoller.for_client(first, on_snapshot=self._snapshot)
        if poller is None:
            return None
        for client in clients:
            poller.watch(client.bus)
        self.metrics_url, self.metrics_interval_s = poller.url, poller.interval_s
        poller.start()
        return poller

    def _snapshot(self, snapshot: Mapping[str, float] | None) -> None:
        self.server_snapshots[self._running].append(snapshot)

    async def _slice(self, client: ChatClient, name: str, slice_no: int) -> None:
        n, seconds = self.scenario.slice_budget(slice_no)
        start = time.perf_counter_ns()
        deadline = None if seconds is None else start + int(seconds * 1e9)
        self._budget, self._deadline = n, deadline
        try:
            if self.scenario.open_loop:
                await self._open(client, name, slice_no, n, start, deadline)
            else:
                await self._closed(client, name, slice_no, n, deadline)
        except BaseExceptionGroup as group:
            raise _first_error(group) from None
        finally:
            self.walls_ns[name] += time.perf_counter_ns() - start

    async def _closed(self, client: ChatClient, name: str, slice_no: int, n: int | None,
                      deadline: int | None) -> None:
        sc = self.scenario
        issued = 0

        async def user(u: int) -> None:
            nonlocal issued
            if sc.ramp_s > 0 and u:
                await asyncio.sleep(sc.ramp_s * u / sc.users)
            while (n is None or issued < n) and (deadline is None or time.perf_counter_ns() < deadline):
                index = issued
                issued += 1
                await self._send(client, name, slice_no, index, None)

        async with asyncio.TaskGroup() as tg:
            for u in range(sc.users):
                tg.create_task(user(u))

    async def _open(self, client: ChatClient, name: str, slice_no: int, n: int | None, start: int,
                    deadline: int | None) -> None:
        sc = self.scenario
        rng = self._arrivals(slice_no)
        room = asyncio.Semaphore(sc.max_in_flight)
        due = start
        index = 0
        async with asyncio.TaskGroup() as tg:
            while n is None or index < n:
                if index:
                    due += int(rng.expovariate(sc.rate) * 1e9)
                if deadline is not None and due >= deadline:
                    break
                wait_ns = due - time.perf_counter_ns()
                if wait_ns > 0:
                    await asyncio.sleep(wait_ns / 1e9)
                if self._budget == 0 and sc.turns == "all":
                    break  # the conversations so far used up the requests: no arrival would send one
                if room.locked():
                    self.cap_hits += 1
                await room.acquire()
                tg.create_task(self._send_released(room, client, name, slice_no, index, due, start))
                index += 1

    async def _send_released(self, room: asyncio.Semaphore, client: ChatClient, name: str, slice_no: int,
                             index: int, due: int, start: int) -> None:
        try:
            await self._send(client, name, slice_no, index, due, start)
        finally:
            room.release()

    def _arrivals(self, slice_no: int) -> random.Random:
        # The same arrival times under every configuration: the stream of gaps depends on the slice only.
        return random.Random(f"llmchat-bench-arrivals:{self.scenario.seed}:{slice_no}")

    async def _send(self, client: ChatClient, name: str, slice_no: int, index: int, due: int | None,
                    start: int = 0) -> None:
        if self.scenario.turns == "all":
            await self._conversation(client, name, slice_no, index, due, start)
            return
        record, long, tokens = await self._request(client, slice_no, index)
        self._count(name, slice_no, index, long, record, due, start, tokens)

    async def _request(self, client: ChatClient, slice_no: int, index: int
                       ) -> tuple[TimingRecord, bool, RequestTokens]:
        """Send request ``index`` of slice ``slice_no``: its record, whether its prompt was a long one, and its
        token counts."""
        messages, long = self.plan.messages(slice_no, index)
        probe = ReplyProbe()
        record = await request_once(client, messages, mode=self.scenario.mode, model=self.model,
                                    params=self.scenario.params(), probe=probe)
        return record, long, self._tokens(messages, (), record, probe)

    async def _conversation(self, client: ChatClient, name: str, slice_no: int, index: int, due: int | None,
                            start: int) -> None:
        """Every human turn of one conversation in order, each carrying the history with this run's replies;
        a failed turn ends it (there is no reply to carry). Only the first turn has a scheduled start."""
        conversation, long = self.plan.conversation(slice_no, index)
        history = [{"role": "system", "content": conversation.system}] if conversation.system else []
        replies: list[int | None] = []
        for turn, text in enumerate(conversation.turns, 1):
            if self._budget is not None:
                if self._budget <= 0:
                    return
                self._budget -= 1
            if turn > 1 and self._deadline is not None and time.perf_counter_ns() >= self._deadline:
                return
            history.append({"role": "user", "content": text})
            probe = ReplyProbe(keep_text=True)
            record = await request_once(client, list(history), mode=self.scenario.mode, model=self.model,
                                        params=self.scenario.params(), probe=probe)
            tokens = self._tokens(history, replies, record, probe, turn=turn)
            self._count(name, slice_no, index, long, record, due if turn == 1 else None, start, tokens)
            if record.error_kind is not None:
                return
            history.append({"role": "assistant", "content": probe.text})
            replies.append(record.output_tokens if record.usage_from_server else None)

    def _tokens(self, messages: list[dict[str, str]], replies: Sequence[int | None], record: TimingRecord,
                probe: ReplyProbe, *, turn: int = 1) -> RequestTokens:
        tokens = RequestTokens(turn=turn, chunk_tokens=probe.chunk_tokens(record.content_chunks))
        if self.counter is not None:
            tokens.prompt_tokens, tokens.prompt_by = self.counter.count(messages, replies)
        return tokens

    def _count(self, name: str, slice_no: int, index: int, long: bool, record: TimingRecord, due: int | None,
               start: int, tokens: RequestTokens | None = None) -> None:
        """Tally one finished request (its attribution made here, fed to the detector) and hand it on."""
        attribution = attribute(record, detector=self.detector)
        since_s = 0.0 if due is None else (due - start) / 1e9
        self.tallies[name].add(record, attribution, long=long, due_ns=due, since_s=since_s, tokens=tokens)
        self.done += 1
        if record.error_kind is not None:
            self.failed += 1
            if self.first_error is None:
                self.first_error = record.error or record.error_kind
        if self.on_sample is not None:
            lag_ms = 0.0 if due is None else schedule_lag_ms(record, due)
            self.on_sample(Sample(name, slice_no, index, long, record, lag_ms, attribution, due, tokens))


async def _first_model(target: Target, cache_dir: str, pools: Pools) -> str:
    # Asked on a client (and pool) of its own: on a configuration's client the lookup would open a connection
    # that configuration then reuses and the others do not. An APIError here (refused, 401 ...) is raised as
    # it is: its one line says more than "pass --model".
    client = make_client("base", target, cache_dir, pools)
    try:
        offered = await client.models()
    finally:
        await client.aclose()
        await pools.release(client.transport)
    if not offered:
        raise UsageError(f"no model given and {client.endpoint.hostport} lists none; pass --model")
    return offered[0]


async def _count_prompts(load: LoadRun, cache_dir: str, pools: Pools) -> PromptCounter:
    """The prompts' token counts with the server's tokenizer, asked on a client (and pool) of its own before
    the run: every system prompt and human turn of the requests a ``requests`` budget sends (of the first
    MAX_COUNTED prompts without one)."""
    sc, plan = load.scenario, load.plan
    texts: dict[str, None] = {}
    for s in range(sc.slices):
        n, _ = sc.slice_budget(s)
        for i in range(MAX_COUNTED if n is None else min(n, MAX_COUNTED)):
            conversation, _ = plan.conversation(s, i)
            texts.update(dict.fromkeys((conversation.system, *(
                conversation.turns if sc.turns == "all" else conversation.turns[:1]))))
        if len(texts) >= MAX_COUNTED:
            break
    counter = PromptCounter()
    client = make_client("base", load.target, cache_dir, pools)
    try:
        await counter.prime(client, texts, load.model)
    finally:
        await client.aclose()
        await pools.release(client.transport)
    return counter


def _first_error(group: BaseExceptionGroup[Any]) -> BaseException:
    # A TaskGroup wraps what its tasks raised; the user wants the one-line LLMChatError, not the group.
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            return _first_error(exc)
        if isinstance(exc, LLMChatError):
            return exc
    return group.exceptions[0]
