"""Training paths that would print wrong numbers without an error (issue 14, items 1-7, 9).

Two gloo ranks (torch.multiprocessing, ~10 s) prove the multi-rank items: fp16 + PowerSGD keeps
training after an overflow, the skipped-step count is not multiplied by the workers, each rank
draws its own dropout masks, and each rank resumes its own random state. The rest are unit tests
on the CPU; the CUDA-only ones skip here."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from helpers import two_gloo_ranks
from torch import nn

from cifar_ray.core.checkpoints import CHECKPOINT_FILE
from cifar_ray.core.config import TrainConfig
from cifar_ray.training import comm, data
from cifar_ray.training import loop as train
from cifar_ray.training.check_runs import make_config, train_steps
from cifar_ray.training.distributed import Worker, rank_seed, reduce_train_totals
from cifar_ray.training.memory import peak_memory_mb, reset_peak_memory
from cifar_ray.training.models import build_model
from cifar_ray.training.state import CheckpointError, load_checkpoint, restore_rng_state, rng_state, save_checkpoint

POISONED_STEP = 3  # 0-based optimizer step whose gradient overflows on rank 0 (PowerSGD compresses from step 2)
STEPS = 8


def _batches(step: int, rank: int, per_rank: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1000 * step + rank)
    images = torch.randn(per_rank, 3, 32, 32, generator=generator)
    return [(images, torch.randint(0, 10, (per_rank,), generator=generator))]


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _powersgd_after_overflow(rank: int, world: int) -> dict:
    """PowerSGD with GradScaler: rank 0's gradient is inf in step POISONED_STEP (as an fp16 overflow)."""
    cfg = TrainConfig(
        model="simple_cnn",
        width=4,
        depth=2,
        norm="group",
        workers=world,
        batch_size=16,
        grad_compression="powersgd",
        powersgd_start_iter=2,
        use_gpu="false",
    )
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    model = build_model(cfg)
    calls = []
    if rank == 0:
        model.head[-1].weight.register_hook(
            lambda grad: (
                torch.full_like(grad, float("inf")) if calls.append(1) or len(calls) == POISONED_STEP + 1 else grad
            )
        )
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, enabled=True)
    training = train.build_training(cfg, model, STEPS, Worker(rank, world, [cpu]), scaler)
    moved, local = [], torch.zeros(4, dtype=torch.float64)
    for step in range(STEPS):
        before = _flat(model)
        local += train.train_epoch(training, [_batches(step, rank)], cfg, cpu)
        moved.append((_flat(model) - before).abs().max().item())
    state = comm.hook_state(training.model)
    totals = reduce_train_totals(local)
    return {
        "moved": moved,
        "memories_finite": all(
            torch.isfinite(t).all().item() for t in [*state.error_dict.values(), *state.q_memory_dict.values()]
        ),
        "params_finite": bool(torch.isfinite(_flat(model)).all()),
        "local_skipped": local[3].item(),
        "skipped": totals[3].item(),
        "samples": totals[2].item(),
        "local_samples": local[2].item(),
    }


class DropoutMasks:
    """Records the mask of the model's first dropout in every forward: the draw the real dropout is
    about to make (same function, shape and generator state), taken on a forked RNG."""

    def __init__(self):
        self.masks: list[torch.Tensor] = []

    def __call__(self, model: nn.Module) -> None:
        dropout = next(m for m in model.modules() if isinstance(m, nn.Dropout))

        def record(module, inputs):
            with torch.random.fork_rng(devices=[]):
                self.masks.append(nn.functional.dropout(torch.ones_like(inputs[0]), module.p, True) == 0)

        dropout.register_forward_pre_hook(record)


