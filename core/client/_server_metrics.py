"""Reading a server's Prometheus ``/metrics`` for the few gauges that say whether it is saturated.

Normalised names, whichever server sent them (counts summed over label sets, the cache usage the highest):

=================  ==================================================  ======================================
key                vLLM                                                llama.cpp (``--metrics``)
=================  ==================================================  ======================================
requests_waiting   ``vllm:num_requests_waiting``                       ``llamacpp:requests_deferred``
requests_running   ``vllm:num_requests_running``                       ``llamacpp:requests_processing``
kv_cache_usage     ``vllm:gpu_cache_usage_perc`` / ``kv_cache_usage_perc``  ``llamacpp:kv_cache_usage_ratio``
=================  ==================================================  ======================================

``llmchat serve`` sends ``llmchat_local:requests_waiting`` and ``llmchat_local:requests_running``. The usage
is a fraction, 0 to 1, on both servers (vLLM's "perc" notwithstanding).
"""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import llmchat.core.errors as errors
from llmchat.core.config import HttpSettings
from llmchat.core.http import Endpoint, HTTPTransport, Transport
from llmchat.core.observe import Phases

if TYPE_CHECKING:
    from llmchat.core.client._client import ChatClient

#: Prometheus metric name -> (normalised key, how label sets combine).
METRICS: dict[str, tuple[str, str]] = {
    "vllm:num_requests_waiting": ("requests_waiting", "sum"),
    "vllm:num_requests_running": ("requests_running", "sum"),
    "vllm:gpu_cache_usage_perc": ("kv_cache_usage", "max"),
    "vllm:kv_cache_usage_perc": ("kv_cache_usage", "max"),
    "llamacpp:requests_deferred": ("requests_waiting", "sum"),
    "llamacpp:requests_processing": ("requests_running", "sum"),
    "llamacpp:kv_cache_usage_ratio": ("kv_cache_usage", "max"),
    "llmchat_local:requests_waiting": ("requests_waiting", "sum"),
    "llmchat_local:requests_running": ("requests_running", "sum"),
}

_NAMES = tuple(METRICS)
_TIMEOUT_S = 2.0


def parse_server_metrics(text: str) -> dict[str, float]:
    """The normalised gauges found in Prometheus text exposition ``text``; {} when none is there.

    Comment lines, other metrics, malformed lines and non-finite values are skipped; never raises.
    """
    found: dict[str, float] = {}
    for line in text.splitlines():
        # vLLM's exposition is ~1,000 lines of histograms around a few gauges: a prefix test in C skips the
        # rest before any Python work (it took 6.7 ms of the event loop a scrape before; 0.4 ms now).
        if not line.startswith(_NAMES):
            if not line[:1].isspace():
                continue
            line = line.strip()
            if not line.startswith(_NAMES):
                continue
        name, value = _sample(line.rstrip())
        target = METRICS.get(name)
        if target is None or value is None:
            continue
        key, how = target
        if key not in found:
            found[key] = value
        elif how == "sum":
            found[key] += value
        else:
            found[key] = max(found[key], value)
    return found


def _sample(line: str) -> tuple[str, float | None]:
    """(name, value) of one sample line ``name{labels} value [timestamp]``; value None if unreadable."""
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        name = line[:brace]
        rest = _after_labels(line, brace)
        if rest is None:
            return name, None
    elif space != -1:
        name, rest = line[:space], line[space:]
    else:
        return line, None
    fields = rest.split()
    if not fields:
        return name, None
    try:
        value = float(fields[0])
    except ValueError:
        return name, None
    return name, value if math.isfinite(value) else None


def _after_labels(line: str, brace: int) -> str | None:
    """The text after the label set opening at ``brace``, honouring quoted values (which may hold ``}``)."""
    quoted = False
    i = brace + 1
    while i < len(line):
        c = line[i]
        if quoted and c == "\\":
            i += 2
            continue
        if c == '"':
            quoted = not quoted
        elif c == "}" and not quoted:
            return line[i + 1 :]
        i += 1
    return None


