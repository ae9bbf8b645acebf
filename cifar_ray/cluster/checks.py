"""The checks of `cifar-ray check` that need Ray: DDP over Ray Train workers == one process, and the command's run
of every check (training/checks.py holds the in-process ones and what they share), one printed line each."""

from __future__ import annotations

import math
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
from ..training import checks, gpu
from ..training.check_runs import (
    CheckResult,
    Plan,
    Trained,
    device_keys,
    make_config,
    rel_diff,
    resolve_device,
    result,
    train_steps,
    update_rel_diff,
)
from ..training.checks import TOL_AMP_UPDATE, TOL_FLOAT64, TOL_METRIC64, failed
from ..training.distributed import Worker, select_device
from ..training.models import build_model
from .trainer import TrainRun, torch_trainer

SAME_SUMS = "the same sums in another order"  # why float64 runs of one computation may differ at all
# What the GPU variants of the DDP check may differ by from their reference run (update rel diff), and why.
TOL_FP16_HOOK = 1e-2  # fp16 gradient all-reduce: each gradient rounded to 2^-11 relative, a few steps
TOL_BF16_HOOK = 5e-2  # bf16 gradient all-reduce: each gradient rounded to 2^-8 relative, a few steps
TOL_POWERSGD = 1.0  # rank-r approximation + error feedback: not farther from fp32 than fp32 moved
GPU_VARIANT_WORKERS = 2  # the GPU variants' ranks: the smallest world where DDP communicates


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
    scaler = torch.amp.GradScaler(device.type, init_scale=checks.CHECK_INIT_SCALE) if cfg.amp == "fp16" else None
    trained = train_steps(cfg, loop_config["steps"], Worker(rank, world, [device]), dtype, scaler=scaler)
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