def _dropout_masks(rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    cfg = make_config(dropout=0.5, workers=world, batch_size=16 * world)
    runs = []
    for _ in range(2):  # the same seed twice
        masks = DropoutMasks()
        train_steps(cfg, 2, Worker(rank, world, [torch.device("cpu")]), prepare=masks)
        runs.append(torch.stack(masks.masks))
    return runs[0], runs[1]


def _rank_rng_resume(rank: int, world: int, folder: Path) -> dict:
    """Each rank's random state saved (gathered to rank 0) and restored on that same rank."""
    import torch.distributed as dist

    cfg = make_config(workers=world, batch_size=16 * world)
    cpu = torch.device("cpu")
    model = build_model(cfg)
    training = train.build_training(cfg, model, 4, Worker(rank, world, [cpu]))
    torch.rand(rank + 3)  # advance each rank's stream by a different amount
    states = comm.gather_on_rank0(rng_state(cpu))
    if rank == 0:
        save_checkpoint(folder, 1, training, rng_states=states)
    dist.barrier()
    expected = torch.rand(4)
    torch.manual_seed(12345)  # lose the state
    load_checkpoint(folder, training, Worker(rank, world, [cpu]), seed=cfg.seed)
    return {"resumed_draw_equals_own": torch.equal(torch.rand(4), expected), "draw": expected.tolist()}


def _findings(rank: int, world: int, folder: str) -> dict:
    import torch.distributed as dist

    findings = {"powersgd": _powersgd_after_overflow(rank, world)}
    first, again = _dropout_masks(rank, world)
    gathered = [torch.zeros_like(first) for _ in range(world)]
    dist.all_gather(gathered, first)
    findings["dropout"] = {
        "repeats": torch.equal(first, again),
        "ranks_differ": not torch.equal(gathered[0], gathered[1]),
        "drop_share": first.float().mean().item(),
    }
    findings["rng"] = _rank_rng_resume(rank, world, Path(folder))
    return findings


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> list[dict]:
    return two_gloo_ranks(_findings, tmp_path_factory.mktemp("two-ranks"))


def test_powersgd_with_grad_scaler_trains_on_after_an_overflow(two_ranks):
    for rank, findings in enumerate(two_ranks):
        run = findings["powersgd"]
        assert run["moved"][POISONED_STEP] == 0.0, "the overflowed step must be skipped on every rank"
        after = run["moved"][POISONED_STEP + 1 :]
        assert all(step > 0 for step in after), f"training stopped after the overflow on rank {rank}: {run}"
        assert run["memories_finite"] and run["params_finite"], run
        assert run["local_skipped"] == 1.0, run


def test_skipped_steps_are_counted_once_not_per_worker(two_ranks):
    run = two_ranks[0]["powersgd"]
    assert run["skipped"] == 1.0, "every rank skips the same step: 2 workers must not report 2"
    assert run["samples"] == 2 * run["local_samples"], "samples are still summed over the ranks"


def test_each_rank_draws_its_own_dropout_masks_and_repeats_them(two_ranks):
    for findings in two_ranks:
        assert findings["dropout"]["repeats"], "the same seed must give the same masks"
        assert findings["dropout"]["ranks_differ"], "ranks drew identical dropout masks"
        assert 0.4 < findings["dropout"]["drop_share"] < 0.6


def test_each_rank_resumes_its_own_random_state(two_ranks):
    for findings in two_ranks:
        assert findings["rng"]["resumed_draw_equals_own"]
    assert two_ranks[0]["rng"]["draw"] != two_ranks[1]["rng"]["draw"]


def test_rank_streams_differ_from_each_other_and_from_the_weight_seed():
    seeds = {(seed, rank): rank_seed(seed, rank) for seed in range(3) for rank in range(8)}
    assert len(set(seeds.values())) == 24
    assert all(stream != seed for (seed, _), stream in seeds.items()), "a rank's stream is not the weights' seed"


def test_a_resume_on_another_number_of_workers_restarts_the_rank_stream():
    cpu = torch.device("cpu")
    torch.manual_seed(7)
    saved = [rng_state(cpu)]
    restore_rng_state(saved, rank=1, world=2, seed=3, devices=[cpu])
    torch.manual_seed(rank_seed(3, 1))
    expected = torch.rand(3)
    restore_rng_state(saved, rank=1, world=2, seed=3, devices=[cpu])
    assert torch.equal(torch.rand(3), expected)


# --- DataParallel: the replicas' autocast dtype and device ids (wiring tested on CPU, run on GPUs only)


def test_replica_autocast_keeps_the_configured_dtype_in_a_replica_thread():
    """nn.DataParallel runs each replica in a thread under autocast without a dtype (the device's
    default, fp16 on CUDA; pytorch/pytorch#125186). Simulated on the CPU with fp16 as that default."""
    layer, x = nn.Linear(4, 3), torch.randn(2, 4)
    seen = {}

    def replica_thread():
        with torch.autocast("cpu", dtype=torch.float16):
            seen["bare"] = layer(x).dtype
            seen["wrapped"] = train.ReplicaAutocast(layer, "cpu", torch.bfloat16)(x).dtype

    thread = threading.Thread(target=replica_thread)
    thread.start()
    thread.join()
    assert seen == {"bare": torch.float16, "wrapped": torch.bfloat16}


def test_dp_wraps_replicas_with_the_amp_dtype_on_rays_gpus(monkeypatch):
    built = {}

    class RecordingDataParallel(nn.Module):
        def __init__(self, module, device_ids, output_device):
            super().__init__()
            built.update(module=module, device_ids=device_ids, output_device=output_device)

    monkeypatch.setattr(train.nn, "DataParallel", RecordingDataParallel)
    cfg = TrainConfig(strategy="dp", workers=2, amp="bf16", use_gpu="true")
    ray_gpus = [torch.device("cuda", 2), torch.device("cuda", 3)]  # what ray.train.torch.get_devices() gives
    train.wrap_model(nn.Linear(2, 2), cfg, ray_gpus[0], world=1, devices=ray_gpus)
    assert built["device_ids"] == [2, 3] and built["output_device"] == 2
    assert isinstance(built["module"], train.ReplicaAutocast) and built["module"].dtype == torch.bfloat16
    cfg_fp32 = TrainConfig(strategy="dp", workers=2, amp="off", use_gpu="true")
    train.wrap_model(nn.Linear(2, 2), cfg_fp32, ray_gpus[0], world=1, devices=ray_gpus)
    assert isinstance(built["module"], nn.Linear)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_peak_memory_is_the_max_over_the_workers_gpus():
    devices = [torch.device("cuda", 0), torch.device("cuda", 1)]
    reset_peak_memory(devices)
    small, big = torch.empty(2**20, device=devices[0]), torch.empty(2**24, device=devices[1])
    assert peak_memory_mb(devices) >= big.numel() * 4 / 2**20 > small.numel() * 4 / 2**20


# --- the data path


def test_normalising_builds_no_tensor_per_batch_and_draws_on_the_datas_device(monkeypatch):
    cfg = make_config(augment="flip_crop_cutout", batch_size=32)
    split = data.synthetic_cifar(128, split_seed=1)
    list(data.iterate_train(split, cfg, 1, 0, 1))  # warm the per-device constants
    built, draws = [], []
    real_tensor, real_randint = torch.tensor, torch.randint
    monkeypatch.setattr(torch, "tensor", lambda *a, **k: built.append(a) or real_tensor(*a, **k))
    monkeypatch.setattr(torch, "randint", lambda *a, **k: draws.append(k.get("device")) or real_randint(*a, **k))
    steps = list(data.iterate_train(split, cfg, 2, 0, 1))
    assert len(steps) == 4 and not built, "normalise must not build its constants per batch (a host copy on CUDA)"
    assert draws and all(device == split.images.device for device in draws), draws


def test_inputs_take_the_models_memory_format():
    cfg = make_config(batch_size=16)
    split = data.synthetic_cifar(32, split_seed=1)
    images, _ = next(data.iterate_train(split, cfg, 1, 0, 1, torch.channels_last))[0]
    assert images.is_contiguous(memory_format=torch.channels_last)


def test_the_loop_trains_channels_last_on_cpu(monkeypatch, tmp_path):
    """Weights and every batch the model sees in a CPU trial are NHWC (oneDNN's fast layout: loop.MEMORY_FORMAT)."""
    weights, inputs = [], []
    real_build = train.build_training

    def recording(cfg, model, *args, **kwargs):
        weights.extend(p.is_contiguous(memory_format=torch.channels_last) for p in model.parameters() if p.dim() == 4)
        model.register_forward_pre_hook(
            lambda _, args: inputs.append(args[0].is_contiguous(memory_format=torch.channels_last))
        )
        return real_build(cfg, model, *args, **kwargs)

    monkeypatch.setattr(train, "build_training", recording)
    cfg = make_config(train_subset=64, test_subset=32, batch_size=16, epochs=1, augment="flip_crop")
    train.run_trial(cfg, str(tmp_path), Worker(0, 1, [torch.device("cpu")]), lambda metrics, folder: None)
    assert weights and all(weights)
    assert len(inputs) >= 4 and all(inputs)  # 4 training steps and the evaluation passes


def test_cutout_hole_is_exactly_cutout_size():
    images = torch.ones(64, 3, 32, 32)
    out = data.augment(images, "flip_crop_cutout", torch.Generator().manual_seed(0))
    holes = (out == 0).all(1)  # N x H x W
    rows, cols = holes.any(2).sum(1), holes.any(1).sum(1)
    inside = holes.sum((1, 2)) == data.CUTOUT_SIZE**2  # holes clipped by the border are smaller
    assert inside.any() and (rows[inside] == data.CUTOUT_SIZE).all() and (cols[inside] == data.CUTOUT_SIZE).all()
    assert (holes.sum((1, 2)) <= data.CUTOUT_SIZE**2).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_an_epoch_makes_no_host_sync_on_cuda():
    device = torch.device("cuda", 0)
    cfg = make_config(use_gpu="true", backend="nccl", augment="flip_crop_cutout", batch_size=32, dropout=0.1)
    split = data.synthetic_cifar(256, split_seed=1).to(device)
    model = build_model(cfg).to(device, memory_format=torch.channels_last)
    training = train.build_training(cfg, model, 8, Worker.single(device))
    list(data.iterate_train(split, cfg, 1, 0, 1, torch.channels_last))  # warm-up: constants, kernels
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        train.train_epoch(training, data.iterate_train(split, cfg, 2, 0, 1, torch.channels_last), cfg, device)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_the_epochs_indices_reach_a_gpu_without_a_host_sync(monkeypatch):
    """test_an_epoch_makes_no_host_sync_on_cuda failed on a GPU: iterate_train copied the epoch's indices from
    pageable memory, which the host waits for. They go from pinned memory, non-blocking (fakes stand in for CUDA)."""
    copies = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: copies.append("pinned") or self)
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *args, **kwargs: copies.append((args, kwargs)) or self)
    cuda = torch.device("cuda", 0)
    data.to_device(torch.arange(4), cuda)
    assert copies == ["pinned", ((cuda,), {"non_blocking": True})]
    monkeypatch.undo()
    moved = []
    monkeypatch.setattr(data, "to_device", lambda tensor, device: moved.append(device) or tensor.to(device))
    cfg = make_config(batch_size=32)
    assert len(list(data.iterate_train(data.synthetic_cifar(64, 1), cfg, 1, 0, 1))) == 2
    assert moved == [torch.device("cpu")]  # the epoch's indices, once


