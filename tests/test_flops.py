"""MFU's parts (training/flops.py): FLOPs per image against a hand count, the epoch's FLOP/s and MFU, the peak probed
once per process, dtype and thread count."""

from __future__ import annotations

import weakref

import pytest
import torch
from torch import nn

from cifar_ray.core.config import TrainConfig
from cifar_ray.core.storage import StoragePath
from cifar_ray.training import flops
from cifar_ray.training.distributed import Worker
from cifar_ray.training.loop import run_trial, torch_threads

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


def test_an_architecture_is_counted_once_per_process_and_another_is_counted_anew(monkeypatch):
    """A warm slot's later trials of the same model reuse its count (a FlopCounterMode pass per trial was a quarter
    of the set-up between two trials); another width is another architecture."""
    from cifar_ray.training.models import build_model

    counted = []
    real = flops._count_flops
    monkeypatch.setattr(flops, "_count_flops", lambda model: counted.append(model) or real(model))
    monkeypatch.setattr(flops, "_COUNTS", {})
    narrow = [build_model(TrainConfig(width=8, seed=seed)) for seed in (0, 1)]
    wide = build_model(TrainConfig(width=16))
    assert flops.training_flops_per_image(narrow[0]) == flops.training_flops_per_image(narrow[1]) == real(narrow[1])
    assert len(counted) == 1
    assert flops.training_flops_per_image(wide) == real(wide) > real(narrow[0])
    assert len(counted) == 2


def test_flops_per_s_and_mfu_arithmetic():
    # 60 MFLOP per image, 1,000 images in 2 s: 30 GFLOP/s; against a 100 GFLOP/s peak, 30 %.
    assert flops.throughput(60e6, 1000, 2.0, 100e9) == pytest.approx({"flops_per_s": 30e9, "mfu": 0.3})


@pytest.fixture
def probes(monkeypatch):
    """Fake probes at set rates (FLOP/s by probe name), recording each call as (probe, device type, dtype)."""
    calls, rates = [], {"GEMM": 1e11, "convolution": 0.5e11}

    def fake(name):
        return lambda device, dtype: calls.append((name, device.type, dtype)) or rates[name]

    flops._cached_peak.cache_clear()
    monkeypatch.setattr(flops, "PROBES", {name: fake(name) for name in flops.PROBES})
    yield calls, rates
    flops._cached_peak.cache_clear()


def test_the_peak_is_probed_once_per_dtype_and_thread_count(probes):
    calls, _ = probes
    with torch_threads(1):
        first = flops.device_peak(CPU, "off")
        assert flops.device_peak(CPU, "off") is first and len(calls) == 2  # a warm slot's next trial: no probe
        assert first.flops_per_s == 1e11
        assert first.source == "GEMM probe: 1024² GEMM fp32 on cpu, 1 thread, the faster of GEMM and convolution"
        flops.device_peak(CPU, "bf16")
    with torch_threads(2):
        assert flops.device_peak(CPU, "off").source.endswith("2 threads, the faster of GEMM and convolution")
    dtypes = [torch.float32, torch.bfloat16, torch.float32]
    assert calls == [(probe, "cpu", dtype) for dtype in dtypes for probe in ("GEMM", "convolution")]


def test_the_peak_is_the_faster_probe_so_that_a_model_of_convolutions_stays_below_it(probes):
    # Some CPUs run convolutions faster than a GEMM: a GEMM-only peak then gave MFU 1.18. Here the GEMM probe is
    # the slower one, as it was there: the peak is the convolution's.
    _, rates = probes
    rates["convolution"] = 1.3e11
    peak = flops.device_peak(CPU, "off")
    assert peak.flops_per_s == 1.3e11 and peak.source.startswith("convolution probe: 3×3 convolution fwd+bwd")
    # an epoch at 1.2e11 FLOP/s: below this peak, above the GEMM's
    assert flops.throughput(1.2e8, 1000, 1.0, peak.flops_per_s)["mfu"] < 1 < 1.2e11 / rates["GEMM"]


