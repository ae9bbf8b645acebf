"""The report's header: its answer block (the sweep's question and what was measured) and when, where and how the run
ran (header_info, also report.json's "sweep") as a table; for several runs, a row per run and what they share."""

from __future__ import annotations

from datetime import datetime

import pandas as pd

from ..core import provenance, runlog
from ..core.config import KEYS, TrainConfig
from ..core.runlog import RunLog
from ..core.status import SETTLE_KEY, settle_text
from ..core.text import counted
from .build import Report
from .compare import RUN_FACTOR, RUN_MATCH_RULE, RunSource
from .document import Block, Heading, Paragraph, Table
from .format import best_phrase, fmt_date, fmt_duration, fmt_value, same_value
from .load import config_value
from .metrics import INCOMPLETE, PAIRED_METRICS
from .sequential import Comparison, look_text
from .stats import OVERFIT_RULE

DEFAULTS = {key: TrainConfig.model_fields[key].default for key in KEYS}


def _wall_time(sweep: dict) -> tuple[float | None, str]:
    wall = sweep.get("wall_time_s")
    if isinstance(wall, (int, float)):
        return float(wall), fmt_duration(float(wall))
    try:
        start = datetime.fromisoformat(sweep["started_at"])
        end = datetime.fromisoformat(sweep["finished_at"])
        seconds = (end - start).total_seconds()
        return seconds, fmt_duration(seconds)
    except (KeyError, TypeError, ValueError):
        return None, "not finished (no finished_at in sweep.json)" if sweep else "unknown (no sweep.json)"


def hardware(run: RunLog) -> str:
    """GPU model and count from the trials' system info, else the host's CPU model and cores."""
    sweep = run.sweep
    host, cluster = sweep.get("host") or {}, sweep.get("cluster") or {}
    systems = [t.record.system or {} for t in run.trials]
    gpus = sorted({s.get("device_name", "GPU") for s in systems if s.get("device_type") == "cuda"})
    nodes = cluster.get("nodes")
    where = f" on {nodes} node{'s' if nodes != 1 else ''}" if isinstance(nodes, int) else ""
    if gpus:
        count = cluster.get("gpus") or max((s.get("num_gpus") or 0) for s in systems)
        most = max((s.get("num_gpus") or 0) for s in systems)
        return (
            f"{fmt_value(float(count))} × {' / '.join(gpus)}{where} (up to {most} per trial); "
            f"host CPU {host.get('cpu_model', 'unknown')}"
        )
    cores = host.get("cpu_count")
    cpus = cluster.get("cpus")
    ray = f", {fmt_value(float(cpus))} CPUs in the Ray cluster{where}" if isinstance(cpus, (int, float)) else ""
    return f"CPU only: {host.get('cpu_model', 'unknown CPU')}, {counted(cores or '?', 'core')}{ray}"


# The statuses a report counts, in its order: the final ones (runlog.FINAL_STATUSES), then the others, the latest
# stage first (running before pending).
_UNFINISHED = tuple(s for s in reversed(runlog.STATUSES) if s not in runlog.FINAL_STATUSES)


def status_counts(trials: pd.DataFrame) -> dict[str, int]:
    """Trials by outcome: the logged status, or incomplete for a finished one with epochs missing."""
    counts = trials["outcome"].value_counts()
    return {s: int(counts.get(s, 0)) for s in (*runlog.FINAL_STATUSES, INCOMPLETE, *_UNFINISHED)}


def _values_text(values: list) -> str:
    return ", ".join(sorted({fmt_value(v) for v in values}, key=[fmt_value(v) for v in values].index))


def measured_text(report: Report) -> str:
    """`4 trials (4 finished, ...): workers 1, 2 × optimizer a, b × 1 seed, 3 epochs each on synthetic, tested on
    1000 images; measured per trial: ...`."""
    n = len(report.trials)
    configs = [t.config for t in report.run.trials if t.config]
    grid = " × ".join(f"{key} {_values_text(report.grid[key])}" for key in report.factors)
    seeds = f"{report.seeds} seed{'s' if report.seeds != 1 else ''}"
    epochs = _values_text([c.get("epochs") for c in configs]) if configs else "—"
    dataset = _values_text([config_value(c, "dataset") for c in configs]) if configs else "—"
    images = sorted({int(n) for n in report.trials["test_images"].dropna()})
    tested = (
        f", tested on {images[0]} images"
        if len(images) == 1
        else f", tested on {images[0]} to {images[-1]} images (trials differ)"
        if images
        else ""
    )
    return (
        f"{n} trial{'s' if n != 1 else ''} ({statuses_text(status_counts(report.trials))}): "
        f"{grid + ' × ' if grid else ''}{seeds}, {counted(epochs, 'epoch')} each on {dataset}{tested}. Measured per "
        "trial: final test accuracy, time per epoch and peak memory; compared as paired effects of each factor."
    )


