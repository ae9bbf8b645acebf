"""`cifar-ray check`: the real command on this machine, its output format, exit codes and usage errors."""

from __future__ import annotations

import re

import pytest
import torch
from helpers import shared_ddp_run

from cifar_ray.cli import main
from cifar_ray.cluster import checks as ddp_checks
from cifar_ray.training import checks as check

pytestmark = pytest.mark.usefixtures("ray_cluster")

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
        "single == dp(1) == ddp(1 worker)",
        "same seed repeats",
        "bf16 autocast",
        "GradScaler skipped steps counted (cpu)",
        "ddp 2 workers (gloo) == 1 process",
        "metrics all-reduced over 2 ranks",
    ):
        assert expected in names, expected
    assert sum(line.startswith("PASS") for line in lines) == 8
    skipped = [line for line in lines if line.startswith("SKIP")]
    assert len(skipped) == 1 and "fp16" in skipped[0] and "CUDA" in skipped[0]
    assert re.search(r"^8 passed, 0 failed, 1 skipped in \d+\.\d s$", out, re.M)
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
    assert "5 passed, 2 failed, 2 skipped" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--workers", "0"], "--workers must be >= 1"),
        (["--workers", "3"], "--workers 3 needs 3 CPUs but the Ray cluster has 2"),
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
