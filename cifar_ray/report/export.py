"""The report's files: README.md with its plots, one self-contained report.html, CSV tables or report.json. Only
the logs are read, never the clock or the current checkout: the same logs give byte-identical files. In CSV/JSON,
accuracies stay fractions 0-1 as in metrics.jsonl."""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..core.errors import ConfigError
from ..core.provenance import tracked_refusal
from ..core.report_options import check_report_options
from ..core.runlog import Where
from ..core.storage import local_write_refusal
from .build import Report, build_report
from .document import Document, to_markdown
from .findings import findings
from .header import header_info
from .html import to_html
from .overview import draw_overview
from .plots import plot_curves, plot_factor
from .roofline import PLOT_FILE as ROOFLINE_PLOT
from .roofline import draw_roofline, roofline_data, shows_plot
from .sections import OVERVIEW, document

REPORT_DIR = "report"  # the default output folder, inside a local run folder


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _records(frame: pd.DataFrame) -> list[dict]:
    return [{str(k): _plain(v) for k, v in row.items()} for row in frame.to_dict("records")]


def export_json(report: Report, out_dir: Path) -> Path:
    info = header_info(report)
    noise_std, noise_configs = report.noise
    data = {
        "sweep": {k: _plain(v) if not isinstance(v, dict) else v for k, v in info.items()},
        "trials": _records(report.trials),
        "configurations": _records(report.configs),
        "factors": {
            key: {
                "baseline": report.baseline[key],
                "rows": _records(frame),
                "paired": {column: _records(effect) for column, effect in report.effects[key].items()},
            }
            for key, frame in report.groups.items()
        },
        "effects": [effect.record() for effect in report.records],
        "interactions": {
            "tests": _records(report.interactions.tests),
            "strata": _records(report.interactions.strata),
        },
        "seed_noise": {"final_test_acc_std": _plain(noise_std), "configurations": noise_configs},
        "verdicts": {"margin": report.margin, "comparisons": report.comparisons, "test_images": report.test_images},
        "findings": findings(report),
    }
    path = out_dir / "report.json"
    path.write_text(json.dumps(data, indent=2, allow_nan=False, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def export_csv(report: Report, out_dir: Path) -> Path:
    path = out_dir / "trials.csv"
    report.trials.to_csv(path, index=False)
    report.configs.to_csv(out_dir / "configurations.csv", index=False)
    for key, frame in report.groups.items():
        frame.to_csv(out_dir / f"factor_{key}.csv", index=False)
        effects = pd.concat(
            [effect.assign(metric=column) for column, effect in report.effects[key].items()], ignore_index=True
        )
        effects[["metric", *(c for c in effects.columns if c != "metric")]].to_csv(
            out_dir / f"effect_{key}.csv", index=False
        )
    report.interactions.tests.to_csv(out_dir / "interactions.csv", index=False)
    report.interactions.strata.to_csv(out_dir / "interaction_strata.csv", index=False)
    report.epochs.to_csv(out_dir / "epochs.csv", index=False)
    return path


def report_document(report: Report, out_dir: Path) -> Document:
    """The report's blocks (sections.LAYOUT), its plots drawn into `out_dir`: what README.md and report.html show."""
    import matplotlib.style

    with matplotlib.style.context("default"):
        plots = {"": plot_curves(report, out_dir), OVERVIEW: draw_overview(report, out_dir)}
        for key in report.factors:
            plots[key] = plot_factor(report, key, out_dir)
        roofline = roofline_data(report)
        if shows_plot(roofline, report):
            draw_roofline(roofline, out_dir / ROOFLINE_PLOT)
    return document(report, plots)


def export_markdown(report: Report, out_dir: Path) -> Path:
    path = out_dir / "README.md"
    path.write_text(to_markdown(report_document(report, out_dir)), encoding="utf-8")
    return path


def export_html(report: Report, out_dir: Path) -> Path:
    """report.html, one self-contained page: its plots drawn in a scratch folder and embedded, no file beside it."""
    path = out_dir / "report.html"
    with tempfile.TemporaryDirectory(prefix="cifar-ray-figures-") as figures:
        page = to_html(report_document(report, Path(figures)), Path(figures), report.name)
    path.write_text(page, encoding="utf-8")
    return path


def default_out(report: Report) -> Path:
    """Where a report goes without --out: beside the run it reads (RUN_DIR/report), not over a committed report;
    a run at a URI or several runs compared: reports/<name>."""
    path = report.run.path
    return (
        Path(path.path) / REPORT_DIR if report.comparison is None and path.is_local else Path("reports") / report.name
    )


def export(report: Report, out: Path, fmt: str = "md") -> Path:
    """`report` written into the folder `out` (made if missing) in format `fmt`; returns the main file."""
    out.mkdir(parents=True, exist_ok=True)
    return {"md": export_markdown, "csv": export_csv, "json": export_json, "html": export_html}[fmt](report, out)


def write_report(
    run_dir: Where | Sequence[Where],
    out_dir: str | Path | None = None,
    baseline: dict | None = None,
    fmt: str = "md",
    force: bool = False,
    **judging: Any,
) -> Path:
    """Write the report of the run at `run_dir`, or of several runs compared (a list: the runs become the factor
    `run`); returns the main file (README.md, trials.csv, report.json or report.html).

    `out_dir` defaults to RUN_DIR/report for a run on this machine's disk, else to reports/<sweep name> (for several
    runs reports/<label>-vs-<label>...), refused when git tracks files there unless `force`: the default never
    replaces a committed file. `baseline` ({key: grid value}, {"run": label} among them) picks the reference value
    of a factor for the Δ columns (default: its first grid value, the first run); `judging` goes to build_report:
    `margin_pp` (the equivalence margin of accuracy effects in percentage points), `target` (a test accuracy whose
    time to reach is compared). Raises ConfigError on bad input.
    """
    check_report_options(fmt, judging.get("target"))
    report = build_report(run_dir, baseline, **judging)
    out = Path(out_dir) if out_dir is not None else default_out(report)
    refusal = None if out_dir is not None or force else tracked_refusal(out)
    if refusal:
        raise ConfigError(f"report: {refusal}")
    refusal = local_write_refusal(out)
    if refusal:
        raise ConfigError(f"report --out {out}: cannot write there: {refusal}; allowed: a folder you can write")
    return export(report, out, fmt)
