"""The Ray session: connecting to a cluster or starting an embedded Ray, quieting Ray's logs, and
proving that every node reaches the run storage."""

from __future__ import annotations

import json
import logging
import os
import re
import traceback
import warnings
from collections.abc import Callable
from typing import Any

from ..core import provenance, sysinfo
from ..core.errors import GPU_OOM_MARKS, ClusterError, StorageError
from ..core.run import RunFolder
from ..core.storage import StoragePath
from ..core.text import first_line
from .placement import RESOURCE_CPU, RESOURCE_GPU, capacity_of
from .ray_start import ray_starting

# Ray Client's head-side server for a new client dies at start now and then ("Initialization failure
# from server"; 1 of 5 connections here, ~7 % in ray-project/ray#63202, open in Ray 2.60).
CLIENT_CONNECT_TRIES = 3


# Set before Ray starts so every Ray process inherits them.
RAY_ENV_DEFAULTS = {
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",  # else a core_worker error line per trial
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",  # measured: trial overhead 16.0 s -> 10.6 s
    "RAY_AIR_NEW_OUTPUT": "0",
    "RAY_DEDUP_LOGS": "1",
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "0",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
    "PYTHONWARNINGS": "ignore::DeprecationWarning,ignore::FutureWarning",
    "RAY_WARN_BLOCKING_GET_INSIDE_ASYNC": "0",  # what Ray Train gives its controller (trainer.LeanTrainer.start)
}

# The local Ray init_ray started from this process: its GCS address and the environment its processes inherited.
_started_here: tuple[str, dict[str, str]] | None = None


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
    """Runs in the driver, and on a cluster in each of the job's worker processes (worker_process_setup_hook)."""
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    for name, prefix in REPEATED_TUNE_ERRORS.items():
        target = logging.getLogger(name)
        if not any(isinstance(f, DropMessages) for f in target.filters):
            target.addFilter(DropMessages(prefix))
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)


WORKER_POOL_WARNING = "the maximum expected startup concurrency"


def drop_worker_pool_warning() -> None:
    """The raylet warns once a node has started 4 x its CPUs worker processes ("... which is 4x the maximum
    expected startup concurrency"). Warm slots start zero-CPU processes by design (the Dispatcher, per slot
    a driver task and Ray Train's controller, one thin Tune trial per running trial): 12 and more on 2 CPUs.
    The line reaches the terminal through the driver's error channel, past log_to_driver=False, so it is
    dropped there; every other line passes."""
    import ray._private.worker as ray_worker

    show = ray_worker.print_to_stdstream
    if getattr(show, "drops_worker_pool_warning", False):
        return

    def without_worker_pool_warning(data: dict, *args, **kwargs):
        lines = [line for line in data.get("lines", []) if WORKER_POOL_WARNING not in line]
        if lines:
            show({**data, "lines": lines}, *args, **kwargs)

    without_worker_pool_warning.drops_worker_pool_warning = True
    ray_worker.print_to_stdstream = without_worker_pool_warning


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
        env["worker_process_setup_hook"] = "cifar_ray.cluster.session.quiet_ray_logs"
    return env


def init_ray(
    address: str | None = None, verbose: bool = False, num_cpus: int | None = None, num_gpus: int | None = None
) -> bool:
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
        drop_worker_pool_warning()
    options: dict[str, Any] = {
        "log_to_driver": verbose,
        "logging_level": logging.INFO if verbose else logging.ERROR,
        "configure_logging": True,
    }
    if address:
        options["runtime_env"] = cluster_runtime_env(verbose)
        _check_reachable(address)
        _check_token(address)
        tries = CLIENT_CONNECT_TRIES if address.startswith("ray://") else 1
        for attempt in range(1, tries + 1):
            try:
                with ray_starting():
                    ray.init(address=address, **options)
                break
            except (ConnectionError, RuntimeError, ValueError, ImportError, ray.exceptions.RayError) as error:
                ray.shutdown()
                if isinstance(error, ConnectionAbortedError) and attempt < tries:
                    continue  # the head's per-client server died at start: a new connection gets a new one
                first = first_line(error)
                raise ClusterError(
                    f"cannot connect to the Ray cluster at {address} (--address or RAY_ADDRESS): {first[:300]}"
                ) from None
    else:
        node = local_resources(num_cpus, num_gpus)
        # address="local": always a new Ray, never one that `ray start` left running on this machine. No runtime env
        # of the job's own: with one, no prestarted worker serves the job and each new worker process waits for the
        # runtime-env agent; its processes inherit RAY_ENV_DEFAULTS, and their logs stay in Ray's files (log_to_driver).
        global _started_here
        try:
            with ray_starting():
                ray.init(
                    address="local",
                    num_cpus=node["CPU"],
                    num_gpus=node["GPU"],
                    include_dashboard=False,
                    resources={key: node[key] for key in (RESOURCE_CPU, RESOURCE_GPU)},
                    **options,
                )
                _started_here = (ray.get_runtime_context().gcs_address, dict(os.environ))
        except Exception as error:  # Ray's own: "The current node timed out during startup." on a busy machine
            first = first_line(error)
            load = sysinfo.load_text(sysinfo.machine_load())
            raise ClusterError(
                f"Ray did not start on this machine: {first[:300]} ({load}); nothing of the run was trained: run the "
                "same command again"
            ) from None
    return True


