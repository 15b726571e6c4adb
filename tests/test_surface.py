"""The engine's public surface is the only seam between it and its faces, and this file pins both.

- Each ``__all__`` (``llmchat.core`` and every ``llmchat.core.<pkg>``) is compared with the list written here,
  so adding or removing a public name is a change someone makes on purpose, in this file too.
- The import contract, read from the source (an AST walk, so a lazy import inside a function counts): the faces
  (tui/, benchmarks/) import only public names (never ``llmchat.core._x`` or ``llmchat.core.<pkg>._x``, nor
  a ``_name`` from a core package); core/ never imports the face (``llmchat.tui``) or Textual; tui/ never
  imports the HTTP stack (httpx, httpcore, or their httpx2 / httpcore2 forks).

scripts/check runs this file as its import-contract step; the suite runs it too.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import types
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

import llmchat.core

ROOT = Path(__file__).resolve().parent.parent

SURFACE: dict[str, list[str]] = {
    "llmchat.core": [
        "APIError", "Attribution", "AuthError", "Baseline", "BaselineStore", "BatchSettings", "Bus",
        "CacheSettings", "CancelledByUser", "ChatClient", "ChatReply", "ChatStream", "Chunk",
        "ColdStartDetector",
        "ConfigError", "ConnectError", "DisconnectedError", "FirstToken", "HTTPStatusError", "Http2Mode",
        "HttpSettings", "LLMChatError", "LogSettings", "MicroBatcher", "NotFoundError", "Part", "Phases",
        "ProtocolError", "ProviderSettings", "RateLimitError", "ReplyCache", "RequestDone", "RequestStarted",
        "ResolvedProvider", "RetryEvent", "RetryPlanned", "RetrySettings", "SSEDecoder", "ServerError",
        "ServerMetricsPoller", "ServerMetricsSampled", "ServerSentEvent", "ServerSettings", "ServerSignals",
        "Settings", "StreamCutError", "TLSError", "TimeoutError", "TimingRecord", "UISettings", "UsageError",
        "Warmer", "WarmupState", "__version__", "attribute", "default_config_path", "format_shares",
        "load_settings", "mask_secret", "mask_url", "parse_server_metrics", "part_samples", "percentile",
        "record_notes", "resolve_provider", "scrape_server_metrics", "shares_over",
        "Pools",
        "RateLimitHeld",
    ],
    "llmchat.core.client": [
        "ChatClient", "ChatReply", "ChatStream", "ServerMetricsPoller", "ServerSignals", "Warmer",
        "parse_server_metrics", "scrape_server_metrics", "summarize_snapshots",
        "endpoint_from_settings",
        "ContextBudget", "ContextFit", "ContextOverflowError", "estimate_tokens",
        "MESSAGE_TOKENS", "REPLY_TOKENS",
    ],
    "llmchat.core.config": [
        "BatchSettings", "CacheSettings", "Http2Mode", "HttpSettings", "LogSettings", "ProviderSettings",
        "ResolvedProvider", "RetrySettings", "ServerSettings", "Settings", "UISettings", "config_path_in_use",
        "default_config_path", "is_secret_header", "load_settings", "mask_secret", "mask_url",
        "resolve_provider",
        "settings_to_toml",
        "set_toml_keys",
    ],
    "llmchat.core.diagnose": [
        "Changes", "Context", "DEFAULT_BUDGET_REQUESTS", "DEFAULT_BUDGET_S", "Estimate", "Finding",
        "Mark", "Report", "SECTIONS", "SECTION_TITLES", "estimate", "run_battery", "toml_snippet",
    ],
    "llmchat.core.history": [
        "Conversation", "ConversationInfo", "ConversationNotFoundError", "ExportError", "Generation",
        "HistoryError", "HistoryStore", "Origin", "ReplyWriter", "export_folder", "export_markdown",
        "export_records_json", "save_export", "write_private",
        "SearchHit",
        "pretty_arguments",
    ],
    "llmchat.core.http": [
        "Endpoint", "SSEDecoder", "ServerSentEvent", "Transport", "WireResponse", "parse_chunk",
        "parse_reply",
        "HTTPResponse", "HTTPTransport", "MockRequest", "MockResponse", "MockTransport", "Pools",
        "ToolCall",
        "parse_reset", "read_headroom",
        "ProxyRoute", "resolve_proxy",
        "Attachment", "AttachmentError", "message_content", "message_text", "read_attachment",
        "split_file_lines",
    ],
    "llmchat.core.load": [
        "CLIENT_ERRORS", "CONFIGS", "ConfigStats", "EXACT_LIMIT", "Job", "JobSummary", "LoadRun", "METRICS",
        "METRIC_NAMES", "OutputLock", "PromptPlan", "QUANTILES", "RELATIVE_ERROR", "SLO", "Sample",
        "Scenario",
        "Target", "check_output", "compare_rows", "drop_failed", "open_output", "parse_configs", "read_done",
        "read_jobs", "run_jobs", "split_lines",
        "BatchAPI", "BatchOutcome", "BatchStatus", "batch_input", "pending_batch", "run_batch_api",
        "state_path",
        "ASSUMED_OUTPUT", "Actuals", "DEFAULT_WINDOW_S", "Duration", "Estimate", "PathEstimate",
        "SampleStats", "estimate", "measure_sample",
        "GROWTH_MS", "Level", "MAX_IN_FLIGHT", "MAX_LEVELS", "SLO_SHARE", "ScheduleFigures", "Sweep",
        "SweepResult", "run_sweep",
        "Conversation", "Dataset", "RequestTokens", "TokenFigures", "load_dataset",
        "RATE_PER_WORKER", "WorkerError", "WorkerRun", "available_cores", "choose_workers", "default_workers",
        "make_run", "workers_runner",
        "RECORD_FIELDS", "Timeline", "record_row",
    ],
    "llmchat.core.observe": [
        "Attribution", "Baseline", "BaselineStore", "Bus", "Chunk", "ColdStartDetector", "ConnectionState",
        "FirstToken", "GROUPS", "LATENCY_BUCKETS", "Metrics", "PARTS", "Part", "Phases", "REQUEST_SERIES",
        "RequestDone", "RequestLog", "RequestStarted", "RetryPlanned", "Series", "ServerMetricsSampled",
        "ServerState", "Spread", "TimingRecord", "WarmupState", "attach_observers", "attribute", "failed",
        "format_shares", "load_prometheus_client", "part_samples", "percentile", "prices_from_settings",
        "record_notes", "shares_over", "start_exporter",
        "Headroom", "Price", "RateLimitHeld", "round_ms",
    ],
    "llmchat.core.policy": [
        "Hold", "MicroBatcher", "ProviderLimiter", "RateLimits", "ReplyCache", "RetryEvent",
        "call_with_retries",
        "replay_chunks", "request_charge",
    ],
    "llmchat.core.server": [
        "PROFILES", "PROFILE_SUMMARIES", "DelayProxy", "Listening", "RunningServer", "ServerMetrics",
        "SubprocessServer", "Target", "cli", "resolve_settings", "run_proxy", "serve", "start_in_thread",
        "start_subprocess", "validate_settings",
    ],
}
"""What each package exports. Adding a public name: export it from the package's __init__, its __all__, here."""

