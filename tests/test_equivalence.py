"""Proof that the training computes what docs/semantics.md says, on real code.

Each test calls a check of `cifar_ray.training.checks` or `cifar_ray.cluster.checks` (the same functions
`cifar-ray check` runs), asserts it passes, and adds lower-level assertions on what it measured. The checks build
model, optimizer, schedule and scaler as `loop.run_trial` does and run optimizer steps through the real
`train_epoch` over `iterate_train` step lists.

Tolerances: the exactness checks run in float64 (model.double(), double inputs), where two
orderings of the same arithmetic differ by ~1e-15; the tolerance is 1e-9 on the update rel diff
|theta_a - theta_b| / |theta_b - theta_0| (the difference relative to how far training moved the
parameters) and 1e-12 on loss sums. float32 is avoided for these on purpose: its rounding
differences grow chaotically with steps (NOTES.md: 9e-9 after 1 step, 5e-3 after 46).

Batch-norm caveat: with accumulation each micro-batch is normalised with its own statistics (over
b samples, not k*b) and the running statistics are updated k times per step, so k x b is NOT the
same as one k*b batch with BN. test_accumulation_with_batchnorm_differs measures the size (update
rel diff ~0.4 after 3 steps of 4x16 vs 64 on the check model, against ~4e-15 without BN).

Only the DDP test starts Ray Train workers (one TorchTrainer run, 2 gloo workers, ~10-15 s).
"""

from __future__ import annotations

import pytest
import torch
from helpers import shared_ddp_run

from cifar_ray.cluster import checks as ddp_checks
from cifar_ray.training import checks as check
from cifar_ray.training import loop
from cifar_ray.training.check_runs import cached_splits
from cifar_ray.training.data import iterate_train
from cifar_ray.training.distributed import Worker
from cifar_ray.training.loop import build_training, train_epoch, wrap_model
from cifar_ray.training.models import build_model

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def accumulation_no_bn() -> check.CheckResult:
    return check.check_accumulation(CPU)


def test_accumulation_equals_big_batch_without_batchnorm(accumulation_no_bn):
    """4 micro-batches of 16 == one batch of 64: the same parameters after 3 optimizer steps."""
    result = accumulation_no_bn
    assert result.passed, result.line()
    big, acc = result.values["big"], result.values["acc"]
    assert (big.initial == acc.initial).all()  # the same start
    assert result.values["update_rel_diff"] < check.TOL_FLOAT64
    assert (big.final - big.initial).norm() > 1e-3 * big.initial.norm()  # training moved: not trivially equal
    # the same samples were seen: 3 steps x 64, and the same loss sum and correct count
    assert big.totals[2].item() == acc.totals[2].item() == 3 * 64
    assert big.totals[1].item() == acc.totals[1].item()
    assert check.rel_diff(acc.totals[0].item(), big.totals[0].item()) < check.TOL_METRIC64


def test_accumulation_equals_big_batch_with_layer_norm():
    """Per-sample normalisation (GroupNorm with one group) keeps the equivalence."""
    result = check.check_accumulation(CPU, accum=2, micro=16, n_steps=2, norm="layer")
    assert result.passed, result.line()


def test_accumulation_with_batchnorm_differs_and_is_measured(accumulation_no_bn):
    """The documented batch-norm caveat: statistics over 16 samples, not 64, so the parameters
    differ by orders of magnitude more than float64 rounding. Printed for the record."""
    result = check.check_accumulation_batchnorm(CPU, no_bn=accumulation_no_bn)
    print(result.line())
    assert result.passed, result.line()
    bn, no_bn = result.values["update_rel_diff"], accumulation_no_bn.values["update_rel_diff"]
    assert bn > 1e-3 and bn > 1e6 * no_bn, (bn, no_bn)


def test_single_and_one_worker_ddp_agree():
    result = check.check_strategies(CPU)
    assert result.passed, result.line()
    assert result.values["diffs"]["single"] == 0.0  # the same code path on CPU: bitwise
    # one process: wrap_model leaves the model alone (no process group)
    for strategy in ("single", "ddp"):
        cfg = check.make_config(strategy=strategy, workers=1)
        model = build_model(cfg)
        assert wrap_model(model, cfg, CPU, world=1) is model


