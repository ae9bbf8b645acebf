"""Large-batch and communication-efficient training: LR scaling, LARS, DDP compression hooks,
bytes per step, PowerSGD state across checkpoints (issue 9).

Costs: one pair of 2 gloo ranks (torch.multiprocessing, ~5 s) and one real Ray run (~30 s)."""

import json
import math
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from helpers import FRESH, in_a_fresh_process
from torch import nn

from cifar_ray.core.config import ConfigError, TrainConfig, parse_config, parse_overrides
from cifar_ray.training import comm
from cifar_ray.training.distributed import Worker
from cifar_ray.training.optim import LARS, build_optimizer, build_scheduler, lr_at_step, peak_lr, scaled_lr

# --- learning rate: Goyal et al. scaling on top of warm-up and the schedule


def test_lr_scaling_rules():
    assert scaled_lr(0.1, 2048, 256, "linear") == pytest.approx(0.8)
    assert scaled_lr(0.1, 2048, 256, "sqrt") == pytest.approx(0.1 * 8**0.5)
    assert scaled_lr(0.1, 2048, 256, "none") == 0.1
    assert scaled_lr(0.1, 128, 256, "linear") == pytest.approx(0.05)  # smaller batches scale down
    cfg = TrainConfig(lr=0.1, batch_size=256, accum_steps=8, lr_scaling="linear")  # base_batch defaults to 256
    assert cfg.base_batch == 256 and peak_lr(cfg) == pytest.approx(0.8)


@pytest.mark.parametrize("rule, peak", [("linear", 0.8), ("sqrt", 0.1 * math.sqrt(8)), ("none", 0.1)])
def test_lr_schedule_matches_the_formula_at_sampled_steps(rule, peak):
    # effective batch 256 x 8 = 2048 = 8 x base_batch; 10 steps/epoch, 10 epochs = 100 steps,
    # 2 warm-up epochs = 20 steps, then cosine over the remaining 80
    cfg = TrainConfig(
        lr=0.1,
        batch_size=256,
        accum_steps=8,
        base_batch=256,
        lr_scaling=rule,
        warmup_epochs=2,
        epochs=10,
        scheduler="cosine",
    )
    by_hand = {
        0: peak * 1 / 20,  # warm-up step s runs at (s+1)/20 of the peak
        9: peak * 10 / 20,
        19: peak,
        20: peak,  # cosine at t = 0
        60: peak * 0.5 * (1 + math.cos(math.pi * 40 / 80)),  # = peak / 2
        99: peak * 0.5 * (1 + math.cos(math.pi * 79 / 80)),
    }
    for step, lr in by_hand.items():
        assert lr_at_step(step, cfg, steps_per_epoch=10) == pytest.approx(lr, rel=1e-12), step
    # and the real optimizer + LambdaLR the training builds runs at exactly these LRs
    optimizer = build_optimizer([nn.Parameter(torch.zeros(2, 2))], cfg)
    scheduler = build_scheduler(optimizer, cfg, steps_per_epoch=10)
    seen = {}
    for step in range(100):
        seen[step] = optimizer.param_groups[0]["lr"]
        optimizer.step()
        scheduler.step()
    for step, lr in by_hand.items():
        assert seen[step] == pytest.approx(lr, rel=1e-12), step


# --- LARS


