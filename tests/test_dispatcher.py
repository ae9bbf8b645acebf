"""The Dispatcher as a plain object (its methods under asyncio, no Ray): one-trial slots, the one writer of
trial.json, and every way a trial can fail ending in the trial retried or failed, never in a wait forever; and
how the errors a slot sees when a worker runs out of memory are classified."""

from __future__ import annotations

import asyncio
import traceback

import pytest

from cifar_ray.cluster.dispatcher import Dispatcher, RunTrial, tune_run_trial
from cifar_ray.cluster.session import failure_status
from cifar_ray.core import runlog
from cifar_ray.core.config import TrainConfig
from cifar_ray.core.storage import StoragePath
from cifar_ray.core.sweep import TrialSpec


def run_trials(tmp_path, count: int = 2, **config) -> list[RunTrial]:
    run_dir = StoragePath.of(tmp_path)
    trials = []
    for i in range(count):
        spec = TrialSpec(i, f"t{i:03d}", {"seed": i}, TrainConfig(seed=i, epochs=2, **config))
        runlog.write_json(run_dir / spec.name / runlog.TRIAL_FILE, spec.as_dict() | {"status": "pending"})
        trials.append(RunTrial.of(spec, run_dir))
    return trials


def dispatcher(trials: list[RunTrial], slot_names=("slot-a",), one_trial: bool = False) -> Dispatcher:
    return Dispatcher(trials, {trials[0].shape: list(slot_names)}, one_trial)


def news(d: Dispatcher, trial: str) -> list[dict]:
    return asyncio.run(d.read(trial, 0, 0.01))


def test_a_one_trial_slot_takes_one_trial_then_ends(tmp_path):
    trials = run_trials(tmp_path)
    d = dispatcher(trials, ("slot-a", "slot-b"), one_trial=True)
    shape = trials[0].shape
    assert asyncio.run(d.take(shape, "slot-a")) == trials[0]
    asyncio.run(d.done("slot-a", "t000"))
    assert asyncio.run(d.take(shape, "slot-a")) is None  # ends with its trial, though t001 waits
    assert asyncio.run(d.take(shape, "slot-b")) == trials[1]


def test_a_warm_slot_takes_trial_after_trial(tmp_path):
    trials = run_trials(tmp_path)
    d = dispatcher(trials)
    shape = trials[0].shape
    assert asyncio.run(d.take(shape, "slot-a")) == trials[0]
    asyncio.run(d.done("slot-a", "t000"))
    assert asyncio.run(d.take(shape, "slot-a")) == trials[1]


def test_a_slot_is_wanted_while_a_trial_of_its_shape_waits_and_one_not_wanted_is_not_live(tmp_path):
    """--max-concurrent 1 starts a shape's second slot only once its first has ended, having trained every trial
    of the shape: the Dispatcher says it is not wanted, and a trial handed back later cannot wait for it."""
    trials = run_trials(tmp_path)
    d = dispatcher(trials, ("slot-a", "slot-b", "slot-c"))
    shape = trials[0].shape
    assert asyncio.run(d.wanted(shape, "slot-a"))
    assert asyncio.run(d.take(shape, "slot-a")) == trials[0]
    asyncio.run(d.done("slot-a", "t000"))
    assert asyncio.run(d.take(shape, "slot-a")) == trials[1]
    assert not asyncio.run(d.wanted(shape, "slot-b"))
    assert d.live[shape] == {"slot-a", "slot-c"}
    asyncio.run(d.slot_failed("slot-a", shape, "failed", "lost"))  # the trial it ran goes back
    assert asyncio.run(d.wanted(shape, "slot-c"))
    assert asyncio.run(d.take(shape, "slot-c")) == trials[1]


def test_the_dispatcher_records_the_outcome_when_the_last_or_a_diverged_epoch_ends(tmp_path):
    trials = run_trials(tmp_path)
    d = dispatcher(trials)
    for trial, rows in ((trials[0], [{"epoch": 1}, {"epoch": 2}]), (trials[1], [{"epoch": 1, "diverged": True}])):
        for row in rows:
            runlog.append_epoch(trial.trial_dir, row)
            asyncio.run(d.epoch(trial.name, row))
    assert runlog.read_json(trials[0].trial_file)["status"] == "finished"
    meta = runlog.read_json(trials[1].trial_file)
    assert meta["status"] == "diverged" and meta["diverged_epoch"] == 1


