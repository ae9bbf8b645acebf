"""Equivalence checks of the training semantics, run on real code (`cifar-ray check`, and the tests); the DDP
check, which needs Ray, and the command's run of them all are in cluster/checks.py.

Every check builds the model, optimizer, schedule and scaler exactly as `train.run_trial`
does and runs a few optimizer steps through the real `train_epoch` over `iterate_train` step lists,
then compares two ways of computing the same thing:

- accumulation: k micro-batches of b == one batch of k*b (no batch-norm); with batch-norm the
  statistics are over b, not k*b, and the difference is measured (it must be far above the no-BN one);
- DDP: W Ray Train workers (gloo on CPU, nccl on GPU) == one process on the same global batch,
  parameters and all-reduced train metrics (one Ray Train run, cluster/trainer.py);
- strategies: single == ddp with one worker; dp == single over >= 2 GPUs (SKIP with the reason elsewhere:
  DataParallel without GPUs runs the bare model, which would compare the model with itself);
- seeds: the same seed repeats exactly (CPU; within relative tolerances on CUDA), another seed differs;
- checkpoint round trip: save, load (to the CPU, then onto the device), continue == uninterrupted;
- mixed precision: bf16 autocast (and fp16 + GradScaler on CUDA) stays near fp32 over a few steps;
- GradScaler: a step with an inf gradient is skipped and counted (train_epoch's totals[3]).

The exactness checks run in float64 (model.double(), double inputs): float32 rounding differences
grow chaotically with steps, float64 ones stay ~1e-15, so a tight tolerance proves the semantics.
The parameter difference is measured against the size of the update, not of the parameters:
`update rel diff = |theta_a - theta_b| / |theta_b - theta_0|` (2-norms over all parameters), so
a wrong gradient cannot hide behind large weights.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..core.config import TrainConfig
from .check_runs import (
    CHECK_INIT_SCALE,
    CheckResult,
    Plan,
    Trained,
    _build,
    _train_range,
    _train_steps,
    _trained,
    device_keys,
    make_config,
    param_vector,
    rel_diff,
    result,
    train_steps,
    update_rel_diff,
)
from .distributed import Worker
from .loop import torch_threads
from .state import load_checkpoint, rng_state, save_checkpoint

# Tolerances (see docs/semantics.md, "Evidence"): float64 exactness, float32 repeatability, mixed precision.
TOL_FLOAT64 = 1e-9  # update rel diff of two float64 runs that should be the same computation
TOL_METRIC64 = 1e-12  # relative difference of float64 loss sums
BN_MIN_DIFF = 1e-4  # the batch-norm accumulation difference must exceed this (measured: 0.37)
# Same seed twice on CUDA: cuDNN's fastest backward kernels sum with atomics in no fixed order, so float32
# results differ by rounding (~1e-7 relative per op) that grows over the steps; relative, as loss sums are ~220.
TOL_SEED_CUDA_UPDATE = 1e-4  # update rel diff of two same-seed float32 runs on CUDA
TOL_SEED_CUDA_LOSS = 1e-5  # relative difference of their loss sums (float32 losses summed in float64)
SEED_CUDA_CORRECT = 1  # their correct counts may differ by one: a logit tie within rounding flips an argmax
TOL_AMP_UPDATE = 0.3  # bf16/fp16 vs fp32: update rel diff after AMP_STEPS steps (bf16 CPU: ~0.13)
TOL_AMP_LOSS = 0.01  # bf16/fp16 vs fp32: relative difference of the mean train loss (bf16 CPU: <1e-3)
AMP_STEPS = 3


def check_accumulation(
    device: torch.device, accum: int = 4, micro: int = 16, n_steps: int = 3, norm: str = "none"
) -> CheckResult:
    """k micro-batches of b == one batch of k*b after `n_steps` optimizer steps (float64)."""
    common = device_keys(device) | {"norm": norm}
    big = train_steps(
        make_config(**common, batch_size=accum * micro, accum_steps=1), n_steps, Worker.single(device), torch.float64
    )
    acc = train_steps(
        make_config(**common, batch_size=micro, accum_steps=accum), n_steps, Worker.single(device), torch.float64
    )
    diff = update_rel_diff(big.initial, acc.final, big.final)
    loss = rel_diff(acc.totals[0].item(), big.totals[0].item())
    name = f"accumulation {accum}x{micro} == {accum * micro} ({'no BN' if norm != 'batch' else 'batch-norm'})"
    same_data = acc.totals[1:3].tolist() == big.totals[1:3].tolist()
    ok = diff <= TOL_FLOAT64 and loss <= TOL_METRIC64 and same_data
    return result(
        name,
        ok,
        f"update rel diff {diff:.1e} (tol {TOL_FLOAT64:.0e}), loss rel diff {loss:.1e}, float64, {n_steps} steps",
        update_rel_diff=diff,
        loss_rel_diff=loss,
        big=big,
        acc=acc,
    )


def check_accumulation_batchnorm(
    device: torch.device, accum: int = 4, micro: int = 16, n_steps: int = 3, no_bn: CheckResult | None = None
) -> CheckResult:
    """With batch-norm, accumulation is NOT the big batch: each micro-batch is normalised with its
    own statistics (over b samples, not k*b) and the running statistics are updated k times per
    step. The check measures that difference and passes when it is clearly visible (so the no-BN
    comparison above is sensitive enough to see a real semantic difference)."""
    common = device_keys(device) | {"norm": "batch"}
    big = train_steps(
        make_config(**common, batch_size=accum * micro, accum_steps=1), n_steps, Worker.single(device), torch.float64
    )
    acc = train_steps(
        make_config(**common, batch_size=micro, accum_steps=accum), n_steps, Worker.single(device), torch.float64
    )
    diff = update_rel_diff(big.initial, acc.final, big.final)
    floor = max(BN_MIN_DIFF, 100 * no_bn.values["update_rel_diff"]) if no_bn else BN_MIN_DIFF
    loss = rel_diff(acc.totals[0].item(), big.totals[0].item())
    return result(
        f"accumulation {accum}x{micro} vs {accum * micro} (batch-norm)",
        diff > floor,
        f"update rel diff {diff:.1e} (expected > {floor:.0e}: BN statistics over {micro}, not {accum * micro}), "
        f"loss rel diff {loss:.1e}",
        update_rel_diff=diff,
        loss_rel_diff=loss,
    )


STRATEGY_KEYS = {"norm": "group", "batch_size": 32, "accum_steps": 2}  # the strategy checks' shared model and batch


def check_strategies(device: torch.device, n_steps: int = 3) -> CheckResult:
    """single == ddp with one worker (float64): strategy=ddp with one process is the single-process run."""
    common = device_keys(device) | STRATEGY_KEYS
    runs = {
        "ddp": train_steps(
            make_config(**common, strategy="ddp", workers=1), n_steps, Worker.single(device), torch.float64
        ),
        "single": train_steps(
            make_config(**common, strategy="single", workers=1), n_steps, Worker.single(device), torch.float64
        ),
    }
    ref, single = runs["ddp"], runs["single"]
    diff = update_rel_diff(ref.initial, single.final, ref.final)
    loss = rel_diff(single.totals[0].item(), ref.totals[0].item())
    return result(
        "single == ddp(1 worker)",
        diff <= TOL_FLOAT64 and loss <= TOL_METRIC64,
        f"update rel diff {diff:.1e} (tol {TOL_FLOAT64:.0e}), loss rel diff {loss:.1e}, float64",
        diffs={"single": diff},
        loss_rel_diffs={"single": loss},
    )


def dp_plan(device: torch.device, workers: int, gpu_count: int) -> Plan:
    """dp over min(max(2, workers), gpu_count) GPUs vs one process on the first. torch's DataParallel runs the
    bare module without CUDA (no device_ids) or with one device, so below 2 GPUs there is nothing to compare."""
    n = min(max(2, workers), gpu_count)
    devices = tuple(torch.device("cuda", i) for i in range(n))
    name = f"dp({n if n >= 2 else 2} GPUs) == single"
    common = device_keys(device) | STRATEGY_KEYS
    configs = {
        "single": make_config(**common, strategy="single", workers=1),
        "dp": make_config(**common, strategy="dp", workers=max(n, 1)),
    }
    why = "float64: dp splits each batch and sums the replicas' gradients in another order"
    if device.type != "cuda":
        skip = "DataParallel splits batches over CUDA GPUs; on CPU it runs the bare model, nothing to compare"
        return Plan(name, configs, TOL_FLOAT64, why, skip=skip)
    if n < 2:
        return Plan(name, configs, TOL_FLOAT64, why, skip=f"needs 2 GPUs, torch sees {gpu_count}")
    return Plan(name, configs, TOL_FLOAT64, why, devices=devices)


def check_dp(device: torch.device, workers: int = 2, n_steps: int = 3, gpu_count: int | None = None) -> CheckResult:
    """dp over this machine's GPUs == one process (float64), and the dp run really ran as nn.DataParallel over
    the planned GPUs (not the bare model, which would pass by comparing the model with itself)."""
    plan = dp_plan(device, workers, torch.cuda.device_count() if gpu_count is None else gpu_count)
    if plan.skip:
        return plan.skipped()
    single = train_steps(plan.configs["single"], n_steps, Worker.single(device), plan.dtype)
    dp = train_steps(plan.configs["dp"], n_steps, Worker(0, 1, list(plan.devices)), plan.dtype)
    return compare_dp(plan, single, dp)


def compare_dp(plan: Plan, single: Trained, dp: Trained) -> CheckResult:
    diff = update_rel_diff(single.initial, dp.final, single.final)
    loss = rel_diff(dp.totals[0].item(), single.totals[0].item())
    planned = tuple(d.index for d in plan.devices)
    wrapped = dp.wrapper == "DataParallel" and dp.device_ids == planned
    return result(
        plan.name,
        diff <= plan.tolerance and loss <= TOL_METRIC64 and wrapped,
        f"update rel diff {diff:.1e} (tol {plan.tolerance:.0e}, {plan.why}), loss rel diff {loss:.1e}; "
        f"ran as {dp.wrapper} over GPUs {list(dp.device_ids)} (expected DataParallel over {list(planned)})",
        update_rel_diff=diff,
        loss_rel_diff=loss,
    )


@dataclass(frozen=True)
class SeedTolerance:
    """How far two runs of the same seed on one device may differ, and why."""

    update: float  # update rel diff
    loss: float  # relative difference of the loss sums
    correct: int  # difference of the correct counts
    why: str


def seed_tolerance(device: torch.device) -> SeedTolerance:
    if device.type == "cpu":
        return SeedTolerance(0.0, 0.0, 0, "CPU kernels are deterministic: bitwise")
    return SeedTolerance(
        TOL_SEED_CUDA_UPDATE, TOL_SEED_CUDA_LOSS, SEED_CUDA_CORRECT, "cuDNN kernels sum in no fixed order"
    )


def compare_repeat(first: Trained, again: Trained, tol: SeedTolerance) -> tuple[bool, dict[str, float], str]:
    """Two runs that should be the same computation on one device: within `tol` (relative to the update)."""
    update = update_rel_diff(first.initial, again.final, first.final)
    loss = rel_diff(again.totals[0].item(), first.totals[0].item())
    correct = abs(int(again.totals[1]) - int(first.totals[1]))
    same_samples = int(again.totals[2]) == int(first.totals[2])
    ok = update <= tol.update and loss <= tol.loss and correct <= tol.correct and same_samples
    text = (
        f"update rel diff {update:.1e}, loss rel diff {loss:.1e}, correct +-{correct} "
        f"(tol {tol.update:.0e}, {tol.loss:.0e}, {tol.correct}: {tol.why})"
    )
    return ok, {"update": update, "loss": loss, "correct": correct}, text


def check_seeds(device: torch.device, n_steps: int = 3) -> CheckResult:
    """The same seed repeats (bitwise on CPU; within seed_tolerance on CUDA), another seed differs.
    float32 with flip_crop augmentation and dropout, so every random source is covered."""
    common = device_keys(device) | {"norm": "batch", "batch_size": 32, "augment": "flip_crop", "dropout": 0.1}
    first = train_steps(make_config(**common, seed=0), n_steps, Worker.single(device))
    again = train_steps(make_config(**common, seed=0), n_steps, Worker.single(device))
    other = train_steps(make_config(**common, seed=1), n_steps, Worker.single(device))
    repeats, repeat, text = compare_repeat(first, again, seed_tolerance(device))
    other_diff = ((other.final - first.final).norm() / first.final.norm()).item()
    metrics_differ = other.totals[:2].tolist() != first.totals[:2].tolist()
    return result(
        "same seed repeats, other seed differs",
        repeats and other_diff > 0.1 and metrics_differ,
        f"seed 0 twice: {text}; seed 1: param rel diff {other_diff:.1e}",
        repeat_update_diff=repeat["update"],
        repeat_loss_diff=repeat["loss"],
        other_seed_diff=other_diff,
        first=first,
        again=again,
        other=other,
    )


def resumed_steps(cfg: TrainConfig, n_steps: int, stop: int, device: torch.device, folder: Path) -> Trained:
    """`stop` steps, save_checkpoint into `folder`, then a new model from another seed loads it (load_checkpoint:
    to the CPU, then onto `device`) and runs steps stop..n_steps-1: what a restarted trial does mid-epoch."""
    alone = Worker.single(device)
    train, initial, first = _build(cfg, alone, torch.float32)
    _train_range(first, train, cfg, alone, torch.float32, range(stop))
    save_checkpoint(folder, 1, first, rng_states=[rng_state(device)])  # this device's generator: dropout draws on it
    _, _, resumed = _build(cfg.model_copy(update={"seed": cfg.seed + 1}), alone, torch.float32)
    load_checkpoint(folder, resumed, alone, seed=cfg.seed)
    local = _train_range(resumed, train, cfg, alone, torch.float32, range(stop, n_steps))
    return _trained(resumed, initial, local)


def check_checkpoint_round_trip(device: torch.device, n_steps: int = 4, stop: int = 2) -> CheckResult:
    """Training interrupted after `stop` of `n_steps` steps and resumed from its checkpoint on `device` ==
    training uninterrupted (float32, dropout and batch-norm: the random state and buffers must come back too)."""
    cfg = make_config(**device_keys(device), norm="batch", batch_size=32, dropout=0.1, optimizer="adamw")
    with torch_threads(cfg.cpus_per_worker), tempfile.TemporaryDirectory(prefix="cifar-ray-check-") as folder:
        whole = _train_steps(cfg, n_steps, Worker.single(device), torch.float32, None, None)
        resumed = resumed_steps(cfg, n_steps, stop, device, Path(folder))
    tol = seed_tolerance(device)
    update = update_rel_diff(whole.initial, resumed.final, whole.final)
    return result(
        f"checkpoint round trip == uninterrupted ({device.type})",
        update <= tol.update,
        f"saved after step {stop} of {n_steps}, loaded to {device}: update rel diff {update:.1e} "
        f"(tol {tol.update:.0e}: {tol.why})",
        update_rel_diff=update,
        whole=whole,
        resumed=resumed,
    )


def check_amp(device: torch.device, amp: str, n_steps: int = AMP_STEPS) -> CheckResult:
    """amp (bf16 autocast, or fp16 autocast + GradScaler) vs fp32 over `n_steps` steps."""
    name = f"{amp} autocast{' + GradScaler' if amp == 'fp16' else ''} ~ fp32 ({device.type})"
    if amp == "fp16" and device.type != "cuda":
        return CheckResult(name, "SKIP", "needs a CUDA GPU (fp16 + GradScaler is the CUDA path)")
    if amp == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return CheckResult(name, "SKIP", "this GPU does not support bf16")
    common = device_keys(device) | {"norm": "batch", "batch_size": 32}
    ref = train_steps(make_config(**common, amp="off"), n_steps, Worker.single(device))
    scaler = torch.amp.GradScaler(device.type, init_scale=CHECK_INIT_SCALE) if amp == "fp16" else None
    low = train_steps(make_config(**common, amp=amp), n_steps, Worker.single(device), scaler=scaler)
    diff = update_rel_diff(ref.initial, low.final, ref.final)
    ref_loss = ref.totals[0].item() / ref.totals[2].item()
    low_loss = low.totals[0].item() / low.totals[2].item()
    loss = rel_diff(low_loss, ref_loss)
    skipped = int(low.totals[3].item())
    ok = diff <= TOL_AMP_UPDATE and loss <= TOL_AMP_LOSS and skipped == 0
    return result(
        name,
        ok,
        f"update rel diff {diff:.1e} (tol {TOL_AMP_UPDATE:g}), mean loss {low_loss:.4f} vs {ref_loss:.4f} "
        f"(rel {loss:.1e}, tol {TOL_AMP_LOSS:g}), {n_steps} steps, {skipped} skipped",
        update_rel_diff=diff,
        loss_rel_diff=loss,
        skipped=skipped,
    )


class GradientPoison:
    """A `prepare` hook for train_steps: the gradient of the model's first parameter becomes inf
    in backward pass `step` (0-based; one backward per micro-batch) while the loss stays finite, as
    when an fp16 gradient overflows. It records the parameters as the poisoned backward and the
    one after it see them: before and after the poisoned step's optimizer.step."""

    def __init__(self, step: int):
        self.step = step
        self.calls = 0
        self.seen: list[torch.Tensor] = []  # parameter vectors at backward `step` and `step + 1`

    def __call__(self, model: nn.Module) -> None:
        params = list(model.parameters())

        def hook(grad: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            if self.calls in (self.step + 1, self.step + 2):
                self.seen.append(param_vector(params))
            return torch.full_like(grad, float("inf")) if self.calls == self.step + 1 else grad

        params[0].register_hook(hook)


def check_grad_scaler(device: torch.device, n_steps: int = 3, bad_step: int = 1) -> CheckResult:
    """A step with an inf gradient is skipped by GradScaler and counted in train_epoch's
    totals[3] (reported per epoch as amp_skipped_steps): exactly 1 of `n_steps`, the parameters
    unchanged by it (bitwise), the epoch's loss still finite. On CPU the scaler is
    torch.amp.GradScaler("cpu") around an fp32 forward; on CUDA it is the real fp16 path."""
    if not 0 <= bad_step < n_steps - 1:
        raise ValueError("bad_step needs a step after it")
    amp = "fp16" if device.type == "cuda" else "off"
    cfg = make_config(**device_keys(device), norm="group", batch_size=32, amp=amp)
    poison = GradientPoison(bad_step)
    scaler = torch.amp.GradScaler(device.type, init_scale=CHECK_INIT_SCALE, enabled=True)
    run = train_steps(cfg, n_steps, Worker.single(device), scaler=scaler, prepare=poison)
    skipped = int(run.totals[3].item())
    before, after = poison.seen
    unchanged = (after - before).abs().max().item()
    moved = (run.final - after).abs().max().item()  # the step after the skipped one trains again
    finite_loss = bool(torch.isfinite(run.totals[0]))
    ok = skipped == 1 and unchanged == 0.0 and moved > 0 and finite_loss
    return result(
        f"GradScaler skipped steps counted ({device.type})",
        ok,
        f"inf gradient forced in step {bad_step + 1} of {n_steps}: {skipped} skipped step counted (expected 1), "
        f"params changed by it {unchanged:.1e} (expected 0), loss {'finite' if finite_loss else 'NOT finite'}",
        skipped=skipped,
        unchanged=unchanged,
        moved_after=moved,
        finite_loss=finite_loss,
        run=run,
        init_scale=CHECK_INIT_SCALE,
    )


def failed(name: str, error: BaseException) -> CheckResult:
    text = str(error).strip().splitlines()
    return CheckResult(name, "FAIL", f"{type(error).__name__}: {text[-1] if text else ''}"[:300])