def fake_trained(loss_sum: float = 220.0, correct: int = 30, final_shift: float = 0.0, **kwargs) -> check.Trained:
    """What a run left, made up: parameters moved from 0 to 1 (+ final_shift), loss sum ~220 as the seed check's."""
    totals = torch.tensor([loss_sum, float(correct), 96.0, 0.0], dtype=torch.float64)
    final = torch.ones(4, dtype=torch.float64) + final_shift
    return check.Trained(torch.zeros(4, dtype=torch.float64), final, {}, totals, totals, **kwargs)


def test_dp_check_skips_on_cpu_instead_of_comparing_the_model_with_itself(monkeypatch):
    """Before: dp was built without its devices, so "single == dp" trained the bare model twice and passed.
    On CPU (torch's DataParallel without GPUs runs the bare module) the check says it did not run."""
    ran = []
    monkeypatch.setattr(check, "train_steps", lambda *a, **k: ran.append(a) or fake_trained())
    result = check.check_dp(CPU, workers=2)
    assert result.status == "SKIP" and "CPU" in result.detail and ran == []
    one_gpu = check.check_dp(torch.device("cuda", 0), workers=2, gpu_count=1)
    assert one_gpu.status == "SKIP" and "needs 2 GPUs, torch sees 1" in one_gpu.detail and ran == []


def test_dp_check_on_gpus_trains_dp_over_its_devices_and_requires_dataparallel(monkeypatch):
    """The runner gives the dp run the planned GPUs; a dp run that did not run as DataParallel over them
    (the bare model, as before the fix) FAILs even when its numbers equal the single run's."""
    calls = []

    def recording(cfg, n_steps, worker, dtype=torch.float32, **kwargs):
        calls.append((cfg.strategy, cfg.workers, tuple(worker.devices), dtype))
        ran_as = {"wrapper": "DataParallel", "device_ids": (0, 1)} if cfg.strategy == "dp" else {}
        return fake_trained(**ran_as)

    monkeypatch.setattr(check, "train_steps", recording)
    cuda = torch.device("cuda", 0)
    result = check.check_dp(cuda, workers=2, gpu_count=4)
    assert result.passed, result.line()
    assert calls == [
        ("single", 1, (torch.device("cuda", 0),), torch.float64),  # the one device it was given
        ("dp", 2, (torch.device("cuda", 0), torch.device("cuda", 1)), torch.float64),
    ]
    plan = check.dp_plan(cuda, workers=3, gpu_count=4)
    assert plan.devices == tuple(torch.device("cuda", i) for i in range(3)) and plan.configs["dp"].workers == 3
    bare = fake_trained(wrapper="SimpleCNN")  # what the dp run was before: the model itself
    assert check.compare_dp(check.dp_plan(cuda, 2, 2), fake_trained(), bare).status == "FAIL"


def test_train_steps_hands_dp_devices_to_dataparallel(monkeypatch):
    """The chain below check_dp: train_steps gives `devices` to build_training, and wrap_model builds
    nn.DataParallel over exactly those GPUs (a recording DataParallel: no GPU needed to see the call)."""
    seen = []
    real_build = build_training

    def recording_build(*args, **kwargs):
        seen.append(args[3].devices)  # the worker's
        return real_build(*args, **kwargs)

    monkeypatch.setattr(loop, "build_training", recording_build)  # start_training calls it
    cfg = check.make_config(norm="group", batch_size=32)
    trained = check.train_steps(cfg, 1, Worker(0, 1, [CPU]))
    assert seen == [[CPU]]
    assert trained.wrapper == "SimpleCNN" and trained.device_ids == ()  # what check_dp refuses as a dp run

    class RecordingDataParallel(torch.nn.Module):
        def __init__(self, module, device_ids=None, output_device=None):
            super().__init__()
            self.module, self.device_ids, self.output_device = module, device_ids, output_device

    monkeypatch.setattr(torch.nn, "DataParallel", RecordingDataParallel)
    dp_cfg = check.make_config(strategy="dp", workers=2, use_gpu="true", backend="nccl")
    gpus = [torch.device("cuda", 0), torch.device("cuda", 1)]
    wrapped = wrap_model(build_model(dp_cfg), dp_cfg, gpus[0], world=1, devices=gpus)
    assert isinstance(wrapped, RecordingDataParallel)
    assert wrapped.device_ids == [0, 1] and wrapped.output_device == 0