FORBIDDEN_IN_TUI = {"httpx", "httpcore", "httpx2", "httpcore2"}
"""The HTTP stack stays behind the engine's transport: the face never sees it."""


def _subpackages() -> list[str]:
    return sorted(f"llmchat.core.{m.name}" for m in pkgutil.iter_modules(llmchat.core.__path__) if m.ispkg)


# -- the surface ------------------------------------------------------------------------------------------


def test_every_core_subpackage_has_its_surface_written_here() -> None:
    assert sorted(SURFACE) == sorted(["llmchat.core", *_subpackages()]), (
        "a core subpackage was added or removed: write its __all__ in SURFACE"
    )


@pytest.mark.parametrize("package", sorted(SURFACE))
def test_all_is_exactly_the_intended_surface(package: str) -> None:
    module = importlib.import_module(package)
    exported = list(getattr(module, "__all__", []))
    assert len(exported) == len(set(exported)), f"{package}.__all__ names something twice"
    added, removed = sorted(set(exported) - set(SURFACE[package])), sorted(set(SURFACE[package]) - set(exported))
    assert (added, removed) == ([], []), (
        f"{package}.__all__ changed: added {added}, removed {removed}; if on purpose, change SURFACE here too"
    )
    missing = [name for name in exported if not hasattr(module, name)]
    assert missing == [], f"{package}.__all__ names what the package does not define: {missing}"


@pytest.mark.parametrize("package", sorted(SURFACE))
def test_nothing_public_is_defined_outside_all(package: str) -> None:
    # A public-looking name outside __all__ is one the faces could come to depend on unpinned. Not counted:
    # submodules (the package's own files), and what the __init__ imports for itself from outside llmchat
    # (``annotations``, ``TYPE_CHECKING``, ``Any``...).
    module = importlib.import_module(package)

    def own(name: str) -> bool:
        value = getattr(module, name)
        if isinstance(value, types.ModuleType) or name in ("annotations", "TYPE_CHECKING"):
            return False
        return str(getattr(value, "__module__", "llmchat")).startswith("llmchat")

    loose = sorted(n for n in vars(module) if not n.startswith("_") and n not in module.__all__ and own(n))
    assert loose == [], f"{package} defines public names outside __all__: {loose}; export them or make them private"


