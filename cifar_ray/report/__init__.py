"""Turn a run's logs into a report: Markdown with PNG plots, or CSV / JSON tables.

    write_report(run_dir)                 -> reports/<sweep name>/README.md (+ *.png beside it)
    write_report(run_dir, fmt="csv")      -> reports/<sweep name>/trials.csv (+ factor_<key>.csv, effect_<key>.csv, ...)
    write_report(run_dir, fmt="json")     -> reports/<sweep name>/report.json
    write_report([run_a, run_b])          -> reports/<a>-vs-<b>/README.md: the runs compared, one more factor `run`

One concern per module: data (the logs as frames, statistics), text (formatting, findings, Markdown),
plots (what each plot shows, and drawing it), export (the files).
Imports only core (and numpy, pandas; matplotlib only inside the drawing functions).
"""

from .data import (
    FACTOR_METRICS,
    MEMORY_MEASURES,
    OBJECTIVES,
    OVERFIT_RULE,
    RUN_FACTOR,
    RUN_MATCH_RULE,
    Metric,
    Overfit,
    Report,
    build_report,
    find_overfitting,
    paired_effects,
    seed_noise,
    t_quantile,
    trial_overfitting,
)
from .export import FORMATS, write_report
from .plots import accuracy_series, dodge, factor_axis, factor_positions
from .text import findings, markdown_table

__all__ = [
    "FACTOR_METRICS",
    "FORMATS",
    "MEMORY_MEASURES",
    "OBJECTIVES",
    "OVERFIT_RULE",
    "RUN_FACTOR",
    "RUN_MATCH_RULE",
    "Metric",
    "Overfit",
    "Report",
    "accuracy_series",
    "build_report",
    "dodge",
    "factor_axis",
    "factor_positions",
    "find_overfitting",
    "findings",
    "markdown_table",
    "paired_effects",
    "seed_noise",
    "t_quantile",
    "trial_overfitting",
    "write_report",
]
