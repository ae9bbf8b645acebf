"""Running a sweep plan on Ray: one Tune trial per config, each a Ray Train `TorchTrainer` run.

Ray 2.60 runs Train V2, where `Tuner(TorchTrainer(...))` is no longer allowed: Tune runs the plain
function `run_trial` per trial, which builds and fits a TorchTrainer and forwards its reports to
Tune with `TuneReportCallback` (ray-project/ray doc/source/train/user-guides/
hyperparameter-optimization.rst).

Packing: a trial's driver needs no core, its workers do. Each trial reserves the cores and GPUs of
its workers in custom resources that mirror the cluster's (RESOURCE_CPU, RESOURCE_GPU), so Tune
starts a trial only when its workers will fit: two 1-worker trials run side by side on 2 cores,
2-worker trials one after another, and no trial's driver holds a core its workers wait for (which
deadlocks on small machines). A trial reserves one mirror bundle per worker, so on a cluster its
workers, like the Train workers, may sit on different nodes.

On an existing cluster (`--address`, RAY_ADDRESS) the mirror resources exist only if its nodes
were started with `ray start --resources='{"cifar_ray_cpu": <CPUs>, "cifar_ray_gpu": <GPUs>}'`
("slots" packing, exact). Without them ("cap" packing) a trial's driver still reserves no core and
Tune runs at most as many trials at once as copies of the largest trial fit the nodes: never a
deadlock, but a smaller trial may wait while a slot would be free.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

from . import runlog, sysinfo
from .config import ConfigError, TrainConfig
from .storage import StoragePath, redact
from .sweep import SweepPlan, TrialSpec

# Ray Client's head-side server for a new client dies at start now and then ("Initialization failure
# from server"; 1 of 5 connections here, ~7 % in ray-project/ray#63202, open in Ray 2.60).
CLIENT_CONNECT_TRIES = 3
RESOURCE_CPU = "cifar_ray_cpu"
RESOURCE_GPU = "cifar_ray_gpu"

# Set before Ray starts so every Ray process inherits them.
RAY_ENV_DEFAULTS = {
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",  # else a core_worker error line per trial
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",  # measured: trial overhead 16.0 s -> 10.6 s
    "RAY_AIR_NEW_OUTPUT": "0",
    "RAY_DEDUP_LOGS": "1",
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "0",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
    "PYTHONWARNINGS": "ignore::DeprecationWarning,ignore::FutureWarning",
}
NOISY_LOGGERS = (
    "ray.train.v2._internal.execution.controller.placement_group_cleaner",
    "ray.train.v2._internal.execution.context",
    "ray.train.v2._internal.execution.controller.controller",
    "ray.tune",
    "ray.train",
)


# Tune logs a failed trial's whole traceback (~45 lines) and then lists the failed trials; our
# on_trial_error line and the closing summary say both in one line each, error.txt keeps the traceback.
REPEATED_TUNE_ERRORS = {
    "ray.tune.execution.tune_controller": "Trial task failed for trial",
    "ray.tune.tune": "Trials did not complete",
}


class DropMessages(logging.Filter):
    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


def quiet_ray_logs() -> None:
    """Runs in every Ray worker process (worker_process_setup_hook) and in the driver."""
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    for name, prefix in REPEATED_TUNE_ERRORS.items():
        target = logging.getLogger(name)
        if not any(isinstance(f, DropMessages) for f in target.filters):
            target.addFilter(DropMessages(prefix))
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)


def cluster_address(address: str | None) -> str | None:
    """The existing Ray cluster to use: `address` (auto, HOST:PORT, ray://HOST:PORT for Ray
    Client), else the RAY_ADDRESS variable (`ray job submit` sets it for its entrypoint). None or
    "local": none, start an embedded local Ray."""
    address = (address or os.environ.get("RAY_ADDRESS") or "").strip()
    return None if address in ("", "local") else address


def is_ray_client() -> bool:
    """Connected through Ray Client (ray://): Tune then runs in an actor on the cluster."""
    import ray.util.client

    return ray.util.client.ray.is_connected()


def cluster_runtime_env(verbose: bool) -> dict[str, Any]:
    """Our job's runtime env on an existing cluster. Its workers start from the nodes'
    environment, not this process's, so RAY_ENV_DEFAULTS travel as env_vars. Under `ray job
    submit` Ray merges this into the job's own runtime env and refuses keys set in both: the
    job's settings win."""
    try:
        job_env = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") or "{}").get("runtime_env") or {}
    except (ValueError, AttributeError):
        job_env = {}
    taken = set(job_env.get("env_vars") or {})
    env: dict[str, Any] = {"env_vars": {k: os.environ.get(k, v) for k, v in RAY_ENV_DEFAULTS.items() if k not in taken}}
    if not verbose and "worker_process_setup_hook" not in job_env:
        env["worker_process_setup_hook"] = "cifar_ray.orchestrate.quiet_ray_logs"
    return env


def init_ray(address: str | None = None, verbose: bool = False, num_cpus: int | None = None, num_gpus: int | None = None) -> bool:
    """Connect to the cluster at `address` (or RAY_ADDRESS, see cluster_address), or start an
    embedded local Ray (num_cpus/num_gpus apply to that one only). Returns True when this call
    initialised Ray (and so the caller must shut it down). An already initialised Ray (tests)
    is used as is."""
    import ray

    if ray.is_initialized():
        return False
    address = cluster_address(address)
    for key, value in RAY_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    if not verbose:
        quiet_ray_logs()
    options: dict[str, Any] = {
        "log_to_driver": verbose,
        "logging_level": logging.INFO if verbose else logging.ERROR,
        "configure_logging": True,
        "runtime_env": {"worker_process_setup_hook": "cifar_ray.orchestrate.quiet_ray_logs"} if not verbose else None,
    }
    if address:
        options["runtime_env"] = cluster_runtime_env(verbose)
        _check_reachable(address)
        tries = CLIENT_CONNECT_TRIES if address.startswith("ray://") else 1
        for attempt in range(1, tries + 1):
            try:
                ray.init(address=address, **options)
                break
            except (ConnectionError, RuntimeError, ValueError, ImportError, ray.exceptions.RayError) as error:
                ray.shutdown()
                if isinstance(error, ConnectionAbortedError) and attempt < tries:
                    continue  # the head's per-client server died at start: a new connection gets a new one
                first = next((line for line in str(error).splitlines() if line.strip()), type(error).__name__)
                raise ConfigError(f"cannot connect to the Ray cluster at {address} (--address or RAY_ADDRESS): {first[:300]}") from None
    else:
        cpus = num_cpus or os.cpu_count() or 1
        gpus = num_gpus if num_gpus is not None else _local_gpu_count()
        # address="local": always a new Ray, never one that `ray start` left running on this machine
        ray.init(address="local", num_cpus=cpus, num_gpus=gpus, include_dashboard=False,
                 resources={RESOURCE_CPU: cpus, RESOURCE_GPU: gpus}, **options)
    return True


def _check_reachable(address: str) -> None:
    """HOST:PORT must accept a connection: Ray itself retries a dead
    address for minutes before it gives up."""
    import socket

    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto" and the like: Ray resolves them
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as error:
        raise ConfigError(f"cannot connect to the Ray cluster at {address} (--address or RAY_ADDRESS): {error.strerror or error}; "
                          "start it with `ray start --head --port=PORT` or pass the head's address") from None


def _local_gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # a broken CUDA install means no usable GPU, not a crash
        return 0


def cluster_capacity() -> dict[str, float]:
    import ray

    total = ray.cluster_resources()
    keys = ("CPU", "GPU", RESOURCE_CPU, RESOURCE_GPU)
    per_node = [{k: float(n["Resources"].get(k, 0.0)) for k in keys} for n in ray.nodes() if n.get("Alive")]
    return {"cpus": total.get("CPU", 0.0), "gpus": total.get("GPU", 0.0), "nodes": len(per_node),
            "slot_cpus": total.get(RESOURCE_CPU, 0.0), "slot_gpus": total.get(RESOURCE_GPU, 0.0),
            "packing": "slots" if total.get(RESOURCE_CPU, 0.0) > 0 else "cap", "per_node": per_node}


def worker_resources(cfg: TrainConfig) -> dict[str, float]:
    """Resources of ONE Ray Train worker (dp: the single worker holds all its GPUs)."""
    resources = {"CPU": float(cfg.cpus_per_worker)}
    if cfg.use_gpu == "true":
        resources["GPU"] = float(cfg.workers if cfg.strategy == "dp" else 1)
    return resources


def mirror_resources(per_worker: dict[str, float]) -> dict[str, float]:
    """A worker's CPUs and GPUs under the mirror (slot) resource names."""
    mirror = {RESOURCE_CPU: per_worker["CPU"]}
    if per_worker.get("GPU"):
        mirror[RESOURCE_GPU] = per_worker["GPU"]
    return mirror


def trial_bundles(cfg: TrainConfig, slots: bool = True) -> list[dict[str, float]]:
    """What a Tune trial (the driver of one TorchTrainer) reserves: no core for the driver
    ("memory": 1 byte keeps Ray from rejecting a bundle with no CPU) and, with slot packing, one
    bundle of mirror resources per worker (PACK: on one node if they fit, else spread)."""
    head = {"CPU": 0.0, "memory": 1.0}
    return [head] + [mirror_resources(worker_resources(cfg))] * cfg.ray_workers if slots else [head]


def workers_that_fit(per_worker: dict[str, float], nodes: list[dict[str, float]]) -> int:
    """How many workers of this shape the nodes hold at once (a worker lives on one node)."""
    need = {k: v for k, v in per_worker.items() if v > 0}
    return sum(min(int((node.get(k, 0.0) + 1e-9) // v) for k, v in need.items()) for node in nodes) if need else 0


def trials_that_fit(cfg: TrainConfig, nodes: list[dict[str, float]], slots: bool) -> int:
    """How many copies of this trial run at once on empty nodes (slots: also in the mirror resources)."""
    per_worker = worker_resources(cfg)
    fit = workers_that_fit(per_worker, nodes)
    if slots:
        fit = min(fit, workers_that_fit(mirror_resources(per_worker), nodes))
    return fit // cfg.ray_workers


def _per_node(nodes: list[dict[str, float]], key: str) -> str:
    return "+".join(f"{node.get(key, 0.0):g}" for node in nodes) or "0"


def check_fits(plan: SweepPlan, capacity: dict[str, Any]) -> None:
    """A trial that fits no placement on the cluster's nodes would wait forever: refuse it up front."""
    nodes = capacity["per_node"]
    for trial in plan.trials:
        cfg = trial.config
        per_worker = worker_resources(cfg)
        gpus = f" and {per_worker['GPU']:g} GPU(s)" if "GPU" in per_worker else ""
        need = (f"trial {trial.name} needs {cfg.ray_workers} worker(s) x {per_worker['CPU']:g} CPU(s){gpus} "
                f"(workers={cfg.workers}, cpus_per_worker={cfg.cpus_per_worker})")
        if workers_that_fit(per_worker, nodes) < cfg.ray_workers:
            raise ConfigError(f"{need} but the cluster's {len(nodes)} node(s) have CPUs {_per_node(nodes, 'CPU')}, "
                              f"GPUs {_per_node(nodes, 'GPU')}: it can never run")
        if capacity["packing"] == "slots" and workers_that_fit(mirror_resources(per_worker), nodes) < cfg.ray_workers:
            raise ConfigError(
                f"{need} but the nodes' slot resources are {RESOURCE_CPU} {_per_node(nodes, RESOURCE_CPU)}, "
                f"{RESOURCE_GPU} {_per_node(nodes, RESOURCE_GPU)}: start every node with "
                f"--resources='{{\"{RESOURCE_CPU}\": <its CPUs>, \"{RESOURCE_GPU}\": <its GPUs>}}', or none of them"
            )


def concurrency_cap(plan: SweepPlan, capacity: dict[str, Any], max_concurrent: int | None) -> int | None:
    """Tune's max_concurrent_trials. Slot packing: --max-concurrent as given (Tune packs by
    resources). Cap packing: at most as many trials as copies of the most demanding one fit."""
    if capacity["packing"] == "slots":
        return max_concurrent
    fit = max(1, min(trials_that_fit(t.config, capacity["per_node"], slots=False) for t in plan.trials))
    return min(fit, max_concurrent) if max_concurrent else fit


def _storage_probe(marker: StoragePath) -> dict[str, Any]:
    """Runs on one node: can it read the driver's marker and write a file beside it?"""
    import socket

    import ray

    answer = {"ip": ray.util.get_node_ip_address(), "host": socket.gethostname()}
    try:
        if not marker.read_text():
            return answer | {"ok": False, "why": "the marker file is empty here"}
        probe = marker.parent / f"{marker.name}-{answer['ip']}"
        probe.write_text("written by a cifar-ray node\n")
        probe.unlink()
    except OSError as error:
        return answer | {"ok": False, "why": (str(error).splitlines() or [type(error).__name__])[0][:200]}
    return answer | {"ok": True}


def check_shared_storage(folder: StoragePath, print_line: Callable[[str], None] = print, timeout_s: float = 180.0) -> None:
    """On a multi-node cluster or through Ray Client, prove that every node reaches `folder` (the
    --storage root) as the driver sees it: the driver writes a marker file, a zero-CPU task on
    each node reads it and writes beside it. A node that cannot (a folder not mounted there, an
    object store without credentials there) is a ConfigError; one that does not answer in time
    (e.g. still installing a runtime env) is only reported."""
    import uuid

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    folder.mkdir()
    marker = folder / f".cifar-ray-storage-check-{uuid.uuid4().hex}"
    marker.write_text("written by the cifar-ray driver; every node must see this file\n")
    probe = ray.remote(num_cpus=0, max_retries=0)(_storage_probe)
    try:
        refs = {node["NodeID"]: probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)).remote(marker)
                for node in ray.nodes() if node.get("Alive")}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        blind, errors, silent = [], [], []
        for node_id, ref in refs.items():
            if ref not in ready:
                silent.append(node_id[:8])
                continue
            try:
                answer = ray.get(ref)
            except Exception as error:  # e.g. cifar_ray not importable there
                errors.append(f"node {node_id[:8]}: {_error_line(error)}")
                continue
            if not answer["ok"]:
                blind.append(f"{answer['ip']} ({answer['host']}: {answer['why']})")
    finally:
        marker.unlink()
    if blind:
        raise ConfigError(f"--storage {folder} is not reachable (or not writable) from node(s) {', '.join(blind)}: on a Ray cluster "
                          "it must be a folder that every node and this machine mount at the same path (NFS, ...) or a URI they all "
                          "have credentials for")
    if errors:
        raise ConfigError(f"cannot run cifar_ray code on every node ({'; '.join(errors)}): install the package on every "
                          "node, or ship it with `ray job submit --runtime-env-json '{\"working_dir\": \".\"}'`")
    if silent:
        print_line(f"storage: node(s) {', '.join(silent)} did not answer in {timeout_s:g} s; cannot tell whether they reach {folder}")


def shape_label(cfg: TrainConfig) -> str:
    per_worker = worker_resources(cfg)
    gpus = f" + {per_worker['GPU']:g} GPU" if "GPU" in per_worker else ""
    return f"{cfg.ray_workers} worker{'s' * (cfg.ray_workers > 1)} x {per_worker['CPU']:g} CPU{gpus}"


def trials_at_once(plan: SweepPlan, capacity: dict[str, Any], limit: int | None) -> dict[str, tuple[int, int]]:
    """Per trial shape: (number of trials, how many of them run at once on the empty cluster).
    Slot packing: as many copies as fit the nodes; cap packing: Tune's cap for all."""
    shapes: dict[str, tuple[int, int]] = {}
    for trial in plan.trials:
        label = shape_label(trial.config)
        if capacity["packing"] == "slots":
            fit = trials_that_fit(trial.config, capacity["per_node"], slots=True)
            fit = min(fit, limit) if limit else fit
        else:
            fit = limit or 1
        count = shapes.get(label, (0, 0))[0] + 1
        shapes[label] = (count, min(fit, count))
    return shapes


def sweep_header(plan: SweepPlan, capacity: dict[str, Any], limit: int | None, run_dir: StoragePath,
                 unfinished: int | None = None) -> str:
    """The first thing a sweep prints: what runs, how many at once, where the logs go.
    `unfinished`: the trials a --resume still has to run."""
    shapes = trials_at_once(plan, capacity, limit)
    at_once = ", ".join(f"{fit} of {count} with {label}" for label, (count, fit) in shapes.items())
    nodes = capacity["nodes"]
    where = f"{capacity['cpus']:g} CPUs, {capacity['gpus']:g} GPUs on {nodes} node{'s' * (nodes > 1)}"
    trials = f"{len(plan.trials)} trial{'s' * (len(plan.trials) > 1)}"
    what = f"{plan.name}: {trials}"
    if unfinished is not None:
        what = f"resuming {plan.name}: {unfinished} of {trials} unfinished"
    return f"{what}, at once: {at_once} ({where}); logs and checkpoints in {run_dir}"


def resolve_plan(plan: SweepPlan, capacity: dict[str, float]) -> SweepPlan:
    """`auto` use_gpu/backend made concrete for this cluster, for every trial."""
    has_gpus = capacity["gpus"] > 0
    trials = [TrialSpec(t.index, t.name, t.swept, t.config.resolved(has_gpus)) for t in plan.trials]
    return SweepPlan(**{**plan.__dict__, "trials": trials})


def _failure_status(error: BaseException) -> str:
    text = "".join(traceback.format_exception(error))
    return "oom" if ("OutOfMemoryError" in text or "MemoryError" in text) else "failed"


def _error_line(error: BaseException) -> str:
    """The root cause in one line (Ray wraps worker errors in several layers)."""
    text = "".join(traceback.format_exception_only(error)).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    causes = [line for line in lines if "Error" in line.split(":")[0] or "Exception" in line.split(":")[0]]
    line = causes[-1] if causes else lines[-1] if lines else repr(error)
    return re.sub(r"^(?:\w+\.)+(?=\w+:)", "", line)[:500]  # cifar_ray.data.DataError: ... -> DataError: ...


def run_trial(tune_config: dict) -> None:
    """The Tune function trainable: one TorchTrainer fit for one trial spec."""
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    from .train import train_loop_per_worker

    spec, run_dir = tune_config["trial"], tune_config["run_dir"]
    cfg = TrainConfig(**spec["config"])
    trial_dir = run_dir / spec["name"]
    trial_file = trial_dir / runlog.TRIAL_FILE
    if runlog.read_json(trial_file).get("status") in ("finished", "diverged"):
        return  # done before the driver died; Tune's saved state may lag behind our log
    started = time.time()
    runlog.update_json(trial_file, **spec, status="running", error=None, started_at=runlog.now_iso(), started_unix=started)
    runlog.update_json(trial_file, driver=sysinfo.worker_placement())  # the node running this trial's Tune driver
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"config": cfg.model_dump(), "trial_dir": trial_dir},
        torch_config=TorchConfig(backend=cfg.backend),
        scaling_config=ray.train.ScalingConfig(num_workers=cfg.ray_workers, use_gpu=cfg.use_gpu == "true",
                                               resources_per_worker=worker_resources(cfg)),
        # A stable name per trial: a restored sweep's trial finds its run and checkpoints again.
        run_config=ray.train.RunConfig(
            name="train", **trial_dir.ray_storage(), callbacks=[TuneReportCallback()],
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.keep_checkpoints),
            failure_config=ray.train.FailureConfig(max_failures=cfg.max_failures),
        ),
    )
    try:
        trainer.fit()
    except Exception as error:
        if runlog.read_json(run_dir / runlog.SWEEP_FILE).get("interrupted_unix", 0) > started:
            raise  # stopped with the interrupted sweep (Ray Client): unfinished, resumable
        (trial_dir / runlog.ERROR_FILE).write_text("".join(traceback.format_exception(error)))
        runlog.update_json(trial_file, status=_failure_status(error), error=_error_line(error), finished_at=runlog.now_iso())
        raise
    record_outcome(trial_dir)


