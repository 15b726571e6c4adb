"""Load through the engine: bench scenarios and their statistics, bulk jobs and their cost model, the Locust
user."""

from __future__ import annotations

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
from llmchat.core.load._run import CONFIGS, LoadRun, Sample, Scenario, Target, parse_configs
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

__all__ = [
    "ASSUMED_OUTPUT",
    "Actuals",
    "CLIENT_ERRORS",
    "CONFIGS",
    "ConfigStats",
    "DEFAULT_WINDOW_S",
    "Duration",
    "EXACT_LIMIT",
    "Estimate",
    "Job",
    "JobSummary",
    "LoadRun",
    "METRICS",
    "METRIC_NAMES",
    "OutputLock",
    "PathEstimate",
    "PromptPlan",
    "QUANTILES",
    "RELATIVE_ERROR",
    "SLO",
    "Sample",
    "SampleStats",
    "Scenario",
    "Target",
    "check_output",
    "compare_rows",
    "drop_failed",
    "estimate",
    "open_output",
    "measure_sample",
    "parse_configs",
    "read_done",
    "read_jobs",
    "run_jobs",
    "split_lines",
]
