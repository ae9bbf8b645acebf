"""Which trials shared a GPU, so that their times include a neighbour's contention: by design (trial.json's
system.gpu_share below 1: its ranks hold a fraction of a GPU, beside its own ranks or another trial's) or seen
(two trials on one GPU UUID whose started_unix..finished_unix spans overlap). CPU trials record neither."""

from __future__ import annotations

from collections.abc import Sequence

from ..core.runlog import TrialLog


def _gpus(trial: TrialLog) -> set[str]:
    return {uuid for uuids in (trial.meta.get("system") or {}).get("gpu_uuids") or [] for uuid in uuids}


def _overlap(a: TrialLog, b: TrialLog) -> bool:
    spans = [(t.meta.get("started_unix"), t.meta.get("finished_unix")) for t in (a, b)]
    if any(start is None or end is None for start, end in spans):
        return False
    (a_start, a_end), (b_start, b_end) = spans
    return a_start < b_end and b_start < a_end


def gpu_neighbours(trials: Sequence[TrialLog]) -> dict[str, str]:
    """Trial name -> why its times include a neighbour's contention ("gpu_share 0.5", "beside t003 on one
    GPU"), for the trials that shared a GPU; the others are absent."""
    why = {}
    for trial in trials:
        share = (trial.meta.get("system") or {}).get("gpu_share")
        gpus = _gpus(trial)
        beside = [t.name for t in trials if t is not trial and gpus & _gpus(t) and _overlap(trial, t)]
        reasons = ([f"gpu_share {share:g}"] if share is not None and share < 1 else []) + (
            [f"beside {', '.join(beside)} on one GPU"] if beside else []
        )
        if reasons:
            why[trial.name] = "; ".join(reasons)
    return why
