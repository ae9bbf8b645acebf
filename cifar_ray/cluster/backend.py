"""The torch process group of a slot's workers, set up by a Ray Train backend that imports torch only where it trains.

Ray's TorchConfig imports torch in every process that unpickles it: Ray Train's controller that runs the backend,
a process on the critical path of a sweep's start that never trains
(reports/bench/README.md: the start-up's steps). This backend does what Ray's torch backend does on a worker group
of ours (ray.train.torch.config's _TorchBackend: the master's address, the torch.distributed environment variables,
init_process_group on every rank, its shutdown) by handing Ray's own worker-side functions to the workers by name:
only the workers, which import torch to train anyway, import them.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import ray
from ray.train.backend import Backend, BackendConfig

logger = logging.getLogger(__name__)


def torch_config_call(function: str, **kwargs):
    """Runs ray.train.torch.config's `function` in a worker (imported there, with torch)."""
    from ray.train.torch import config

    return getattr(config, function)(**kwargs)


def set_master(addr: str, port: int) -> None:
    """init_method env://: where every rank finds rank 0."""
    os.environ["MASTER_ADDR"] = addr
    os.environ["MASTER_PORT"] = str(port)


class CudaDevice:
    """Ray's TorchConfigContextManager, imported in the worker: a worker's default CUDA device is its own."""

    def __enter__(self):
        from ray.train.torch.config import TorchConfigContextManager

        TorchConfigContextManager().__enter__()

    def __exit__(self, *exc) -> bool:
        return False


class TorchProcessGroupBackend(Backend):
    share_cuda_visible_devices: bool = True  # as Ray's torch backend: NCCL ranks of one node see each other's GPUs

    def on_start(self, worker_group, backend_config: TorchProcessGroup) -> None:
        from ray.train._internal.utils import get_address_and_port

        addr, port = worker_group.execute_single(0, get_address_and_port)
        worker_group.execute(set_master, addr=addr, port=port)
        worker_group.execute(torch_config_call, "_set_torch_distributed_env_vars")
        ranks = len(worker_group)
        setups = [
            worker_group.execute_single_async(
                rank,
                torch_config_call,
                "_setup_torch_process_group",
                backend=backend_config.backend,
                world_rank=rank,
                world_size=ranks,
                init_method="env://",
                timeout_s=backend_config.timeout_s,
            )
            for rank in range(ranks)
        ]
        ray.get(setups)

    def on_shutdown(self, worker_group, backend_config: TorchProcessGroup) -> None:
        from ray._private import ray_constants
        from ray.exceptions import GetTimeoutError
        from ray.train.constants import (
            DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
            TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
        )

        shutdowns = worker_group.execute_async(
            torch_config_call, "_shutdown_torch", destroy_process_group=len(worker_group) > 1
        )
        timeout_s = ray_constants.env_integer(
            TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S, DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S
        )
        try:
            ray.get(shutdowns, timeout=timeout_s)
        except GetTimeoutError:
            logger.warning(f"Torch process group shutdown timed out after {timeout_s} seconds")


@dataclass
class TorchProcessGroup(BackendConfig):
    """TorchConfig's settings that a slot uses: its backend (gloo or nccl: core/shapes.py) and the collectives'
    timeout."""

    backend: str = "gloo"
    timeout_s: int = 1800

    @property
    def backend_cls(self):
        return TorchProcessGroupBackend

    @property
    def train_func_context(self):
        return CudaDevice

    @property
    def framework(self):
        from ray.train.v2._internal.util import TrainingFramework

        return TrainingFramework.TORCH

    def to_dict(self) -> dict:
        return {"backend": self.backend, "init_method": "env", "timeout_s": self.timeout_s}