def test_lars_trust_ratio_and_one_step_by_hand():
    layer = nn.Linear(2, 2)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[3.0, 0.0], [0.0, 4.0]]))  # ||w|| = 5
        layer.bias.copy_(torch.tensor([1.0, -1.0]))
    layer.weight.grad = torch.tensor([[0.0, 1.0], [0.0, 0.0]])  # ||g|| = 1
    layer.bias.grad = torch.tensor([0.5, 0.5])
    cfg = TrainConfig(optimizer="lars", lr=2.0, momentum=0.9, weight_decay=0.1, lars_eta=0.001)
    optimizer = build_optimizer(layer.parameters(), cfg)
    assert isinstance(optimizer, LARS)
    # trust = eta ||w|| / (||g|| + wd ||w||) = 0.001 * 5 / (1 + 0.1 * 5) = 1/300
    trust = LARS.trust_ratio(layer.weight, layer.weight.grad, 0.001, 0.1)
    assert trust.item() == pytest.approx(1 / 300, rel=1e-6)
    optimizer.step()
    # weight: w - lr * trust * (g + wd w) = w - 2/300 * [[0.3, 1], [0, 0.4]]
    expected = torch.tensor([[3.0 - 2 / 300 * 0.3, 0.0 - 2 / 300 * 1.0], [0.0, 4.0 - 2 / 300 * 0.4]])
    torch.testing.assert_close(layer.weight.detach(), expected, rtol=1e-6, atol=1e-7)
    # bias (1-D): no trust ratio, no weight decay: b - lr * g
    torch.testing.assert_close(layer.bias.detach(), torch.tensor([0.0, -2.0]))
    # second step: the momentum buffer v = 0.9 v + lr * g (bias, same gradient)
    optimizer.step()
    torch.testing.assert_close(layer.bias.detach(), torch.tensor([0.0 - (0.9 * 1.0 + 1.0), -2.0 - (0.9 * 1.0 + 1.0)]))
    # a zero weight (or gradient) gets trust ratio 1 rather than 0 or NaN
    assert LARS.trust_ratio(torch.zeros(3, 3), torch.ones(3, 3), 0.001, 0.1).item() == 1.0


# --- config rules


@pytest.mark.parametrize(
    "values, expected",
    [
        (
            {"grad_compression": "powersgd", "workers": 1},
            "grad_compression=powersgd compresses DDP's gradient all-reduce: it needs strategy=ddp and workers > 1",
        ),
        ({"grad_compression": "fp16", "strategy": "single"}, "needs strategy=ddp and workers > 1"),
        (
            {"grad_compression": "zip", "workers": 2},
            "grad_compression='zip': not allowed; allowed: one of none, fp16, bf16, powersgd",
        ),
        ({"static_graph": True, "accum_steps": 2}, "static_graph=true does not work with accum_steps=2"),
        ({"powersgd_start_iter": 1}, "powersgd_start_iter=1: should be greater than or equal to 2"),
        ({"gradient_as_bucket_view": "maybe"}, "allowed: true or false"),
        ({"lr_scaling": "cubic"}, "allowed: one of none, linear, sqrt"),
    ],
)
def test_config_refuses_what_cannot_work(values, expected):
    with pytest.raises(ConfigError) as error:
        parse_config(values)
    assert expected in str(error.value)


def test_new_keys_parse_from_the_command_line():
    cfg = parse_config(
        parse_overrides(
            [
                "workers=2",
                "grad_compression=bf16",
                "bucket_cap_mb=1",
                "gradient_as_bucket_view=true",
                "static_graph=true",
                "optimizer=lars",
                "lr_scaling=sqrt",
                "base_batch=128",
            ]
        )
    )
    assert (cfg.grad_compression, cfg.bucket_cap_mb, cfg.gradient_as_bucket_view, cfg.static_graph) == (
        "bf16",
        1.0,
        True,
        True,
    )
    assert comm.ddp_kwargs(cfg) == {"bucket_cap_mb": 1.0, "gradient_as_bucket_view": True, "static_graph": True}
    assert (cfg.optimizer, cfg.lr_scaling, cfg.base_batch) == ("lars", "sqrt", 128)


# --- bytes per step