def test_the_probes_memory_leaves_the_cuda_caching_allocator_before_a_trial(probes, monkeypatch):
    """The GPU probe's 8192² matrices (~0.8 GB) stayed cached and showed in the first trial's peak_mem_reserved_mb:
    once the probes return, their blocks go back to the driver and the allocator's peaks start anew."""
    kept = []

    def probe_holding_a_tensor(device, dtype):
        scratch = torch.ones(4)
        kept.append(weakref.ref(scratch))
        return 1e12

    released = []
    monkeypatch.setattr(flops, "PROBES", {"GEMM": probe_holding_a_tensor, "convolution": probe_holding_a_tensor})
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: released.append(("empty_cache", [r() for r in kept])))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: released.append(("reset", device)))
    gpu = torch.device("cuda", 0)
    assert flops.device_peak(gpu, "bf16").flops_per_s == 1e12
    assert released == [("empty_cache", [None, None]), ("reset", gpu)]  # the tensors were gone when it emptied


def test_ranks_sharing_one_gpu_count_its_peak_once(probes, monkeypatch):
    # Two ranks on one GPU (fractional GPUs, gloo): each probed the same GPU; its peak counts once, not per rank.
    monkeypatch.setattr(flops, "physical_device", lambda device: f"GPU-uuid-{device.index}")
    monkeypatch.setattr(flops, "gather_ranks", lambda mine: [mine, mine])  # the other rank holds the same GPU
    monkeypatch.setattr(flops.memory, "release_probe_memory", lambda device: None)  # no CUDA here
    cfg = TrainConfig(use_gpu="true", backend="gloo", workers=2)
    assert flops.trial_peak(cfg, [torch.device("cuda", 0)]).flops_per_s == 1e11


def test_a_trials_peak_sums_distinct_gpus_and_cpu_workers():
    one_gpu = {"devices": ["GPU-a"], "flops_per_s": 10.0}
    assert flops.summed_peak([one_gpu, one_gpu | {"flops_per_s": 12.0}]) == 12.0  # shared: the faster probe of it
    assert flops.summed_peak([one_gpu, {"devices": ["GPU-b"], "flops_per_s": 10.0}]) == 20.0
    assert flops.summed_peak([{"devices": ["GPU-a", "GPU-b"], "flops_per_s": 10.0}]) == 20.0  # dp: one rank, 2 GPUs
    cpu_worker = {"devices": [None], "flops_per_s": 5.0}
    assert flops.summed_peak([cpu_worker, cpu_worker]) == 10.0  # each CPU worker's own threads


@pytest.mark.parametrize("probe", sorted(flops.PROBES))
def test_a_real_probe_measures_a_plausible_cpu_rate(probe):
    with torch_threads(1):
        rate = flops.PROBES[probe](CPU, torch.float32)
    assert 1e9 < rate < 1e13  # a CPU core: more than 1 GFLOP/s, less than 10 TFLOP/s


def test_a_real_trials_logged_mfu_stays_at_most_1(tmp_path):
    """A tiny real training run on one thread: every epoch's MFU is at most 1 (no clamp: the peak is the faster of
    two probes of what the model runs)."""
    flops._cached_peak.cache_clear()
    cfg = TrainConfig(
        dataset="synthetic", train_subset=256, test_subset=64, train_eval_size=0, width=16, epochs=2, batch_size=64
    )
    epochs = []
    with torch_threads(1):
        run_trial(
            cfg, StoragePath.of(tmp_path / "trial"), Worker(0, 1, [CPU]), lambda metrics, _: epochs.append(metrics)
        )
    flops._cached_peak.cache_clear()
    assert [0 < epoch["mfu"] <= 1 for epoch in epochs] == [True, True], [epoch["mfu"] for epoch in epochs]
    assert epochs[0]["peak_source"].endswith("the faster of GEMM and convolution")
