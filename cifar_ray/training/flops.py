"""What model FLOPs utilisation (MFU) divides: the model's training FLOPs per image, counted once per trial, and the
device's peak FLOP/s at the trial's dtype, found once per worker process (a warm slot's later trials reuse it).

- FLOPs: torch.utils.flop_counter counts the matmuls and convolutions of one forward + backward (2 FLOPs per
  multiply-add; elementwise ops, norms and the optimizer are not counted, as in the MFU of PaLM, Chowdhery et al.
  2022), on a copy of the model so the trial's weights, gradients and batch-norm statistics stay untouched.
- Peak: the faster of two short probes on the device at the trial's dtype, at the worker's thread count (on CPU)
  and with the process's numerics (TF32 off on CUDA: gpu.py), each the best of a few runs: a square GEMM, and the
  forward and backward of a 3x3 convolution laid out as the loop lays out its tensors (on some CPUs convolutions
  run faster than a GEMM, and a peak below what the model reaches gave MFU above 1). A measured peak of this
  machine, not a datasheet's: MFU then says how much of what this device does with its fastest dense kernels the
  model gets. The peak's source names the probe that set it.
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from ..core.config import TrainConfig
from . import memory
from .data import IMAGE_SHAPE
from .distributed import gather_ranks

PROBE_SIZES = {"cpu": 1024, "cuda": 8192}  # n of the n x n GEMM: ~2 GFLOP on a CPU core, ~1 TFLOP on a GPU
# (batch, channels in and out, side) of the 3x3 convolution probe: ~4 GFLOP forward + backward on a CPU, ~0.9 TFLOP on
# a GPU; channels as a CIFAR network's wider layers have them (on CPU a 64-channel probe ran slower than resnet9's own
# layers, and MFU came out above 1)
CONV_PROBES = {"cpu": (16, 128, 16), "cuda": (256, 256, 32)}
PROBE_RUNS = 5  # after one warm-up run; the fastest counts (a busy machine only ever slows a run down)
# cfg.amp -> the dtype its convolutions and matmuls run in, and its name
DTYPES = {"off": (torch.float32, "fp32"), "fp16": (torch.float16, "fp16"), "bf16": (torch.bfloat16, "bf16")}


def training_flops_per_image(model: nn.Module) -> float:
    """FLOPs of one forward and backward pass of `model` per image (a training step's model FLOPs, optimizer not
    counted), counted on a copy with one image on the model's device. The copy runs in eval mode: the counted ops
    (convolutions, matmuls) are those of training, and neither dropout nor batch norm touches any state. Counted
    once per architecture in a process: a warm slot's later trials of the same model reuse the count."""
    # The key: the model's class and its repr, which names every layer with its sizes (the forward's code is its
    # classes'), and the device it runs on.
    key = (f"{type(model).__module__}.{type(model).__qualname__}", repr(model), next(model.parameters()).device.type)
    if key not in _COUNTS:
        _COUNTS[key] = _count_flops(model)
    return _COUNTS[key]


_COUNTS: dict[tuple[str, str, str], float] = {}  # a process's counts by architecture (training_flops_per_image)


def _count_flops(model: nn.Module) -> float:
    counted = copy.deepcopy(model).eval()
    device = next(counted.parameters()).device
    images = torch.zeros(1, *IMAGE_SHAPE, device=device)
    with FlopCounterMode(display=False) as counter:
        nn.functional.cross_entropy(counted(images), torch.zeros(1, dtype=torch.long, device=device)).backward()
    return float(counter.get_total_flops())


@dataclass(frozen=True)
class Peak:
    flops_per_s: float
    source: str  # how it was found, for people: "GEMM probe: 1024² GEMM fp32 on cpu, 1 thread, the faster of ..."


def _best_rate(device: torch.device, flops: float, run: Callable[[], object]) -> float:
    """FLOP/s of the fastest of PROBE_RUNS runs of `run` (`flops` each), after a warm-up run."""
    best = float("inf")
    for _ in range(PROBE_RUNS + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - started)
    return flops / best