def test_a_failed_trial_json_write_still_tells_the_thin_trial_and_is_retried(tmp_path, monkeypatch):
    """_fail used to drop the trial from in_flight before writing trial.json: a write that raised left its thin
    trial waiting forever, and the trial running for good."""
    trials = run_trials(tmp_path, count=1, max_failures=0)
    d = dispatcher(trials)
    shape = trials[0].shape
    asyncio.run(d.take(shape, "slot-a"))  # attempt 1
    asyncio.run(d.failed_attempt("t000", "failed", "RuntimeError: boom", None))

    def unwritable(*args, **kwargs):
        raise OSError("storage timeout")

    with monkeypatch.context() as patch:
        patch.setattr(runlog, "update_json", unwritable)
        with pytest.raises(OSError):
            asyncio.run(d.take(shape, "slot-a"))  # the restarted slot: attempts used up, the write fails
    assert {"failed": "RuntimeError: boom", "status": "failed"} in news(d, "t000")  # its thin trial ends
    assert asyncio.run(d.take(shape, "slot-a")) is None  # restarted again: the write is retried, nothing left
    meta = runlog.read_json(trials[0].trial_file)
    assert meta["status"] == "failed" and meta["error"] == "RuntimeError: boom"


def test_a_lost_slots_trial_goes_to_a_surviving_slot_then_fails_when_none_is_left(tmp_path):
    trials = run_trials(tmp_path, count=1, max_failures=1)
    d = dispatcher(trials, ("slot-a", "slot-b"))
    shape = trials[0].shape
    asyncio.run(d.take(shape, "slot-a"))
    asyncio.run(d.slot_failed("slot-a", shape, "failed", "NodeDiedError: lost"))
    assert asyncio.run(d.take(shape, "slot-b")) == trials[0]  # attempt 2, from its checkpoint
    asyncio.run(d.slot_failed("slot-b", shape, "failed", "NodeDiedError: lost"))
    assert {"failed": "NodeDiedError: lost", "status": "failed"} in news(d, "t000")
    assert runlog.read_json(trials[0].trial_file)["status"] == "failed"


def test_a_worker_killed_for_memory_fails_its_trial_as_oom(tmp_path):
    trials = run_trials(tmp_path, count=1, max_failures=0)
    d = dispatcher(trials)
    shape = trials[0].shape
    asyncio.run(d.take(shape, "slot-a"))
    error = worker_group_error(oom_killed_actor())
    asyncio.run(d.worker_died("slot-a", failure_status(error), "ActorDiedError: NODE_OUT_OF_MEMORY"))
    assert asyncio.run(d.take(shape, "slot-a")) is None
    assert runlog.read_json(trials[0].trial_file)["status"] == "oom"


def oom_killed_actor():
    """The error Ray gives for an actor its memory monitor killed (ray/exceptions.py ActorDiedError, with the
    exit type the raylet writes)."""
    from ray.core.generated.common_pb2 import ActorDiedErrorContext
    from ray.exceptions import ActorDiedError

    return ActorDiedError(
        ActorDiedErrorContext(
            error_message="The actor is dead because its worker process has died. Worker exit type: "
            "NODE_OUT_OF_MEMORY Worker exit detail: Task was killed due to the node running low on memory.",
            actor_id=b"\x01" * 16,
            class_name="RayTrainWorker",
        )
    )


def worker_group_error(death: Exception) -> Exception:
    """How Ray Train 2.60 hands a dead worker to the slot (and to its after_exception callback)."""
    from ray.train.v2._internal.exceptions import WorkerHealthCheckFailedError
    from ray.train.v2.api.exceptions import WorkerGroupError

    failure = WorkerHealthCheckFailedError("Worker health check failed.", failure=death)
    return WorkerGroupError(str(failure), {0: failure})


def test_a_worker_killed_for_memory_reads_as_oom_however_ray_wraps_it():
    from ray.exceptions import RayTaskError
    from ray.train.v2._internal.exceptions import WorkerHealthCheckFailedError

    death = oom_killed_actor()
    group = worker_group_error(death)
    trace = "".join(traceback.format_exception(group))  # what a Ray call that raised it sends back
    task = RayTaskError("TrainController.run", trace, group).as_instanceof_cause()
    for error in (death, WorkerHealthCheckFailedError("health check failed", failure=death), group, task):
        assert failure_status(error) == "oom", type(error)
    assert failure_status(worker_group_error(RuntimeError("SIGSEGV"))) == "failed"


