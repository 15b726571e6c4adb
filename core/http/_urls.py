"""Request URLs from a ``base_url`` as providers write them.

A base URL may carry a query that every request must keep (Azure OpenAI's ``?api-version=2024-06-01``): the
request's path goes before it, never after it (``/v1/models?api-version=...``, not ``/v1?api-version=.../models``).
A base URL must not carry userinfo (``https://user:pw@host/v1``): the HTTP stack would send it as Basic auth in
place of the API key, and the provider's 401 would then blame a key that is right.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import llmchat.core.errors as errors
from llmchat.core.config._secrets import mask_url


def join_url(base_url: str, path: str) -> str:
    """``path`` (``"models"``, ``"files/x/content?limit=1"``) under ``base_url``'s path, with the base's query
    first and the path's own after it; a fragment is dropped. An absolute ``path`` (``http://...``) is returned
    as it is. Never fails."""
    if "://" in path:
        return path
    base, _, query = base_url.partition("#")[0].partition("?")
    rest, _, own = path.lstrip("/").partition("?")
    url = base.rstrip("/") + "/" + rest if rest else base.rstrip("/")
    both = "&".join(q for q in (query, own) if q)
    return f"{url}?{both}" if both else url


def has_userinfo(base_url: str) -> bool:
    """True when ``base_url`` has a ``user@`` or ``user:password@`` part. Never fails."""
    try:
        return "@" in urlsplit(base_url).netloc
    except ValueError:
        return False


def userinfo_error(base_url: str, where: str) -> errors.UsageError:
    """The one-line error for a base URL with userinfo; ``where`` names the setting or flag. The URL is
    shown masked."""
    return errors.UsageError(
        f"{where} {mask_url(base_url)!r} has a user:password@ in it, which would go out as Basic auth instead "
        "of the API key; take it out of the URL and put the key in api_key or api_key_env"
    )