def inherited_by_ray_processes(env_vars: dict[str, str]) -> bool:
    """Whether every Ray process already has these variables with these values: the connected Ray is the local one
    init_ray started from this process, whose environment then held them (its processes inherit it). An actor given
    them as a runtime env instead gets a new process of its own rather than a prestarted one."""
    import ray

    if _started_here is None or not ray.is_initialized():
        return False
    address, environment = _started_here
    return ray.get_runtime_context().gcs_address == address and all(
        environment.get(key) == value for key, value in env_vars.items()
    )


def local_resources(num_cpus: int | None = None, num_gpus: int | None = None) -> dict[str, int]:
    """The one node of the embedded local Ray (init_ray): this machine's CPUs and GPUs unless given, mirrored as
    the slot resources (placement.py)."""
    cpus = num_cpus or os.cpu_count() or 1
    gpus = num_gpus if num_gpus is not None else _local_gpu_count()
    return {"CPU": cpus, "GPU": gpus, RESOURCE_CPU: cpus, RESOURCE_GPU: gpus}


def embedded_capacity() -> dict[str, Any]:
    """placement.cluster_capacity() of the embedded local Ray, known before it starts (sweep --estimate)."""
    return capacity_of([{key: float(value) for key, value in local_resources().items()}])


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
        raise ClusterError(
            f"cannot connect to the Ray cluster at {address} (--address or RAY_ADDRESS): {error.strerror or error}; "
            "start it with `ray start --head --port=PORT` or pass the head's address"
        ) from None


def _check_token(address: str) -> None:
    """A cluster with token authentication must take this machine's token: Ray's own connection retries a refused
    one for 20 s (Ray Client: 30 s), a line each second, then names an address it resolved. One call the cluster
    answers at once (the GCS's cluster id; Ray Client's ping), sent with the token as Ray sends it, tells first.
    Any other answer (or none) is left to Ray's connection."""
    import grpc
    from ray._private.authentication import authentication_utils
    from ray._private.grpc_utils import init_grpc_channel

    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return
    channel = init_grpc_channel(f"{host}:{port}", asynchronous=False)
    try:
        if address.startswith("ray://"):
            from ray.core.generated import ray_client_pb2 as messages
            from ray.core.generated import ray_client_pb2_grpc as services

            ping = messages.ClusterInfoRequest(type=messages.ClusterInfoType.PING)
            services.RayletDriverStub(channel).ClusterInfo(ping, timeout=5)
        else:
            from ray.core.generated import gcs_service_pb2 as messages
            from ray.core.generated import gcs_service_pb2_grpc as services

            services.NodeInfoGcsServiceStub(channel).GetClusterId(messages.GetClusterIdRequest(), timeout=5)
    except grpc.RpcError as error:
        if error.code() != grpc.StatusCode.UNAUTHENTICATED:
            return
        if authentication_utils.is_token_auth_enabled():
            why = (
                "the cluster refused this machine's token (from RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or "
                "~/.ray/auth_token): set RAY_AUTH_TOKEN to the cluster's token"
            )
        else:
            why = (
                "the cluster needs a token and none was sent (RAY_AUTH_MODE is not token): "
                "export RAY_AUTH_MODE=token RAY_AUTH_TOKEN=<the cluster's token>"
            )
        raise ClusterError(
            f"cannot connect to the Ray cluster at {address} (--address or RAY_ADDRESS): {why}"
        ) from None
    finally:
        channel.close()