def test_same_seed_repeats_and_other_seed_differs():
    result = check.check_seeds(CPU)
    assert result.passed, result.line()
    first, again, other = result.values["first"], result.values["again"], result.values["other"]
    assert torch.equal(first.final, again.final) and torch.equal(first.totals, again.totals)
    assert not torch.equal(first.initial, other.initial)
    assert first.totals[0].item() != other.totals[0].item()


def test_seed_tolerance_is_bitwise_on_cpu_and_relative_on_cuda():
    """Loss sums are ~220: cuDNN's atomics-ordered float32 sums differ by ~1e-7 relative, 2e-5 absolute, which
    the old absolute 1e-5 failed on a correct setup; relative tolerances pass it and still catch real drift."""
    cpu, cuda = check.seed_tolerance(CPU), check.seed_tolerance(torch.device("cuda", 0))
    assert (cpu.update, cpu.loss, cpu.correct) == (0.0, 0.0, 0)
    assert (cuda.update, cuda.loss) == (check.TOL_SEED_CUDA_UPDATE, check.TOL_SEED_CUDA_LOSS) and cuda.why
    first = fake_trained()
    rounding = fake_trained(loss_sum=220.0 * (1 + 1e-7), final_shift=1e-7, correct=31)
    assert abs(rounding.totals[0] - first.totals[0]).item() > 1e-5  # what the absolute tolerance refused
    assert check.compare_repeat(first, rounding, cuda)[0]
    assert not check.compare_repeat(first, rounding, cpu)[0]
    for drift in (
        fake_trained(loss_sum=220.0 * (1 + 1e-3)),
        fake_trained(final_shift=1e-2),
        fake_trained(correct=33),
    ):
        assert not check.compare_repeat(first, drift, cuda)[0]


def test_checkpoint_round_trip_equals_uninterrupted_on_cpu():
    """The CUDA check's code path with device=cpu, for real: save after 2 of 4 steps, load with
    map_location=cpu into a model of another seed, continue: bitwise the uninterrupted run."""
    result = check.check_checkpoint_round_trip(CPU)
    assert result.passed, result.line()
    whole, resumed = result.values["whole"], result.values["resumed"]
    assert torch.equal(whole.final, resumed.final)
    assert (whole.final - whole.initial).norm() > 0


def test_checkpoint_round_trip_check_sees_a_lost_random_state(monkeypatch):
    """Control: a load that drops the saved random state (dropout masks then differ) FAILs the check."""
    real_load = check.load_checkpoint

    def load_without_rng(folder, training, worker, *args, **kwargs):
        epoch = real_load(folder, training, worker, *args, **kwargs)
        torch.manual_seed(12345)
        return epoch

    monkeypatch.setattr(check, "load_checkpoint", load_without_rng)
    assert check.check_checkpoint_round_trip(CPU).status == "FAIL"


def test_bf16_autocast_stays_near_fp32_on_cpu():
    result = check.check_amp(CPU, "bf16")
    print(result.line())
    assert result.passed, result.line()
    assert result.values["update_rel_diff"] < check.TOL_AMP_UPDATE
    assert result.values["loss_rel_diff"] < check.TOL_AMP_LOSS
    assert result.values["update_rel_diff"] > 0  # bf16 really ran (not silently fp32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 + GradScaler needs a CUDA GPU; none here")
def test_fp16_with_grad_scaler_stays_near_fp32_on_cuda():
    result = check.check_amp(torch.device("cuda", 0), "fp16")
    assert result.passed, result.line()


