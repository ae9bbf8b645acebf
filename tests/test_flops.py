"""MFU's parts (training/flops.py): FLOPs per image against a hand count, the epoch's FLOP/s and MFU, the peak probed
once per process, dtype and thread count."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cifar_ray.training import flops
from cifar_ray.training.loop import torch_threads

CPU = torch.device("cpu")


def test_flops_per_image_of_a_tiny_model_match_a_hand_count():
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.Flatten(), nn.Linear(4 * 32 * 32, 10))
    conv = 2 * (3 * 3 * 3) * 4 * (32 * 32)  # 2 FLOPs per multiply-add: 27 per output value, 4 x 32 x 32 outputs
    linear = 2 * (4 * 32 * 32) * 10
    # Backward: the conv's weight gradient only (its input, the images, needs none); the linear layer's weight
    # gradient and its input gradient (for the conv), each as many FLOPs as its forward.
    assert flops.training_flops_per_image(model) == conv + conv + 3 * linear


def test_counting_leaves_the_model_as_it_was():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(10))
    model(torch.zeros(2, 3, 32, 32))  # materialise the lazy layer
    model.train()
    before = {name: value.clone() for name, value in model.state_dict().items()}
    flops.training_flops_per_image(model)
    assert model.training and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[name], value) for name, value in model.state_dict().items())


def test_flops_per_s_and_mfu_arithmetic():
    # 60 MFLOP per image, 1,000 images in 2 s: 30 GFLOP/s; against a 100 GFLOP/s peak, 30 %.
    assert flops.throughput(60e6, 1000, 2.0, 100e9) == pytest.approx({"flops_per_s": 30e9, "mfu": 0.3})


def test_the_peak_is_probed_once_per_dtype_and_thread_count(monkeypatch):
    flops._cached_peak.cache_clear()
    probes = []
    monkeypatch.setattr(flops, "_probe", lambda device, dtype, size: probes.append((dtype, size)) or 1e11)
    with torch_threads(1):
        first = flops.device_peak(CPU, "off")
        assert flops.device_peak(CPU, "off") is first and len(probes) == 1  # a warm slot's next trial: no probe
        assert first.flops_per_s == 1e11 and first.source == "GEMM probe: 1024² fp32 on cpu, 1 thread"
        flops.device_peak(CPU, "bf16")
    with torch_threads(2):
        assert flops.device_peak(CPU, "off").source.endswith("2 threads")
    assert probes == [(torch.float32, 1024), (torch.bfloat16, 1024), (torch.float32, 1024)]
    flops._cached_peak.cache_clear()


def test_a_real_probe_measures_a_plausible_cpu_peak():
    flops._cached_peak.cache_clear()
    with torch_threads(1):
        peak = flops.device_peak(CPU, "off")
    flops._cached_peak.cache_clear()
    assert 1e9 < peak.flops_per_s < 1e13  # a CPU core: more than 1 GFLOP/s, less than 10 TFLOP/s