def _local_gpu_count() -> int:
    """The GPUs Ray itself gives a local node it detects them on: its GPU manager's count (NVML), capped by the
    devices CUDA_VISIBLE_DEVICES leaves visible. Not torch's count: importing torch (~2 s) would delay Ray's start."""
    from ray._private.accelerators import get_accelerator_manager_for_resource

    try:
        manager = get_accelerator_manager_for_resource("GPU")
        count = manager.get_current_node_num_accelerators()
        visible = manager.get_current_process_visible_accelerator_ids()
    except Exception:  # a broken driver install means no usable GPU, not a crash
        return 0
    return count if visible is None else min(count, len(visible))


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


def check_shared_storage(
    folder: StoragePath, print_line: Callable[[str], None] = print, timeout_s: float = 180.0
) -> None:
    """On a multi-node cluster or through Ray Client, prove that every node reaches `folder` (the
    --storage root) as the driver sees it: the driver writes a marker file, a zero-CPU task on
    each node reads it and writes beside it. A node that cannot (a folder not mounted there, an
    object store without credentials there) is a StorageError, a node that cannot run cifar_ray's code a
    ClusterError; one that does not answer in time (e.g. still installing a runtime env) is only reported."""
    import uuid

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    folder.mkdir()
    marker = folder / f".cifar-ray-storage-check-{uuid.uuid4().hex}"
    marker.write_text("written by the cifar-ray driver; every node must see this file\n")
    probe = ray.remote(num_cpus=0, max_retries=0)(_storage_probe)
    try:
        refs = {
            node["NodeID"]: probe.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
            ).remote(marker)
            for node in ray.nodes()
            if node.get("Alive")
        }
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        blind, errors, silent = [], [], []
        for node_id, ref in refs.items():
            if ref not in ready:
                silent.append(node_id[:8])
                continue
            try:
                answer = ray.get(ref)
            except Exception as error:  # e.g. cifar_ray not importable there
                errors.append(f"node {node_id[:8]}: {error_line(error)}")
                continue
            if not answer["ok"]:
                blind.append(f"{answer['ip']} ({answer['host']}: {answer['why']})")
    finally:
        marker.unlink()
    if blind:
        raise StorageError(
            f"--storage {folder} is not reachable (or not writable) from node(s) {', '.join(blind)}: on a Ray cluster "
            "it must be a folder that every node and this machine mount at the same path (NFS, ...) or a URI they all "
            "have credentials for"
        )
    if errors:
        raise ClusterError(
            f"cannot run cifar_ray code on every node ({'; '.join(errors)}): install the package on every "
            'node, or ship it with `ray job submit --runtime-env-json \'{"working_dir": "."}\'`'
        )
    if silent:
        print_line(
            f"storage: node(s) {', '.join(silent)} did not answer in {timeout_s:g} s; "
            f"cannot tell whether they reach {folder}"
        )


def write_provenance(run_dir: StoragePath, session: int) -> None:
    """Session `session`'s provenance (core/provenance.py), gathered on the driver as the session starts: the
    checkout cifar_ray runs from, the installed packages, this machine's GPU stack (workers' GPUs: trial.json)."""
    git, diff = provenance.git_state(sysinfo.PACKAGE_DIR)
    RunFolder(run_dir).record_provenance(
        session, git, diff, provenance.installed_packages_now(), provenance.gpu_stack(_local_gpu_count())
    )


# How running out of memory reads in an error's text: Python's and torch's errors, Ray's OutOfMemoryError (a task
# the memory monitor killed), an actor the memory monitor killed (a worker of a slot: Ray Train wraps its
# ActorDiedError, "Worker exit type: NODE_OUT_OF_MEMORY", in a WorkerHealthCheckFailedError and WorkerGroupError),
# and the CUDA libraries' own words (GPU_OOM_MARKS).
OOM_MARKS = ("MemoryError", "NODE_OUT_OF_MEMORY", *GPU_OOM_MARKS)


def failure_status(error: BaseException) -> str:
    """The status of a trial that `error` ended: oom when memory ran out anywhere in its chain, else failed."""
    text = "".join(traceback.format_exception(error))
    return "oom" if any(mark in text for mark in OOM_MARKS) else "failed"


def error_line(error: BaseException) -> str:
    """The root cause in one line (Ray wraps worker errors in several layers)."""
    text = "".join(traceback.format_exception_only(error)).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    causes = [line for line in lines if "Error" in line.split(":")[0] or "Exception" in line.split(":")[0]]
    line = causes[-1] if causes else lines[-1] if lines else repr(error)
    return re.sub(r"^(?:\w+\.)+(?=\w+:)", "", line)[:500]  # cifar_ray.core.datasets.DataError: ... -> DataError: ...
