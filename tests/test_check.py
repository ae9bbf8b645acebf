"""`cifar-ray check`: the real command on this machine, its output format, exit codes and usage errors."""

from __future__ import annotations

import re

import pytest
import torch
from helpers import shared_ddp_run

from cifar_ray.cli import main
from cifar_ray.cluster import checks as ddp_checks
from cifar_ray.training import checks as check
from cifar_ray.training import gpu
from cifar_ray.training.distributed import Worker

pytestmark = pytest.mark.usefixtures("ray_cluster")

REAL_CHECK_DDP = ddp_checks.check_ddp  # fast_checks swaps it for a fake
LINE = re.compile(r"^(PASS|FAIL|SKIP)  \S.*\[\d+\.\d s\]$")


def check_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line[:4] in ("PASS", "FAIL", "SKIP")]


def test_check_command_passes_on_this_machine(monkeypatch, capsys):
    """The whole command, for real: the in-process checks run here; the DDP check's one
    TorchTrainer run (2 gloo workers) is shared with test_equivalence.py, so the suite launches
    Ray Train once (run alone, this test makes that run itself)."""
    calls = []

    def shared(device, workers):
        calls.append((device.type, workers))
        return shared_ddp_run()

    monkeypatch.setattr(ddp_checks, "check_ddp", shared)
    code = main(["check", "--workers", "2", "--use-gpu", "false"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    lines = check_lines(out)
    assert all(LINE.match(line) for line in lines), lines
    names = " | ".join(lines)
    for expected in (
        "accumulation 4x16 == 64 (no BN)",
        "accumulation 4x16 vs 64 (batch-norm)",
        "single == ddp(1 worker)",
        "same seed repeats",
        "bf16 autocast",
        "GradScaler skipped steps counted (cpu)",
        "checkpoint round trip == uninterrupted (cpu)",
        "ddp 2 workers (gloo) == 1 process",
        "metrics all-reduced over 2 ranks",
    ):
        assert expected in names, expected
    assert sum(line.startswith("PASS") for line in lines) == 9
    skipped = [line for line in lines if line.startswith("SKIP")]
    # dp, fp16 and the 6 GPU variants of the DDP check: each says why it did not run, none passes vacuously
    assert len(skipped) == 8, skipped
    assert any("dp(2 GPUs) == single" in line and "on CPU it runs the bare model" in line for line in skipped)
    assert all("CUDA" in line for line in skipped)
    assert re.search(r"^9 passed, 0 failed, 8 skipped in \d+\.\d s$", out, re.M)
    # every PASS line shows what was measured and against which tolerance
    assert all("tol" in line or "expected" in line for line in lines if line.startswith("PASS"))
    assert calls == [("cpu", 2)]


@pytest.fixture
def fast_checks(monkeypatch):
    """The checks replaced by instant fakes: one fails, one crashes; for the exit-code logic."""

    def fake(name, status="PASS"):
        return lambda *args, **kwargs: check.CheckResult(name, status, "measured 0 (tol 1)")

    monkeypatch.setattr(check, "check_accumulation", fake("accumulation", "FAIL"))
    monkeypatch.setattr(check, "check_accumulation_batchnorm", fake("bn"))
    monkeypatch.setattr(check, "check_strategies", fake("strategies"))
    monkeypatch.setattr(check, "check_dp", fake("dp", "SKIP"))
    monkeypatch.setattr(check, "check_checkpoint_round_trip", fake("checkpoint"))
    monkeypatch.setattr(check, "check_seeds", fake("seeds"))
    monkeypatch.setattr(check, "check_amp", fake("amp", "SKIP"))
    monkeypatch.setattr(check, "check_grad_scaler", lambda *a, **k: 1 / 0)
    monkeypatch.setattr(
        ddp_checks,
        "check_ddp",
        lambda *a, **k: (check.CheckResult("ddp", "PASS", ""), check.CheckResult("metrics", "PASS", "")),
    )


def test_any_fail_exits_1_and_a_crash_is_a_fail_line(fast_checks, capsys):
    code = main(["check", "--use-gpu", "false"])
    out, _ = capsys.readouterr()
    assert code == 1
    lines = check_lines(out)
    assert lines[0].startswith("FAIL  accumulation")
    assert any(line.startswith("FAIL  GradScaler skipped steps") and "ZeroDivisionError" in line for line in lines)
    assert "6 passed, 2 failed, 9 skipped" in out  # SKIP: dp, the two amp checks, the 6 GPU variants


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--workers", "0"], "--workers must be >= 1"),
        # on CPU: with CUDA visible three ranks would share the GPU and run
        (["--workers", "3", "--use-gpu", "false"], "--workers 3 needs 3 CPUs but the Ray cluster has 2"),
        (["--use-gpu", "maybe"], "invalid choice: 'maybe'"),
        (["--workers", "two"], "invalid int value: 'two'"),
    ],
)
def test_usage_errors_exit_2_with_one_line(argv, message, fast_checks, capsys):
    code = main(["check", *argv])
    out, err = capsys.readouterr()
    assert code == 2
    assert err.count("\n") == 1 and message in err, err
    assert err.startswith(("cifar-ray: error:", "cifar-ray check: error:")), err
    assert not check_lines(out)  # refused before any check ran


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: use_gpu=true is valid here")
def test_use_gpu_true_without_cuda_is_a_usage_error(capsys):
    assert main(["check", "--use-gpu", "true"]) == 2
    _, err = capsys.readouterr()
    assert "use_gpu=true but torch sees no CUDA GPU" in err and err.count("\n") == 1


