"""What a result needs to be trusted: hardware, library versions, git revision."""

from __future__ import annotations

import platform
import socket
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@lru_cache(maxsize=1)
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_info(device: torch.device, num_devices: int = 1) -> dict:
    """The device a worker trains on (its model's GPU, named explicitly: the current CUDA device is
    whatever was set last, not necessarily the worker's), or the CPU model."""
    import torch

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()
    return {"device_type": device.type, "device_name": name, "devices_per_worker": num_devices}


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


def gather_placement() -> dict:
    """{"nodes": [...], "hostnames": [...]} of every rank, in rank order. Collective when
    torch.distributed runs with several ranks: every rank must call it."""
    import torch.distributed as dist

    mine = worker_placement()
    every = [mine]
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, mine)
    return {"nodes": [p["node_id"] for p in every], "hostnames": [p["hostname"] for p in every]}
