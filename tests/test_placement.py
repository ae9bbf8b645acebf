"""Cluster placement without a cluster: packing arithmetic, --storage, --address, data staging
under a lock, and a data error surfacing as the trial's one-line error (that one on real Ray)."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import tarfile
import threading

import pytest
from conftest import write_cifar_fixture

from cifar_ray.cluster import placement, progress
from cifar_ray.cluster import session as ray_session
from cifar_ray.cluster.placement import RESOURCE_CPU, RESOURCE_GPU, worker_placement
from cifar_ray.core import sysinfo
from cifar_ray.core.config import ConfigError, TrainConfig
from cifar_ray.core.errors import ClusterError
from cifar_ray.core.shapes import trial_shape
from cifar_ray.core.sweep import build_plan
from cifar_ray.training import data
from cifar_ray.training.distributed import gather_ranks


def plan_of(grid: dict, **base):
    document = {"name": "p", "base": {"dataset": "synthetic", "batch_size": 120} | base, "grid": grid}
    plan = build_plan(document)
    return placement.resolve_plan(plan, {"gpus": 1 if base.get("use_gpu") == "true" else 0})


def capacity(*nodes: dict, slots: bool = False) -> dict:
    per_node = [{"CPU": 0.0, "GPU": 0.0, RESOURCE_CPU: 0.0, RESOURCE_GPU: 0.0} | n for n in nodes]
    return {
        "per_node": per_node,
        "nodes": len(per_node),
        "packing": "slots" if slots else "cap",
        "gpus": sum(n["GPU"] for n in per_node),
    }


TWO_ONE_CPU_NODES = capacity({"CPU": 1}, {"CPU": 1})


def test_a_trial_may_span_nodes_but_a_worker_may_not():
    placement.check_fits(plan_of({"workers": [1, 2]}), TWO_ONE_CPU_NODES)  # 2 workers: one per node
    with pytest.raises(ConfigError) as error:
        placement.check_fits(plan_of({"workers": [1]}, cpus_per_worker=2), TWO_ONE_CPU_NODES)
    message = str(error.value)
    assert "\n" not in message and "t000" in message and "1 worker(s) x 2 CPU(s)" in message
    assert "CPUs 1+1" in message and "can never run" in message
    with pytest.raises(ConfigError, match="needs 3 worker"):
        placement.check_fits(plan_of({"workers": [3]}), TWO_ONE_CPU_NODES)


def test_gpu_trials_need_gpu_nodes():
    gpu_nodes = capacity({"CPU": 8, "GPU": 2}, {"CPU": 8, "GPU": 2})
    plan = plan_of({"workers": [4]}, use_gpu="true")
    placement.check_fits(plan, gpu_nodes)
    assert placement.concurrency_cap(plan, gpu_nodes, None) == 1
    with pytest.raises(ConfigError, match="and 1 GPU"):
        placement.check_fits(plan_of({"workers": [5]}, use_gpu="true"), gpu_nodes)


def test_slot_packing_needs_the_mirror_resources_on_the_nodes():
    nodes = capacity({"CPU": 2, RESOURCE_CPU: 2}, {"CPU": 2}, slots=True)
    placement.check_fits(plan_of({"workers": [2]}), nodes)
    with pytest.raises(ConfigError, match=f'start every node with --resources=\'{{"{RESOURCE_CPU}"'):
        placement.check_fits(plan_of({"workers": [4]}), nodes)


def test_cap_packing_runs_as_many_trials_as_copies_of_the_largest_fit():
    ones = plan_of({"seed": [0, 1, 2, 3]})
    assert placement.concurrency_cap(ones, TWO_ONE_CPU_NODES, None) == 2
    assert placement.concurrency_cap(ones, TWO_ONE_CPU_NODES, 1) == 1  # --max-concurrent still caps
    assert placement.concurrency_cap(ones, TWO_ONE_CPU_NODES, 5) == 2
    assert placement.concurrency_cap(plan_of({"workers": [1, 2]}), TWO_ONE_CPU_NODES, None) == 1
    big = capacity({"CPU": 3}, {"CPU": 3})  # 2-CPU workers: one per node, not 3 CPUs' worth
    assert placement.concurrency_cap(plan_of({"seed": [0, 1, 2]}, cpus_per_worker=2), big, None) == 2
    slots = capacity({"CPU": 2, RESOURCE_CPU: 2}, slots=True)  # Tune packs by resources: no cap
    assert placement.concurrency_cap(ones, slots, None) is None
    assert placement.concurrency_cap(ones, slots, 3) == 3


def test_sweep_header_says_how_many_trials_of_each_shape_run_at_once():
    plan = plan_of({"workers": [1, 2], "seed": [0, 1]})
    two_cpus = capacity({"CPU": 2, RESOURCE_CPU: 2}, slots=True) | {"cpus": 2.0}
    assert placement.trials_at_once(plan, two_cpus, None) == {"1 worker x 1 CPU": (2, 2), "2 workers x 1 CPU": (2, 1)}
    assert placement.trials_at_once(plan, two_cpus, 1) == {"1 worker x 1 CPU": (2, 1), "2 workers x 1 CPU": (2, 1)}
    header = progress.sweep_header(plan, two_cpus, None, "runs/p")
    assert header.startswith(
        "p: 4 trials, at once: 2 of 2 with 1 worker x 1 CPU, 1 of 2 with 2 workers x 1 CPU "
        "(2 CPUs, 0 GPUs on 1 node); logs and checkpoints in runs/p; wall time ~"  # tests/test_rough_estimate.py
    )
    one = capacity({"CPU": 1, RESOURCE_CPU: 1}, slots=True) | {"cpus": 1.0, "gpus": 1.0}
    assert "(1 CPU, 1 GPU on 1 node)" in progress.sweep_header(plan_of({"seed": [0]}), one, None, "runs/p")
    resuming = progress.sweep_header(plan, two_cpus, None, "runs/p", unfinished=3)
    assert resuming.startswith("resuming p: 3 of 4 trials unfinished, at once: 2 of 2")
    cap = TWO_ONE_CPU_NODES | {"cpus": 2.0}  # cap packing: Tune's one cap for every shape
    assert placement.trials_at_once(plan, cap, 1) == {"1 worker x 1 CPU": (2, 1), "2 workers x 1 CPU": (2, 1)}


def test_fractional_gpus_pack_small_trials_onto_one_gpu_and_keep_nccl_ranks_apart():
    """Planning with fake GPUs (2 per node on this CPU machine): 0.25 GPU per worker packs four 1-worker
    trials per GPU; a 2-worker trial sharing GPUs must use gloo, since NCCL refuses two ranks on one GPU."""
    two_gpus = capacity({"CPU": 16, "GPU": 2}, {"CPU": 16, "GPU": 2})["per_node"]
    quarter = TrainConfig(use_gpu="true", gpus_per_worker=0.25)
    assert trial_shape(quarter).worker_resources == {"CPU": 1.0, "GPU": 0.25}
    assert placement.trials_that_fit(quarter, two_gpus, slots=False) == 16  # 4 per GPU, 2 GPUs on each of 2 nodes
    gloo_pairs = TrainConfig(use_gpu="true", gpus_per_worker=0.5, workers=2, backend="gloo")
    assert placement.trials_that_fit(gloo_pairs, two_gpus, slots=False) == 4
    assert TrainConfig(gpus_per_worker=0.5, workers=2, backend="gloo").resolved(True).backend == "gloo"
    for backend in ("nccl", "auto"):
        with pytest.raises(ConfigError, match="NCCL refuses") as error:
            TrainConfig(gpus_per_worker=0.5, workers=2, backend=backend).resolved(True)
        assert "\n" not in str(error.value)
    assert TrainConfig(gpus_per_worker=0.25).resolved(True).backend == "nccl"  # one rank: nothing to share
    with pytest.raises(ValueError, match="strategy=dp"):
        TrainConfig(use_gpu="true", strategy="dp", workers=2, gpus_per_worker=0.5)


ONE_GPU = capacity({"CPU": 16, "GPU": 1})


def test_two_workers_on_one_gpu_run_as_gloo_ranks_sharing_it_and_say_so():
    """The defaults (use_gpu=auto, backend=auto, workers=2 as in the README quickstart) on a one-GPU machine."""
    plan = build_plan({"name": "p", "base": {"dataset": "synthetic"}, "grid": {"workers": [1, 2, 4]}})
    lines = []
    resolved = placement.resolve_plan(plan, ONE_GPU, lines.append)
    shapes = [(t.config.use_gpu, t.config.backend, t.config.gpus_per_worker) for t in resolved.trials]
    assert shapes == [("true", "nccl", 1.0), ("true", "gloo", 0.5), ("true", "gloo", 0.25)]
    placement.check_fits(resolved, ONE_GPU)
    assert len(lines) == 2 and "1 trial(s) with 2 workers on 1 GPU(s): ranks share GPUs" in lines[0]
    assert "gpus_per_worker=0.5, backend=gloo" in lines[0] and "gpus_per_worker=0.25" in lines[1]
    two_gpus = capacity({"CPU": 16, "GPU": 2})  # whole GPUs fit 2 workers: they stay as they are
    on_two = placement.resolve_plan(plan, two_gpus, lines.append).trials
    assert [t.config.gpus_per_worker for t in on_two] == [1.0, 1.0, 0.5]
    assert lines[2:] == [
        "1 trial(s) with 4 workers on 2 GPU(s): ranks share GPUs (gpus_per_worker=0.5, backend=gloo: "
        "NCCL refuses two ranks on one GPU); use_gpu=false runs them on CPU instead"
    ]
    three = TrainConfig(workers=3, batch_size=120)
    assert placement.gpu_share_that_fits(three, ONE_GPU["per_node"]) == 0.3333  # Ray's 0.0001 steps: 3 fit


def test_a_trial_that_chose_its_gpus_is_refused_naming_the_way_out():
    for base in (
        {"use_gpu": "true", "backend": "nccl"},
        {"use_gpu": "true", "gpus_per_worker": 1.0, "backend": "nccl"},
    ):
        plan = build_plan({"name": "p", "base": {"dataset": "synthetic", "workers": 2} | base})
        resolved = placement.resolve_plan(plan, ONE_GPU, print)
        assert resolved.trials[0].config.backend == "nccl"
        with pytest.raises(ConfigError) as error:
            placement.check_fits(resolved, ONE_GPU)
        message = str(error.value)
        assert "\n" not in message and message.endswith(
            "can never run; use gpus_per_worker=0.5 backend=gloo (ranks share GPUs), or use_gpu=false (CPU workers)"
        )
    dp = placement.resolve_plan(plan_of({}, use_gpu="true", strategy="dp", workers=2), ONE_GPU)
    with pytest.raises(ConfigError, match=r"can never run; use use_gpu=false \(CPU workers\)$"):
        placement.check_fits(dp, ONE_GPU)  # dp drives whole GPUs from one process: no sharing


def test_a_thin_trial_reserves_no_core_on_the_head_node():
    """A thin trial lives on the head (the driver's node) so that losing another node cannot error its Tune trial;
    HEAD_NODE_RESOURCE must be the name Ray gives the head's resource."""
    from ray._common.constants import HEAD_NODE_RESOURCE_NAME

    assert placement.HEAD_NODE_RESOURCE == HEAD_NODE_RESOURCE_NAME
    assert placement.thin_trial_bundles() == [{"CPU": 0.0, "memory": 1.0, HEAD_NODE_RESOURCE_NAME: 0.001}]


def test_address_comes_from_the_flag_or_ray_address(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert ray_session.cluster_address(None) is None
    assert ray_session.cluster_address("local") is None
    assert ray_session.cluster_address("10.0.0.1:6379") == "10.0.0.1:6379"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.2:6379")  # what `ray job submit` gives its entrypoint
    assert ray_session.cluster_address(None) == "10.0.0.2:6379"
    assert ray_session.cluster_address("auto") == "auto"
    assert ray_session.cluster_address("ray://head:10001") == "ray://head:10001"


def test_a_dead_address_is_a_one_line_error_not_minutes_of_retries():
    with pytest.raises(ClusterError, match=r"cannot connect to the Ray cluster at 127\.0\.0\.1:1 "):
        ray_session._check_reachable("127.0.0.1:1")
    with pytest.raises(ClusterError, match=r"cannot connect to the Ray cluster at ray://127\.0\.0\.1:1 "):
        ray_session._check_reachable("ray://127.0.0.1:1")
    ray_session._check_reachable("auto")  # left to Ray


def test_runtime_env_leaves_the_jobs_own_settings_alone(monkeypatch):
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    env = ray_session.cluster_runtime_env(verbose=False)
    assert set(env["env_vars"]) == set(ray_session.RAY_ENV_DEFAULTS)
    assert env["worker_process_setup_hook"] == "cifar_ray.cluster.session.quiet_ray_logs"
    job = {"runtime_env": {"working_dir": "gcs://x.zip", "env_vars": {"RAY_DEDUP_LOGS": "0"}}}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(job))
    env = ray_session.cluster_runtime_env(verbose=True)
    assert "RAY_DEDUP_LOGS" not in env["env_vars"] and "worker_process_setup_hook" not in env


def test_placement_of_a_single_process():
    import ray

    placement = sysinfo.placement_of(gather_ranks(worker_placement()))
    # this process's node when an earlier test started the session's Ray, else none
    expected = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    assert placement["nodes"] == [expected] and len(placement["hostnames"]) == 1


def serve(content: bytes):
    """A one-file HTTP server on loopback; returns (url, server, list of GET paths served)."""
    gets: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()

        def do_GET(self):
            gets.append(self.path)
            self.do_HEAD()
            self.wfile.write(content)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_port}/cifar-10-python.tar.gz", server, gets


