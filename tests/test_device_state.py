"""A trial's state on a GPU, proven on the CPU (issue 26): checkpoints resume where the model lives, the
optimizer state takes its parameters' layout, every GPU's random state is kept, a skipped fp16 step is not a
divergence, and memory is read from the worker's own devices. `meta` tensors stand in for CUDA ones (torch
refuses both in .numpy() and copies out of neither without a move); torch.cuda functions are recorders."""

from __future__ import annotations

import gc
import math
import time
import weakref

import numpy as np
import pytest
import torch

from cifar_ray.cluster.session import failure_status
from cifar_ray.training import comm
from cifar_ray.training import loop as train
from cifar_ray.training.check_runs import make_config
from cifar_ray.training.distributed import Worker
from cifar_ray.training.flops import Peak
from cifar_ray.training.memory import GpuOutOfMemoryError, peak_reserved_mb, release_trial, rss_mb, trim_host_heap
from cifar_ray.training.models import build_model
from cifar_ray.training.state import load_checkpoint, rng_state, save_checkpoint
from cifar_ray.training.timing import PhaseTimer

META = torch.device("meta")


def _powersgd_state() -> comm.PowerSGDState:
    state = comm.PowerSGDState(None, matrix_approximation_rank=2, start_powerSGD_iter=2)
    state.error_dict, state.iter = {0: torch.randn(50)}, 9
    state.rng.randint(1000, size=5)  # advance the numpy RNG: its keys are what a resume must restore
    return state


@pytest.mark.filterwarnings("ignore:for .*copying from a non-meta parameter")  # meta stands in for the device
def test_a_powersgd_checkpoint_resumes_on_another_device(tmp_path, monkeypatch):
    """Saved on the CPU, resumed where the model lives (meta standing in for CUDA): the PowerSGD RNG keys and
    the generators' states must reach numpy and torch.set_rng_state as CPU tensors, not on the device."""
    cfg = make_config()
    cpu = torch.device("cpu")
    saved_state = _powersgd_state()
    expected_draw = np.random.RandomState(0)
    expected_draw.set_state(saved_state.rng.get_state())
    save_checkpoint(
        tmp_path,
        2,
        train.build_training(cfg, build_model(cfg), 4, Worker.single(cpu)),
        [comm.hook_state_dict(saved_state)],
    )

    resumed_state = comm.PowerSGDState(None, matrix_approximation_rank=2, start_powerSGD_iter=2)
    monkeypatch.setattr(comm, "hook_state", lambda model: resumed_state)  # the resumed DDP model's hook
    on_device = train.build_training(cfg, build_model(cfg).to(META), 4, Worker.single(META))
    assert load_checkpoint(tmp_path, on_device, Worker.single(META)) == 2
    assert resumed_state.iter == 9 and resumed_state.error_dict[0].device == META  # memories go to the device
    assert resumed_state.rng.randint(10**9) == expected_draw.randint(10**9)


def test_optimizer_state_takes_the_layout_of_its_parameters(tmp_path):
    """A CPU checkpoint (contiguous buffers) resumed where the parameters are channels_last (CUDA's layout):
    after load_checkpoint every state tensor has its parameter's strides, as fused optimizer kernels require."""
    cfg = make_config(optimizer="adam")
    cpu = torch.device("cpu")
    saved = train.build_training(cfg, build_model(cfg), 4, Worker.single(cpu))
    for param in saved.raw_model.parameters():
        param.grad = torch.ones_like(param)
    saved.optimizer.step()  # Adam's exp_avg and exp_avg_sq, contiguous
    save_checkpoint(tmp_path, 1, saved)

    model = build_model(cfg).to(memory_format=torch.channels_last)
    resumed = train.build_training(cfg, model, 4, Worker.single(cpu))
    load_checkpoint(tmp_path, resumed, Worker.single(cpu))
    convolutions = [p for p in model.parameters() if p.ndim == 4]
    assert convolutions and all(not p.is_contiguous() for p in convolutions)  # the layout really differs
    buffers = [(p, v) for p in model.parameters() for v in resumed.optimizer.state[p].values() if v.shape == p.shape]
    assert len(buffers) == 2 * len(list(model.parameters()))
    assert all(value.stride() == param.stride() for param, value in buffers)
    for before, after in zip(saved.raw_model.parameters(), model.parameters(), strict=True):  # values kept
        assert torch.equal(resumed.optimizer.state[after]["exp_avg"], saved.optimizer.state[before]["exp_avg"])


def test_every_gpu_of_a_dp_worker_keeps_its_random_state(tmp_path, monkeypatch):
    """A dp worker's replicas draw dropout masks on each of its GPUs: the checkpoint saves every GPU's
    generator and the resume gives each its own back (torch.cuda's generators replaced by recorders)."""
    gpus = [torch.device("cuda", 2), torch.device("cuda", 5)]  # Ray's assignment: not the first GPUs
    generators = {gpu: torch.tensor([gpu.index], dtype=torch.uint8) for gpu in gpus}
    restored = {}
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device: generators[device].clone())
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: restored.__setitem__(device, state))

    cfg = make_config()
    cpu = torch.device("cpu")
    save_checkpoint(
        tmp_path, 1, train.build_training(cfg, build_model(cfg), 4, Worker.single(cpu)), rng_states=[rng_state(*gpus)]
    )
    load_checkpoint(tmp_path, train.build_training(cfg, build_model(cfg), 4, Worker.single(cpu)), Worker(0, 1, gpus))
    assert restored.keys() == set(gpus)
    assert all(torch.equal(restored[gpu], generators[gpu]) and restored[gpu].device == cpu for gpu in gpus)


