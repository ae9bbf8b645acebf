"""What model FLOPs utilisation (MFU) divides: the model's training FLOPs per image, counted once per trial, and the
device's peak FLOP/s at the trial's dtype, found once per worker process (a warm slot's later trials reuse it).

- FLOPs: torch.utils.flop_counter counts the matmuls and convolutions of one forward + backward (2 FLOPs per
  multiply-add; elementwise ops, norms and the optimizer are not counted, as in the MFU of PaLM, Chowdhery et al.
  2022), on a copy of the model so the trial's weights, gradients and batch-norm statistics stay untouched.
- Peak: a short square GEMM at the trial's dtype on the device, at the worker's thread count (on CPU) and with the
  process's numerics (TF32 off on CUDA: gpu.py); the best of a few runs. A measured peak of this machine, not a
  datasheet's: MFU then says how much of what this device does with a large GEMM the model gets.
"""

from __future__ import annotations

import copy
import functools
import time
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from ..core.config import TrainConfig
from .data import IMAGE_SHAPE
from .distributed import all_reduce

PROBE_SIZES = {"cpu": 1024, "cuda": 8192}  # n of the n x n GEMM: ~2 GFLOP on a CPU core, ~1 TFLOP on a GPU
PROBE_RUNS = 5  # after one warm-up run; the fastest counts (a busy machine only ever slows a run down)
# cfg.amp -> the dtype its convolutions and matmuls run in, and its name
DTYPES = {"off": (torch.float32, "fp32"), "fp16": (torch.float16, "fp16"), "bf16": (torch.bfloat16, "bf16")}


def training_flops_per_image(model: nn.Module) -> float:
    """FLOPs of one forward and backward pass of `model` per image (a training step's model FLOPs, optimizer not
    counted), counted on a copy with one image on the model's device. The copy runs in eval mode: the counted ops
    (convolutions, matmuls) are those of training, and neither dropout nor batch norm touches any state."""
    counted = copy.deepcopy(model).eval()
    device = next(counted.parameters()).device
    images = torch.zeros(1, *IMAGE_SHAPE, device=device)
    with FlopCounterMode(display=False) as counter:
        nn.functional.cross_entropy(counted(images), torch.zeros(1, dtype=torch.long, device=device)).backward()
    return float(counter.get_total_flops())


@dataclass(frozen=True)
class Peak:
    flops_per_s: float
    source: str  # how it was found, for people: "GEMM probe: 1024² fp32 on cpu, 1 thread"


def _probe(device: torch.device, dtype: torch.dtype, size: int) -> float:
    """FLOP/s of the fastest of PROBE_RUNS `size`² GEMMs (after a warm-up run); its own generator leaves the
    trial's random streams alone."""
    generator = torch.Generator(device).manual_seed(0)
    a, b = (torch.randn(size, size, device=device, generator=generator).to(dtype) for _ in range(2))
    best = float("inf")
    for _ in range(PROBE_RUNS + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        torch.mm(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best


@functools.cache
def _cached_peak(device: torch.device, amp: str, threads: int) -> Peak:
    size = PROBE_SIZES.get(device.type, PROBE_SIZES["cpu"])
    dtype, name = DTYPES[amp]
    where = f"{device.type}, {threads} thread{'s' if threads != 1 else ''}" if device.type == "cpu" else str(device)
    return Peak(_probe(device, dtype, size), f"GEMM probe: {size}² {name} on {where}")


def device_peak(device: torch.device, amp: str) -> Peak:
    """The peak FLOP/s of `device` at the dtype of `amp` (cfg.amp), measured once per process, dtype and torch
    thread count (a warm slot probes before its first trial only)."""
    return _cached_peak(device, amp, torch.get_num_threads() if device.type == "cpu" else 0)


def trial_peak(cfg: TrainConfig, devices: list[torch.device], world: int) -> Peak:
    """The peak of all the trial's devices at its dtype: each worker's (dp drives several GPUs), summed over the
    `world` workers. Collective."""
    own = device_peak(devices[0], cfg.amp)
    local = torch.tensor([own.flops_per_s * len(devices)], dtype=torch.float64, device=devices[0])
    return Peak(all_reduce(local).item(), own.source)  # the source of one device's peak: the same on each


def throughput(flops_per_image: float, samples: float, seconds: float, peak_flops_per_s: float) -> dict[str, float]:
    """An epoch's model FLOP/s (FLOPs per image x images trained / train time) and its MFU (that over the peak)."""
    flops_per_s = flops_per_image * samples / seconds
    return {"flops_per_s": flops_per_s, "mfu": flops_per_s / peak_flops_per_s}