def test_check_shuts_down_only_the_ray_it_started(fast_checks, monkeypatch, capsys):
    import ray

    from cifar_ray.cluster import session as ray_session

    started, stopped = [], []
    monkeypatch.setattr(ray_session, "init_ray", lambda address=None, verbose=False: started.append(address) or True)
    monkeypatch.setattr(ray, "shutdown", lambda: stopped.append(True))
    assert main(["check", "--use-gpu", "false", "--address", "10.0.0.9:1"]) == 1  # the fake accumulation FAIL
    assert started == ["10.0.0.9:1"] and stopped == [True]


def test_the_checks_run_with_the_trials_cuda_numerics(fast_checks, monkeypatch, capsys):
    """The references of `cifar-ray check` ran with torch's defaults (TF32 convolutions on CUDA) while every
    trial and the DDP check's workers run IEEE fp32: the in-process checks now run as the trials do."""
    backends = torch.backends
    seen = []

    def seeds(*args, **kwargs):
        seen.append((backends.cuda.matmul.fp32_precision, backends.cudnn.conv.fp32_precision))
        return check.CheckResult("seeds", "PASS", "measured 0 (tol 1)")

    monkeypatch.setattr(check, "check_seeds", seeds)
    before = backends.cuda.matmul.fp32_precision, backends.cudnn.fp32_precision
    backends.cuda.matmul.fp32_precision = backends.cudnn.fp32_precision = "tf32"  # not the trials' numerics
    try:
        main(["check", "--use-gpu", "false"])
    finally:
        backends.cuda.matmul.fp32_precision, backends.cudnn.fp32_precision = before
    capsys.readouterr()
    assert seen == [(gpu.FP32_PRECISION, gpu.FP32_PRECISION)]


CUDA = torch.device("cuda", 0)


def test_ddp_check_shares_one_gpu_with_gloo():
    """Two ranks need two GPUs under NCCL; with fewer, the check's ranks share them over gloo."""
    assert ddp_checks.ddp_shape(CUDA, 2, 2) == {"use_gpu": "true", "backend": "nccl", "gpus_per_worker": 1.0}
    assert ddp_checks.ddp_shape(CUDA, 2, 1) == {"use_gpu": "true", "backend": "gloo", "gpus_per_worker": 0.5}
    assert ddp_checks.ddp_shape(CUDA, 3, 1)["gpus_per_worker"] == 0.3333  # Ray's 4 decimals, 3 shares <= 1
    assert ddp_checks.ddp_shape(CUDA, 3, 2)["gpus_per_worker"] == 0.5  # two ranks on the fullest GPU
    plan = ddp_checks.ddp_plan(CUDA, 2, 1)
    ddp, single = plan.configs["ddp"], plan.configs["single"]
    assert (ddp.backend, ddp.gpus_per_worker, ddp.workers, ddp.use_gpu) == ("gloo", 0.5, 2, "true")
    assert (single.strategy, single.use_gpu) == ("single", "true")
    assert "(gloo, 0.5 GPU each)" in plan.name and plan.tolerance == check.TOL_FLOAT64