class Tiny(nn.Module):
    """conv weight 8x3x3x3 (an 8 x 27 matrix), conv bias 8, linear weight 10x32, linear bias 10."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.fc = nn.Linear(32, 10)


def test_bytes_per_step_by_hand():
    model = Tiny()
    fp32 = (216 + 8 + 320 + 10) * 4
    assert comm.gradient_bytes(model, "none") == fp32 == 2216
    assert comm.gradient_bytes(model, "fp16") == comm.gradient_bytes(model, "bf16") == fp32 // 2
    # rank 2: conv (8 + 27) * 2 = 70 elements, 2 * 70 < 216: compressed; fc (10 + 32) * 2 = 84, 168 < 320:
    # compressed; the biases are n x 1 matrices: never worth it, sent as they are
    assert comm.gradient_bytes(model, "powersgd", rank=2) == (70 + 8 + 84 + 10) * 4
    # rank 3: conv 35 * 3 = 105, 210 < 216 and fc 42 * 3 = 126, 252 < 320: both still compressed
    assert comm.gradient_bytes(model, "powersgd", rank=3) == (105 + 8 + 126 + 10) * 4
    # rank 4: conv 35 * 4 = 140, 280 > 216 and fc 42 * 4 = 168, 336 > 320: compressing would save
    # less than torch's min_compression_rate 2, so PowerSGD sends everything uncompressed
    assert comm.gradient_bytes(model, "powersgd", rank=4) == fp32
    cfg = TrainConfig(workers=2, batch_size=64, grad_compression="powersgd", powersgd_rank=2, powersgd_start_iter=2)
    # steps 0 and 1 are PowerSGD's fp32 warm-up; epoch = steps 0..4, then steps 5..9
    assert comm.allreduce_bytes_per_step(model, cfg, world=2, first_step=0, steps=5) == (2 * 2216 + 3 * 688) / 5
    assert comm.allreduce_bytes_per_step(model, cfg, world=2, first_step=5, steps=5) == 688
    assert comm.allreduce_bytes_per_step(model, TrainConfig(), world=1) == 0.0  # one process: no all-reduce


# --- two real gloo ranks: hooks, measured bytes, accumulation, PowerSGD checkpoint and resume


def _micro_batches(step: int, rank: int, accum: int, per_rank: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return [
        (torch.randn(per_rank, 3, 32, 32, generator=generator), torch.randint(0, 10, (per_rank,), generator=generator))
        for _ in range(accum)
    ]


def _two_rank_worker(rank: int, world: int, folder: str) -> None:
    """One of two gloo ranks (spawned by the test below); writes its findings to rank<N>.json."""
    import torch.distributed as dist

    from cifar_ray.core.checkpoints import CHECKPOINT_FILE
    from cifar_ray.training import loop as train
    from cifar_ray.training.models import build_model
    from cifar_ray.training.state import load_checkpoint, save_checkpoint

    torch.set_num_threads(1)
    # a timeout: a rank that fails mid-collective makes the other fail too, instead of waiting forever
    dist.init_process_group(
        "gloo", init_method=f"file://{folder}/store", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    sent = []  # bytes handed to every Python-level all-reduce (the hooks call dist.all_reduce)
    real_all_reduce = dist.all_reduce

    def counting_all_reduce(tensor, *args, **kwargs):
        sent.append(tensor.numel() * tensor.element_size())
        return real_all_reduce(tensor, *args, **kwargs)

    dist.all_reduce = counting_all_reduce
    cpu, findings = torch.device("cpu"), {}
    base = {
        "model": "simple_cnn",
        "width": 4,
        "depth": 2,
        "workers": 2,
        "batch_size": 16,
        "accum_steps": 2,
        "epochs": 2,
        "powersgd_rank": 2,
        "powersgd_start_iter": 2,
    }

    def build(cfg: TrainConfig, seed: int) -> train.Training:
        torch.manual_seed(seed)
        return train.build_training(cfg, build_model(cfg), 3, Worker(rank, world, [cpu]))

    def run(training: train.Training, cfg: TrainConfig, steps: range) -> None:
        train.train_epoch(training, (_micro_batches(step, rank, cfg.accum_steps) for step in steps), cfg, cpu)

    def resumed_equals_continuous(
        cfg: TrainConfig, checkpoint: Path, continuous: list[torch.Tensor], as_saved: bool = False
    ) -> bool:
        """Steps 3-5 after resuming from `checkpoint` equal the uninterrupted run's."""
        training = build(cfg, seed=123)  # other initial weights: everything must come from the checkpoint
        load_checkpoint(checkpoint, training, Worker(rank, world, [cpu]))
        if as_saved:  # no layout record: bucket memories are used as they are, like torch's own load
            comm.hook_state(training.model).layouts = {}
        run(training, cfg, range(3, 6))
        return all(torch.equal(a, b.detach()) for a, b in zip(continuous, training.raw_model.parameters()))

    def same_on_all_ranks(raw) -> bool:
        flat = torch.cat([p.detach().flatten() for p in raw.parameters()])
        gathered = [torch.zeros_like(flat) for _ in range(world)]
        dist.all_gather(gathered, flat)
        return all(torch.equal(g, gathered[0]) for g in gathered)

    for compression in ("fp16", "bf16", "powersgd"):
        cfg = TrainConfig(**base, grad_compression=compression)
        training = build(cfg, seed=0)
        sent.clear()
        run(training, cfg, range(5))  # 5 optimizer steps of 2 micro-batches each
        state = comm.hook_state(training.model)
        findings[compression] = {
            "hook": type(state).__name__ if state else None,
            "measured": sum(sent) / 5,
            "computed": comm.allreduce_bytes_per_step(training.raw_model, cfg, world, first_step=0, steps=5),
            "in_sync": same_on_all_ranks(training.raw_model),
            "finite": all(torch.isfinite(p).all().item() for p in training.raw_model.parameters()),
        }

    # PowerSGD checkpoint after 3 steps (2 warm-up + 1 compressed), then 3 more steps: continuously,
    # after a resume with the PowerSGD state, from a checkpoint without it, and with torch's memories put
    # back as they were saved (per bucket index). A new DDP starts with all parameters in one bucket in
    # registration order and rebuilds its buckets after the first iteration in gradient-ready
    # order: with one bucket (bucket_cap_mb=25) the parameters are reordered, with tiny buckets
    # (bucket_cap_mb=0.01) they also move between buckets.
    for bucket_cap_mb in (25, 0.01):
        cfg = TrainConfig(**base, grad_compression="powersgd", bucket_cap_mb=bucket_cap_mb)
        first = build(cfg, seed=0)
        run(first, cfg, range(3))
        states = comm.gather_hook_state(comm.hook_state(first.model))
        full, without_state = Path(folder) / f"full-{bucket_cap_mb}", Path(folder) / f"without-{bucket_cap_mb}"
        if rank == 0:
            assert states is not None and len(states) == world
            full.mkdir()
            without_state.mkdir()
            save_checkpoint(full, 1, first, comm_states=states)
            save_checkpoint(without_state, 1, first)  # the control: no PowerSGD state saved
        dist.barrier()
        saved = torch.load(full / CHECKPOINT_FILE, weights_only=False)["comm"]
        run(first, cfg, range(3, 6))
        continuous = [p.detach().clone() for p in first.raw_model.parameters()]

        resumed = build(cfg, seed=123)
        epoch = load_checkpoint(full, resumed, Worker(rank, world, [cpu]))
        state = comm.hook_state(resumed.model)
        findings[f"resume_{bucket_cap_mb}"] = {
            "epoch": epoch,
            "iter": state.iter,
            "buckets": len(saved[rank]["error_dict"]),
            "own_error": all(
                torch.equal(state.error_dict[k], saved[rank]["error_dict"][k]) for k in saved[rank]["error_dict"]
            ),
            "ranks_errors_differ": not all(
                torch.equal(saved[0]["error_dict"][k], saved[1]["error_dict"][k]) for k in saved[0]["error_dict"]
            ),
            "q_restored": bool(state.q_memory_dict)
            and all(
                torch.equal(state.q_memory_dict[k], saved[rank]["q_memory_dict"][k])
                for k in saved[rank]["q_memory_dict"]
            ),
            "equal_to_continuous": resumed_equals_continuous(cfg, full, continuous),
            "without_state_equal": resumed_equals_continuous(cfg, without_state, continuous),
            # torch's memories used as saved: with one bucket the error of each parameter lands on
            # another one, silently; with several, the first compressed step fails on a size mismatch
            "as_saved_equal": resumed_equals_continuous(cfg, full, continuous, as_saved=True)
            if bucket_cap_mb == 25
            else None,
        }
        dist.barrier()

    (Path(folder) / f"rank{rank}.json").write_text(json.dumps(findings))
    dist.destroy_process_group()