def statuses_text(counts: dict[str, int]) -> str:
    """`3 finished, 1 failed, 0 diverged, 0 oom` (incomplete, running and pending only when there are some)."""
    parts = [f"{counts[s]} {s}" for s in runlog.FINAL_STATUSES]
    parts += [f"{counts[s]} {s}" for s in (INCOMPLETE, *_UNFINISHED) if counts[s]]
    return ", ".join(parts)


def fixed_settings(report: Report) -> dict:
    """The config keys every trial shares, other than the factors, seed and data_dir (report.json keeps them all)."""
    configs = [t.config for t in report.run.trials if t.config]
    if not configs:
        return {}
    varying = set(report.factors) | {"seed", "data_dir"}
    return {k: v for k, v in configs[0].items() if k not in varying and all(c.get(k) == v for c in configs)}


def _fixed_text(report: Report) -> str:
    """The fixed settings that differ from TrainConfig's defaults (the Markdown shows only those)."""
    changed = {k: v for k, v in fixed_settings(report).items() if k not in KEYS or not same_value(v, DEFAULTS[k])}
    return ", ".join(f"{k}={fmt_value(v)}" for k, v in changed.items()) or "— (every other key at its default)"


def _run_fields(run: RunLog) -> dict:
    """What one run's sweep.json and trials say about where and how it ran; "command" (what re-runs it) only where
    sweep.json recorded one."""
    sweep = run.sweep
    versions = sweep.get("versions") or {}
    wall_s, wall = _wall_time(sweep)
    command = sweep.get("command")
    return {
        "description": sweep.get("description", ""),
        "date": fmt_date(sweep.get("started_at")),
        "started_at": sweep.get("started_at"),
        "git_revision": sweep.get("git_revision", "unknown"),
        **provenance.header_facts(run.path, sweep),
        **({"command": command} if command else {}),
        "hardware": hardware(run),
        "versions": {k: versions.get(k, "unknown") for k in ("python", "torch", "ray", "cuda")},
        "wall_time_s": wall_s,
        "wall_time": wall,
    }


def _compared_run(report: Report, source: RunSource) -> dict:
    trials = report.trials[report.trials[RUN_FACTOR] == source.label]
    sweep = source.log.sweep
    return {
        "label": source.label,
        "path": str(source.log.path),
        "sweep": str(sweep.get("name") or source.log.path.name),
        **_run_fields(source.log),
        "trials": len(trials),
        "status_counts": status_counts(trials),
    }


def header_info(report: Report) -> dict:
    """The header's facts (report.json's "sweep"); with several runs, each run's under "compared_runs", the
    run-level keys and the pairing rule."""
    sweep = report.run.sweep
    metric, mode = sweep.get("metric", "test_acc"), sweep.get("mode", "max")
    comparison = report.comparison
    runs = (
        {
            "compared_runs": [_compared_run(report, source) for source in report.sources],
            "run_level_keys": comparison.run_level,
            "pairing_rule": RUN_MATCH_RULE,
        }
        if comparison
        else _run_fields(report.run)
    )
    return {
        "name": report.name,
        **runs,
        "trials": len(report.trials),
        "status_counts": status_counts(report.trials),
        "fixed_settings": fixed_settings(report),
        "metric": metric,
        "mode": mode,
        "best": f"{best_phrase(report.objective)} ({report.objective_note or f'sweep metric={metric}, mode={mode}'})",
        "best_column": report.objective.column,
        "best_mode": report.objective.better,
        "grid": report.grid,
        "baseline": report.baseline,
        "repeats": sweep.get("repeats", 1),
        "overfitting_rule": OVERFIT_RULE,
        "memory_measure": report.memory_measure,
    }


def _software(versions: dict) -> str:
    return f"Python {versions['python']}, torch {versions['torch']}, Ray {versions['ray']}, CUDA {versions['cuda']}"


