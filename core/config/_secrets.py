"""Which settings hold secrets, and how a secret is shown when it must be shown at all.

One place decides this so that `config show`, error messages and ``ResolvedProvider``'s repr agree: a key
that one of them masks, all of them mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

# Header names are matched by substring so that "Authorization", "X-Api-Key", "api-key" and
# "X-Auth-Token" are all caught without a list of every vendor's spelling.
_SECRET_HEADER_PARTS = ("auth", "key", "token", "secret", "cookie")
_SECRET_FIELDS = frozenset({"api_key"})
# Below this length the last four characters are too large a share of the secret to show.
_MIN_LEN_FOR_TAIL = 16


def mask_secret(value: str) -> str:
    """Return ``value`` with everything but a recognisable hint hidden.

    Keys of 16 characters or more keep their last four characters (and an ``sk-`` prefix, which every OpenAI
    key shares and so gives nothing away): ``sk-...abcd``. Shorter values are replaced by ``***`` outright;
    the empty string stays empty, since "no secret" is not a secret. Never fails.
    """
    if not value:
        return ""
    if len(value) < _MIN_LEN_FOR_TAIL:
        return "***"
    prefix = "sk-" if value.startswith("sk-") else ""
    return f"{prefix}...{value[-4:]}"


def mask_url(url: str) -> str:
    """``url`` fit to show: a password in it (``https://user:SECRET@host/v1``) becomes ``***``, and so does the
    value of any query parameter whose name looks like a credential (``?key=...``, ``&token=...``). Anything
    that is not a URL comes back as it is. Never fails."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password is not None:
            userinfo, _, hostport = netloc.rpartition("@")
            user = userinfo.split(":", 1)[0]
            netloc = f"{user}:***@{hostport}"
        query = parts.query
        if query:
            pairs = parse_qsl(query, keep_blank_values=True)
            if any(is_secret_header(name) for name, _ in pairs):
                query = urlencode([(n, "***" if is_secret_header(n) else v) for n, v in pairs], safe="*")
        if netloc == parts.netloc and query == parts.query:
            return url
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        return url


def is_secret_header(name: str) -> bool:
    """True when a header of this name may carry a credential (its name contains auth, key, token ...)."""
    lowered = name.lower()
    return any(part in lowered for part in _SECRET_HEADER_PARTS)


def is_url_path(parts: Sequence[str]) -> bool:
    """True when the setting at this key path is a URL that may carry credentials, shown through ``mask_url``:
    any ``*_url`` (``base_url``, ``metrics_url``) and ``http.proxy`` (a provider's ``http`` override too)."""
    return bool(parts) and (parts[-1].endswith("_url") or parts[-1] == "proxy")


def is_secret_path(parts: Sequence[str]) -> bool:
    """True when the setting at this key path holds a secret.

    That is any ``api_key`` (``("server", "api_key")``, ``("providers", NAME, "api_key")``) and any header
    whose name looks like a credential (``("providers", NAME, "headers", "Authorization")``).
    """
    if not parts:
        return False
    if parts[-1] in _SECRET_FIELDS:
        return True
    return len(parts) >= 2 and parts[-2] == "headers" and is_secret_header(parts[-1])