def test_hooks_bytes_and_powersgd_resume_on_two_gloo_ranks(tmp_path):
    import torch.multiprocessing as mp

    mp.start_processes(_two_rank_worker, args=(2, str(tmp_path)), nprocs=2, join=True, start_method=FRESH)
    for rank in (0, 1):
        findings = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for compression in ("fp16", "bf16", "powersgd"):
            row = findings[compression]
            # what the hooks really handed to all-reduce, per optimizer step (accumulation: one
            # all-reduce per step, not per micro-batch), is what the metric reports
            assert row["measured"] == row["computed"] > 0, (compression, row)
            assert row["in_sync"] and row["finite"], (compression, row)
        assert findings["fp16"]["measured"] == findings["bf16"]["measured"]
        assert findings["powersgd"]["hook"] == "PowerSGDState"
        for bucket_cap_mb in (25, 0.01):
            resume = findings[f"resume_{bucket_cap_mb}"]
            assert resume["epoch"] == 1 and resume["iter"] == 3 and resume["buckets"] >= 1, resume
            assert resume["own_error"] and resume["q_restored"], resume
            assert resume["ranks_errors_differ"], "error feedback is per rank: each rank's own must be saved"
            assert resume["equal_to_continuous"], (
                f"resumed PowerSGD training differs from the uninterrupted run: {resume}"
            )
            # controls: without the state, or with torch's per-bucket memories applied to the new
            # DDP's differently ordered buckets, the resumed run is not the uninterrupted one
            assert resume["without_state_equal"] is False and resume["as_saved_equal"] in (False, None), resume
        assert findings["resume_0.01"]["buckets"] > 1


