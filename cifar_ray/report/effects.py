"""The report's typed answers: one `Effect` per comparison (a factor's value against its baseline, on one metric of
metrics.COMPARED, pooled over the other factors or in one cell of them), with the verdict report/judge.py gave it and
why. `report --format json` writes them as its `effects` list (Effect.record); every verdict the Markdown states is
the verdict of one of them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

# The verdicts, each a value of Effect.verdict (docs/report.md says what each means).
DIFFERS = "differs"  # the interval the verdict used excludes no change, and leaves the equivalence band
EQUIVALENT = "equivalent"  # inside the equivalence band (two one-sided tests)
NO_PRACTICAL = "no practical difference"  # a change the data show, but its whole interval is inside the band
OPEN = "not conclusive"  # judged, neither of the above
NO_VERDICT = "no verdict"  # too few pairs (or degrees of freedom) to judge by
DEPENDS = "depends"  # the effect differs between cells of the other factors: see the per-cell effects
FAILED = "failed"  # the value's every trial failed, diverged or ran out of memory: nothing to compare
UNFAIR = "unfair"  # pairs that set a trial that shared a device against one that ran alone
NO_PAIRS = "no pairs"  # no matched pair yet (trials unfinished, or not planned)
VERDICTS = (DIFFERS, EQUIVALENT, NO_PRACTICAL, OPEN, NO_VERDICT, DEPENDS, FAILED, UNFAIR, NO_PAIRS)
Verdict = Literal[
    "differs",
    "equivalent",
    "no practical difference",
    "not conclusive",
    "no verdict",
    "depends",
    "failed",
    "unfair",
    "no pairs",
]
# Settle records written before the verdicts had these names (sweep.json's looks): old name -> verdict.
LEGACY_VERDICTS = {"CI excludes 0": DIFFERS}


@dataclass(frozen=True)
class Interval:
    """The interval a verdict used, on the effect's scale (pp or ratio): `level` its coverage (0.95, 0.90 for an
    equivalence at 5 %), `label` what set it (`95 % CI`, `97.5 % CI, Holm`, `90 % CI, equivalence (TOST)`)."""

    low: float
    high: float
    level: float
    label: str

    def record(self) -> dict:
        return {"low": _number(self.low), "high": _number(self.high), "level": self.level, "label": self.label}


@dataclass(frozen=True)
class Effect:
    """`factor`=`value` against `baseline` on `metric` (a name of metrics.COMPARED): `estimate` a difference in pp
    (unit "pp") or a ratio value / baseline (unit "ratio"), from `pairs` matched pairs; `pairs_lost` planned pairs
    that did not finish, `lost_why` what removed them; `cell` the other factors' values held fixed ({} when pooled
    over them); `depends_on` the factors a "depends" verdict names."""

    metric: str
    factor: str
    value: Any
    baseline: Any
    cell: dict[str, Any]
    pairs: int
    pairs_lost: int
    lost_why: str
    estimate: float
    unit: Literal["pp", "ratio"]
    interval: Interval | None
    verdict: Verdict
    reason: str
    depends_on: tuple[str, ...] = field(default=())

    def record(self) -> dict:
        """The JSON record (`report --format json`'s `effects`): exactly its documented fields."""
        return {
            "metric": self.metric,
            "factor": self.factor,
            "value": self.value,
            "baseline": self.baseline,
            "cell": dict(self.cell),
            "pairs": self.pairs,
            "pairs_lost": {"count": self.pairs_lost, "why": self.lost_why},
            "estimate": _number(self.estimate),
            "unit": self.unit,
            "interval": self.interval.record() if self.interval else None,
            "verdict": self.verdict,
            "reason": self.reason,
        }


def _number(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None