# --- checkpoints are data, never code


class _Exploit:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_checkpoint_that_would_run_code_is_refused_in_one_line(tmp_path):
    marker = tmp_path / "pwned"
    torch.save({"epoch": 1, "model": _Exploit(marker)}, tmp_path / CHECKPOINT_FILE)
    cfg = make_config()
    model = build_model(cfg)
    training = train.build_training(cfg, model, 4, Worker.single(torch.device("cpu")))
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(tmp_path, training, Worker.single(torch.device("cpu")))
    message = str(error.value)
    assert "\n" not in message and str(tmp_path / CHECKPOINT_FILE) in message
    assert not marker.exists(), "loading the checkpoint ran code"


def test_a_real_checkpoint_loads_with_weights_only(tmp_path):
    cfg = make_config(dropout=0.1)
    cpu = torch.device("cpu")
    model = build_model(cfg)
    save_checkpoint(tmp_path, 3, train.build_training(cfg, model, 4, Worker.single(cpu)))
    expected = torch.rand(3)
    other_cfg = make_config(dropout=0.1, seed=5)
    other = build_model(other_cfg)
    assert (
        load_checkpoint(tmp_path, train.build_training(other_cfg, other, 4, Worker.single(cpu)), Worker.single(cpu))
        == 3
    )
    assert torch.equal(_flat(other), _flat(model)) and torch.equal(torch.rand(3), expected)


