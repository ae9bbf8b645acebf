"""Which trials shared a device with other trials, so that their times include a neighbour's contention. A GPU
trial: by design (trial.json's system.gpu_share below 1: its ranks hold a fraction of a GPU, beside its own ranks or
another trial's) or seen (two trials on one GPU UUID whose spans overlap). A CPU trial: seen, another CPU trial of
another slot on one of its nodes whose span overlaps (concurrent trials share the node's cores, caches and memory
bandwidth, however Ray divides the CPUs). A span runs from started_unix to the last epoch's end (a warm slot takes
its next trial before the driver records the last one finished), else to finished_unix. Trials that recorded
neither node nor GPU nor times are never marked."""

from __future__ import annotations

from collections.abc import Sequence

from ..core.runlog import TrialLog


def _gpus(trial: TrialLog) -> set[str]:
    return {uuid for uuids in (trial.record.system or {}).get("gpu_uuids") or [] for uuid in uuids}


def _cpu_nodes(trial: TrialLog) -> set[str]:
    system = trial.record.system or {}
    return set(system.get("nodes") or []) if system.get("device_type") == "cpu" else set()


def _span(trial: TrialLog) -> tuple[float, float] | None:
    ends = [row.get("end_unix") for row in trial.epochs if isinstance(row.get("end_unix"), (int, float))]
    start, end = trial.record.started_unix, max(ends, default=trial.record.finished_unix)
    return None if start is None or end is None else (start, end)


def _overlap(a: TrialLog, b: TrialLog) -> bool:
    spans = [_span(a), _span(b)]
    if None in spans or (a.record.slot and a.record.slot == b.record.slot):
        return False  # one slot runs its trials one after another
    (a_start, a_end), (b_start, b_end) = spans
    return a_start < b_end and b_start < a_end


def shared_trials(trials: Sequence[TrialLog]) -> dict[str, str]:
    """Trial name -> why its times include a neighbour's contention ("gpu_share 0.5", "beside t003 on one GPU",
    "beside t001 on one node's CPUs"), for the trials that shared a device; the others are absent."""
    why = {}
    for trial in trials:
        share = (trial.record.system or {}).get("gpu_share")
        gpus, nodes = _gpus(trial), _cpu_nodes(trial)
        beside_gpu = [t.name for t in trials if t is not trial and gpus & _gpus(t) and _overlap(trial, t)]
        beside_cpu = [t.name for t in trials if t is not trial and nodes & _cpu_nodes(t) and _overlap(trial, t)]
        reasons = ([f"gpu_share {share:g}"] if share is not None and share < 1 else []) + (
            [f"beside {', '.join(beside_gpu)} on one GPU"] if beside_gpu else []
        )
        reasons += [f"beside {', '.join(beside_cpu)} on one node's CPUs"] if beside_cpu else []
        if reasons:
            why[trial.name] = "; ".join(reasons)
    return why