def test_check_on_one_gpu_runs_two_ranks_sharing_it(fast_checks, monkeypatch, capsys):
    """`cifar-ray check` (2 workers) on a one-GPU machine: before, refused ("needs 2 GPUs"); now its DDP check
    runs gloo ranks sharing the GPU, and the GPU variants that need 2 GPUs say so."""
    from cifar_ray.cluster import placement

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
    monkeypatch.setattr(placement, "cluster_capacity", lambda: {"cpus": 2.0, "gpus": 1.0})
    ddp_runs, variants = [], []

    def no_gpu_run(plan, device, n_steps):
        ddp_runs.append(plan)
        raise RuntimeError("no GPU here")

    monkeypatch.setattr(ddp_checks, "run_plan", no_gpu_run)
    monkeypatch.setattr(ddp_checks, "check_ddp", REAL_CHECK_DDP)
    real_variant = ddp_checks.check_gpu_variant
    monkeypatch.setattr(
        ddp_checks, "check_gpu_variant", lambda plan, device: variants.append(plan) or real_variant(plan, device)
    )
    assert main(["check"]) == 1  # the fake accumulation FAIL, and run_plan's RuntimeError: not a refusal
    out, err = capsys.readouterr()
    assert "needs" not in err, err
    assert f"GPU Fake GPU, {gpu.NUMERICS}" in out.splitlines()[0]  # the header says which numerics ran
    main_ddp = ddp_runs[0].configs["ddp"]
    assert (main_ddp.backend, main_ddp.gpus_per_worker, main_ddp.workers) == ("gloo", 0.5, 2)
    names = [plan.name for plan in variants]
    assert "2 ranks sharing 1 GPU" not in names  # the ddp check above is that run
    per_rank = next(plan for plan in variants if plan.name.startswith("gloo on CUDA tensors"))
    assert per_rank.skip == "needs 2 GPUs, torch sees 1"
    assert len(variants) == len(ddp_checks.GPU_VARIANTS) - 1


def test_gpu_variant_plans():
    """What each GPU variant compares and at which tolerance; on CPU every one is a SKIP saying why."""
    assert all(plan.skip == "needs a CUDA GPU" for plan in ddp_checks.gpu_variant_plans(torch.device("cpu"), 0))
    plans = {plan.name: plan for plan in ddp_checks.gpu_variant_plans(CUDA, 2)}
    assert len(plans) == len(ddp_checks.GPU_VARIANTS) and not any(plan.skip for plan in plans.values())

    def ddp(name):
        return plans[name].configs["ddp"]

    assert (
        ddp("gloo on CUDA tensors, 1 GPU per rank").backend,
        ddp("gloo on CUDA tensors, 1 GPU per rank").gpus_per_worker,
    ) == ("gloo", 1.0)
    assert (ddp("2 ranks sharing 1 GPU").backend, ddp("2 ranks sharing 1 GPU").gpus_per_worker) == ("gloo", 0.5)
    amp = plans["ddp fp16 autocast + GradScaler ~ fp32"]
    assert (amp.configs["ddp"].amp, amp.configs["single"].amp, amp.dtype) == ("fp16", "off", torch.float32)
    assert amp.tolerance == check.TOL_AMP_UPDATE
    for hook, tolerance in (("fp16", ddp_checks.TOL_FP16_HOOK), ("bf16", ddp_checks.TOL_BF16_HOOK)):
        plan = plans[f"ddp {hook} gradient hook"]
        assert plan.configs["ddp"].grad_compression == hook and plan.tolerance == tolerance
        assert plan.configs["single"].grad_compression == "none"  # the reference is uncompressed
    assert plans["ddp PowerSGD hook"].configs["ddp"].grad_compression == "powersgd"
    for plan in plans.values():  # every run on the GPU, and a reason for every tolerance
        assert plan.configs["ddp"].use_gpu == plan.configs["single"].use_gpu == "true" and plan.why


def test_compare_params_tolerance_start_and_skipped_steps():
    """The comparison every DDP plan ends in, on a real single-process run and a made-up ddp result."""
    cpu = torch.device("cpu")
    ddp_cfg, single_cfg = ddp_checks.ddp_configs(2, cpu, 2)
    single = check.train_steps(single_cfg, 2, Worker.single(cpu), torch.float32)
    names = [name for name, _ in ddp_checks.build_model(single_cfg).named_parameters()]
    move = single.final - single.initial

    def saved(shift: float = 0.0, skipped: int = 0, initial=None):
        final = single.final + shift * move
        sizes = [single.state[name].numel() for name in names]
        pieces = final.split(sizes)
        state = {name: piece.view_as(single.state[name]) for name, piece in zip(names, pieces)}
        totals = single.totals.clone()
        totals[3] = skipped
        return {"state": state, "totals": totals, "initial": single.initial if initial is None else initial}

    plan = check.Plan("ddp fp16 gradient hook", {"ddp": ddp_cfg, "single": single_cfg}, 1e-2, "fp16 gradients")
    assert ddp_checks.compare_params(plan, saved(shift=5e-3), single).passed
    assert not ddp_checks.compare_params(plan, saved(shift=2e-2), single).passed
    assert not ddp_checks.compare_params(plan, saved(skipped=1), single).passed
    assert not ddp_checks.compare_params(plan, saved(initial=single.initial + 1), single).passed
    assert not ddp_checks.compare_params(plan, saved(shift=float("nan")), single).passed