# -- the import contract ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Import:
    path: str
    line: int
    module: str
    """The module imported from, absolute (``from . import x`` resolved against the file's package)."""
    names: tuple[str, ...]
    """The names taken from it (``from m import a, b``); empty for ``import m``."""

    def __str__(self) -> str:
        what = f"from {self.module} import {', '.join(self.names)}" if self.names else f"import {self.module}"
        return f"{self.path}:{self.line}: {what}"


def _package_of(path: Path) -> str:
    """The dotted package a source file is in, as installed (core/ is llmchat.core, tui/ llmchat.tui)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    top = {"core": "llmchat.core", "tui": "llmchat.tui"}.get(parts[0], parts[0])
    return ".".join([top, *parts[1:-1]])


def imports_of(source: str, path: str) -> list[Import]:
    """Every import statement in one file's ``source`` (top level or inside functions); ``path`` is relative
    to the repository."""
    package = _package_of(ROOT / path).split(".")
    found: list[Import] = []
    for node in ast.walk(ast.parse(source, filename=path)):
        if isinstance(node, ast.Import):
            found.extend(Import(path, node.lineno, alias.name, ()) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, module] if module else base)
            found.append(Import(path, node.lineno, module, tuple(a.name for a in node.names)))
    return found


def imports_in(folder: str) -> list[Import]:
    """Every import statement under ``folder``."""
    return [imp for path in sorted((ROOT / folder).rglob("*.py"))
            for imp in imports_of(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]


def _is_private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def private_core_imports(imports: Iterable[Import]) -> list[str]:
    """The imports that reach past the public surface: a private core module, or a private name (or private
    submodule) taken from a core package."""
    found = []
    for imp in imports:
        parts = imp.module.split(".")
        if parts[:2] != ["llmchat", "core"]:
            continue
        if any(_is_private(p) for p in parts[2:]) or any(_is_private(n) for n in imp.names):
            found.append(str(imp))
    return found


def layer_violations(imports: Iterable[Import], forbidden: set[str]) -> list[str]:
    """The imports of a module under any of the ``forbidden`` top-level names or dotted prefixes."""
    return [
        str(imp) for imp in imports
        if any(imp.module == f or imp.module.startswith(f + ".") for f in forbidden)
    ]


@pytest.mark.parametrize("face", ["tui", "benchmarks"])
def test_the_faces_import_only_the_public_surface(face: str) -> None:
    found = private_core_imports(imports_in(face))
    assert found == [], (
        f"{face}/ imports past the public surface (export the name from its subpackage's __init__ and __all__, "
        "then import it from there):\n" + "\n".join(found)
    )


def test_the_engine_never_imports_the_face_or_textual() -> None:
    found = layer_violations(imports_in("core"), {"llmchat.tui", "textual"})
    assert found == [], "core/ is the engine and never imports the face:\n" + "\n".join(found)


def test_the_face_never_imports_the_http_stack() -> None:
    found = layer_violations(imports_in("tui"), FORBIDDEN_IN_TUI)
    assert found == [], "tui/ talks to the network only through the engine:\n" + "\n".join(found)


def test_the_contract_checks_see_what_they_forbid() -> None:
    # The checks themselves, on imports written the ways the rules forbid (and the ways they allow), so a
    # walker that stopped seeing an import would fail here rather than pass everything.
    private = imports_of(
        "from llmchat.core.http._sse import SSEDecoder\nimport llmchat.core._x\n"
        "from llmchat.core.history import _file\ndef f():\n    from llmchat.core.observe import _name\n",
        "tui/x.py",
    )
    assert len(private_core_imports(private)) == 4
    public = imports_of(
        "from llmchat.core import __version__, ChatClient\nfrom llmchat.core.http import SSEDecoder\n"
        "from llmchat.core import text as _text\n",
        "tui/x.py",
    )
    assert private_core_imports(public) == []
    engine = imports_of("from textual.app import App\nfrom . import _sse\nimport llmchat.tui.cli\n", "core/http/x.py")
    assert len(layer_violations(engine, {"llmchat.tui", "textual"})) == 2
    face = imports_of("import httpx\nfrom httpcore import Origin\nimport httpx_sse\n", "tui/x.py")
    assert len(layer_violations(face, FORBIDDEN_IN_TUI)) == 2
