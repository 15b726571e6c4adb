"""Which proxy, if any, the transport sends a provider's requests through (``resolve_proxy``).

One answer for everyone who asks: ``Transport`` connects by it, the timing record names it and ``llmchat
doctor`` reports it, so the three never disagree. Sources, first that applies wins:

1. ``NO_PROXY`` (with ``http.trust_env``) naming the target: no proxy, whatever is set below.
2. ``http.proxy``: a URL, for every request of the provider (it replaces the environment's proxy variables).
3. With ``http.trust_env``: ``HTTPS_PROXY`` for https:// targets, ``HTTP_PROXY`` for http:// ones, else
   ``ALL_PROXY``, lower-case forms included, read by the standard library (``urllib.request.getproxies``:
   a lower-case variable beats its upper-case twin), as httpx reads them when left to itself.

``NO_PROXY`` is read as httpx reads it (``httpx._utils.get_environment_proxies``, a parity test pins that):
comma-separated; ``*`` anywhere turns every proxy off; an IPv4 or IPv6 address, or ``localhost``, names that
host exactly; ``.example.com`` names its subdomains, ``example.com`` the domain and its subdomains; a
``:port`` suffix limits an entry to that port, and an entry with a scheme (``https://host``) to that scheme.
One difference, on purpose: a port is compared with the target's effective port, so ``example.com:443``
does match ``https://example.com`` (httpx compares it with the URL's written port and never matches).

This module imports no HTTP library: the config layer's URLs and the standard library are enough.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.request
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from llmchat.core.config import HttpSettings, mask_url
from llmchat.core.errors import ConfigError

_SCHEMES = ("http", "https")
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True, kw_only=True)
class ProxyRoute:
    """How requests to one target travel. ``url`` is None for a direct connection.

    ``source`` says where the proxy came from (``"http.proxy"``, ``"HTTPS_PROXY"``, ``"ALL_PROXY"`` ...;
    empty when direct); ``bypassed_by`` is the ``NO_PROXY`` entry that sent a target past a proxy that was
    set (empty otherwise). ``url`` keeps any credentials (the transport needs them): show ``shown``, never
    ``url`` itself, and repr masks it.
    """

    url: str | None = field(default=None, repr=False)
    source: str = ""
    bypassed_by: str = ""

    def __repr__(self) -> str:
        return f"ProxyRoute(url={self.shown!r}, source={self.source!r}, bypassed_by={self.bypassed_by!r})"

    @property
    def shown(self) -> str | None:
        """The proxy's URL fit to show (a password in it masked, ``http://user:***@host:3128``), or None."""
        return None if self.url is None else mask_url(self.url)

    @property
    def scheme(self) -> str:
        return "" if self.url is None else urlsplit(self.url).scheme

    @property
    def host(self) -> str:
        return "" if self.url is None else (urlsplit(self.url).hostname or "")

    @property
    def port(self) -> int:
        if self.url is None:
            return 0
        parts = urlsplit(self.url)
        return parts.port or _DEFAULT_PORTS.get(parts.scheme, 80)

    @property
    def credentials(self) -> tuple[str, str] | None:
        """The user name and password from the URL (percent-decoded), for Proxy-Authorization; else None."""
        if self.url is None:
            return None
        parts = urlsplit(self.url)
        if parts.username is None and parts.password is None:
            return None
        return unquote(parts.username or ""), unquote(parts.password or "")

    def describe(self) -> str:
        """One line for people: ``"http://127.0.0.1:3128 (HTTPS_PROXY)"``, ``"none (NO_PROXY has
        127.0.0.1)"`` or ``"none"``."""
        if self.url is not None:
            return f"{self.shown} ({self.source})"
        return f"none (NO_PROXY has {self.bypassed_by})" if self.bypassed_by else "none"


def _as_url(value: str) -> str:
    # As httpx reads a variable: "proxy:3128" is "http://proxy:3128".
    value = value.strip()
    return value if "://" in value else f"http://{value}"