def test_powersgd_state_dict_round_trip_without_a_process_group():
    """Unit level: a PowerSGDState's memories survive save -> new state -> load (torch.save file)."""
    import numpy as np

    state = comm.PowerSGDState(None, matrix_approximation_rank=2, start_powerSGD_iter=2)
    state.error_dict = {0: torch.randn(50), 1: torch.randn(7)}
    state.p_memory_dict, state.q_memory_dict = {0: torch.randn(12)}, {0: torch.randn(20)}
    state.iter, state.layouts = 17, {0: (3, 2, 1, 0), 1: (4,)}
    state.rng.randint(1000, size=5)  # advance the RNG
    expected_next = np.random.RandomState(0)
    expected_next.set_state(state.rng.get_state())
    saved = comm.hook_state_dict(state)
    assert "process_group" not in saved
    buffer = __import__("io").BytesIO()
    torch.save(saved, buffer)
    buffer.seek(0)
    fresh = comm.PowerSGDState(None, matrix_approximation_rank=2, start_powerSGD_iter=2)
    comm.load_hook_state_dict(fresh, torch.load(buffer, weights_only=False))
    for name in ("error_dict", "p_memory_dict", "q_memory_dict"):
        original, loaded = getattr(state, name), getattr(fresh, name)
        assert original.keys() == loaded.keys() and all(torch.equal(original[k], loaded[k]) for k in original)
    assert fresh.iter == 17 and fresh.layouts == state.layouts
    assert fresh.rng.randint(10**9) == expected_next.randint(10**9)  # the next random Q seed is the same


