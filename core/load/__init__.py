"""Load through the engine: bench scenarios and their statistics, bulk jobs (direct, or through a provider's
Batch API) and their cost model, the Locust user."""

from __future__ import annotations

from llmchat.core.load._batch_api import (
    BatchAPI,
    BatchOutcome,
    BatchStatus,
    batch_input,
    pending_batch,
    run_batch_api,
    state_path,
)
from llmchat.core.load._dataset import Conversation, Dataset, load_dataset
from llmchat.core.load._estimate import (
    ASSUMED_OUTPUT,
    DEFAULT_WINDOW_S,
    Actuals,
    Duration,
    Estimate,
    PathEstimate,
    SampleStats,
    estimate,
    measure_sample,
)
from llmchat.core.load._jobs import (
    Job,
    JobSummary,
    OutputLock,
    check_output,
    drop_failed,
    open_output,
    read_done,
    read_jobs,
    run_jobs,
    split_lines,
)
from llmchat.core.load._prompts import PromptPlan
from llmchat.core.load._run import CONFIGS, MAX_IN_FLIGHT, LoadRun, Sample, Scenario, Target, parse_configs
from llmchat.core.load._schedule import GROWTH_MS, ScheduleFigures
from llmchat.core.load._stats import (
    CLIENT_ERRORS,
    EXACT_LIMIT,
    METRIC_NAMES,
    METRICS,
    QUANTILES,
    RELATIVE_ERROR,
    SLO,
    ConfigStats,
    compare_rows,
)
from llmchat.core.load._sweep import MAX_LEVELS, SLO_SHARE, Level, Sweep, SweepResult, run_sweep
from llmchat.core.load._tokens import RequestTokens, TokenFigures

__all__ = [
    "BatchAPI",
    "BatchOutcome",
    "BatchStatus",
    "ASSUMED_OUTPUT",
    "Actuals",
    "CLIENT_ERRORS",
    "CONFIGS",
    "ConfigStats",
    "Conversation",
    "Dataset",
    "DEFAULT_WINDOW_S",
    "Duration",
    "EXACT_LIMIT",
    "Estimate",
    "GROWTH_MS",
    "Job",
    "JobSummary",
    "Level",
    "LoadRun",
    "METRICS",
    "MAX_IN_FLIGHT",
    "MAX_LEVELS",
    "METRIC_NAMES",
    "OutputLock",
    "PathEstimate",
    "PromptPlan",
    "QUANTILES",
    "RELATIVE_ERROR",
    "SLO",
    "SLO_SHARE",
    "Sample",
    "SampleStats",
    "ScheduleFigures",
    "Scenario",
    "Sweep",
    "SweepResult",
    "Target",
    "TokenFigures",
    "RequestTokens",
    "check_output",
    "batch_input",
    "compare_rows",
    "drop_failed",
    "estimate",
    "load_dataset",
    "open_output",
    "measure_sample",
    "parse_configs",
    "pending_batch",
    "read_done",
    "read_jobs",
    "run_batch_api",
    "run_jobs",
    "run_sweep",
    "split_lines",
    "state_path",
]
