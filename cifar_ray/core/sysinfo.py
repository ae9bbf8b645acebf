"""What a result needs to be trusted: hardware, library versions, git revision."""

from __future__ import annotations

import platform
import socket
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # core imports no torch at import time
    import torch

# The cifar_ray package's folder: in a checkout, the checkout whose revision and changes a run records.
PACKAGE_DIR = Path(__file__).resolve().parent.parent


@lru_cache(maxsize=1)
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_info(device: torch.device | str, num_devices: int = 1) -> dict:
    """The device a worker trains on (a torch.device or its type): the GPU's model (of `device` itself, not
    of the process's current CUDA device) and the CUDA libraries' precision flags as they are set
    (training/gpu.py chooses them), or the CPU model and the cores it may use."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return {"device_type": device.type, "device_name": cpu_model(), "devices_per_worker": num_devices}
    numerics = {
        "matmul_fp32_precision": torch.backends.cuda.matmul.fp32_precision,  # ieee: no TF32
        "cudnn_fp32_precision": torch.backends.cudnn.conv.fp32_precision,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
    }
    name = torch.cuda.get_device_name(device)
    return {"device_type": "cuda", "device_name": name, "devices_per_worker": num_devices, "cuda_numerics": numerics}


def versions() -> dict:
    import ray
    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ray": ray.__version__,
        "cuda": torch.version.cuda or "none",
    }


def git_revision(path: str | Path = ".") -> str:
    """Short revision of the checkout at `path` (with -dirty), or 'unknown' outside git."""
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=10"],
            cwd=path,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def host_info() -> dict:
    import os

    return {
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
    }


def worker_placement() -> dict:
    """Where this process runs: its Ray node id (unique per node, also for several nodes on one
    machine; None outside Ray) and the hostname."""
    node_id = None
    try:
        import ray

        if ray.is_initialized():
            node_id = ray.get_runtime_context().get_node_id()
    except Exception:  # placement is information, never a reason to fail a run
        pass
    return {"node_id": node_id, "hostname": socket.gethostname()}


def gather_ranks(mine: dict) -> list[dict]:
    """Every rank's `mine`, in rank order. Collective when torch.distributed runs with several ranks: every
    rank must call it."""
    import torch.distributed as dist

    every = [mine]
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, mine)
    return every


def placement_of(every: list[dict]) -> dict:
    """{"nodes": [...], "hostnames": [...]} from every rank's worker_placement(), in rank order."""
    return {"nodes": [p["node_id"] for p in every], "hostnames": [p["hostname"] for p in every]}


def gpu_record(uuids_per_rank: list[list[str]], gpus_per_rank: float) -> dict:
    """trial.json's GPU keys from the UUIDs of every rank's GPUs (rank order) and the GPUs Ray gave each rank
    (a fraction when ranks share one): num_gpus counts distinct physical GPUs, so two ranks on one GPU are 1
    GPU, not 2; gpu_share is the fraction of each of its GPUs a rank holds (0.5: it shares the GPU by design,
    with its own trial's ranks or another trial's, whose contention its times then include)."""
    distinct = {uuid for uuids in uuids_per_rank for uuid in uuids}
    per_rank = max((len(uuids) for uuids in uuids_per_rank), default=0)
    return {
        "num_gpus": len(distinct),
        "gpu_uuids": uuids_per_rank,
        "gpu_share": min(1.0, gpus_per_rank / per_rank) if per_rank else None,
    }
