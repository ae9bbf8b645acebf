"""What a GPU is set to and refused for, decided here once: the CUDA libraries' numerics and the GPUs too old
for an amp format.

Numerics (`set_cuda_numerics`, once per worker process, before its system info is recorded):
- TF32 off for fp32 matmuls and convolutions. torch enables TF32 for cuDNN convolutions by default, so on
  Ampere and newer `amp=off` would train in 10-bit mantissas, not fp32; here `amp` is the one precision
  knob: off is IEEE fp32, fp16/bf16 are autocast.
- cuDNN autotuning on (`cudnn.benchmark`): a trial's input shapes are fixed, so the one-off search per shape
  (in the first steps of epoch 1) buys the fastest convolutions for every later step. The algorithm it picks
  may differ between runs, and cuDNN's default kernels are not deterministic anyway (`cudnn.deterministic`
  stays off): CUDA runs of one seed agree to a tolerance, not bit for bit.
They are process-wide torch flags; trial.json records them as the worker has them (device_info).
"""

from __future__ import annotations

import torch

from ..core import sysinfo
from ..core.config import TrainConfig
from ..core.errors import ConfigError

FP32_PRECISION = "ieee"  # torch's fp32_precision for CUDA matmuls and cuDNN: no TF32
CUDNN_BENCHMARK = True
NUMERICS = "fp32 as IEEE fp32 (TF32 off), cuDNN autotuning on, as in the trials"  # for people: what a run had
# bf16 tensor cores start with Ampere (compute capability 8.0): older GPUs emulate bf16 slowly or fail in cuDNN.
BF16_MIN_CAPABILITY = (8, 0)


def set_cuda_numerics() -> None:
    """TF32 off, cuDNN autotuning on (the module's docstring says why); harmless without a GPU."""
    # torch's new precision API only: reading a legacy `allow_tf32` flag after it raises, mixing them is refused
    torch.backends.cuda.matmul.fp32_precision = FP32_PRECISION
    torch.backends.cudnn.fp32_precision = FP32_PRECISION  # convolutions and RNNs
    torch.backends.cudnn.benchmark = CUDNN_BENCHMARK


def bf16_refusal(name: str, capability: tuple[int, int]) -> str | None:
    """Why amp=bf16 cannot run on the GPU `name` of this compute capability, in one line; None if it can."""
    if tuple(capability) >= BF16_MIN_CAPABILITY:
        return None
    need = ".".join(map(str, BF16_MIN_CAPABILITY))
    return (
        f"amp=bf16 needs a GPU of compute capability {need} (Ampere) or newer, but {name} is "
        f"{capability[0]}.{capability[1]}: bf16 runs emulated or fails in cuDNN there; use amp=fp16 or amp=off"
    )


def check_amp_supported(cfg: TrainConfig, device: torch.device) -> None:
    """On a worker, before its trial builds anything: refuse (ConfigError, one line) an amp its GPU cannot run."""
    if cfg.amp == "bf16" and device.type == "cuda":
        refusal = bf16_refusal(torch.cuda.get_device_name(device), torch.cuda.get_device_capability(device))
        if refusal:
            raise ConfigError(refusal)


def check_local_gpus_for_bf16() -> None:
    """Before the embedded Ray starts, for a plan with amp=bf16 on GPUs: refuse it when any of this machine's
    GPUs is older than Ampere (Ray may hand a trial any of them). A cluster's GPUs are refused on the worker
    (check_amp_supported)."""
    for index in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        refusal = bf16_refusal(torch.cuda.get_device_name(index), torch.cuda.get_device_capability(index))
        if refusal:
            raise ConfigError(refusal)


def device_info(device: torch.device | str, num_devices: int = 1) -> dict:
    """The device a worker trains on (a torch.device or its type): the GPU's model (of `device` itself, not
    of the process's current CUDA device) and the CUDA libraries' precision flags as they are set
    (training/gpu.py chooses them), or the CPU model and the cores it may use."""
    device = torch.device(device)
    if device.type != "cuda":
        return {"device_type": device.type, "device_name": sysinfo.cpu_model(), "devices_per_worker": num_devices}
    numerics = {
        "matmul_fp32_precision": torch.backends.cuda.matmul.fp32_precision,  # ieee: no TF32
        "cudnn_fp32_precision": torch.backends.cudnn.conv.fp32_precision,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
    }
    name = torch.cuda.get_device_name(device)
    return {"device_type": "cuda", "device_name": name, "devices_per_worker": num_devices, "cuda_numerics": numerics}
