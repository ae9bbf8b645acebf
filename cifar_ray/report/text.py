"""The report as text: numbers formatted for reading, the findings, the Markdown tables and the whole README.md.
Markdown shows accuracies as percentages (the frames keep fractions 0-1)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pandas as pd

from ..runlog import RunLog
from .data import (
    FACTOR_METRICS,
    OVERFIT_RULE,
    PAIRED_METRICS,
    RUN_FACTOR,
    RUN_MATCH_RULE,
    Metric,
    Report,
    RunSource,
    fmt_value,
    values_label,
)

RUNNING_NOTE = (
    "Running train accuracy and loss are means over the epoch's training steps, taken with augmentation "
    "and dropout on while the weights still change, so they trail the model at the end of the epoch and "
    "can read below test accuracy: not a like-for-like comparison with the test metrics."
)
EVAL_NOTE = (
    "Eval train accuracy and loss evaluate the first `train_eval_size` training images{size} after each epoch "
    "exactly as the test set is (eval mode, no augmentation, the same code): the like-for-like comparison."
)
# What peak_mem_mb measures, by the trials' device type (trial.json: system.device_type).


def _places(x: float) -> int:
    """Decimals that show `x` with about three significant digits (none at 1000 and above)."""
    x = abs(x)
    if x >= 1000:
        return 0
    if x >= 100:
        return 1
    if x >= 1 or x == 0:
        return 2
    return min(-math.floor(math.log10(x)) + 2, 12)


def _missing(x: Any) -> bool:
    return x is None or x is pd.NA or (isinstance(x, float) and math.isnan(x))


def _num(x: Any, like: float | None = None) -> str:
    """A number rounded for reading; `like` sets the decimals (a std shown as its mean is)."""
    if _missing(x):
        return "—"
    x = float(x)
    places = _places(x if _missing(like) else like)
    return f"{x:,.{places}f}"


def _pct(fraction: Any) -> str:
    return "—" if _missing(fraction) else f"{100 * fraction:.2f}"


def _loss(x: Any) -> str:
    return "—" if _missing(x) else f"{x:.4f}"


def _int(x: Any) -> str:
    return "—" if _missing(x) else str(int(x))


def _duration(seconds: float | None) -> str:
    if _missing(seconds):
        return "—"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def _mean_std(metric: Metric | None, mean: float, std: float) -> str:
    """`mean ± std`, both to the same decimals; the std of a single trial is shown as —."""
    if math.isnan(mean):
        return "—"
    if metric is not None and metric.kind == "acc":
        return f"{_pct(mean)} ± {_pct(std) if not math.isnan(std) else '—'}"
    return f"{_num(mean)} ± {_num(std, like=mean) if not math.isnan(std) else '—'}"


def _metric_text(metric: Metric, x: Any) -> str:
    return _pct(x) if metric.kind == "acc" else _loss(x) if metric.kind == "loss" else _num(x)


def _best_phrase(metric: Metric) -> str:
    return f"{'highest' if metric.better == 'max' else 'lowest'} {metric.label}"


def _signed(metric: Metric, x: float, like: float) -> str:
    """A difference with its sign: percentage points for accuracies, else to the decimals `like` needs."""
    return f"{100 * x:+.2f}" if metric.kind == "acc" else f"{x:+,.{_places(like)}f}"


def _paired_parts(metric: Metric, row: pd.Series) -> tuple[str, str, str]:
    """Mean paired difference and its CI bounds, to the same decimals (the CI bounds are — below two pairs)."""
    columns = ("mean_diff", "ci_low", "ci_high")
    like = max((abs(row[c]) for c in columns if not _missing(row[c])), default=0.0)
    return tuple("—" if _missing(row[c]) else _signed(metric, row[c], like) for c in columns)


def _verdict(row: pd.Series) -> str:
    if row["n_pairs"] == 0:
        return "no matched pairs"
    if row["conclusive"]:
        return "real effect"
    return "not conclusive (CI includes 0)" if row["n_pairs"] > 1 else "not conclusive (one pair, no CI)"


def _delta(metric: Metric, row: pd.Series) -> str:
    if row["is_baseline"]:
        return "baseline"
    if metric.kind == "acc":
        d = row[f"{metric.column}_delta"]
        return "—" if math.isnan(d) else f"{100 * d:+.2f} pp"
    d = row[f"{metric.column}_delta_pct"]
    return "—" if math.isnan(d) or math.isinf(d) else f"{d:+.1f} %"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """A GitHub-flavoured Markdown table; `align` is one letter per column: l, r or c."""

    def cell(x: Any) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")

    align = align or "l" * len(headers)
    rule = {"l": "---", "r": "---:", "c": ":---:"}
    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "|".join(rule[a] for a in align) + "|"]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def _short(key: str) -> str:
    return key.removeprefix("time_").removesuffix("_s")


def _last_line(text: Any) -> str:
    if _missing(text):  # None, or NaN once in a frame
        return ""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    line = lines[-1] if lines else ""
    return line if len(line) <= 200 else line[:197] + "..."


# ---------------------------------------------------------------------------------------- header


def _date(text: str | None) -> str:
    if not text:
        return "unknown"
    try:
        dt = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return str(text)
    return dt.strftime("%Y-%m-%d %H:%M") + (dt.strftime(" (UTC%z)") if dt.tzinfo else "")


def _wall_time(sweep: dict) -> tuple[float | None, str]:
    wall = sweep.get("wall_time_s")
    if isinstance(wall, (int, float)):
        return float(wall), _duration(float(wall))
    try:
        start = datetime.fromisoformat(sweep["started_at"])
        end = datetime.fromisoformat(sweep["finished_at"])
        seconds = (end - start).total_seconds()
        return seconds, _duration(seconds)
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


def _status_counts(trials: pd.DataFrame) -> dict[str, int]:
    counts = trials["status"].value_counts()
    return {
        s: int(counts.get(s, 0)) for s in ("finished", "failed", "diverged", "oom", "running", "interrupted", "pending")
    }


def _trials_line(report: Report) -> str:
    counts = _status_counts(report.trials)
    n = len(report.trials)
    n_configs = len(report.configs)
    repeats = report.run.sweep.get("repeats", 1)
    shape = (
        f" ({n_configs} configuration{'s' if n_configs != 1 else ''} × {repeats} repeats)"
        if isinstance(repeats, int) and repeats > 1
        else ""
    )
    return f"{n} run{'s' if n != 1 else ''}{shape}: " + _statuses(counts)


def _statuses(counts: dict[str, int]) -> str:
    """`3 finished, 1 failed, 0 diverged, 0 oom` (running, interrupted and pending only when there are some)."""
    parts = [f"{counts[s]} {s}" for s in ("finished", "failed", "diverged", "oom")]
    parts += [f"{counts[s]} {s}" for s in ("running", "interrupted", "pending") if counts[s]]
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
        "date": _date(sweep.get("started_at")),
        "started_at": sweep.get("started_at"),
        "git_revision": sweep.get("git_revision", "unknown"),
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
        "status_counts": _status_counts(trials),
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
        "status_counts": _status_counts(report.trials),
        "metric": metric,
        "mode": mode,
        "best": f"{_best_phrase(report.objective)} ({report.objective_note or f'sweep metric={metric}, mode={mode}'})",
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


def _header_md(report: Report) -> list[str]:
    if report.comparison:
        return _runs_header_md(report)
    info = header_info(report)
    rows = [
        ("Date", info["date"]),
        ("Git revision", f"`{info['git_revision']}`"),
        *([("Re-run with", f"`{info['command']}`")] if "command" in info else []),
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


def _runs_header_md(report: Report) -> list[str]:
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
                    f"{run['trials']}: {_statuses(run['status_counts'])}",
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
        ("Trials", f"{n} trial{'s' if n != 1 else ''} in {len(runs)} runs: {_statuses(info['status_counts'])}"),
        ("Grid", _grid_text(report)),
        ("Run-level keys", run_level),
        ("Fixed settings", _fixed_settings(report)),
        ("Best means", info["best"]),
    ]
    return lines + [markdown_table(["", ""], rows), "", f"**Pairing across runs.** {RUN_MATCH_RULE}", ""]


# -------------------------------------------------------------------------------------- findings


def _best(frame: pd.DataFrame, column: str, better: str) -> tuple[int, int] | None:
    """Row labels of the best and the worst value of `column` (NaN ignored), or None."""
    values = frame[column].dropna()
    if len(values) < 1:
        return None
    return (values.idxmax(), values.idxmin()) if better == "max" else (values.idxmin(), values.idxmax())


def findings(report: Report) -> list[str]:
    """Facts read off the configuration tables (best by the sweep's metric, fastest, most accurate, least memory)
    and the paired effects of each factor."""
    configs = report.configs[report.configs["n"] > 0]
    done = int((report.trials["status"] == "finished").sum())
    if not len(configs):
        return ["No trial finished: there is nothing to compare yet."]
    lines = []
    repeated = report.run.sweep.get("repeats", 1) not in (None, 1) or "seed" in report.grid
    unit = "configuration (mean over its finished seeds)" if repeated else "configuration"

    def name(i: int) -> str:
        return values_label(configs.loc[i], report.factors) or "the only configuration"

    def n_note(i: int) -> str:
        n = int(configs.loc[i, "n"])
        return f", mean of {n} trials" if n > 1 else ""

    if len(configs) == 1:
        config = configs.loc[configs.index[0]]
        accuracy = _mean_std(FACTOR_METRICS[0], config["final_test_acc_mean"], config["final_test_acc_std"])
        return [
            f"One {unit}: final test accuracy {accuracy} %, "
            f"{_num(config['time_per_epoch_s_mean'])} s/epoch, peak memory {_memory_text(config)} "
            f"({done} finished trial{'s' if done != 1 else ''})."
        ]

    best = report.objective
    if report.objective_note:
        lines.append(f"**Best** means the {_best_phrase(best)} ({report.objective_note}).")
    pick = _best(configs, f"{best.column}_mean", best.better) if best != FACTOR_METRICS[0] else None
    if pick:  # the default objective's best is the Most accurate line
        top, low = pick
        lines.append(
            f"**Best** {unit} by the sweep's metric ({_best_phrase(best)}): {name(top)} at "
            f"{_metric_text(best, configs.loc[top, f'{best.column}_mean'])}{n_note(top)}; the worst is "
            f"{name(low)} ({_metric_text(best, configs.loc[low, f'{best.column}_mean'])})."
        )
    pick = _best(configs, "time_per_epoch_s_mean", "min")
    if pick:
        fast, slow = pick
        t_fast, t_slow = configs.loc[fast, "time_per_epoch_s_mean"], configs.loc[slow, "time_per_epoch_s_mean"]
        lines.append(
            f"**Fastest** {unit}: {name(fast)} at {_num(t_fast)} s/epoch{n_note(fast)}; "
            f"{t_slow / t_fast:.2f}× faster than the slowest, {name(slow)} ({_num(t_slow)} s/epoch)."
        )
    pick = _best(configs, "final_test_acc_mean", "max")
    if pick:
        top, low = pick
        a_top, a_low = configs.loc[top, "final_test_acc_mean"], configs.loc[low, "final_test_acc_mean"]
        ratio = f"; {(1 - a_low) / (1 - a_top):.2f}× fewer test errors" if a_top < 1 else ""
        lines.append(
            f"**Most accurate**: {name(top)} at {_pct(a_top)} % final test accuracy{n_note(top)}; "
            f"{100 * (a_top - a_low):+.2f} pp over the least accurate, {name(low)} ({_pct(a_low)} %){ratio}."
        )
    # Ranked by the total (what running the configuration costs) when every configuration logged one.
    by_total = bool(configs["peak_mem_total_mb_mean"].notna().all())
    column = "peak_mem_total_mb_mean" if by_total else "peak_mem_mb_mean"
    pick = _best(configs, column, "min")
    if pick:
        small, big = pick
        m_small, m_big = configs.loc[small, column], configs.loc[big, column]
        ratio = f"{m_big / m_small:.2f}× less than" if m_small > 0 else "versus"
        basis = (
            "by the peak total over workers, what the configuration occupies; per worker is what must fit on one device"
            if by_total
            else "by the peak per worker: not every configuration logged a total"
        )
        lines.append(
            f"**Least memory** ({basis}): {name(small)} at {_memory_text(configs.loc[small])}{n_note(small)}; "
            f"{ratio} the most, {name(big)} ({_memory_text(configs.loc[big])})."
        )
    for key in report.factors:
        lines.extend(_factor_finding(report, key))
    return lines


def _memory_text(config: pd.Series) -> str:
    """`2,200 MB total over workers, 1,100 MB per worker` for a configuration row; per worker alone without a total."""
    per_worker = f"{_num(config['peak_mem_mb_mean'])} MB per worker"
    total = config["peak_mem_total_mb_mean"]
    return per_worker if _missing(total) else f"{_num(total)} MB total over workers, {per_worker}"


def _paired_text(metric: Metric, row: pd.Series, unit: str) -> str:
    """`+1.00 pp (95 % CI +0.85 to +1.15 pp, 9 pairs)`."""
    mean, low, high = _paired_parts(metric, row)
    n = int(row["n_pairs"])
    return f"{mean} {unit} (95 % CI {low} to {high} {unit}, {n} pairs)" if n > 1 else f"{mean} {unit} (1 pair)"


def _partner(report: Report, key: str, swept: str) -> str:
    """The trial a trial with another value of `key` is paired with: `swept` (the words for a swept key), or for the
    run factor the trial of the baseline run with an equal config apart from the run-level keys (RUN_MATCH_RULE)."""
    if report.comparison and key == RUN_FACTOR:
        return f"trial of run {fmt_value(report.baseline[key])} with an equal config apart from the run-level keys"
    return swept


def _run_level_note(report: Report, key: str) -> str:
    """For the run factor, the run-level keys its effect includes; "" otherwise."""
    if not (report.comparison and key == RUN_FACTOR and report.comparison.run_level):
        return ""
    return f" The runs also differ in run-level keys, part of this effect: {run_level_text(report)}."


def _factor_finding(report: Report, key: str) -> list[str]:
    acc, time = (report.effects[key][m.column] for m in PAIRED_METRICS)
    if not len(acc):  # a single grid value: nothing to compare
        return []
    base = fmt_value(report.baseline[key])
    partner = _partner(report, key, f"trial with {key}={base} and the same other keys and seed")
    parts = []
    for (_, a), (_, t) in zip(acc.iterrows(), time.iterrows()):
        part = f"{key}={fmt_value(a[key])}: "
        if a["n_pairs"] == 0:
            parts.append(part + f"no matched pairs (no finished {partner}), so no effect is estimated")
            continue
        part += f"final test accuracy {_paired_text(PAIRED_METRICS[0], a, 'pp')}, {_verdict(a)}"
        if t["n_pairs"]:
            part += f"; time/epoch {_paired_text(PAIRED_METRICS[1], t, 's')}"
        parts.append(part)
    line = (
        f"**{key}** (baseline {base}; paired differences vs the {partner}): "
        + ". ".join(parts)
        + "."
        + _run_level_note(report, key)
    )
    std, configs = report.noise
    if configs:
        line += (
            f" Seed noise: {100 * std:.2f} pp (pooled within-configuration std of final test accuracy over "
            f"{configs} configuration{'s' if configs != 1 else ''} with ≥ 2 finished seeds)."
        )
    return [line]


# ------------------------------------------------------------------------------------- md tables


def _has_train_eval(report: Report) -> bool:
    return bool((report.trials["train_basis"] == "eval").any())


def _always(report: Report) -> bool:
    return True


@dataclass(frozen=True)
class TrialColumn:
    """A column of the trial table: its header, its alignment (l, r or c), its cell for a trial row, and whether a
    report shows it."""

    header: str
    align: str
    cell: Callable[[Report, pd.Series], str]
    shown: Callable[[Report], bool] = _always


def _field(column: str, fmt: Callable[[Any], str]) -> Callable[[Report, pd.Series], str]:
    """The cell that shows a trial row's `column` through `fmt`."""
    return lambda report, r: fmt(r[column])


def _best_cell(report: Report, r: pd.Series) -> str:
    return "—" if math.isnan(r["best_test_acc"]) else f"{_pct(r['best_test_acc'])} ({_int(r['best_epoch'])})"


def _gap_cell(report: Report, r: pd.Series) -> str:
    """The gap, marked † where the report has eval train metrics but this trial's gap reads the running ones."""
    running = _has_train_eval(report) and r["train_basis"] == "running" and r["epochs_done"]
    return _pct(r["gap"]) + (" †" if running else "")


def _overfit_cell(report: Report, r: pd.Series) -> str:
    if r["overfitting"]:
        return f"**yes** (from epoch {_int(r['overfit_epoch'])})"
    return "no" if r["epochs_done"] >= 2 else "—"


# The trial table after the trial and its label_keys, in order.
TRIAL_COLUMNS = (
    TrialColumn("workers", "r", _field("workers", _int), lambda report: "workers" not in report.label_keys),
    TrialColumn("GPUs", "r", _field("gpus", _int), lambda report: bool((report.trials["gpus"].fillna(0) > 0).any())),
    TrialColumn("device", "l", _field("device", str), lambda report: report.trials["device"].nunique() > 1),
    TrialColumn("eff. batch", "r", _field("effective_batch", _int)),
    TrialColumn("epochs", "r", lambda report, r: f"{r['epochs_done']}/{_int(r['epochs_planned'])}"),
    TrialColumn("final test acc (%)", "r", _field("final_test_acc", _pct)),
    TrialColumn("best test acc (%) (epoch)", "r", _best_cell),
    TrialColumn("train acc, running (%)", "r", _field("final_train_acc", _pct)),
    TrialColumn("train acc, eval (%)", "r", _field("final_train_eval_acc", _pct), _has_train_eval),
    TrialColumn("gap (pp)", "r", _gap_cell),
    TrialColumn("train loss, running", "r", _field("final_train_loss", _loss)),
    TrialColumn("train loss, eval", "r", _field("final_train_eval_loss", _loss), _has_train_eval),
    TrialColumn("test loss", "r", _field("final_test_loss", _loss)),
    TrialColumn("time", "r", _field("train_time_s", _duration)),
    TrialColumn("time/epoch (s)", "r", _field("time_per_epoch_s", _num)),
    TrialColumn("samples/s", "r", _field("samples_per_s", _num)),
    TrialColumn("peak mem per worker (MB)", "r", _field("peak_mem_mb", _num)),
    TrialColumn("peak mem, total over workers (MB)", "r", _field("peak_mem_total_mb", _num)),
    TrialColumn("status", "l", _field("status", str)),
    TrialColumn("overfitting", "l", _overfit_cell),
)


def _trial_table(report: Report) -> str:
    columns = [TrialColumn("trial", "l", _field("trial", lambda name: f"`{name}`"))]
    columns += [TrialColumn(key, "l", _field(key, fmt_value)) for key in report.label_keys]
    columns += [column for column in TRIAL_COLUMNS if column.shown(report)]
    rows = [[column.cell(report, r) for column in columns] for _, r in report.trials.iterrows()]
    return markdown_table([c.header for c in columns], rows, "".join(c.align for c in columns))


def _factor_table(report: Report, key: str) -> str:
    frame = report.groups[key]
    headers = [key, "n"]
    for metric in report.metrics:
        headers += [metric.label, "Δ"]
    best = {}
    for metric in report.metrics:
        means = frame.loc[frame["n"] > 0, f"{metric.column}_mean"].dropna()
        best[metric.column] = (means.max() if metric.better == "max" else means.min()) if len(means) else None
    rows = []
    for _, r in frame.iterrows():
        row = [fmt_value(r[key]) + (" (baseline)" if r["is_baseline"] else ""), str(r["n"])]
        for metric in report.metrics:
            mean = r[f"{metric.column}_mean"]
            text = _mean_std(metric, mean, r[f"{metric.column}_std"])
            if best[metric.column] is not None and mean == best[metric.column]:
                text = f"**{text}**"
            row += [text, _delta(metric, r)]
        rows.append(row)
    return markdown_table(headers, rows, "lr" + "r" * 2 * len(report.metrics))


def _paired_table(report: Report, key: str) -> str:
    acc, time = (report.effects[key][m.column] for m in PAIRED_METRICS)
    headers = ["value", "pairs", "Δ final test acc (pp) [95 % CI]", "Δ time/epoch (s) [95 % CI]", "accuracy effect"]

    def cell(metric: Metric, row: pd.Series) -> str:
        mean, low, high = _paired_parts(metric, row)
        return "—" if row["n_pairs"] == 0 else f"{mean} [{low}, {high}]" if row["n_pairs"] > 1 else mean

    rows = [
        [
            f"{key}={fmt_value(a[key])}",
            str(a["n_pairs"]),
            cell(PAIRED_METRICS[0], a),
            cell(PAIRED_METRICS[1], t),
            _verdict(a),
        ]
        for (_, a), (_, t) in zip(acc.iterrows(), time.iterrows())
    ]
    return markdown_table(headers, rows, "lrrrl")


def _factor_breakdown_table(report: Report, key: str) -> str:
    frame = report.groups[key]
    headers = [key, "n", "epoch (s)"] + [f"{_short(k)} (s)" for k in report.breakdown]
    rows = [
        [fmt_value(r[key]), str(r["n"]), _mean_std(None, r["time_per_epoch_s_mean"], r["time_per_epoch_s_std"])]
        + [_mean_std(None, r[f"{k}_mean"], r[f"{k}_std"]) for k in report.breakdown]
        for _, r in frame.iterrows()
    ]
    return markdown_table(headers, rows, "lr" + "r" * (1 + len(report.breakdown)))


def _trial_breakdown_table(report: Report) -> str:
    headers = ["trial", "epoch (s)"] + [f"{_short(k)} (s, share)" for k in report.breakdown]
    rows = []
    for _, r in report.trials.iterrows():
        if r["epochs_done"] == 0:
            continue
        total = r["time_per_epoch_s"]
        cells = []
        for k in report.breakdown:
            share = f" ({100 * r[k] / total:.0f} %)" if total and not math.isnan(r[k]) else ""
            cells.append(_num(r[k]) + share)
        rows.append([f"`{r['trial']}`", _num(total), *cells])
    return markdown_table(headers, rows, "l" + "r" * (1 + len(report.breakdown)))


def _overfit_sentences(report: Report) -> list[str]:
    lines = []
    for _, r in report.trials[report.trials["overfitting"]].iterrows():
        o = report.overfits[r["trial"]]
        label = report.trial_label(r)
        basis = r["train_basis"]
        lines.append(
            f"- `{r['trial']}` ({label}): test loss bottomed at {o.test_min:.4f} in epoch {o.min_epoch}, "
            f"then rose to {o.test_at_onset:.4f} in epoch {o.onset} "
            f"({100 * (o.test_at_onset / o.test_min - 1):+.1f} %) while {basis} train loss fell from "
            f"{o.train_at_min:.4f} to {o.train_at_onset:.4f}; final {basis} train − test accuracy gap "
            f"{_pct(r['gap'])} pp" + ("." if basis == "eval" else " (running: not like-for-like).")
        )
    return lines


def train_metrics_note(report: Report) -> str:
    """What the train accuracy and loss columns measure: the running means, and the eval ones where logged."""
    if not _has_train_eval(report):
        return f"{RUNNING_NOTE} These logs have no eval train metrics (train_eval_acc): the gap is not like-for-like."
    sizes = {
        t.config.get("train_eval_size")
        for t, basis in zip(report.run.trials, report.trials["train_basis"])
        if basis == "eval"
    }
    size = f" ({fmt_value(sizes.pop())} here; all of them when the training set is smaller)" if len(sizes) == 1 else ""
    return f"{RUNNING_NOTE} {EVAL_NOTE.format(size=size)}"


def _gap_note(report: Report) -> str:
    if not _has_train_eval(report):
        return "gap = final running train acc − final test acc (percentage points)"
    t = report.trials
    running = ((t["train_basis"] == "running") & (t["epochs_done"] > 0)).any()
    return "gap = final eval train acc − final test acc (percentage points" + (
        "; † the running train acc: the trial logged no eval one)" if running else ")"
    )


def memory_note(report: Report) -> str:
    """What the two peak memory columns measure, worded from the trials' devices."""
    t = report.trials
    missing = ((t["epochs_done"] > 0) & t["peak_mem_total_mb"].isna()).any()
    return (
        f"Peak mem per worker: {report.memory_measure}, the largest over the workers and epochs: what must fit "
        "on one device. Peak mem, total over workers: the sum of every worker's peak (of every GPU's with "
        "strategy=dp), the largest over epochs: what running it occupies (at most: the workers may peak at "
        "different moments)" + ("; — where the logs have no total (peak_mem_total_mb)." if missing else ".")
    )


def _excluded_lines(report: Report) -> list[str]:
    lines = []
    for _, r in report.trials[report.trials["status"] != "finished"].iterrows():
        label = report.trial_label(r)
        done, planned = r["epochs_done"], _int(r["epochs_planned"])
        status = r["status"]
        error = _last_line(r["error"])
        if status == "diverged":
            why = f"diverged at epoch {_int(r['diverged_epoch'])} (non-finite loss)"
        elif status == "failed":
            why = f"failed after {done} of {planned} epochs"
        elif status == "oom":
            why = f"ran out of memory after {done} of {planned} epochs"
        elif status == "running":
            why = f"still running: {done} of {planned} epochs so far"
        else:
            why = f"{status}: {done} of {planned} epochs"
        lines.append(f"- `{r['trial']}` ({label}): {why}" + (f" — `{error}`" if error else "") + ".")
    return lines


# -------------------------------------------------------------------------------------- markdown


def render_markdown(report: Report, plots: dict[str, list[tuple[str, str]]]) -> str:
    counts = _status_counts(report.trials)
    excluded = len(report.trials) - counts["finished"]
    lines = _header_md(report)
    lines += ["## Findings", ""] + [f"- {line}" for line in findings(report)]
    scope = (
        f"Aggregates use the {counts['finished']} finished trial(s) only; the {excluded} other trial(s) "
        "are excluded (listed under *Excluded trials*)."
        if excluded
        else "Every trial finished and enters the aggregates."
    )
    lines += ["", scope, ""]

    for key in report.factors:
        base = f"{key}={fmt_value(report.baseline[key])}"
        best = "highest" if report.objective.better == "max" else "lowest"
        lines += [f"## Effect of `{key}`", ""]
        if len(report.effects[key][PAIRED_METRICS[0].column]):
            partner = _partner(report, key, f"trial that has {base} and the same other keys and seed")
            lines += [
                f"Paired effect vs the baseline {base}: each finished trial with another {key} value is paired "
                f"with the finished {partner}; the table gives the "
                "mean of the differences (value − baseline) and a Student-t 95 % confidence interval over the "
                "pairs. An interval that excludes 0 is a real effect; its width covers seed noise and any "
                f"change of the effect across the other keys' values.{_run_level_note(report, key)}",
                "",
                _paired_table(report, key),
                "",
            ]
        lines += [
            "Per-value means, not effects: mean ± sample std (ddof=1; — for a single trial) over finished "
            "trials with each value, all other keys and seeds pooled, so they also carry the other keys' "
            f"effects. Δ = difference of these means vs {base}: accuracy in percentage points, others in "
            f"percent. Bold: the best value per column (for {report.objective.label}, the sweep's metric, the "
            f"{best}). {memory_note(report)}",
            "",
            _factor_table(report, key),
            "",
        ]
        if report.breakdown:
            lines += [
                "Step-time breakdown (seconds per epoch, mean ± std):",
                "",
                _factor_breakdown_table(report, key),
                "",
            ]
        lines += [f"![{caption}]({file})" for file, caption in plots.get(key, [])]
        lines += [""]

    lines += [
        "## Trials",
        "",
        _trial_table(report),
        "",
        f"Accuracies are at the last logged epoch unless marked best; {_gap_note(report)}; time = sum of epoch "
        "times; time/epoch and samples/s are means over logged epochs; eff. batch = batch_size × accum_steps. "
        f"{train_metrics_note(report)} {memory_note(report)}",
        "",
    ]
    if report.breakdown:
        lines += [
            "### Step-time breakdown",
            "",
            "Mean seconds per epoch (share of the epoch time):",
            "",
            _trial_breakdown_table(report),
            "",
        ]

    lines += ["## Overfitting", "", OVERFIT_RULE, "", train_metrics_note(report), ""]
    flagged = _overfit_sentences(report)
    lines += flagged if flagged else ["No trial is flagged."]
    lines += [""]

    excluded_lines = _excluded_lines(report)
    if excluded_lines:
        lines += ["## Excluded trials", "", "Not in the aggregates above:", ""] + excluded_lines + [""]

    lines += ["## Training curves", ""] + [f"![{caption}]({file})" for file, caption in plots.get("", [])] + [""]
    return "\n".join(lines)