@pytest.mark.parametrize(
    "message",
    [
        "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other API call",
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
        "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",
        "NCCL error in: ProcessGroupNCCL.cpp:3356, unhandled cuda error (run with NCCL_DEBUG=INFO for details), "
        "NCCL version 2.27.5\nncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\n"
        "Cuda failure 2 'out of memory'",
        "NCCL error: ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device "
        "error.\nLast error:\nFailed to CUDA calloc 6291456 bytes",
    ],
)
def test_a_cuda_library_out_of_memory_reads_as_oom_however_ray_wraps_it(message):
    """torch raises these as RuntimeError (torch's Exceptions.h, NCCL's CUDACHECK), not torch.OutOfMemoryError."""
    from ray.exceptions import RayTaskError

    cause = RuntimeError(message)
    group = worker_group_error(cause)
    task = RayTaskError("TrainController.run", "".join(traceback.format_exception(group)), group).as_instanceof_cause()
    for error in (cause, group, task):
        assert failure_status(error) == "oom", (type(error), message)


def test_other_cuda_library_errors_read_as_failed():
    for message in ("CUDA error: an illegal memory access was encountered", "cuDNN error: CUDNN_STATUS_BAD_PARAM"):
        assert failure_status(worker_group_error(RuntimeError(message))) == "failed"


def test_trials_travel_as_typed_specs(tmp_path):
    trial = run_trials(tmp_path, count=1)[0]
    assert tune_run_trial({"trial": {"name": trial.name, "run": trial}}) is trial


def test_running_out_of_gpu_memory_is_final_where_other_failures_are_retried(tmp_path):
    """A trial out of GPU memory runs out again (and on a shared GPU squeezes its neighbours each time): the
    restarted slot's question fails it as oom, where another error gets its max_failures retries."""
    trials = run_trials(tmp_path, max_failures=2)
    d = dispatcher(trials)
    shape = trials[0].shape
    assert asyncio.run(d.take(shape, "slot-a")) == trials[0]
    asyncio.run(d.failed_attempt("t000", "failed", "RuntimeError: a bug", None))
    assert asyncio.run(d.take(shape, "slot-a")) == trials[0]  # retried from its checkpoint
    asyncio.run(d.failed_attempt("t000", "oom", "GpuOutOfMemoryError: CUDA out of memory", None, final=True))
    assert asyncio.run(d.take(shape, "slot-a")) == trials[1]  # not retried: failed, the slot goes on
    meta = runlog.read_json(trials[0].trial_file)
    assert meta["status"] == "oom" and meta["error"] == "GpuOutOfMemoryError: CUDA out of memory"


def test_a_trial_that_ended_before_its_tune_trial_started_still_has_its_news(tmp_path):
    """A short trial can end in its slot before Tune starts its thin trial, which then reads every epoch from the
    start."""
    trials = run_trials(tmp_path)
    d = dispatcher(trials[:1])
    asyncio.run(d.take(trials[0].shape, "slot-a"))
    for epoch in (1, 2):
        asyncio.run(d.epoch("t000", {"epoch": epoch}))
    assert runlog.read_json(trials[0].trial_file)["status"] == "finished"
    assert [event.get("epoch", {}).get("epoch") for event in news(d, "t000")][-2:] == [1, 2]


def test_what_a_slot_tells_the_dispatcher_unpickles_without_torch():
    """The Dispatcher imports no torch: a torch type in what a slot sends it (torch.__version__ is a TorchVersion)
    made its first read of a trial's system record import torch, its event loop blocked for ~5 s while every slot
    of a pooled sweep waited on it (reports/bench: 2c)."""
    import pickle
    import subprocess
    import sys

    import torch

    from cifar_ray.training.distributed import Worker, worker_system

    system = worker_system(Worker(0, 1, [torch.device("cpu")]), 0, {"node_id": None, "hostname": "h"})
    code = "import pickle, sys; pickle.loads(sys.stdin.buffer.read()); assert 'torch' not in sys.modules"
    done = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(system), capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()[-500:]
