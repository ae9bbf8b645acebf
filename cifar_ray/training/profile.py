"""`--profile`: torch.profiler over a few steps of the first epoch a trial trains, after its warm-up steps, on rank 0.
Rank 0 writes a Chrome trace (runlog.PROFILE_TRACE_FILE: opens in Perfetto and TensorBoard's profiler) and beside it
a small summary, the top operators by self time (runlog.PROFILE_FILE), which the report reads instead of the trace.
Without --profile nothing here runs: the loop's steps are not wrapped."""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TypeVar

import torch
from torch.autograd import DeviceType

from ..core import runlog
from ..core.storage import StoragePath

SKIPPED_STEPS = 2  # the first steps pay the warm-up (first-touch allocations, kernel plans, DDP's bucket rebuild)
PROFILER_WARMUP_STEPS = 1  # traced but discarded: the profiler's own start-up settles
ACTIVE_STEPS = 3  # the steps recorded
TOP_OPERATORS = 20  # operators kept in the summary, by self time

Step = TypeVar("Step")


def profile_schedule(steps: int) -> tuple[int, int, int]:
    """(skipped, profiler warm-up, recorded) steps of an epoch of `steps`: fewer where the epoch is short, at least
    one recorded."""
    skipped = min(SKIPPED_STEPS, max(0, steps - 1))
    warmup = min(PROFILER_WARMUP_STEPS, max(0, steps - skipped - 1))
    return skipped, warmup, max(1, min(ACTIVE_STEPS, steps - skipped - warmup))


def counted_events(averages, on_device: bool) -> list:
    """The events of key_averages() whose self times add up to the recorded time once: on CUDA the device's own
    events (kernels, copies, memsets; their self time is their run time), not the CPU ops that launched them (whose
    self device time counts the same kernels again); on CPU the CPU ops. Either way no user annotation
    (`ProfilerStep#N`, record_function ranges): an annotation encloses operators and counts their time again."""
    return [
        event
        for event in averages
        if (event.device_type != DeviceType.CPU) == on_device and not getattr(event, "is_user_annotation", False)
    ]


def operator_summary(averages, device: torch.device, epoch: int, schedule: tuple[int, int, int]) -> dict:
    """runlog.PROFILE_FILE's content from the profiler's key_averages(): the top operators by self time (on CUDA
    the device's kernels, elsewhere the CPU's operators: counted_events), each with its calls, self and total time
    in seconds; `time` says which time it is, `self_s_all` is its sum over every counted event."""
    on_device = device.type == "cuda"
    sort_key = "self_device_time_total" if on_device else "self_cpu_time_total"
    events = sorted(counted_events(averages, on_device), key=lambda event: getattr(event, sort_key), reverse=True)
    operators = []
    for event in events[:TOP_OPERATORS]:
        operator = {
            "name": event.key,
            "calls": event.count,
            "self_s": getattr(event, sort_key) / 1e6,  # the profiler counts microseconds
            "total_s": (event.device_time_total if on_device else event.cpu_time_total) / 1e6,
        }
        operators.append(operator)
    skipped, warmup, recorded = schedule
    return {
        "epoch": epoch,
        "skipped_steps": skipped + warmup,
        "steps": recorded,
        "time": "GPU time of the CUDA kernels" if on_device else "CPU self time of the operators",
        "self_s_all": sum(getattr(event, sort_key) for event in events) / 1e6,
        "operators": operators,
        "trace": runlog.PROFILE_TRACE_FILE,
    }


def profiled_steps(
    steps: Iterable[Step], steps_per_epoch: int, trial_dir: StoragePath, device: torch.device, epoch: int
) -> Iterator[Step]:
    """`steps` as the loop takes them, profiled on the schedule of profile_schedule(steps_per_epoch); when the
    recorded steps end, the trace and its summary are written to `trial_dir`. A step ends when the loop asks for the
    next one, so each recorded step holds its data, forward, backward and optimizer."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    schedule = profile_schedule(steps_per_epoch)
    skipped, warmup, recorded = schedule

    def save(profiler: torch.profiler.profile) -> None:
        with tempfile.TemporaryDirectory() as scratch:
            trace = Path(scratch) / runlog.PROFILE_TRACE_FILE
            profiler.export_chrome_trace(str(trace))
            (StoragePath.of(trial_dir) / runlog.PROFILE_TRACE_FILE).write_bytes(trace.read_bytes())
        summary = operator_summary(profiler.key_averages(), device, epoch, schedule)
        runlog.write_json(StoragePath.of(trial_dir) / runlog.PROFILE_FILE, summary)

    with torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(wait=skipped, warmup=warmup, active=recorded, repeat=1),
        on_trace_ready=save,
    ) as profiler:
        for step in steps:
            yield step
            profiler.step()