def ddp_shape(device: torch.device, workers: int, gpu_count: int) -> dict[str, Any]:
    """Backend and GPU share of the DDP check's ranks: on CPU gloo; one GPU per rank with nccl where there are
    enough; else ranks share GPUs, which NCCL refuses ("Duplicate GPU detected"), so gloo with a fractional
    share (rounded down to Ray's 4 decimals, so the shares of one GPU never add up to more than 1)."""
    if device.type != "cuda":
        return {"use_gpu": "false", "backend": "gloo"}
    if gpu_count >= workers:
        return {"use_gpu": "true", "backend": "nccl", "gpus_per_worker": 1.0}
    per_gpu = -(-workers // max(gpu_count, 1))  # ranks on the fullest GPU
    return {"use_gpu": "true", "backend": "gloo", "gpus_per_worker": math.floor(1e4 / per_gpu) / 1e4}


def ddp_configs(
    workers: int, device: torch.device, n_steps: int, gpu_count: int = 0, **keys: Any
) -> tuple[TrainConfig, TrainConfig]:
    """(ddp config, single-process config): the same global batch 16*workers, accumulation 2 (so
    DDP's no_sync path is exercised), n_steps steps = the whole (tiny) epoch. `keys` go to the ddp run only:
    the single-process reference runs plain."""
    batch = 16 * workers
    common = {"norm": "group", "batch_size": batch, "accum_steps": 2, "train_subset": n_steps * batch * 2}
    ddp = common | ddp_shape(device, workers, gpu_count) | {"strategy": "ddp", "workers": workers} | keys
    return make_config(**ddp), make_config(**common, **device_keys(device), strategy="single", workers=1)


def ddp_plan(device: torch.device, workers: int, gpu_count: int, n_steps: int = 4) -> Plan:
    """The DDP check: `workers` ranks == one process, float64."""
    ddp, single = ddp_configs(workers, device, n_steps, gpu_count)
    share = f", {ddp.gpus_per_worker:g} GPU each" if ddp.use_gpu == "true" and ddp.gpus_per_worker < 1 else ""
    plural = "s" if workers > 1 else ""
    name = f"ddp {workers} worker{plural} ({ddp.backend}{share}) == 1 process, batch {ddp.batch_size}"
    return Plan(name, {"ddp": ddp, "single": single}, TOL_FLOAT64, SAME_SUMS)


# The DDP paths only a GPU exercises, each vs one process: (name, keys of the ddp run, dtype, tolerance, why).
GPU_VARIANTS = (
    (
        "gloo on CUDA tensors, 1 GPU per rank",
        {"backend": "gloo", "gpus_per_worker": 1.0},
        torch.float64,
        TOL_FLOAT64,
        SAME_SUMS,
    ),
    # NCCL refuses two ranks on one GPU ("Duplicate GPU detected"); gloo runs them
    ("2 ranks sharing 1 GPU", {"backend": "gloo", "gpus_per_worker": 0.5}, torch.float64, TOL_FLOAT64, SAME_SUMS),
    ("ddp fp16 autocast + GradScaler ~ fp32", {"amp": "fp16"}, torch.float32, TOL_AMP_UPDATE, "as the fp16 check"),
    ("ddp fp16 gradient hook", {"grad_compression": "fp16"}, torch.float32, TOL_FP16_HOOK, "fp16 gradients"),
    ("ddp bf16 gradient hook", {"grad_compression": "bf16"}, torch.float32, TOL_BF16_HOOK, "bf16 gradients"),
    ("ddp PowerSGD hook", {"grad_compression": "powersgd"}, torch.float32, TOL_POWERSGD, "low rank + error feedback"),
)


def gpu_variant_plans(device: torch.device, gpu_count: int, n_steps: int = 4) -> list[Plan]:
    """One plan per GPU_VARIANTS row, GPU_VARIANT_WORKERS ranks each; a SKIP saying why where it cannot run."""
    workers, plans = GPU_VARIANT_WORKERS, []
    for name, keys, dtype, tolerance, why in GPU_VARIANTS:
        if device.type != "cuda":  # the configs themselves need a GPU (amp=fp16, gloo with a GPU share)
            plans.append(Plan(name, {}, tolerance, why, dtype, skip="needs a CUDA GPU"))
            continue
        ddp, single = ddp_configs(workers, device, n_steps, gpu_count, **keys)
        gpus_needed = workers * ddp.gpus_per_worker
        skip = f"needs {gpus_needed:g} GPUs, torch sees {gpu_count}" if gpus_needed > gpu_count else ""
        plans.append(Plan(name, {"ddp": ddp, "single": single}, tolerance, why, dtype, skip=skip))
    return plans


def run_ddp(cfg: TrainConfig, n_steps: int, out: Path, dtype: str = "float64") -> dict[str, Any]:
    """One TorchTrainer fit of `ddp_worker` on the connected Ray; returns what rank 0 saved."""
    loop_config = {"config": cfg.model_dump(), "steps": n_steps, "dtype": dtype, "out": str(out)}
    trainer = torch_trainer(ddp_worker, loop_config, cfg, TrainRun("cifar-ray-check", StoragePath.of(out.parent)))
    error = trainer.start().ended_with()
    if error is not None:
        raise error
    return torch.load(out, weights_only=True)


def run_plan(plan: Plan, device: torch.device, n_steps: int) -> tuple[dict[str, Any], Trained]:
    """(what the ddp run's rank 0 saved, the single-process reference run)."""
    with tempfile.TemporaryDirectory(prefix="cifar-ray-check-") as tmp:
        saved = run_ddp(plan.configs["ddp"], n_steps, Path(tmp) / "rank0.pt", plan.dtype_name)
    return saved, train_steps(plan.configs["single"], n_steps, Worker.single(device), plan.dtype)


def ddp_final(saved: dict[str, Any], cfg: TrainConfig) -> torch.Tensor:
    """The ddp run's parameters after training, in model.parameters() order, as float64."""
    names = [name for name, _ in build_model(cfg).named_parameters()]
    return torch.cat([saved["state"][name].double().flatten() for name in names])


def compare_params(plan: Plan, saved: dict[str, Any], single: Trained) -> CheckResult:
    """The ddp run vs the single process: the same start, an update within the plan's tolerance, finite,
    no skipped step (a GradScaler skip would hide an fp16 path that does not train)."""
    diff = update_rel_diff(single.initial, ddp_final(saved, plan.configs["single"]), single.final)
    init_diff = (saved["initial"] - single.initial).abs().max().item()
    skipped = int(saved["totals"][3])
    ok = diff <= plan.tolerance and init_diff == 0.0 and skipped == 0  # a NaN diff fails the <=
    return result(
        plan.name,
        ok,
        f"update rel diff {diff:.1e} (tol {plan.tolerance:.0e}, {plan.why}), {plan.dtype_name}, "
        f"{int(saved['totals'][2])} samples, {skipped} skipped steps",
        update_rel_diff=diff,
        saved=saved,
        single=single,
    )


def check_ddp(
    device: torch.device, workers: int = 2, n_steps: int = 4, gpu_count: int | None = None
) -> tuple[CheckResult, CheckResult]:
    """DDP with `workers` Ray Train workers == one process on the same global batch (float64):
    (parameters after n_steps, all-reduced train metrics). One TorchTrainer run for both."""
    gpus = torch.cuda.device_count() if gpu_count is None else gpu_count
    plan = ddp_plan(device, workers, gpus if device.type == "cuda" else 0, n_steps)
    saved, single = run_plan(plan, device, n_steps)
    params = compare_params(plan, saved, single)
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


def check_gpu_variant(plan: Plan, device: torch.device, n_steps: int = 4) -> CheckResult:
    if plan.skip:
        return plan.skipped()
    return compare_params(plan, *run_plan(plan, device, n_steps))


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
    gpu_count = torch.cuda.device_count() if device.type == "cuda" else 0
    ddp = ddp_plan(device, workers, gpu_count).configs["ddp"]  # ranks share a GPU (gloo) where there are too few
    need, have = ("gpus", "GPUs") if device.type == "cuda" else ("cpus", "CPUs")
    needed = workers * ddp.gpus_per_worker if device.type == "cuda" else workers

    def check_capacity(capacity: dict[str, float], where: str) -> None:
        if needed > capacity[need]:
            raise ConfigError(f"--workers {workers} needs {needed:g} {have} but {where} has {capacity[need]:g}")

    import ray

    if address is None and not ray.is_initialized():  # refuse before starting a local Ray
        check_capacity({"cpus": os.cpu_count() or 1, "gpus": torch.cuda.device_count()}, "this machine")
    started = time.perf_counter()
    owns_ray = init_ray(address=address, verbose=verbose)
    try:
        check_capacity(cluster_capacity(), "the Ray cluster")
        # The references here run with the trials' CUDA numerics, as the DDP check's workers do (select_devices).
        gpu.set_cuda_numerics()
        on_gpu = f", GPU {torch.cuda.get_device_name(device)}, {gpu.NUMERICS}" if device.type == "cuda" else ""
        print_line(
            f"cifar-ray check on {device.type} ({os.cpu_count()} CPU cores{on_gpu}), torch {torch.__version__}; "
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
        run("strategies", lambda: checks.check_strategies(device))
        run("dp", lambda: checks.check_dp(device, workers, gpu_count=gpu_count))
        run("seeds", lambda: checks.check_seeds(device))
        run("bf16 autocast", lambda: checks.check_amp(device, "bf16"))
        run("fp16 autocast + GradScaler", lambda: checks.check_amp(device, "fp16"))
        run("GradScaler skipped steps", lambda: checks.check_grad_scaler(device))
        run("checkpoint round trip", lambda: checks.check_checkpoint_round_trip(device))
        run(f"ddp {workers} workers", lambda: check_ddp(device, workers))
        for plan in gpu_variant_plans(device, gpu_count):
            if plan.configs.get("ddp") != ddp:  # on one GPU the ddp check above already is "2 ranks sharing 1 GPU"
                run(plan.name, lambda plan=plan: check_gpu_variant(plan, device))
    finally:
        if owns_ray:
            import ray

            ray.shutdown()
    counts = {status: sum(r.status == status for r in results) for status in ("PASS", "FAIL", "SKIP")}
    elapsed = time.perf_counter() - started
    print_line(f"{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped in {elapsed:.1f} s")
    return results
