"""The checks of `cifar-ray check` that need Ray: DDP over Ray Train workers == one process, and the command's run
of every check (training/checks.py holds the in-process ones and what they share), one printed line each."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..core.config import TrainConfig
from ..core.errors import ConfigError
from ..core.storage import StoragePath
from ..training import checks
from ..training.checks import (
    TOL_FLOAT64,
    TOL_METRIC64,
    CheckResult,
    device_keys,
    failed,
    make_config,
    rel_diff,
    resolve_device,
    result,
    train_steps,
    update_rel_diff,
)
from ..training.loop import select_device
from ..training.models import build_model
from .trainer import torch_trainer


def ddp_worker(loop_config: dict) -> None:
    """Ray Train worker of the DDP check: `train_steps` with this worker's rank and world (so
    wrap_model gives DDP), then rank 0 saves the state_dict and the totals to loop_config["out"]
    (an absolute path: workers run in a Ray session folder)."""
    import ray.train

    cfg = TrainConfig(**loop_config["config"])
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    device = select_device(cfg)
    dtype = getattr(torch, loop_config["dtype"])
    trained = train_steps(cfg, loop_config["steps"], device, dtype, rank, world)
    if rank == 0:
        torch.save(
            {
                "state": trained.state,
                "local": trained.local,
                "totals": trained.totals,
                "initial": trained.initial,
                "final": trained.final,
                "world": world,
            },
            loop_config["out"],
        )


def ddp_configs(workers: int, device: torch.device, n_steps: int) -> tuple[TrainConfig, TrainConfig]:
    """(ddp config, single-process config): the same global batch 16*workers, accumulation 2 (so
    DDP's no_sync path is exercised), n_steps steps = the whole (tiny) epoch."""
    batch = 16 * workers
    common = device_keys(device) | {
        "norm": "group",
        "batch_size": batch,
        "accum_steps": 2,
        "train_subset": n_steps * batch * 2,
    }
    return make_config(**common, strategy="ddp", workers=workers), make_config(**common, strategy="single", workers=1)


def run_ddp(cfg: TrainConfig, n_steps: int, out: Path, dtype: str = "float64") -> dict[str, Any]:
    """One TorchTrainer fit of `ddp_worker` on the connected Ray; returns what rank 0 saved."""
    loop_config = {"config": cfg.model_dump(), "steps": n_steps, "dtype": dtype, "out": str(out)}
    trainer = torch_trainer(ddp_worker, loop_config, cfg, "cifar-ray-check", StoragePath.of(out.parent))
    trainer.fit()
    return torch.load(out, weights_only=True)


def check_ddp(device: torch.device, workers: int = 2, n_steps: int = 4) -> tuple[CheckResult, CheckResult]:
    """DDP with `workers` Ray Train workers == one process on the same global batch (float64):
    (parameters after n_steps, all-reduced train metrics). One TorchTrainer run for both."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    ddp_cfg, single_cfg = ddp_configs(workers, device, n_steps)
    batch = ddp_cfg.batch_size
    with tempfile.TemporaryDirectory(prefix="cifar-ray-check-") as tmp:
        saved = run_ddp(ddp_cfg, n_steps, Path(tmp) / "rank0.pt")
    single = train_steps(single_cfg, n_steps, device, torch.float64)
    names = [name for name, _ in build_model(single_cfg).named_parameters()]
    ddp_final = torch.cat([saved["state"][name].double().flatten() for name in names])
    diff = update_rel_diff(single.initial, ddp_final, single.final)
    init_diff = (saved["initial"] - single.initial).abs().max().item()
    params = result(
        f"ddp {workers} worker{'s' if workers > 1 else ''} ({backend}) == 1 process, batch {batch}",
        diff <= TOL_FLOAT64 and init_diff == 0.0,
        f"update rel diff {diff:.1e} (tol {TOL_FLOAT64:.0e}), float64, {n_steps} steps x accum 2",
        update_rel_diff=diff,
        saved=saved,
        single=single,
    )
    totals, ref = saved["totals"], single.totals
    loss = rel_diff(totals[0].item(), ref[0].item())
    counts = [int(totals[1]), int(totals[2])] == [int(ref[1]), int(ref[2])]
    local_share = int(saved["local"][2]) * workers == int(totals[2])
    metrics = result(
        f"metrics all-reduced over {workers} ranks == 1 process",
        loss <= TOL_METRIC64 and counts and local_share,
        f"loss sum rel diff {loss:.1e} (tol {TOL_METRIC64:.0e}), correct {int(totals[1])} vs {int(ref[1])}, "
        f"samples {int(totals[2])} vs {int(ref[2])} (rank 0 alone: {int(saved['local'][2])})",
        loss_rel_diff=loss,
    )
    return params, metrics


def run_checks(
    workers: int = 2,
    use_gpu: str = "auto",
    print_line: Callable[[str], None] = print,
    address: str | None = None,
    verbose: bool = False,
) -> list[CheckResult]:
    """All checks, one printed line each: the in-process ones, then the one DDP run on Ray Train.
    Ray is started locally (and shut down afterwards) if it is not running. Usage errors
    (ConfigError) are raised before any check runs."""
    from .placement import cluster_capacity
    from .session import init_ray

    if workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")
    device = resolve_device(use_gpu)
    need, have = ("gpus", "GPUs") if device.type == "cuda" else ("cpus", "CPUs")

    def check_capacity(capacity: dict[str, float], where: str) -> None:
        if workers > capacity[need]:
            raise ConfigError(f"--workers {workers} needs {workers} {have} but {where} has {capacity[need]:g}")

    import ray

    if address is None and not ray.is_initialized():  # refuse before starting a local Ray
        check_capacity({"cpus": os.cpu_count() or 1, "gpus": torch.cuda.device_count()}, "this machine")
    started = time.perf_counter()
    owns_ray = init_ray(address=address, verbose=verbose)
    try:
        check_capacity(cluster_capacity(), "the Ray cluster")
        gpu = f", GPU {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""
        print_line(
            f"cifar-ray check on {device.type} ({os.cpu_count()} CPU cores{gpu}), torch {torch.__version__}; "
            f"exactness checks in float64; update rel diff = |theta_a - theta_b| / |theta_b - theta_0|"
        )
        results: list[CheckResult] = []

        def run(name: str, fn: Callable[[], CheckResult | tuple[CheckResult, ...]]) -> list[CheckResult]:
            began = time.perf_counter()
            try:
                out = fn()
            except Exception as error:  # a crashing check is a failing check, with its reason
                out = failed(name, error)
            out = list(out) if isinstance(out, tuple) else [out]
            seconds = time.perf_counter() - began
            for item in out:
                item.seconds = seconds
                results.append(item)
                print_line(item.line())
            return out

        no_bn = run("accumulation (no BN)", lambda: checks.check_accumulation(device))[0]
        run(
            "accumulation (batch-norm)",
            lambda: checks.check_accumulation_batchnorm(device, no_bn=no_bn if no_bn.values else None),
        )
        run("strategies", lambda: checks.check_strategies(device, workers))
        run("seeds", lambda: checks.check_seeds(device))
        run("bf16 autocast", lambda: checks.check_amp(device, "bf16"))
        run("fp16 autocast + GradScaler", lambda: checks.check_amp(device, "fp16"))
        run("GradScaler skipped steps", lambda: checks.check_grad_scaler(device))
        run(f"ddp {workers} workers", lambda: check_ddp(device, workers))
    finally:
        if owns_ray:
            import ray

            ray.shutdown()
    counts = {status: sum(r.status == status for r in results) for status in ("PASS", "FAIL", "SKIP")}
    elapsed = time.perf_counter() - started
    print_line(f"{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped in {elapsed:.1f} s")
    return results