def title_blocks(report: Report) -> list[Block]:
    """The title and the sweep's question (its description; for several runs, each run's where they differ)."""
    info = header_info(report)
    if report.comparison:
        runs = info["compared_runs"]
        descriptions = {run["label"]: str(run["description"]) for run in runs if run["description"]}
        if len(set(descriptions.values())) == 1:
            description = next(iter(descriptions.values()))
        else:
            description = "; ".join(f"**{label}**: {text}" for label, text in descriptions.items())
        title = " vs ".join(run["label"] for run in runs)
    else:
        title, description = report.name, str(info["description"])
    question = [Paragraph(f"**Question.** {' '.join(description.split())}")] if description else []
    return [Heading(title, 1), *question]


def setup_blocks(report: Report) -> list[Block]:
    """When, where and how the run ran, and what it measured: the setup table; for several runs, a row per run and
    what they share."""
    return _runs_setup(report) if report.comparison else _run_setup(report)


def _run_setup(report: Report) -> list[Block]:
    info = header_info(report)
    rows = (
        ("Measured", measured_text(report)),
        ("Date", info["date"]),
        ("Git revision", "; ".join(filter(None, [f"`{info['git_revision']}`", info["uncommitted"]]))),
        *(
            [("Re-run with", f"`{info['command']}`" + (f" on {info['revision']}" if info["revision"] else ""))]
            if "command" in info
            else []
        ),
        ("Hardware", info["hardware"]),
        ("Software", _software(info["versions"])),
        ("Wall time", info["wall_time"]),
        ("Fixed settings (not default)", _fixed_text(report)),
        ("Best means", info["best"]),
        *([("Until settled", settle_line(report))] if settle_line(report) else []),
    )
    return [Heading("Setup"), Table(("", ""), rows, name="setup")]


def settle_line(report: Report) -> str:
    """How the rounds of `sweep --until-settled` ended and under which procedure (report/settle.py), with each
    comparison's verdict as the report's effects hold it: the look's (settle.apply_looks); "" for a run without
    rounds."""
    record = report.run.sweep.get(SETTLE_KEY)
    if not record or not record.get("rounds"):
        return ""
    accuracy = PAIRED_METRICS[0].column
    each = [
        f"{Comparison(key, row[key], report.baseline[key]).label}: {row['verdict']}{look_text(row)}"
        for key in report.factors
        for _, row in report.effects[key][accuracy].iterrows()
        if row.get("look")
    ]
    return (
        ". ".join([settle_text(record), *(["; ".join(each)] if each else []), record["procedure"]])
        + ". The accuracy verdicts below are these looks', each test at this level"
    )


def run_level_text(report: Report) -> str:
    """`epochs: 1 in a, 2 in b; ...`: the run-level keys (RUN_MATCH_RULE) with each run's value."""
    return "; ".join(
        f"{key}: " + ", ".join(f"{fmt_value(value)} in {label}" for label, value in values.items())
        for key, values in report.comparison.run_level.items()
    )


def _runs_setup(report: Report) -> list[Block]:
    """The setup of a report on several runs: a row per run (where, how and what re-runs it), then what they share."""
    info = header_info(report)
    runs = info["compared_runs"]
    run_rows = tuple(
        (
            run["label"],
            run["date"],
            f"`{run['git_revision']}`",
            run["hardware"],
            _software(run["versions"]),
            run["wall_time"],
            f"{run['trials']}: {statuses_text(run['status_counts'])}",
            f"`{run['command']}`" if "command" in run else "— (not recorded)",
        )
        for run in runs
    )
    run_level = run_level_text(report) or "none: the runs' configs differ only in keys that vary within a run"
    rows = (
        ("Measured", measured_text(report)),
        ("Run-level keys", run_level),
        ("Fixed settings (not default)", _fixed_text(report)),
        ("Best means", info["best"]),
    )
    return [
        Heading("Setup"),
        Paragraph(
            f"{len(runs)} runs compared as one more factor, `{RUN_FACTOR}` (the label is each run's folder name):"
        ),
        Table(
            ("run", "date", "git revision", "hardware", "software", "wall time", "trials", "re-run with"),
            run_rows,
            "lllllrll",
            "runs",
        ),
        Table(("", ""), rows, name="setup"),
    ]
