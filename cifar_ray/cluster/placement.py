"""Where trials run: the resources of a trial and its workers, and how many trials fit the cluster at once.

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

import socket
from collections.abc import Callable
from typing import Any

from ..core.config import TrainConfig, parse_config
from ..core.errors import ConfigError
from ..core.shapes import trial_shape
from ..core.sweep import SweepPlan, TrialSpec

RESOURCE_CPU = "cifar_ray_cpu"
RESOURCE_GPU = "cifar_ray_gpu"


CAPACITY_KEYS = ("CPU", "GPU", RESOURCE_CPU, RESOURCE_GPU)


def cluster_capacity() -> dict[str, Any]:
    import ray

    return capacity_of(
        [{k: float(n["Resources"].get(k, 0.0)) for k in CAPACITY_KEYS} for n in ray.nodes() if n.get("Alive")]
    )


def capacity_of(per_node: list[dict[str, float]]) -> dict[str, Any]:
    """What the sweep needs to know of a cluster whose live nodes have `per_node`'s resources (CAPACITY_KEYS)."""
    total = {k: sum(node.get(k, 0.0) for node in per_node) for k in CAPACITY_KEYS}
    return {
        "cpus": total["CPU"],
        "gpus": total["GPU"],
        "nodes": len(per_node),
        "slot_cpus": total[RESOURCE_CPU],
        "slot_gpus": total[RESOURCE_GPU],
        "packing": "slots" if total[RESOURCE_CPU] > 0 else "cap",
        "per_node": per_node,
    }


def mirror_resources(per_worker: dict[str, float]) -> dict[str, float]:
    """A worker's CPUs and GPUs under the mirror (slot) resource names."""
    mirror = {RESOURCE_CPU: per_worker["CPU"]}
    if per_worker.get("GPU"):
        mirror[RESOURCE_GPU] = per_worker["GPU"]
    return mirror


# Ray's resource on the head node (ray._common.constants.HEAD_NODE_RESOURCE_NAME; Ray Train pins its state actor with
# a 0.001 share of it). Named here so the fast paths import no Ray.
HEAD_NODE_RESOURCE = "node:__internal_head__"


def thin_trial_bundles() -> list[dict[str, float]]:
    """What a thin Tune trial reserves: no core ("memory": 1 byte keeps Ray from rejecting a bundle with no CPU),
    on the head node, where the driver and the Dispatcher live (the driver's node in every supported setup):
    a thin trial on a node that is lost would error its Tune trial while the slots carry the trial on."""
    return [{"CPU": 0.0, "memory": 1.0, HEAD_NODE_RESOURCE: 0.001}]