def _powersgd_steps_on_cpu_with_cuda_visible(store: str) -> None:
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    def no_sync(device=None):
        raise AssertionError(f"torch.cuda.synchronize({device}) on a CPU bucket")

    dist.init_process_group("gloo", init_method="file://" + store, rank=0, world_size=1)
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Flatten(), nn.Linear(48, 32), nn.Linear(32, 10)))
    cfg = TrainConfig(workers=2, batch_size=8, grad_compression="powersgd", powersgd_rank=1, powersgd_start_iter=2)
    state = comm.register_comm_hook(ddp, cfg)
    torch.cuda.is_available = lambda: True
    torch.cuda.synchronize = no_sync
    for _ in range(4):  # 2 plain all-reduces, then 2 compressed steps
        ddp(torch.randn(8, 3, 4, 4)).sum().backward()
    assert state.iter == 4 and state.error_dict and state.q_memory_dict  # compression ran
    assert powersgd.torch is torch  # torch's module keeps its own `torch`


def test_powersgd_on_cpu_tensors_never_synchronises_cuda(tmp_path):
    """A CPU worker sees the GPUs (RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0): torch's powerSGD_hook then calls
    torch.cuda.synchronize with the CPU device, which raises. Here CUDA reads as available and any sync raises;
    compressed steps on CPU must still run, and torch's own hook is left as it was. In a fresh process: a gloo
    process group made in the pytest process is freed later from one of gloo's own threads, whose
    ~ProcessGroupGloo joins itself and aborts the whole test session (seen in CI: SIGABRT in
    ProcessGroupGloo::runLoop during the next test)."""
    in_a_fresh_process(_powersgd_steps_on_cpu_with_cuda_visible, str(tmp_path / "store"))


