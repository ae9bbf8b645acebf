"""Where an epoch's time goes: the loop's phases timed lap by lap, the gradient all-reduce wait, their mean over
ranks. The wait is measured per epoch on CPU (CommTimer times the DDP hook's futures; comm.py registers it); on
CUDA a future says nothing of when its NCCL work ends, so there it is DDP's own running estimate, logged under its
own key (runlog.ALLREDUCE_ESTIMATE_KEY) in place of runlog.ALLREDUCE_KEY."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch
from torch import nn

from ..core.runlog import ALLREDUCE_ESTIMATE_KEY, ALLREDUCE_KEY, BREAKDOWN_KEYS
from .distributed import all_reduce

_TIMER_ATTRIBUTE = "_cifar_ray_comm_timer"


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


class CommTimer:
    """Seconds of gradient communication backward did not overlap with computing gradients, summed over the
    synchronised steps since the last `take_seconds` (comm.py's docstring says what it counts). A step's record is
    closed when the next step's first bucket arrives, or when it is read: by then backward has waited for every
    future."""

    def __init__(self):
        self.lock = threading.Lock()  # futures complete in the backend's threads
        self.total = 0.0
        self._open_step()

    def _open_step(self) -> None:
        self.in_hooks, self.last_launch, self.last_done, self.step_ended = 0.0, None, None, False

    def _close_step(self) -> None:
        if self.last_launch is not None:
            self.total += self.in_hooks + max(0.0, (self.last_done or self.last_launch) - self.last_launch)
        self._open_step()

    def wrap(self, hook: Callable) -> Callable:
        def timed_hook(state, bucket):  # no annotations: DDP compares them to real classes, not strings
            entered = time.perf_counter()
            with self.lock:
                if self.step_ended:
                    self._close_step()
            future = hook(state, bucket)
            launched = time.perf_counter()
            with self.lock:
                self.in_hooks += launched - entered
                self.last_launch = launched
                self.step_ended = bucket.is_last()

            def completed(done):
                finished = time.perf_counter()
                with self.lock:
                    self.last_done = max(self.last_done or finished, finished)
                return done.value()

            return future.then(completed)

        return timed_hook

    def take_seconds(self) -> float:
        """The seconds since the previous call (every step's backward has returned), and start again from 0."""
        with self.lock:
            self._close_step()
            seconds, self.total = self.total, 0.0
        return seconds


def timed_comm_hook(ddp: nn.Module, hook: Callable) -> Callable:
    """`hook` timed by a CommTimer kept on `ddp` (where comm_timer finds it)."""
    timer = CommTimer()
    setattr(ddp, _TIMER_ATTRIBUTE, timer)
    return timer.wrap(hook)


def comm_timer(model: nn.Module) -> CommTimer | None:
    """The CommTimer registered on `model` (DDP, possibly inside torch.compile), else None."""
    model = getattr(model, "_orig_mod", model)
    return model.__dict__.get(_TIMER_ATTRIBUTE)


# DDP on CUDA: the sampled steps per epoch. DDP times its first ten iterations, then one in 100 by default, so the
# estimate of a short trial came from warm-up steps only (bucket rebuild, cuDNN autotuning). A sampled step waits
# for its CUDA timing events once (a host sync), so a few per epoch, not every step.
ALLREDUCE_SAMPLES_PER_EPOCH = 2


def sample_allreduce_every_epoch(model: nn.Module, steps_per_epoch: int) -> None:
    """Where the all-reduce wait is estimated (DDP without a CommTimer: on CUDA), make DDP time a step every
    steps_per_epoch / ALLREDUCE_SAMPLES_PER_EPOCH, so that every epoch holds steady-state samples."""
    if comm_timer(model) is None and hasattr(model, "_set_ddp_runtime_logging_sample_rate"):
        model._set_ddp_runtime_logging_sample_rate(max(1, steps_per_epoch // ALLREDUCE_SAMPLES_PER_EPOCH))


def allreduce_wait(model: nn.Module, steps: int) -> tuple[float, bool]:
    """(seconds, measured): what backward waited on the gradient all-reduce in this epoch's `steps` synchronised
    steps. Measured by the model's CommTimer (DDP on CPU; 0.0 without DDP: nothing to wait for); else (DDP on
    CUDA) estimated from DDP's runtime statistics: the wait of the last step it sampled (this epoch's, after
    sample_allreduce_every_epoch; not its running average, which holds the warm-up) times `steps` (a private
    API: 0.0 when absent)."""
    timer = comm_timer(model)
    if timer is not None:
        return timer.take_seconds(), True
    ddp_stats = getattr(model, "_get_ddp_logging_data", None)
    if ddp_stats is None:  # not DDP
        return 0.0, True
    try:
        stats = ddp_stats()
        per_step = max(0.0, stats["backward_comm_time"] - stats["backward_compute_comm_overlap_time"]) / 1e9
    except (KeyError, RuntimeError, TypeError):
        per_step = 0.0
    return per_step * steps, False


def reduce_time_breakdown(
    phases: dict[str, float],
    allreduce_wait: float,
    eval_time: float,
    world: int,
    device: torch.device,
    measured: bool = True,
) -> dict[str, float]:
    """The epoch's seconds by BREAKDOWN_KEYS, each the mean over ranks (an estimated all-reduce wait under
    ALLREDUCE_ESTIMATE_KEY instead). Collective. The all-reduce wait (at most the forward+backward phase it was
    spent in) is taken out of that phase's time, so compute is what remains."""
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
    keys = [ALLREDUCE_ESTIMATE_KEY if key == ALLREDUCE_KEY and not measured else key for key in BREAKDOWN_KEYS]
    return dict(zip(keys, (all_reduce(breakdown) / world).tolist()))
