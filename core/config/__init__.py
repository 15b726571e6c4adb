"""Settings: the typed model, loading it from TOML, the environment and flags, validation messages, and how
secrets are shown.
"""

from __future__ import annotations

from llmchat.core.config._load import (
    ResolvedProvider,
    config_path_in_use,
    default_config_path,
    load_settings,
    resolve_provider,
)
from llmchat.core.config._secrets import is_secret_header, mask_secret, mask_url
from llmchat.core.config._settings import (
    BatchSettings,
    CacheSettings,
    Http2Mode,
    HttpSettings,
    LogSettings,
    ProviderSettings,
    RetrySettings,
    ServerSettings,
    Settings,
    UISettings,
)
from llmchat.core.config._toml import set_toml_keys, settings_to_toml

__all__ = [
    "BatchSettings",
    "CacheSettings",
    "Http2Mode",
    "HttpSettings",
    "LogSettings",
    "ProviderSettings",
    "ResolvedProvider",
    "RetrySettings",
    "ServerSettings",
    "Settings",
    "UISettings",
    "config_path_in_use",
    "default_config_path",
    "is_secret_header",
    "load_settings",
    "mask_secret",
    "mask_url",
    "resolve_provider",
    "set_toml_keys",
    "settings_to_toml",
]