def _check(url: str, source: str) -> str:
    """``url`` if it is a proxy the transport can use; else a ConfigError that names ``source``."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in ("socks5", "socks5h", "socks4", "socks"):
        fix = ("set http.proxy to an http:// proxy" if source == "http.proxy" else
               f"set {source} or http.proxy to an http:// proxy, add the provider's host to NO_PROXY, or set "
               "http.trust_env to false")
        raise ConfigError(f"{source} names a SOCKS proxy ({mask_url(url)}), which llmchat does not speak; {fix}")
    try:
        _ = parts.port  # raises ValueError for a port that is not a number, or out of range
        host = parts.hostname
    except ValueError:
        host = None
    if scheme not in _SCHEMES or not host or parts.path not in ("", "/"):
        raise ConfigError(
            f"{source} is not a proxy URL ({mask_url(url)}); write it as http://host:port "
            "(http://user:password@host:port with credentials)"
        )
    return url


def _host_port(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    try:
        port = parts.port or _DEFAULT_PORTS.get(scheme, 80)
    except ValueError:
        port = _DEFAULT_PORTS.get(scheme, 80)
    return scheme, host, port


def _is_ip(text: str, version: type[ipaddress.IPv4Address] | type[ipaddress.IPv6Address]) -> bool:
    try:
        version(text.split("/")[0])
    except ValueError:
        return False
    return True


def _bypasses(entry: str, scheme: str, host: str, port: int) -> bool:
    """Whether one NO_PROXY entry names the target, by httpx's reading of it (see the module docstring)."""
    if "://" in entry:
        pattern = entry
    elif _is_ip(entry, ipaddress.IPv4Address) or entry.lower() == "localhost":
        pattern = f"all://{entry}"
    elif _is_ip(entry, ipaddress.IPv6Address):
        pattern = f"all://[{entry}]"
    else:
        pattern = f"all://*{entry}"
    parts = urlsplit(pattern)
    want_scheme = "" if parts.scheme.lower() == "all" else parts.scheme.lower()
    if want_scheme and want_scheme != scheme:
        return False
    try:
        want_port = parts.port
    except ValueError:
        return False
    if want_port is not None and want_port != port:
        return False
    # The host part as written (urlsplit would drop the "*"): between the scheme and a port, path or end.
    netloc = parts.netloc.rpartition("@")[2]
    if netloc.startswith("["):
        want_host = netloc[1:netloc.find("]")] if "]" in netloc else netloc[1:]
    else:
        want_host = netloc.rsplit(":", 1)[0] if want_port is not None else netloc
    want_host = want_host.lower()
    if not want_host or want_host == "*":
        return True
    if want_host.startswith("*."):
        return re.fullmatch(rf".+\.{re.escape(want_host[2:])}", host) is not None
    if want_host.startswith("*"):
        return re.fullmatch(rf"(.+\.)?{re.escape(want_host[1:])}", host) is not None
    return host == want_host


def _no_proxy_entry(no_proxy: str, scheme: str, host: str, port: int) -> str:
    """The first NO_PROXY entry that names the target ("*" for a bare star), or ""."""
    for raw in no_proxy.split(","):
        entry = raw.strip()
        if entry == "*":
            return "*"
        if entry and _bypasses(entry, scheme, host, port):
            return entry
    return ""


def _env_proxies() -> dict[str, str]:
    # The standard library's reading (also macOS's and Windows's system settings when no variable is set),
    # which is httpx's: lower-case beats upper-case, an empty variable unsets.
    return {k: v for k, v in urllib.request.getproxies().items() if v}


def resolve_proxy(http: HttpSettings, target_url: str) -> ProxyRoute:
    """The route to ``target_url`` (a provider's base_url) under ``http``: the proxy the transport connects
    through, and where it came from (see the module docstring for the order).

    Raises ConfigError, one line naming the setting or variable, for a proxy llmchat cannot use: a SOCKS one,
    or something that is not an http:// or https:// URL. Reads the environment when ``http.trust_env``.
    """
    scheme, host, port = _host_port(target_url)
    env = _env_proxies() if http.trust_env else {}
    if http.proxy:
        url, source = http.proxy, "http.proxy"
    elif scheme in env:
        url, source = _as_url(env[scheme]), f"{scheme.upper()}_PROXY"
    elif "all" in env:
        url, source = _as_url(env["all"]), "ALL_PROXY"
    else:
        return ProxyRoute()
    bypass = _no_proxy_entry(env.get("no", ""), scheme, host, port)
    if bypass:
        return ProxyRoute(bypassed_by=bypass)
    return ProxyRoute(url=_check(url, source), source=source)