def _random(device: torch.device, dtype: torch.dtype, *shape: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(*shape, device=device, generator=generator).to(dtype)


def _gemm_rate(device: torch.device, dtype: torch.dtype) -> float:
    """FLOP/s of a PROBE_SIZES n x n GEMM; its own generator leaves the trial's random streams alone."""
    size = PROBE_SIZES.get(device.type, PROBE_SIZES["cpu"])
    generator = torch.Generator(device).manual_seed(0)
    a, b = (_random(device, dtype, size, size, generator=generator) for _ in range(2))
    return _best_rate(device, 2 * size**3, lambda: torch.mm(a, b))


def _conv_rate(device: torch.device, dtype: torch.dtype) -> float:
    """FLOP/s of the forward and backward (input and weight gradients) of a CONV_PROBES 3x3 convolution in
    loop.MEMORY_FORMAT (channels_last), its FLOPs counted as the model's are (FlopCounterMode)."""
    batch, channels, side = CONV_PROBES.get(device.type, CONV_PROBES["cpu"])
    generator = torch.Generator(device).manual_seed(0)
    images = _random(device, dtype, batch, channels, side, side, generator=generator)
    weight = _random(device, dtype, channels, channels, 3, 3, generator=generator)
    images, weight = (t.contiguous(memory_format=torch.channels_last).requires_grad_() for t in (images, weight))

    def run() -> None:
        out = nn.functional.conv2d(images, weight, padding=1)
        images.grad, weight.grad = torch.autograd.grad(out, (images, weight), torch.ones_like(out))

    with FlopCounterMode(display=False) as counter:
        run()
    return _best_rate(device, counter.get_total_flops(), run)


PROBES = {"GEMM": _gemm_rate, "convolution": _conv_rate}


@functools.cache
def _cached_peak(device: torch.device, amp: str, threads: int) -> Peak:
    dtype, name = DTYPES[amp]
    try:
        rates = {probe: rate(device, dtype) for probe, rate in PROBES.items()}
    finally:
        memory.release_probe_memory(device)  # the probes' tensors are gone: none of their blocks stays cached
    fastest = max(rates, key=rates.get)
    size = PROBE_SIZES.get(device.type, PROBE_SIZES["cpu"])
    batch, channels, side = CONV_PROBES.get(device.type, CONV_PROBES["cpu"])
    shapes = {"GEMM": f"{size}² GEMM", "convolution": f"3×3 convolution fwd+bwd, {batch}×{channels}×{side}²"}
    where = f"{device.type}, {threads} thread{'s' if threads != 1 else ''}" if device.type == "cpu" else str(device)
    return Peak(
        rates[fastest], f"{fastest} probe: {shapes[fastest]} {name} on {where}, the faster of {' and '.join(PROBES)}"
    )


def device_peak(device: torch.device, amp: str) -> Peak:
    """The peak FLOP/s of `device` at the dtype of `amp` (cfg.amp), measured once per process, dtype and torch
    thread count (a warm slot probes before its first trial only)."""
    return _cached_peak(device, amp, torch.get_num_threads() if device.type == "cpu" else 0)


def physical_device(device: torch.device) -> str | None:
    """What tells one physical GPU from another across processes (its UUID); None on CPU, where each worker's
    peak is that of its own threads."""
    return str(torch.cuda.get_device_properties(device).uuid) if device.type == "cuda" else None


def summed_peak(every: list[dict]) -> float:
    """The peak of a trial's devices from every rank's {"devices": physical_device of each, "flops_per_s": its
    peak}: each physical GPU counted once (ranks sharing a GPU probed the same one; the fastest probe of it
    counts), each CPU worker's once per rank."""
    gpus: dict[str, float] = {}
    total = 0.0
    for rank in every:
        for key in rank["devices"]:
            if key is None:
                total += rank["flops_per_s"]
            else:
                gpus[key] = max(gpus.get(key, 0.0), rank["flops_per_s"])
    return total + sum(gpus.values())


def trial_peak(cfg: TrainConfig, devices: list[torch.device]) -> Peak:
    """The peak of all the trial's devices at its dtype: each worker's (dp drives several GPUs), over all ranks,
    each physical device once (summed_peak). Collective."""
    own = device_peak(devices[0], cfg.amp)
    every = gather_ranks({"devices": [physical_device(d) for d in devices], "flops_per_s": own.flops_per_s})
    return Peak(summed_peak(every), own.source)  # the source of one device's peak: the same on each


def throughput(flops_per_image: float, samples: float, seconds: float, peak_flops_per_s: float) -> dict[str, float]:
    """An epoch's model FLOP/s (FLOPs per image x images trained / train time) and its MFU (that over the peak)."""
    flops_per_s = flops_per_image * samples / seconds
    return {"flops_per_s": flops_per_s, "mfu": flops_per_s / peak_flops_per_s}