def test_a_checkpoint_resumed_on_other_hardware_keeps_the_optimizers_fused_kernels(tmp_path, monkeypatch):
    """A checkpoint of a CPU run (no fused kernels) resumed where build_optimizer chose fused=True (CUDA): the
    optimizer keeps running fused. Fused Adam runs on CPU too, which stands in for CUDA here."""
    cfg = make_config(optimizer="adam", lr=1e-3, batch_size=32)  # 2 steps an epoch of 64 images
    cpu = torch.device("cpu")
    saved = train.build_training(cfg, build_model(cfg), 4, Worker.single(cpu))
    train.train_epoch(saved, data.iterate_train(data.synthetic_cifar(64, 1), cfg, 1, 0, 1), cfg, cpu)
    save_checkpoint(tmp_path, 1, saved)
    assert not saved.optimizer.param_groups[0]["fused"]
    monkeypatch.setattr(train, "build_optimizer", lambda params, cfg: torch.optim.Adam(params, lr=cfg.lr, fused=True))
    resumed = train.build_training(cfg, build_model(cfg), 4, Worker.single(cpu))
    load_checkpoint(tmp_path, resumed, Worker.single(cpu))
    assert all(group["fused"] for group in resumed.optimizer.param_groups)
    assert resumed.optimizer.param_groups[0]["lr"] == saved.optimizer.param_groups[0]["lr"]  # the rest: saved
    steps = [state["step"] for state in resumed.optimizer.state.values()]
    assert steps and all(step.dtype == torch.float32 and step.item() == 2 for step in steps)  # as fused kernels take it
    train.train_epoch(resumed, data.iterate_train(data.synthetic_cifar(64, 1), cfg, 2, 0, 1), cfg, cpu)
