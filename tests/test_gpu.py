"""What a GPU is set to and refused for (cifar_ray/training/gpu.py), and what trial.json records of it, on CPU:
torch.cuda's answers are monkeypatched (tests/helpers.py fake_gpus)."""

from __future__ import annotations

import pytest
import torch
from helpers import fake_gpus

from cifar_ray.core import sysinfo
from cifar_ray.core.config import TrainConfig
from cifar_ray.core.errors import ConfigError
from cifar_ray.training import gpu

T4, A100 = ("Tesla T4", (7, 5)), ("NVIDIA A100-SXM4-40GB", (8, 0))


def test_a_worker_refuses_bf16_on_its_own_gpu_when_older_than_ampere(monkeypatch):
    """On a cluster the CLI cannot see the GPUs: the worker refuses, in one line, from its own device."""
    fake_gpus(monkeypatch, A100, T4)
    bf16 = TrainConfig(amp="bf16", use_gpu="true")
    with pytest.raises(ConfigError) as error:
        gpu.check_amp_supported(bf16, torch.device("cuda", 1))
    assert str(error.value).startswith("amp=bf16 needs a GPU of compute capability 8.0 (Ampere) or newer, but Tesla T4")
    assert "\n" not in str(error.value)
    gpu.check_amp_supported(bf16, torch.device("cuda", 0))  # the A100 runs it
    gpu.check_amp_supported(TrainConfig(amp="fp16", use_gpu="true"), torch.device("cuda", 1))
    gpu.check_amp_supported(TrainConfig(amp="bf16"), torch.device("cpu"))
    assert gpu.bf16_refusal("GPU", (9, 0)) is None and gpu.bf16_refusal("GPU", (7, 0))


@pytest.fixture
def torch_flags():
    """Put torch's process-wide precision flags back as they were."""
    flags = (
        torch.backends.cuda.matmul.fp32_precision,
        torch.backends.cudnn.fp32_precision,
        torch.backends.cudnn.conv.fp32_precision,
        torch.backends.cudnn.rnn.fp32_precision,
        torch.backends.cudnn.benchmark,
    )
    yield
    matmul, cudnn, conv, rnn, torch.backends.cudnn.benchmark = flags
    torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.fp32_precision = matmul, cudnn
    torch.backends.cudnn.conv.fp32_precision, torch.backends.cudnn.rnn.fp32_precision = conv, rnn


def test_cuda_numerics_are_set_deliberately_and_recorded_for_the_workers_own_gpu(monkeypatch, torch_flags):
    """torch's defaults: TF32 for cuDNN convolutions (amp=off would not be fp32 on Ampere), no autotuning.
    The record names the worker's GPU (cuda:1), not the process's current device (GPU 0)."""
    fake_gpus(monkeypatch, A100, T4)
    gpu.set_cuda_numerics()
    info = gpu.device_info(torch.device("cuda", 1))
    assert info == {
        "device_type": "cuda",
        "device_name": "Tesla T4",
        "devices_per_worker": 1,
        "cuda_numerics": {
            "matmul_fp32_precision": "ieee",
            "cudnn_fp32_precision": "ieee",
            "cudnn_benchmark": True,
            "cudnn_deterministic": False,
        },
    }
    assert torch.backends.cudnn.rnn.fp32_precision == "ieee"
    cpu = gpu.device_info(torch.device("cpu"), 1)
    assert cpu == {"device_type": "cpu", "device_name": sysinfo.cpu_model(), "devices_per_worker": 1}
    assert gpu.device_info("cuda")["device_name"] == "NVIDIA A100-SXM4-40GB"  # a bare type: the current one