def record_outcome(trial_dir: StoragePath) -> None:
    """Mark a trial whose training has ended finished or diverged (from its logged epochs), once.
    The progress callback calls it when the last epoch's result arrives (its checkpoint and log are
    written by then), run_trial when fit() returns: a sweep interrupted in between (the workers'
    teardown takes seconds) keeps a trial that trained every epoch as finished, not running."""
    trial_file = trial_dir / runlog.TRIAL_FILE
    if runlog.read_json(trial_file).get("status") in ("finished", "diverged"):
        return
    epochs = runlog.read_epochs(trial_dir)
    diverged = [row["epoch"] for row in epochs if row.get("diverged")]
    status = "diverged" if diverged else "finished"
    runlog.update_json(trial_file, status=status, diverged_epoch=diverged[0] if diverged else None,
                       finished_at=runlog.now_iso(), finished_unix=time.time())


def format_epoch(trial: str, result: dict, epochs: int) -> str:
    return (
        f"{trial}  epoch {result['epoch']}/{epochs}  "
        f"train loss {result['train_loss']:.3f} acc {100 * result['train_acc']:5.1f}%  "
        f"test loss {result['test_loss']:.3f} acc {100 * result['test_acc']:5.1f}%  "
        f"{result['epoch_time_s']:.1f}s  {result['samples_per_s']:.0f} img/s  "
        f"{result['peak_mem_mb']:.0f} MB/worker peak"
        + ("  DIVERGED" if result.get("diverged") else "")
    )