def test_concurrent_workers_download_once_and_never_see_half_a_folder(tmp_path, monkeypatch):
    source = tmp_path / "source"
    write_cifar_fixture(source, per_batch=20, n_test=20)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        archive.add(source / data.CIFAR_FOLDER, arcname=data.CIFAR_FOLDER)
    url, server, gets = serve(buffer.getvalue())
    import torchvision.datasets.utils as tv_utils

    downloads = []
    real_download = tv_utils.download_and_extract_archive
    monkeypatch.setattr(
        tv_utils, "download_and_extract_archive", lambda *a, **k: downloads.append(a) or real_download(*a, **k)
    )
    monkeypatch.setattr(data, "CIFAR_URL", url)
    monkeypatch.setattr(data, "CIFAR_MD5", hashlib.md5(buffer.getvalue()).hexdigest())
    target = tmp_path / "node-local"
    results, errors = [], []

    def worker():
        try:
            results.append(data.read_cifar_batches(data.ensure_cifar10(target), data.TEST_FILES))
        except Exception as error:  # collected: a thread's exception would be lost
            errors.append(error)

    try:
        threads = [threading.Thread(target=worker) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        server.shutdown()
    assert not errors and len(results) == 4 and all(len(r) == 20 for r in results)
    assert len(downloads) == 1 and gets  # one real download over HTTP for all four
    assert data.cifar_present(target) and not list(target.glob(".cifar10-extract-*"))


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.slow
def test_bad_data_is_the_trials_one_line_error(tmp_path, capfd):
    """As on a cluster node whose copy of the data is damaged: the data is there (so the check
    before Ray starts passes) but a batch cannot be read in the worker."""
    from cifar_ray.cli import main

    write_cifar_fixture(tmp_path / "data", per_batch=10, n_test=10)
    (tmp_path / "data" / data.CIFAR_FOLDER / "data_batch_2").write_bytes(b"cut short")
    code = main(
        [
            "train",
            "--storage",
            str(tmp_path / "runs"),
            "--name",
            "bad",
            "--json",
            "--set",
            "dataset=cifar10",
            f"data_dir={tmp_path / 'data'}",
            "max_failures=0",
            "epochs=1",
            "width=8",
            "batch_size=8",
        ]
    )
    out, err = capfd.readouterr()  # file descriptors: Ray's log handlers write there, not to sys.stderr
    result = json.loads(out.strip().splitlines()[-1])
    assert code == 1 and result["status"] == "failed", err
    assert result["error"].startswith("DataError: cannot read CIFAR-10 batch") and "data_batch_2" in result["error"]
    assert "\n" not in result["error"]
    assert f"FAILED: {result['error']}" in err  # the progress line says the same
    assert "Traceback" not in err and "Trial task failed" not in err and "did not complete" not in err, err
