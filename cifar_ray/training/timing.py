"""Where an epoch's time goes: the loop's phases timed lap by lap, DDP's all-reduce wait, their mean over ranks."""

from __future__ import annotations

import time

import torch
from torch import nn

from ..core.runlog import BREAKDOWN_KEYS
from .distributed import all_reduce


class PhaseTimer:
    """Wall time per phase of the training loop, accumulated lap by lap. On CPU, ops run
    synchronously and perf_counter is exact; on CUDA, events are recorded on the stream and read
    once when the epoch ends, so timing adds no synchronisation to the hot path."""

    def __init__(self, device: torch.device, enabled: bool = True):
        self.cuda = device.type == "cuda"
        self.enabled = enabled
        self.totals: dict[str, float] = {}
        self.pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self.mark = None

    def _now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start(self) -> None:
        if self.enabled:
            self.mark = self._now()

    def lap(self, phase: str) -> None:
        """The time since the previous lap (or start) is spent in `phase`."""
        if not self.enabled:
            return
        now = self._now()
        if self.cuda:
            self.pending.append((phase, self.mark, now))
        else:
            self.totals[phase] = self.totals.get(phase, 0.0) + now - self.mark
        self.mark = now

    def seconds(self) -> dict[str, float]:
        if self.pending:
            torch.cuda.synchronize()
            for phase, begin, end in self.pending:
                self.totals[phase] = self.totals.get(phase, 0.0) + begin.elapsed_time(end) / 1000
            self.pending.clear()
        return dict(self.totals)


def allreduce_wait_per_step(model: nn.Module) -> float:
    """Seconds per synchronised step that backward waits on DDP's gradient all-reduce beyond the
    compute it overlaps with, from DDP's own runtime statistics (torch samples the first
    iterations and every 100th; a private API, so 0.0 when absent)."""
    try:
        stats = model._get_ddp_logging_data()  # type: ignore[operator]
        return max(0.0, stats["avg_backward_comm_time"] - stats["avg_backward_compute_comm_overlap_time"]) / 1e9
    except (AttributeError, KeyError, RuntimeError):
        return 0.0


def reduce_time_breakdown(
    phases: dict[str, float], allreduce_wait: float, eval_time: float, world: int, device: torch.device
) -> dict[str, float]:
    """The epoch's seconds by BREAKDOWN_KEYS, each the mean over ranks. Collective. The all-reduce wait (at most the
    forward+backward phase it was spent in) is taken out of that phase's time, so compute is what remains."""
    allreduce = min(allreduce_wait, phases.get("forward_backward", 0.0))
    breakdown = torch.tensor(
        [
            phases.get("data", 0.0),
            phases.get("forward_backward", 0.0) - allreduce,
            allreduce,
            phases.get("optimizer", 0.0),
            eval_time,
        ],
        dtype=torch.float64,
        device=device,
    )
    return dict(zip(BREAKDOWN_KEYS, (all_reduce(breakdown) / world).tolist()))