def _print_progress(line: str) -> None:
    """Where EpochPrinter writes; run_plan points it at the caller's printer. A module-level hook,
    not a closure, because Tune pickles its callbacks with the experiment and a restored sweep
    must print to the new process's terminal."""
    _progress_printer[0](line)


PROGRESS_RELAY = "cifar-ray-progress"  # a named actor in the client's job (its own namespace)


def _relay_or_print(line: str) -> None:
    """The printer where run_plan set none: in Tune's actor on the cluster (Ray Client) it hands
    the line to the client's ProgressRelay, found by name (a restored sweep has a new one)."""
    import ray

    try:
        relay = ray.get_actor(PROGRESS_RELAY)
    except ValueError:  # no relay: not under Ray Client
        print(line, flush=True)
        return
    ray.get(relay.put.remote(line))  # waited for: the client's last take must see every line


_progress_printer: list[Callable[[str], None]] = [_relay_or_print]


class ProgressRelay:
    """Holds progress lines from Tune's actor until the Ray Client driver takes them."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def put(self, line: str) -> None:
        self.lines.append(line)

    def take(self) -> list[str]:
        lines, self.lines = self.lines, []
        return lines


@contextlib.contextmanager
def progress_relay(print_line: Callable[[str], None], every_s: float = 0.5) -> Iterator[None]:
    """Through Ray Client, Tune and its callbacks run in an actor on the cluster, whose prints do
    not reach this terminal (log_to_driver is off unless --verbose): a ProgressRelay actor
    collects the epoch lines, and a thread here prints them while Tuner.fit() blocks. Enter it
    only when connected through Ray Client."""
    import threading

    import ray

    relay = ray.remote(num_cpus=0)(ProgressRelay).options(name=PROGRESS_RELAY).remote()
    stop = threading.Event()

    def forward() -> None:
        while True:
            last = stop.wait(every_s)
            try:
                lines = ray.get(relay.take.remote())
            except ray.exceptions.RayError:  # the connection or the relay is gone: nothing more to print
                return
            for line in lines:
                print_line(line)
            if last:
                return

    thread = threading.Thread(target=forward, name="cifar-ray-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)
        with contextlib.suppress(ConnectionError, ray.exceptions.RayError):  # a lost connection took it already
            ray.kill(relay)


def _trial_resources_of(config: dict, slots: bool = True):
    from ray import tune

    return tune.PlacementGroupFactory(trial_bundles(TrainConfig(**config["trial"]["config"]), slots))


def trial_trainable(slots: bool) -> Callable[[dict], None]:
    """run_trial with its resources, as Tune takes it. tune.with_resources sets an attribute on
    the function; through Ray Client (ray://) Tune runs in a remote actor that gets the trainable
    pickled, and a module-level function travels by reference, without the attribute (every trial
    then held Tune's default 1 CPU and its workers never started). A local function travels by
    value, attribute included."""
    from ray import tune

    def cifar_ray_trial(config: dict) -> None:
        run_trial(config)

    return tune.with_resources(cifar_ray_trial, functools.partial(_trial_resources_of, slots=slots))


def _trial_folder_name(trial) -> str:
    return trial.config["trial"]["name"]


def swept_text(spec: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in spec["swept"].items())


def _progress_callback():
    from ray.tune.progress_reporter import TrialProgressCallback

    class SweepProgress(TrialProgressCallback):
        """Our progress lines: one when a trial starts (or continues), one per finished epoch, one
        when a trial fails. A TrialProgressCallback, so Tune adds none of its own: its
        `Trial ... completed. Last result:` line printed during --resume even with verbose=0."""

        def on_trial_start(self, iteration, trials, trial, **info):
            spec, run_dir = trial.config["trial"], trial.config["run_dir"]
            trial_dir = run_dir / spec["name"]
            if runlog.read_json(trial_dir / runlog.TRIAL_FILE).get("status") in runlog.FINAL_STATUSES:
                return  # finished before an interruption: run_trial returns at once
            done, epochs = len(runlog.read_epochs(trial_dir)), spec["config"]["epochs"]
            what = f"continues after epoch {done}/{epochs}" if done else "starts"
            _print_progress(f"{spec['name']}  {what}  {swept_text(spec)}".rstrip())

        def on_trial_result(self, iteration, trials, trial, result, **info):
            if "epoch" in result:
                spec = trial.config["trial"]
                _print_progress(format_epoch(spec["name"], result, spec["config"]["epochs"]))
                if result["epoch"] == spec["config"]["epochs"] or result.get("diverged"):
                    record_outcome(trial.config["run_dir"] / spec["name"])

        def on_trial_error(self, iteration, trials, trial, **info):
            spec = trial.config["trial"]
            meta = runlog.read_json(trial.config["run_dir"] / spec["name"] / runlog.TRIAL_FILE)
            _print_progress(f"{spec['name']}  {meta.get('status', 'failed').upper()}: {meta.get('error') or 'see ' + runlog.ERROR_FILE}")

        def on_trial_complete(self, iteration, trials, trial, **info):
            pass

    return SweepProgress()


def run_plan(
    plan: SweepPlan,
    storage: str | os.PathLike | StoragePath = "runs",
    max_concurrent: int | None = None,
    print_line: Callable[[str], None] = print,
    resume: bool = False,
) -> StoragePath:
    """Run every trial of `plan` on the connected Ray; returns the run folder (storage/name).
    Trial failures do not raise: they are recorded in each trial.json. With `resume`, an
    interrupted run of the same plan continues: finished trials are kept, the others continue
    from their last checkpoints."""
    from ray import tune

    capacity = cluster_capacity()
    plan = resolve_plan(plan, capacity)
    check_fits(plan, capacity)
    run_dir = StoragePath.of(storage) / plan.name
    client = is_ray_client()
    if capacity["nodes"] > 1 or client:  # a Ray Client driver may sit on another machine
        check_shared_storage(run_dir.parent, print_line)
    limit = concurrency_cap(plan, capacity, max_concurrent)
    if capacity["packing"] == "cap":
        print_line(f"packing: the cluster has no {RESOURCE_CPU} resources, so at most {limit} trial(s) run at once (copies of "
                   f"the largest trial that fit its {capacity['nodes']} node(s)); start each node with `ray start "
                   f"--resources='{{\"{RESOURCE_CPU}\": <CPUs>, \"{RESOURCE_GPU}\": <GPUs>}}'` to pack exactly")
    sweep_file = run_dir / runlog.SWEEP_FILE
    previous = runlog.read_json(sweep_file)
    names = [t.name for t in plan.trials]
    trainable = trial_trainable(slots=capacity["packing"] == "slots")
    _progress_printer[0] = print_line
    started = time.time()
    if resume:
        if not previous or not tune.Tuner.can_restore(run_dir.path, storage_filesystem=run_dir.ray_filesystem):
            raise ConfigError(f"nothing to resume in {run_dir}: no interrupted run of '{plan.name}' there; run without --resume")
        if previous.get("trials") != names:
            raise ConfigError(f"{run_dir} holds a different sweep (its trials differ from this file's); resume with the same file and --set values, or use --name")
        tuner = tune.Tuner.restore(run_dir.path, trainable=trainable, resume_errored=True, storage_filesystem=run_dir.ray_filesystem)
    else:
        refusal = runlog.existing_run_refusal(run_dir, plan.name)
        if refusal:
            raise ConfigError(refusal)
        run_dir.mkdir()
        runlog.write_json(sweep_file, plan.summary() | {
            "started_at": runlog.now_iso(), "git_revision": sysinfo.git_revision(Path(__file__).parent),
            "host": sysinfo.host_info(), "versions": sysinfo.versions(), "cluster": capacity, "command": redact(" ".join(sys.argv)),
        })
        for trial in plan.trials:
            runlog.write_json(run_dir / trial.name / runlog.TRIAL_FILE, trial.as_dict() | {"status": "pending"})
        tuner = tune.Tuner(
            trainable,
            param_space={"run_dir": run_dir, "trial": tune.grid_search([t.as_dict() for t in plan.trials])},
            tune_config=tune.TuneConfig(max_concurrent_trials=limit, trial_dirname_creator=_trial_folder_name,
                                        trial_name_creator=_trial_folder_name),
            run_config=tune.RunConfig(name=plan.name, **run_dir.parent.ray_storage(), verbose=0,
                                      callbacks=[_progress_callback()]),
        )
    unfinished = sum(t.status not in runlog.FINAL_STATUSES for t in runlog.load_run(run_dir).trials) if resume else None
    print_line(sweep_header(plan, capacity, limit, run_dir, unfinished))
    with progress_relay(print_line) if client else contextlib.nullcontext():
        try:
            tuner.fit()
        except KeyboardInterrupt:
            if not client:
                raise
            # Tune runs on the cluster and stops when this client disconnects (the caller's ray.shutdown),
            # its saved state and checkpoints kept for --resume. The mark tells trials torn down with it
            # that they are unfinished, not failed.
            runlog.update_json(sweep_file, interrupted_unix=time.time())
            logging.getLogger("ray.util.client.dataclient").setLevel(logging.CRITICAL)  # "Unrecoverable error in data channel"
    wall = runlog.read_json(sweep_file).get("wall_time_s") or 0.0  # a resumed run adds its own time
    done = all(t.status in runlog.FINAL_STATUSES for t in runlog.load_run(run_dir).trials)
    runlog.update_json(sweep_file, wall_time_s=wall + time.time() - started, **({"finished_at": runlog.now_iso()} if done else {}))
    return run_dir