def workers_that_fit(per_worker: dict[str, float], nodes: list[dict[str, float]]) -> int:
    """How many workers of this shape the nodes hold at once (a worker lives on one node)."""
    need = {k: v for k, v in per_worker.items() if v > 0}
    return sum(min(int((node.get(k, 0.0) + 1e-9) // v) for k, v in need.items()) for node in nodes) if need else 0


def trials_that_fit(cfg: TrainConfig, nodes: list[dict[str, float]], slots: bool) -> int:
    """How many copies of this trial run at once on empty nodes (slots: also in the mirror resources)."""
    per_worker = trial_shape(cfg).worker_resources
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
        per_worker = trial_shape(cfg).worker_resources
        gpus = f" and {per_worker['GPU']:g} GPU(s)" if "GPU" in per_worker else ""
        need = (
            f"trial {trial.name} needs {cfg.ray_workers} worker(s) x {per_worker['CPU']:g} CPU(s){gpus} "
            f"(workers={cfg.workers}, cpus_per_worker={cfg.cpus_per_worker})"
        )
        if workers_that_fit(per_worker, nodes) < cfg.ray_workers:
            raise ConfigError(
                f"{need} but the cluster's {len(nodes)} node(s) have CPUs {_per_node(nodes, 'CPU')}, "
                f"GPUs {_per_node(nodes, 'GPU')}: it can never run{_gpu_way_out(cfg, nodes)}"
            )
        if capacity["packing"] == "slots" and workers_that_fit(mirror_resources(per_worker), nodes) < cfg.ray_workers:
            raise ConfigError(
                f"{need} but the nodes' slot resources are {RESOURCE_CPU} {_per_node(nodes, RESOURCE_CPU)}, "
                f"{RESOURCE_GPU} {_per_node(nodes, RESOURCE_GPU)}: start every node with "
                f'--resources=\'{{"{RESOURCE_CPU}": <its CPUs>, "{RESOURCE_GPU}": <its GPUs>}}\', or none of them'
            )


def gpu_share_that_fits(cfg: TrainConfig, nodes: list[dict[str, float]]) -> float | None:
    """The GPU share per worker (1/k: k ranks per GPU, the fewest that fit) with which a trial of several
    ranks fits the nodes' GPUs when one GPU per rank does not (a one-GPU machine and workers=2); None when
    whole GPUs fit, or sharing cannot help (dp drives whole GPUs from one process; too few CPUs)."""
    if cfg.strategy == "dp" or cfg.ray_workers < 2:
        return None
    cpus = {"CPU": float(cfg.cpus_per_worker)}
    if workers_that_fit(cpus | {"GPU": 1.0}, nodes) >= cfg.ray_workers:
        return None
    # Ray counts fractional resources in steps of 0.0001: round down so k shares still fit one GPU
    shares = (int(10_000 / ranks) / 10_000 for ranks in range(2, cfg.ray_workers + 1))
    return next((share for share in shares if workers_that_fit(cpus | {"GPU": share}, nodes) >= cfg.ray_workers), None)


def _gpu_way_out(cfg: TrainConfig, nodes: list[dict[str, float]]) -> str:
    """The end of a refusal for a trial whose ranks have too few GPUs: how to run it anyway."""
    if cfg.use_gpu != "true":
        return ""
    share = gpu_share_that_fits(cfg, nodes)
    # NCCL refuses two ranks on one GPU (ray-project/ray#48012): ranks that share a GPU talk over gloo
    shared = f"gpus_per_worker={share:g} backend=gloo (ranks share GPUs), or " if share else ""
    return f"; use {shared}use_gpu=false (CPU workers)"


def concurrency_cap(plan: SweepPlan, capacity: dict[str, Any], max_concurrent: int | None) -> int | None:
    """Tune's max_concurrent_trials. Slot packing: --max-concurrent as given (Tune packs by
    resources). Cap packing: at most as many trials as copies of the most demanding one fit."""
    if capacity["packing"] == "slots":
        return max_concurrent
    fit = max(1, min(trials_that_fit(t.config, capacity["per_node"], slots=False) for t in plan.trials))
    return min(fit, max_concurrent) if max_concurrent else fit


def trials_at_once(plan: SweepPlan, capacity: dict[str, Any], limit: int | None) -> dict[str, tuple[int, int]]:
    """Per trial shape: (number of trials, how many of them run at once on the empty cluster).
    Slot packing: as many copies as fit the nodes; cap packing: Tune's cap for all."""
    shapes: dict[str, tuple[int, int]] = {}
    for trial in plan.trials:
        label = trial_shape(trial.config).label
        if capacity["packing"] == "slots":
            fit = trials_that_fit(trial.config, capacity["per_node"], slots=True)
            fit = min(fit, limit) if limit else fit
        else:
            fit = limit or 1
        count = shapes.get(label, (0, 0))[0] + 1
        shapes[label] = (count, min(fit, count))
    return shapes


def resolve_plan(
    plan: SweepPlan, capacity: dict[str, Any], print_line: Callable[[str], None] | None = None
) -> SweepPlan:
    """`auto` use_gpu/backend made concrete for this cluster, for every trial; a trial this cluster or
    this torch build cannot run is refused (ConfigError). A GPU trial with backend=auto and whole GPUs whose
    ranks outnumber the GPUs runs them as gloo ranks sharing GPUs rather than being refused (a one-GPU
    machine and workers=2), said in one line per trial shape through `print_line`."""
    has_gpus = capacity["gpus"] > 0
    shared: dict[tuple[int, float], list[str]] = {}
    trials = []
    for trial in plan.trials:
        config = trial.config
        share = _auto_share(config, capacity) if has_gpus else None
        if share:
            config = parse_config(config.model_dump() | {"backend": "gloo", "gpus_per_worker": share})
            shared.setdefault((config.ray_workers, share), []).append(trial.name)
        trials.append(TrialSpec(trial.index, trial.name, trial.swept, _resolved(config, has_gpus)))
    for (workers, share), names in shared.items():
        if print_line:
            print_line(
                f"{len(names)} trial(s) with {workers} workers on {capacity['gpus']:g} GPU(s): ranks share GPUs "
                f"(gpus_per_worker={share:g}, backend=gloo: NCCL refuses two ranks on one GPU); "
                "use_gpu=false runs them on CPU instead"
            )
    return SweepPlan(**{**plan.__dict__, "trials": trials})


def _auto_share(config: TrainConfig, capacity: dict[str, Any]) -> float | None:
    """gpu_share_that_fits for a GPU trial (use_gpu auto or true) that leaves its backend to auto and asks whole
    GPUs, else None."""
    if config.use_gpu == "false" or (config.backend, config.gpus_per_worker) != ("auto", 1.0):
        return None
    return gpu_share_that_fits(config, capacity.get("per_node", []))


def _resolved(config: TrainConfig, has_gpus: bool) -> TrainConfig:
    resolved = config.resolved(has_gpus)
    if resolved.grad_compression != "none":
        from ..training.comm import check_grad_compression  # imports torch: only for a trial that compresses

        check_grad_compression(resolved)
    return resolved


def placement_groups_of(actor_ids: set[str]) -> list:
    """The placement groups, not removed, that these actors (by hex id) created: found by their creator in the GCS's
    table, which Ray's public placement_group_table leaves out."""
    import ray
    from ray._private.state import state
    from ray.core.generated.gcs_pb2 import PlacementGroupTableData
    from ray.util.placement_group import PlacementGroup

    groups = []
    for raw in state._connect_and_get_accessor().get_placement_group_table():
        group = PlacementGroupTableData.FromString(raw)
        if group.creator_actor_id.hex() in actor_ids and group.state != PlacementGroupTableData.REMOVED:
            groups.append(PlacementGroup(ray.PlacementGroupID(group.placement_group_id)))
    return groups


def remove_placement_groups_of(actor_ids: set[str]) -> None:
    """Removes the placement groups these actors created (dead actors: they make no more). Ray scopes an actor's
    placement groups to its job, not to the actor: a killed Ray Train controller's worker group keeps its cores
    reserved until the driver exits, and one asked for just before the kill (no workers yet, still pending) would
    take cores later. Through Ray Client, as a task on the cluster: the GCS's table is read there."""
    from ray._private.client_mode_hook import client_mode_wrap

    client_mode_wrap(_remove_placement_groups_of)(actor_ids)


def _remove_placement_groups_of(actor_ids: set[str]) -> None:
    from ray.util.placement_group import remove_placement_group

    for group in placement_groups_of(actor_ids):
        remove_placement_group(group)


def cores_awaited() -> str | None:
    """One line when placement groups on the cluster wait for resources (a worker group of this sweep's, or of other
    work), saying what they ask for and what is free; None when none waits. A worker group asks only what the
    cluster has in all (the plan sizes slots to its capacity), so one that waits waits for other work to free it:
    another job or sweep on the cluster, or a placement group left reserved."""
    import ray
    from ray.util.placement_group import placement_group_table

    asked: dict[str, float] = {}
    for group in placement_group_table().values():
        if group["state"] in ("PENDING", "RESCHEDULING"):
            for bundle in group["bundles"].values():
                for key in ("CPU", "GPU"):
                    asked[key] = asked.get(key, 0.0) + bundle.get(key, 0.0)
    asked = {key: amount for key, amount in asked.items() if amount}
    if not asked:
        return None
    free, total = ray.available_resources(), ray.cluster_resources()
    wanted = " and ".join(f"{amount:g} {key}" for key, amount in asked.items())
    have = " and ".join(f"{free.get(key, 0.0):g} of {total.get(key, 0.0):g} {key}" for key in asked)
    return (
        f"waiting for the cluster: placement groups ask for {wanted}, and {have} are free: other work holds them "
        "(`ray status` lists it); trials start once it frees them"
    )


def worker_placement() -> dict:
    """Where this process runs: its Ray node id (unique per node, also for several nodes on one
    machine; None outside Ray) and the hostname."""
    node_id = None
    try:
        import ray

        if ray.is_initialized():
            node_id = ray.get_runtime_context().get_node_id()
    except Exception:  # placement is information, never a reason to fail a run
        pass
    return {"node_id": node_id, "hostname": socket.gethostname()}
