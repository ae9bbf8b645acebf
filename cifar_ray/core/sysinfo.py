"""What a result needs to be trusted, without importing torch or Ray: the host, the git revision, the versions, the GPU
and placement keys of trial.json from what the workers found (training/distributed.py finds the devices,
cluster/placement.py where a worker runs)."""

from __future__ import annotations

import importlib.util
import os
import platform
import socket
import subprocess
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from .text import counted

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


def machine_load() -> tuple[float, int]:
    """This machine's load average over the last minute and its CPU cores: how busy it is now."""
    return os.getloadavg()[0], os.cpu_count() or 1


def load_text(load: tuple[float, int]) -> str:
    """`load average 5.9 on 2 cores`."""
    return f"load average {load[0]:.1f} on {counted(load[1], 'core')}"


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


@lru_cache(maxsize=1)
def torch_build() -> dict[str, str]:
    """torch's version and the CUDA it was built for, as `torch.__version__` and `torch.version.cuda` give them, read
    from the torch/version.py its build generated (plain assignments) without importing torch (~2 s): the driver
    records them before it starts the first trial."""
    spec = importlib.util.find_spec("torch")
    folder = Path(next(iter(spec.submodule_search_locations)))
    version_spec = importlib.util.spec_from_file_location("cifar_ray_torch_version", folder / "version.py")
    module = importlib.util.module_from_spec(version_spec)
    version_spec.loader.exec_module(module)
    return {"torch": str(module.__version__), "cuda": module.cuda or "none"}


def versions() -> dict:
    """The versions a run records (sweep.json, trial.json's system), read from the installed packages: neither torch
    nor Ray is imported."""
    build = torch_build()
    return {
        "python": platform.python_version(),
        "torch": build["torch"],
        "ray": metadata.version("ray"),
        "cuda": build["cuda"],
    }


def host_info() -> dict:
    import os

    return {
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
    }


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
