"""Peak memory of an epoch: torch's allocations on each GPU (and what its caching allocator reserved), or this
process's RSS on CPU, reduced over ranks. On GPUs neither number counts the CUDA context (a few hundred MB per
process and GPU that torch does not allocate): nvidia-smi shows more."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import resource
from collections.abc import Callable

import torch
import torch.distributed as dist

from ..core.errors import GPU_OOM_MARKS
from .distributed import all_reduce


def reset_peak_memory(devices: list[torch.device]) -> None:
    """Start a new peak: of torch's allocations on each GPU, or of this process's RSS on CPU."""
    for device in devices:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
    if devices[0].type == "cpu":
        reset_peak_rss()


def release_probe_memory(device: torch.device) -> None:
    """After a probe's tensors are freed (flops.py's, before a worker's first trial): hand their blocks in the CUDA
    caching allocator back to the driver and start its peaks anew, so that no trial's peak_mem_reserved_mb counts
    them. On CPU nothing to do: each epoch resets the RSS peak (reset_peak_memory)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def reset_peak_rss() -> None:
    """Linux: writing 5 to /proc/self/clear_refs resets the process's peak RSS (VmHWM) to its current RSS
    (proc(5)), so the peak is that of the epoch, not of the process's life (which would carry one trial's
    peak into the next in a reused process). Where /proc cannot be written the peak stays the lifetime's."""
    with contextlib.suppress(OSError):
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")


def _proc_status_mb(field: str) -> float | None:
    """A field of /proc/self/status in MB (the kernel writes kB); None where /proc cannot tell."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def rss_mb() -> float:
    """This process's resident set now (VmRSS); 0.0 where /proc cannot tell (the rise over it is then the peak)."""
    return _proc_status_mb("VmRSS") or 0.0


def resident_memory_mb(devices: list[torch.device]) -> list[float]:
    """What this worker holds now, measured as peak_memory_per_device_mb measures a peak: torch's allocations per
    GPU, or the process's RSS on CPU. Taken at a trial's start, so that its epochs can log their rise over it."""
    if devices[0].type == "cuda":
        return [torch.cuda.memory_allocated(device) / 2**20 for device in devices]
    return [rss_mb()]


def peak_rss_mb() -> float:
    """This process's peak RSS since the last reset_peak_rss (VmHWM), else since it started (ru_maxrss)."""
    peak = _proc_status_mb("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def peak_memory_per_device_mb(devices: list[torch.device]) -> list[float]:
    """GPU: the peak of bytes allocated by torch since the last reset, one number per GPU of this
    worker (dp drives several). CPU: one number, the peak RSS of this process since the last reset."""
    if devices[0].type == "cuda":
        return [torch.cuda.max_memory_allocated(device) / 2**20 for device in devices]
    return [peak_rss_mb()]


def peak_memory_mb(devices: list[torch.device]) -> float:
    """The largest peak of one of this worker's devices: what must fit on one GPU (or in one process)."""
    return max(peak_memory_per_device_mb(devices))


def peak_reserved_mb(devices: list[torch.device]) -> float | None:
    """GPU: the largest peak of bytes torch's caching allocator reserved (allocated and cached blocks) on one
    of this worker's GPUs since the last reset: what a neighbour on a shared GPU cannot have. CPU: None (the
    RSS already counts all a process holds)."""
    if devices[0].type != "cuda":
        return None
    return max(torch.cuda.max_memory_reserved(device) / 2**20 for device in devices)


def reduce_peak_memory(devices: list[torch.device], at_start: list[float]) -> tuple[float, float, float | None, float]:
    """(per worker, total, reserved, above start) over all ranks: the largest peak of any one device of any worker,
    the sum of the peaks of every device of every worker (what the whole run occupies), the largest
    peak_reserved_mb of any one GPU (None on CPU), and the largest rise of one device's peak over its level
    `at_start` (resident_memory_mb after run_trial's release_trial: what a warm slot's earlier trials left aside)."""
    peaks = peak_memory_per_device_mb(devices)
    reserved = peak_reserved_mb(devices)
    above_start = max(max(0.0, peak - start) for peak, start in zip(peaks, at_start))
    largest = torch.tensor([max(peaks), reserved or 0.0, above_start], device=devices[0], dtype=torch.float64)
    total = torch.tensor([sum(peaks)], device=devices[0], dtype=torch.float64)
    largest_peak, largest_reserved, largest_above_start = all_reduce(largest, dist.ReduceOp.MAX).tolist()
    return largest_peak, all_reduce(total).item(), None if reserved is None else largest_reserved, largest_above_start


class GpuOutOfMemoryError(RuntimeError):
    """A trial ran out of GPU memory. Final: the same trial on the same GPU runs out again, and on a shared GPU
    each retry squeezes the neighbours too, so the slot path does not retry it (its name carries "MemoryError":
    failure_status calls it oom)."""


@contextlib.contextmanager
def gpu_out_of_memory_is_final():
    """Raise every way of running out of GPU memory (torch's allocator, cuBLAS, cuDNN, NCCL) as one type,
    GpuOutOfMemoryError, with the original error as its cause. Used as run_trial's decorator."""
    try:
        yield
    except RuntimeError as error:
        if not isinstance(error, torch.OutOfMemoryError) and not any(mark in str(error) for mark in GPU_OOM_MARKS):
            raise
        raise GpuOutOfMemoryError(str(error).strip().splitlines()[0]) from error


def release_trial(devices: list[torch.device]) -> None:
    """Call before each trial (run_trial: its memory is measured from the level this leaves) and after each in a
    warm slot (and after dropping a failed trial's exception, whose traceback holds its tensors): collect what a
    finished trial left in reference cycles, hand the CUDA caching allocator's unused blocks back to the driver
    (where a neighbour on a shared GPU can have them; the next trial allocates its own again) and start its peaks
    anew, and return the C heap's free pages to the system (trim_host_heap). Without the trim a warm slot's RSS
    grew by up to 90 MB a trial (measured on CPU)."""
    gc.collect()  # first: the tensors it frees go back to the cache that empty_cache then releases
    gpus = [device for device in devices if device.type == "cuda"]
    if gpus:  # not yet run on a GPU (tests/test_device_state.py records the calls)
        torch.cuda.empty_cache()  # every GPU's cache
    for device in gpus:
        torch.cuda.reset_peak_memory_stats(device)
    trim_host_heap()


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none (macOS, musl)."""
    try:
        return ctypes.CDLL(None).malloc_trim  # the symbols this process loaded, the C library's among them
    except (OSError, AttributeError):
        return None


def trim_host_heap() -> bool:
    """Return the free pages of every malloc arena to the system (glibc's malloc_trim(0)): what a finished
    trial's tensors freed stays resident otherwise, and counts in the next trial's RSS. False where there is
    no malloc_trim (the RSS then keeps what the allocator keeps)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
