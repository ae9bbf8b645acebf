"""Values and numbers as the report shows them: config values as a user writes them, numbers to about three
significant digits, accuracies as percentages (the frames keep fractions 0-1), differences with their sign, dates
and durations. A missing value shows as —."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd

from ..core.text import precise_duration
from .metrics import Metric


def fmt_value(value: Any) -> str:
    """A config value as a user writes it: true/false, 0.001, resnet9."""
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value)).lower()
    if isinstance(value, float):
        if math.isnan(value):
            return "—"
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(float(value))
    if value is None:
        return "—"
    return str(value)


def value_key(value: Any) -> tuple:
    """A config value as a typed key, for pairing and grouping trials: 64 and 64.0 (a column pandas made float) are
    one key; True and 1, None and NaN, "64" and 64 are two."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, (int, float)):
        return ("nan",) if isinstance(value, float) and math.isnan(value) else ("number", float(value))
    if value is None:
        return ("none",)
    if isinstance(value, dict):
        return ("map", tuple(sorted((str(k), value_key(v)) for k, v in value.items())))
    if isinstance(value, (list, tuple)):
        return ("list", tuple(value_key(v) for v in value))
    return (type(value).__name__, value)


def same_value(a: Any, b: Any) -> bool:
    """Equal as config values (value_key: 64 matches 64.0, "64" does not)."""
    return value_key(a) == value_key(b)


def values_label(row: pd.Series | dict, keys: Sequence[str]) -> str:
    """`k=v, k=v` for `keys`, each value as a user writes it."""
    return ", ".join(f"{k}={fmt_value(row[k])}" for k in keys)


def decimal_places(x: float) -> int:
    """Decimals that show `x` with about three significant digits (none at 1000 and above)."""
    x = abs(x)
    if x >= 1000:
        return 0
    if x >= 100:
        return 1
    if x >= 1 or x == 0:
        return 2
    return min(-math.floor(math.log10(x)) + 2, 12)


def is_missing(x: Any) -> bool:
    return x is None or x is pd.NA or (isinstance(x, float) and math.isnan(x))


def fmt_num(x: Any, like: float | None = None) -> str:
    """A number rounded for reading; `like` sets the decimals (a std shown as its mean is)."""
    if is_missing(x):
        return "—"
    x = float(x)
    places = decimal_places(x if is_missing(like) else like)
    return f"{x:,.{places}f}"


def fmt_pct(fraction: Any) -> str:
    return "—" if is_missing(fraction) else f"{100 * fraction:.2f}"


def fmt_loss(x: Any) -> str:
    return "—" if is_missing(x) else f"{x:.4f}"


def fmt_int(x: Any) -> str:
    return "—" if is_missing(x) else str(int(x))


def fmt_duration(seconds: Any) -> str:
    """A measured duration (core.text.precise_duration): `1 min 35 s`."""
    return "—" if is_missing(seconds) else precise_duration(seconds)


def fmt_mean_std(metric: Metric | None, mean: float, std: float) -> str:
    """`mean ± std`, both to the same decimals; the std of a single trial is shown as —."""
    if math.isnan(mean):
        return "—"
    if metric is not None and metric.kind == "acc":
        return f"{fmt_pct(mean)} ± {fmt_pct(std) if not math.isnan(std) else '—'}"
    return f"{fmt_num(mean)} ± {fmt_num(std, like=mean) if not math.isnan(std) else '—'}"


def fmt_metric(metric: Metric, x: Any) -> str:
    return fmt_pct(x) if metric.kind == "acc" else fmt_loss(x) if metric.kind == "loss" else fmt_num(x)


def best_phrase(metric: Metric) -> str:
    return f"{'highest' if metric.better == 'max' else 'lowest'} {metric.label}"


def fmt_signed(metric: Metric, x: float, like: float) -> str:
    """A difference with its sign: percentage points for accuracies, else to the decimals `like` needs."""
    return f"{100 * x:+.2f}" if metric.kind == "acc" else f"{x:+,.{decimal_places(like)}f}"


def paired_parts(
    metric: Metric, row: pd.Series, bounds: tuple[str, str] = ("ci_low", "ci_high")
) -> tuple[str, str, str]:
    """Mean paired difference and its CI bounds (the columns `bounds`), to the same decimals (the CI bounds are —
    below two pairs)."""
    columns = ("mean_diff", *bounds)
    like = max((abs(row[c]) for c in columns if not is_missing(row[c])), default=0.0)
    return tuple("—" if is_missing(row[c]) else fmt_signed(metric, row[c], like) for c in columns)


def short_key(key: str) -> str:
    return key.removeprefix("time_").removesuffix("_s")


def last_line(text: Any) -> str:
    if is_missing(text):  # None, or NaN once in a frame
        return ""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    line = lines[-1] if lines else ""
    return line if len(line) <= 200 else line[:197] + "..."


def fmt_date(text: str | None) -> str:
    if not text:
        return "unknown"
    try:
        dt = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return str(text)
    return dt.strftime("%Y-%m-%d %H:%M") + (dt.strftime(" (UTC%z)") if dt.tzinfo else "")
