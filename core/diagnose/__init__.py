"""`llmchat doctor`'s engine: a bounded battery of requests that measures the whole chain (the path, the
connection's life, streaming, the server's side, limits) and prescribes config changes for what it finds.

``estimate(ctx)`` says what a battery will send; ``run_battery(ctx)`` runs it and returns a ``Report`` of
measurements and ``Finding``s, each with its evidence, its effect in milliseconds and a config change
(``toml_snippet``). The measuring is the engine's own: ChatClient's timing records, attribution, the server
signals; this package only decides what to send and what the numbers mean.
"""

from __future__ import annotations

from llmchat.core.diagnose._battery import DEFAULT_BUDGET_REQUESTS, DEFAULT_BUDGET_S, estimate, run_battery
from llmchat.core.diagnose._budget import Context
from llmchat.core.diagnose._findings import SECTION_TITLES, SECTIONS, Changes, Estimate, Finding, Mark, Report
from llmchat.core.diagnose._prescribe import toml_snippet

__all__ = [
    "Changes",
    "Context",
    "DEFAULT_BUDGET_REQUESTS",
    "DEFAULT_BUDGET_S",
    "Estimate",
    "Finding",
    "Mark",
    "Report",
    "SECTIONS",
    "SECTION_TITLES",
    "estimate",
    "run_battery",
    "toml_snippet",
]
