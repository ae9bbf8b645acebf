"""The report's header: when, where and how the run ran (header_info, also report.json's "sweep"), as a Markdown
table; for several runs, a row per run and what they share."""

from __future__ import annotations

from datetime import datetime

import pandas as pd

from ..core import provenance, runlog
from ..core.runlog import RunLog
from ..core.text import markdown_table
from .build import Report
from .compare import RUN_FACTOR, RUN_MATCH_RULE, RunSource
from .format import best_phrase, fmt_date, fmt_duration, fmt_value
from .stats import OVERFIT_RULE


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
    systems = [t.meta.get("system") or {} for t in run.trials]
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
    return f"CPU only: {host.get('cpu_model', 'unknown CPU')}, {cores if cores else '?'} cores{ray}"


# The statuses a report counts, in its order: the final ones (runlog.FINAL_STATUSES), then the others, the latest
# stage first (running before pending).
_UNFINISHED = tuple(s for s in reversed(runlog.STATUSES) if s not in runlog.FINAL_STATUSES)


def status_counts(trials: pd.DataFrame) -> dict[str, int]:
    counts = trials["status"].value_counts()
    return {s: int(counts.get(s, 0)) for s in runlog.FINAL_STATUSES + _UNFINISHED}


def _trials_line(report: Report) -> str:
    counts = status_counts(report.trials)
    n = len(report.trials)
    n_configs = len(report.configs)
    repeats = report.run.sweep.get("repeats", 1)
    shape = (
        f" ({n_configs} configuration{'s' if n_configs != 1 else ''} × {repeats} repeats)"
        if isinstance(repeats, int) and repeats > 1
        else ""
    )
    return f"{n} run{'s' if n != 1 else ''}{shape}: " + statuses_text(counts)


def statuses_text(counts: dict[str, int]) -> str:
    """`3 finished, 1 failed, 0 diverged, 0 oom` (running and pending only when there are some)."""
    parts = [f"{counts[s]} {s}" for s in runlog.FINAL_STATUSES]
    parts += [f"{counts[s]} {s}" for s in _UNFINISHED if counts[s]]
    return ", ".join(parts)


def _fixed_settings(report: Report) -> str:
    configs = [t.config for t in report.run.trials if t.config]
    if not configs:
        return "—"
    varying = set(report.factors) | {"seed", "data_dir"}
    same = [k for k in configs[0] if k not in varying and all(c.get(k) == configs[0][k] for c in configs)]
    return ", ".join(f"{k}={fmt_value(configs[0][k])}" for k in same) or "—"


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
        "runs": len(report.trials),
        "status_counts": status_counts(report.trials),
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


def _grid_text(report: Report) -> str:
    return "; ".join(f"{k}: {', '.join(fmt_value(x) for x in vals)}" for k, vals in report.grid.items()) or "—"


def header_section(report: Report) -> str:
    """`# name`, the description and the header table; for several runs, a row per run and what they share."""
    return "\n".join(_runs_header(report) if report.comparison else _run_header(report))


def _run_header(report: Report) -> list[str]:
    info = header_info(report)
    rows = [
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
        ("Trials", _trials_line(report)),
        ("Grid", _grid_text(report)),
        ("Fixed settings", _fixed_settings(report)),
        ("Best means", info["best"]),
    ]
    lines = [f"# {report.name}", ""]
    if info["description"]:
        lines += [f"> {line}" for line in str(info["description"]).splitlines()] + [""]
    lines += [markdown_table(["", ""], rows), ""]
    return lines


def run_level_text(report: Report) -> str:
    """`epochs: 1 in a, 2 in b; ...`: the run-level keys (RUN_MATCH_RULE) with each run's value."""
    return "; ".join(
        f"{key}: " + ", ".join(f"{fmt_value(value)} in {label}" for label, value in values.items())
        for key, values in report.comparison.run_level.items()
    )


def _runs_header(report: Report) -> list[str]:
    """The header of a report on several runs: a row per run (where, how and what re-runs it), then what they share."""
    info = header_info(report)
    runs = info["compared_runs"]
    lines = [f"# {' vs '.join(run['label'] for run in runs)}", ""]
    descriptions = {run["label"]: str(run["description"]) for run in runs if run["description"]}
    if len(set(descriptions.values())) == 1:
        lines += [f"> {line}" for line in next(iter(descriptions.values())).splitlines()] + [""]
    elif descriptions:
        lines += [f"> **{label}**: {text}" for label, text in descriptions.items()] + [""]
    n = len(report.trials)
    lines += [
        f"{len(runs)} runs compared as one more factor, `{RUN_FACTOR}` (the label is each run's folder name):",
        "",
        markdown_table(
            ["run", "date", "git revision", "hardware", "software", "wall time", "trials", "re-run with"],
            [
                [
                    run["label"],
                    run["date"],
                    f"`{run['git_revision']}`",
                    run["hardware"],
                    _software(run["versions"]),
                    run["wall_time"],
                    f"{run['trials']}: {statuses_text(run['status_counts'])}",
                    f"`{run['command']}`" if "command" in run else "— (not recorded)",
                ]
                for run in runs
            ],
            "lllllrll",
        ),
        "",
    ]
    run_level = run_level_text(report) or "none: the runs' configs differ only in keys that vary within a run"
    rows = [
        ("Trials", f"{n} trial{'s' if n != 1 else ''} in {len(runs)} runs: {statuses_text(info['status_counts'])}"),
        ("Grid", _grid_text(report)),
        ("Run-level keys", run_level),
        ("Fixed settings", _fixed_settings(report)),
        ("Best means", info["best"]),
    ]
    return lines + [markdown_table(["", ""], rows), "", f"**Pairing across runs.** {RUN_MATCH_RULE}", ""]
