"""Who this worker is among the ranks (its rank, world and devices) and the collectives the loop runs over them."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ..core import sysinfo
from ..core.config import TrainConfig
from . import gpu


@dataclass(frozen=True)
class Worker:
    """What stays the same for every trial a worker process runs: its rank among `world` and its devices."""

    rank: int
    world: int
    devices: list[torch.device]

    @classmethod
    def single(cls, device: torch.device) -> Worker:
        """One process alone on one device (rank 0 of 1): `cifar-ray check`, bench, step timing, tests."""
        return cls(0, 1, [device])

    @property
    def device(self) -> torch.device:
        return self.devices[0]


def select_devices(cfg: TrainConfig) -> list[torch.device]:
    """This worker's devices as Ray assigned them: its GPUs (dp drives several; the first is the one
    the model lives on), or the CPU."""
    gpu.set_cuda_numerics()  # once per worker, before worker_system records them
    if cfg.use_gpu == "true":
        import ray.train.torch

        return ray.train.torch.get_devices()
    return [torch.device("cpu")]


def select_device(cfg: TrainConfig) -> torch.device:
    return select_devices(cfg)[0]


def worker_system(worker: Worker, gpus_per_rank: float, placement: dict) -> dict:
    """trial.json's `system`: the devices, versions, the node and host of every rank and, on GPUs, the UUIDs
    of every rank's GPUs with the share of a GPU each rank holds (`gpus_per_rank`: the trial shape's GPUs per
    Ray worker; sysinfo.gpu_record); `placement`: where this rank runs (cluster.placement.worker_placement).
    Collective."""
    cuda = worker.device.type == "cuda"
    uuids = [str(torch.cuda.get_device_properties(device).uuid) for device in worker.devices] if cuda else []
    every = gather_ranks(placement | {"gpu_uuids": uuids})
    gpus = sysinfo.gpu_record([rank["gpu_uuids"] for rank in every], gpus_per_rank) if cuda else {"num_gpus": 0}
    return (
        gpu.device_info(worker.device, len(worker.devices))
        | sysinfo.placement_of(every)  # node id + hostname of every rank, in rank order
        | {"world_size": worker.world}
        | gpus
        | {"versions": sysinfo.versions()}
    )


def gather_ranks(mine: dict) -> list[dict]:
    """Every rank's `mine`, in rank order. Collective when torch.distributed runs with several ranks: every
    rank must call it."""
    every = [mine]
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, mine)
    return every


def rank_seed(seed: int, rank: int) -> int:
    """Seed of rank `rank`'s own random stream (dropout masks): fixed by (seed, rank), different per
    rank, so a global batch of B sees B independent masks as in one process, not B / W repeated."""
    return seed * 1_000_003 + rank + 1


def all_reduce(tensor: torch.Tensor, op: dist.ReduceOp = dist.ReduceOp.SUM) -> torch.Tensor:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=op)
    return tensor


def barrier() -> None:
    """Every rank waits here until all have arrived (a no-op in one process)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def reduce_train_totals(local: torch.Tensor) -> torch.Tensor:
    """train_epoch's [loss sum, correct, samples, skipped steps] over all ranks: the first three are
    summed; a skipped optimizer step is skipped by every rank at once (DDP gives all ranks the same
    gradients, so the same inf), so the count is taken once (max over ranks), not summed."""
    sums = all_reduce(local[:3].clone())
    skipped = all_reduce(local[3:].clone(), dist.ReduceOp.MAX)
    return torch.cat([sums, skipped])


def broadcast_buffers(model: nn.Module) -> None:
    """Give every rank rank 0's batch-norm running statistics before evaluation, so the test
    metrics are those of one model (each rank's last forward pass updated its own copy)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        for buffer in model.buffers():
            dist.broadcast(buffer, src=0)