# --- end to end through Ray: `cifar-ray train` with PowerSGD on 2 gloo workers


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.slow
def test_powersgd_run_through_ray_learns_and_reports_bytes(tmp_path, capsys):
    from cifar_ray.cli import main
    from cifar_ray.core import runlog
    from cifar_ray.training.models import build_model

    settings = {
        "dataset": "synthetic",
        "train_subset": 1024,
        "test_subset": 256,
        "width": 8,
        "epochs": 3,
        "workers": 2,
        "batch_size": 32,
        "accum_steps": 2,
        "augment": "none",
        "grad_compression": "powersgd",
        "powersgd_rank": 2,
        "powersgd_start_iter": 2,
        "lr": 0.025,
        "lr_scaling": "linear",
        "base_batch": 32,
        "warmup_epochs": 1,
    }
    code = main(
        [
            "train",
            "--storage",
            str(tmp_path),
            "--name",
            "psgd",
            "--json",
            "--set",
            *(f"{k}={v}" for k, v in settings.items()),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["status"] == "finished" and result["epochs_done"] == 3, result
    assert result["test_acc"] > 0.3, f"did not learn: {result['test_acc']}"  # chance is 0.1

    # expected bytes, computed here from the model's parameter shapes: PowerSGD rank 2 sends
    # (n + m) * 2 floats for an n x m weight worth compressing (torch's min_compression_rate 2),
    # everything else (biases, BN) as is; the first 2 optimizer steps are plain fp32
    model = build_model(TrainConfig(width=8))
    fp32 = compressed = 0
    for p in model.parameters():
        n = p.shape[0]
        m = p.numel() // n
        fp32 += 4 * p.numel()
        compressed += 4 * ((n + m) * min(n, m, 2) if (n + m) * min(n, m, 2) * 2 < n * m else p.numel())
    steps = 1024 // (32 * 2)  # 16 optimizer steps per epoch, ONE all-reduce each despite 2 micro-batches
    epochs = runlog.read_epochs(tmp_path / "psgd" / result["trial"])
    assert [row["epoch"] for row in epochs] == [1, 2, 3]
    assert epochs[0]["allreduce_bytes_per_step"] == pytest.approx((2 * fp32 + (steps - 2) * compressed) / steps)
    assert epochs[1]["allreduce_bytes_per_step"] == epochs[2]["allreduce_bytes_per_step"] == pytest.approx(compressed)
    assert fp32 / compressed > 20  # simple_cnn width 8: 608776 B -> 17104 B per step
    # linear scaling: effective batch 64 = 2 x base_batch 32 -> peak 0.05; warm-up over epoch 1
    assert all(row["peak_lr"] == pytest.approx(0.05) for row in epochs)
    assert epochs[0]["lr_last"] == epochs[0]["lr_max"] == pytest.approx(0.05)  # warm-up ends on the epoch's last step
    assert epochs[1]["lr_max"] == pytest.approx(0.05) and epochs[1]["lr_last"] < 0.05  # then cosine decays

    # the checkpoint holds both ranks' PowerSGD state (each rank's own error feedback)
    checkpoints = sorted((tmp_path / "psgd" / result["trial"]).rglob("state.pt"))
    assert checkpoints
    saved = torch.load(checkpoints[-1], weights_only=False)
    assert saved["epoch"] == 3 and len(saved["comm"]) == 2
    assert all(state["iter"] == 3 * steps and state["error_dict"] for state in saved["comm"])


def test_fused_optimizer_kernels_on_cuda_only():
    from cifar_ray.training.optim import build_optimizer

    params = list(torch.nn.Linear(3, 3).parameters())
    for name in ("sgd", "momentum", "nesterov", "adam", "adamw"):
        assert build_optimizer(params, TrainConfig(optimizer=name, use_gpu="true")).defaults["fused"] is True
        assert not build_optimizer(params, TrainConfig(optimizer=name, use_gpu="false")).defaults.get("fused")
    assert not build_optimizer(params, TrainConfig(optimizer="rmsprop", use_gpu="true")).defaults.get("fused")


def test_each_epoch_logs_its_last_and_highest_step_lr_as_the_optimizer_ran_them(tmp_path, monkeypatch):
    """lr_last and lr_max against the rates the optimizer stepped with (read before each step): warm-up over half
    an epoch, then onecycle's rise, so that an epoch's highest, first and last rates differ."""
    from cifar_ray.core.storage import StoragePath
    from cifar_ray.training import loop

    stepped: list[float] = []
    build_training = loop.build_training

    def recording(*args, **kwargs):
        training = build_training(*args, **kwargs)
        training.optimizer.register_step_pre_hook(lambda opt, *_: stepped.append(opt.param_groups[0]["lr"]))
        return training

    monkeypatch.setattr(loop, "build_training", recording)
    cfg = TrainConfig(
        dataset="synthetic",
        train_subset=256,
        test_subset=64,
        train_eval_size=0,
        width=4,
        depth=2,
        epochs=3,
        batch_size=32,
        scheduler="onecycle",
        warmup_epochs=0.5,
    )
    epochs: list[dict] = []
    torch.set_num_threads(1)
    worker = Worker(rank=0, world=1, devices=[torch.device("cpu")])
    loop.run_trial(cfg, StoragePath.of(tmp_path / "trial"), worker, lambda metrics, _: epochs.append(metrics))
    steps = 256 // 32
    assert len(stepped) == 3 * steps
    ran = [stepped[i * steps : (i + 1) * steps] for i in range(3)]
    assert [(row["lr_last"], row["lr_max"]) for row in epochs] == [
        (pytest.approx(rates[-1], rel=1e-12), pytest.approx(max(rates), rel=1e-12)) for rates in ran
    ]
    assert ran[0][0] < ran[0][-1] < max(ran[0])  # the first step's rate (the old `lr`) is neither