def _fp16_epoch(overflow_steps: set[int], scaler_enabled: bool = True, steps: int = 4) -> tuple[dict, train.Training]:
    """An epoch of `steps` steps through train_epoch and epoch_record whose forward overflows (an inf input,
    as an fp16 activation overflow) in `overflow_steps`; GradScaler as with amp=fp16 (CPU autocast stays off)."""
    cfg = make_config()
    cpu = torch.device("cpu")
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, enabled=scaler_enabled)
    training = train.build_training(cfg, build_model(cfg), steps, Worker.single(cpu), scaler)
    generator = torch.Generator().manual_seed(0)
    batches = []
    for step in range(steps):
        images = torch.randn(8, 3, 32, 32, generator=generator)
        if step in overflow_steps:
            images[0] = float("inf")
        batches.append([(images, torch.randint(0, 10, (8,), generator=generator))])
    timer = PhaseTimer(cpu)
    started = time.perf_counter()
    totals = train.train_epoch(training, batches, cfg, cpu, timer)
    worker = Worker(0, 1, [cpu])
    peak = Peak(1e9, "a made-up peak")
    trial = train.TrialParts(cfg, training, worker, steps, [0.0], 1e6, peak)
    record = train.epoch_record(trial, 1, train.EpochTimes(totals, timer.seconds(), started, 1.0), {})
    return record, training


def test_an_overflow_the_scaler_skipped_is_not_a_divergence():
    record, _ = _fp16_epoch({2})
    assert record["amp_skipped_steps"] == 1 and not math.isfinite(record["train_loss"])  # the skipped step's loss
    assert record["diverged"] is False


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step")  # every step skipped
def test_what_was_trained_decides_divergence():
    assert _fp16_epoch({0, 1, 2, 3})[0]["diverged"] is True  # every step overflowed: nothing trains any more
    assert _fp16_epoch({2}, scaler_enabled=False)[0]["diverged"] is True  # the inf loss reached the weights
    record, training = _fp16_epoch(set())
    assert record["diverged"] is False
    next(training.raw_model.parameters()).data[0] = float("nan")
    assert train.diverged(training, 1.0, 0, 4) is True  # finite loss, broken weights


def test_reserved_memory_is_read_from_each_of_the_workers_gpus(monkeypatch):
    gpus = [torch.device("cuda", 1), torch.device("cuda", 3)]
    reserved = {gpus[0]: 300 * 2**20, gpus[1]: 700 * 2**20}
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device: reserved[device])
    assert peak_reserved_mb(gpus) == 700
    assert peak_reserved_mb([torch.device("cpu")]) is None  # the RSS already counts what a CPU worker holds


def test_an_epoch_logs_reserved_memory_beside_allocated():
    record, _ = _fp16_epoch(set(), scaler_enabled=False)
    assert list(record).index("peak_mem_reserved_mb") == list(record).index("peak_mem_total_mb") + 1
    assert record["peak_mem_reserved_mb"] is None and record["peak_mem_mb"] > 0  # CPU: RSS only


class _Cycle:
    def __init__(self):
        self.me = self


def test_release_trial_collects_cycles_before_emptying_the_cuda_cache(monkeypatch):
    left = weakref.ref(_Cycle())  # what a finished trial leaves in a reference cycle
    emptied, reset = [], []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(left() is None))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset.append)
    release_trial([torch.device("cpu")])
    assert left() is None and emptied == [] and reset == []  # CPU: nothing cached to hand back
    left = weakref.ref(_Cycle())
    release_trial([torch.device("cuda", 1)])
    assert emptied == [True]  # emptied once, after the collection freed the trial's tensors
    assert reset == [torch.device("cuda", 1)]  # the next trial's peaks start from its own baseline


@pytest.mark.skipif(not trim_host_heap(), reason="no glibc malloc_trim")
def test_release_trial_returns_what_a_trial_freed_to_the_system():
    """Freed small blocks (below malloc's mmap threshold, as most of a trial's are) stay in the process's RSS,
    where a warm slot's next trial counted them, until release_trial trims the heap. Measured: 200 MB freed,
    RSS unchanged (+201 MB over the start) before the trim, +0 MB after."""
    start = rss_mb()
    blocks = [bytearray(16384) for _ in range(12800)]  # 200 MB
    pinned = bytearray(16384)  # allocated last: the heap's top stays in use, as in a live process
    del blocks
    gc.collect()
    assert rss_mb() - start > 150  # freed, still resident
    release_trial([torch.device("cpu")])
    assert rss_mb() - start < 50
    del pinned


@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
        RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED"),
        torch.AcceleratorError("CUDA error: out of memory\nCUDA kernel errors might be reported asynchronously"),
    ],
)
def test_running_out_of_gpu_memory_ends_a_trial_as_one_final_error(monkeypatch, error):
    def out_of_memory(cfg):
        raise error

    monkeypatch.setattr(train, "loaded_splits", out_of_memory)
    with pytest.raises(GpuOutOfMemoryError) as raised:
        train.run_trial(make_config(), None, Worker(0, 1, [torch.device("cpu")]), lambda metrics, folder: None)
    assert raised.value.__cause__ is error and "\n" not in str(raised.value)
    assert failure_status(raised.value) == "oom"


def test_other_errors_pass_through_run_trial_as_they_are(monkeypatch):
    error = RuntimeError("Expected all tensors to be on the same device")
    monkeypatch.setattr(train, "loaded_splits", lambda cfg: (_ for _ in ()).throw(error))
    with pytest.raises(RuntimeError) as raised:
        train.run_trial(make_config(), None, Worker(0, 1, [torch.device("cpu")]), lambda metrics, folder: None)
    assert raised.value is error
