"""Turn a run's logs into a report: Markdown with PNG plots, or CSV / JSON tables.

    write_report(run_dir)                 -> RUN_DIR/report/README.md (+ *.png; a run at a URI: reports/<name>)
    write_report(run_dir, fmt="csv")      -> RUN_DIR/report/trials.csv (+ factor_<key>.csv, effect_<key>.csv, ...)
    write_report(run_dir, fmt="json")     -> RUN_DIR/report/report.json
    write_report(run_dir, fmt="html")     -> RUN_DIR/report/report.html: the README's blocks in one page
    write_report([run_a, run_b])          -> reports/<a>-vs-<b>/README.md: the runs compared, one more factor `run`

One concern per module. The numbers: load (run folders -> frames), compare (several runs as one), metrics (what
is measured, what "best" means), stats (means, paired effects, seed noise, overfitting), testset (the shared test
set's part of an accuracy effect's error), verdicts (what may be
concluded: verdicts, Holm, seeds needed, leaders beyond noise), build (all of it, once: `Report`). The text: format
(values and numbers), header, findings, tables, sections (README.md as a Document of blocks, document.py: a LAYOUT of
section functions), html (those blocks as one self-contained page). Then plots (what each plot shows, and drawing
it) and export (the files).
Imports only core (and numpy, pandas; matplotlib only inside the drawing functions).
"""

from ..core.report_options import FORMATS
from ..core.text import markdown_table
from .build import Report, build_report
from .compare import RUN_FACTOR, RUN_MATCH_RULE
from .export import write_report
from .findings import findings
from .load import MEMORY_MEASURES
from .metrics import FACTOR_METRICS, OBJECTIVES, Metric
from .plots import accuracy_series, dodge, factor_axis, factor_positions
from .stats import OVERFIT_RULE, Overfit, find_overfitting, paired_effects, seed_noise, t_quantile, trial_overfitting

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