def test_fp16_check_is_skipped_without_cuda():
    assert check.check_amp(CPU, "fp16").status == "SKIP"


def test_grad_scaler_counts_a_forced_inf_step():
    """train_epoch returns the skipped steps in totals[3] (-> amp_skipped_steps per epoch)."""
    result = check.check_grad_scaler(CPU)
    assert result.passed, result.line()
    assert result.values["skipped"] == 1  # of 3 steps: the clean ones are not counted
    assert result.values["unchanged"] == 0.0 and result.values["moved_after"] > 0
    assert result.values["finite_loss"]  # a skipped step does not turn the epoch's loss into NaN
    # GradScaler's default 65536 overflows real fp16 gradients in the first steps on a GPU: a natural
    # skip there would make the count 2 and FAIL the check; it starts small, like check_amp's
    assert result.values["init_scale"] == check.CHECK_INIT_SCALE <= 2.0**10


# The first step is skipped on purpose (an inf gradient), so the schedule steps before any optimizer step.
@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before:UserWarning")
def test_grad_scaler_count_over_an_epoch_with_two_bad_steps():
    """Lower level: train_epoch itself, 4 steps, gradients poisoned in steps 1 and 3."""
    cfg = check.make_config(norm="group", batch_size=32)
    torch.manual_seed(0)
    model = build_model(cfg)
    calls = [0]

    def hook(grad):
        calls[0] += 1
        return torch.full_like(grad, float("nan")) if calls[0] in (1, 3) else grad

    next(model.parameters()).register_hook(hook)
    train, _ = cached_splits(cfg)
    steps = list(iterate_train(train, cfg, 1, 0, 1))[:4]
    scaler = torch.amp.GradScaler("cpu", enabled=True, init_scale=1024.0)
    training = build_training(cfg, model, len(steps), Worker.single(CPU), scaler)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny model: one thread is fastest on a busy machine
    try:
        totals = train_epoch(training, steps, cfg, CPU)
    finally:
        torch.set_num_threads(threads)
    assert totals[3].item() == 2 and totals[2].item() == 4 * 32
    assert scaler.get_scale() == 1024.0 / 4  # halved once per skipped step


@pytest.fixture(scope="module")
def ddp_results(ray_cluster):
    return shared_ddp_run()


def test_ddp_two_workers_equals_single_process(ddp_results):
    params, _ = ddp_results
    assert params.passed, params.line()
    saved, single = params.values["saved"], params.values["single"]
    assert saved["world"] == 2  # really two ranks: wrap_model gave DistributedDataParallel
    assert torch.equal(saved["initial"], single.initial)
    assert params.values["update_rel_diff"] < check.TOL_FLOAT64
    # The comparison is sensitive: rank 0 training alone on its half of each batch is far off.
    ddp_cfg, single_cfg = ddp_checks.ddp_configs(2, CPU, 4)
    alone = check.train_steps(single_cfg, 4, Worker(0, 2, [CPU]), torch.float64)  # rank 0's shard, no all-reduce
    assert alone.totals[2].item() == 4 * 2 * 16
    names = [name for name, _ in build_model(single_cfg).named_parameters()]
    ddp_final = torch.cat([saved["state"][name].double().flatten() for name in names])
    assert check.update_rel_diff(single.initial, alone.final, ddp_final) > 1e-3


def test_train_metrics_aggregate_over_all_ranks(ddp_results):
    _, metrics = ddp_results
    assert metrics.passed, metrics.line()
    saved, single = ddp_results[0].values["saved"], ddp_results[0].values["single"]
    local, totals = saved["local"], saved["totals"]
    assert local[2].item() == 4 * 2 * 16  # rank 0 saw half: 4 steps x 2 micro-batches x 16
    assert totals[2].item() == single.totals[2].item() == 4 * 2 * 32  # the all-reduce covers both ranks
    assert totals[1].item() == single.totals[1].item()
    assert check.rel_diff(totals[0].item(), single.totals[0].item()) < check.TOL_METRIC64
    assert local[0].item() < totals[0].item()