async def scrape_server_metrics(
    source: ChatClient | str, *, timeout_s: float = _TIMEOUT_S
) -> dict[str, float]:
    """GET a server's ``/metrics`` and return ``parse_server_metrics`` of it (a snapshot for ``attribute``).

    ``source`` is a metrics URL, or a ChatClient whose provider names one (``providers.NAME.metrics_url``).
    The client's pool (and its API key) is used only when the URL is on the API's own origin; any other origin
    gets a connection of its own and no key. Raises ``UsageError`` when the client's provider names no
    metrics URL, ``TimeoutError`` after ``timeout_s``, ``HTTPStatusError`` for an error status, and the usual
    ``APIError`` family for connection failures.
    """
    transport: HTTPTransport
    if isinstance(source, str):
        url, transport, own = source, metrics_transport(source), True
    else:
        url = _metrics_url(source)
        if _origin(url) == _origin(source.endpoint.base_url):
            transport, own = source.transport, False
        else:
            transport, own = metrics_transport(url, source.endpoint.http), True
    try:
        return await fetch_server_metrics(transport, url, timeout_s=timeout_s)
    finally:
        if own:
            await transport.aclose()


async def fetch_server_metrics(
    transport: HTTPTransport, url: str, *, timeout_s: float = _TIMEOUT_S
) -> dict[str, float]:
    """GET ``url`` on ``transport`` and parse it: ``scrape_server_metrics`` on a connection the caller keeps
    (a poller scrapes every few seconds on one). Raises as ``scrape_server_metrics`` does."""
    try:
        async with asyncio.timeout(timeout_s):
            async with transport.request("GET", url, phases=Phases()) as resp:
                data = await resp.aread()
    except TimeoutError:
        raise errors.TimeoutError(
            f"{url} sent no metrics within {timeout_s:g} s; check the metrics URL and that the server is up",
            phase="read",
        ) from None
    if resp.status >= 400:
        raise errors.HTTPStatusError(
            f"{url} answered HTTP {resp.status} for the metrics; check metrics_url (vLLM serves /metrics, "
            "llama.cpp only when started with --metrics)",
            status=resp.status,
        )
    return parse_server_metrics(data.decode("utf-8", "replace"))


def metrics_url_of(client: ChatClient) -> str:
    """``providers.NAME.metrics_url`` of the client's provider; "" when it names none."""
    provider = client.settings.providers.get(client.endpoint.name)
    return provider.metrics_url if provider is not None else ""


def _metrics_url(client: ChatClient) -> str:
    url = metrics_url_of(client)
    if not url:
        name = client.endpoint.name
        raise errors.UsageError(
            f"provider {name!r} names no metrics URL; set providers.{name}.metrics_url "
            "(for example http://127.0.0.1:8000/metrics)"
        )
    return url


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, parts.hostname or "", port


def metrics_transport(url: str, http: HttpSettings | None = None) -> Transport:
    """A connection pool of its own for ``url``'s origin, with no API key; ``http`` (the provider's) says how
    to verify an https:// URL. Raises UsageError for a URL that is not http:// or https://."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise errors.UsageError(f"metrics URL {url!r} is not an http:// or https:// URL; fix metrics_url")
    root = f"{parts.scheme}://{parts.netloc}"
    base = http or HttpSettings()
    # HTTP/1.1: vLLM and llama.cpp speak no h2c, and one small GET gains nothing from h2. Plain http needs no
    # TLS context: building one (certifi's CAs) cost ~2 ms of the event loop beside the first request.
    verify = base.verify if parts.scheme == "https" else False
    # The provider's proxy too: a metrics URL behind the same corporate proxy is reached the same way.
    settings = HttpSettings(http2=False, warmup=False, verify=verify, trust_env=base.trust_env,
                            proxy=base.proxy, connect_timeout_s=base.connect_timeout_s)
    return Transport(Endpoint(name="metrics", base_url=root, http=settings))
