"""A real 2-node Ray cluster on this machine: two `ray start` (1 CPU each, own temp dir, own
token), driven by `cifar-ray sweep --address` in a subprocess. The pytest process never
connects to it (other tests' embedded Ray may be running alongside), and it is stopped by
killing exactly the processes it started, never with `ray stop` (which stops every Ray here)."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from cifar_ray.core import runlog

BIN = Path(sys.executable).parent
MARKER = "CIFAR_RAY_TEST_CLUSTER"  # in the environment of every process of our cluster, inherited


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalCluster:
    """`ray start --head` plus `ray start --address`, each with --num-cpus 1, on 127.0.0.1."""

    def __init__(self, nodes: int = 2, cpus_per_node: int = 1, resources: dict | None = None):
        self.nodes, self.cpus, self.resources = nodes, cpus_per_node, resources
        self.client_port = free_port()  # the head's Ray Client server (ray://); Ray's default 10001 may be taken
        # short: Ray's unix socket paths live under it (at most 107 characters)
        self.temp_dir = tempfile.mkdtemp(prefix="cr-", dir="/tmp")
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("RAY_ADDRESS", "RAY_JOB_CONFIG_JSON_ENV_VAR", "RAY_AUTH_TOKEN_PATH")
        }
        # Ray 2.60 turns token authentication on for `ray start --head` when ~/.ray/auth_token exists:
        # give this cluster (and only its clients) a token of its own.
        self.env = env | {
            MARKER: self.temp_dir,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": secrets.token_hex(32),
            "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        }

    def ray(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "ray"), *args], env=self.env, capture_output=True, text=True, timeout=90)

    def start(self) -> None:
        common = [
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={self.cpus}",
            "--num-gpus=0",
            f"--temp-dir={self.temp_dir}",
            "--disable-usage-stats",
            *([f"--resources={json.dumps(self.resources)}"] if self.resources else []),
        ]
        head = self.ray(
            "start",
            "--head",
            f"--port={self.port}",
            "--include-dashboard=false",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--ray-client-server-port={self.client_port}",
            *common,
        )
        assert head.returncode == 0, head.stderr[-3000:]
        for _ in range(self.nodes - 1):
            node = self.ray(
                "start", f"--address={self.address}", f"--dashboard-agent-listen-port={free_port()}", *common
            )
            assert node.returncode == 0, node.stderr[-3000:]
        deadline = time.monotonic() + 45
        while self.alive_nodes() < self.nodes:
            assert time.monotonic() < deadline, f"the cluster has {self.alive_nodes()} of {self.nodes} nodes after 45 s"
            time.sleep(0.5)

    def alive_nodes(self) -> int:
        status = self.ray("status", f"--address={self.address}")
        active = status.stdout.split("Active:", 1)[-1].split("Pending:", 1)[0] if "Active:" in status.stdout else ""
        return len(re.findall(r"^\s*\d+ node_[0-9a-f]+", active, re.MULTILINE))

    def processes(self) -> list[psutil.Process]:
        """Every live process of this cluster: its marker is in their environment (workers rename
        themselves, so command lines do not tell), or its temp dir on their command line."""
        found = []
        for proc in psutil.process_iter():
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                if proc.environ().get(MARKER) == self.temp_dir or any(self.temp_dir in part for part in proc.cmdline()):
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass
        return found

    def stop(self) -> list[psutil.Process]:
        """Terminate this cluster's processes (then kill stragglers); returns what is left alive."""
        for _ in range(3):  # a dying raylet may still be starting workers: sweep again
            procs = self.processes()
            if not procs:
                break
            for proc in procs:
                try:
                    proc.terminate()
                except psutil.NoSuchProcess:
                    pass
            _, alive = psutil.wait_procs(procs, timeout=5)
            for proc in alive:
                try:
                    proc.kill()
                except psutil.NoSuchProcess:
                    pass
            psutil.wait_procs(alive, timeout=5)
        left = self.processes()
        if not left:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        return left


def ray_in_this_process() -> bool:
    return "ray" in sys.modules and sys.modules["ray"].is_initialized()


def run_sweep(cluster: LocalCluster, tmp_path: Path, sweep_yaml: str, *extra: str):
    """Start the cluster, run `cifar-ray sweep --address` against it in a subprocess, stop it.
    Returns (the finished subprocess, the run folder, the cluster's node ids)."""
    started = time.monotonic()
    try:
        cluster.start()
        up = time.monotonic()
        (tmp_path / "sweep.yaml").write_text(sweep_yaml)
        storage = tmp_path / "shared"  # one folder every node sees: here, the same disk
        sweep = subprocess.run(
            [
                str(BIN / "cifar-ray"),
                "sweep",
                str(tmp_path / "sweep.yaml"),
                "--address",
                cluster.address,
                "--storage",
                str(storage),
                "--json",
                *extra,
            ],
            env=cluster.env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=240,
        )
        swept = time.monotonic()
        status = cluster.ray("status", f"--address={cluster.address}").stdout
    finally:
        left = cluster.stop()
    print(f"cluster up {up - started:.1f} s, sweep {swept - up:.1f} s, stop {time.monotonic() - swept:.1f} s")
    assert not left, f"processes of the test cluster still alive: {[(p.pid, p.name()) for p in left]}"
    if ray_in_this_process():  # another test's embedded Ray in this session survived the stop
        import ray

        assert ray.available_resources() is not None
    assert sweep.returncode == 0, sweep.stderr[-4000:]
    assert not list(storage.glob(".cifar-ray-storage-check-*"))  # the shared-storage probe cleans up
    node_ids = set(re.findall(r"node_([0-9a-f]{20,})", status))
    assert len(node_ids) == cluster.nodes, status
    name = re.search(r"^name: (\S+)", sweep_yaml, re.MULTILINE).group(1)
    return sweep, runlog.load_run(storage / name), node_ids


def test_sweep_runs_on_both_nodes_of_a_real_cluster(tmp_path):
    """The nodes have no cifar_ray_cpu resources (a cluster started without them): cap packing."""
    sweep_yaml = (
        "name: two-nodes\n"
        "base: {dataset: synthetic, train_subset: 512, test_subset: 128, "
        "width: 8, epochs: 1, batch_size: 64, workers: 1}\n"
        "grid:\n  seed: [0, 1]\n"
    )
    sweep, run, cluster_nodes = run_sweep(LocalCluster(nodes=2, cpus_per_node=1), tmp_path, sweep_yaml)

    results = json.loads(sweep.stdout.strip().splitlines()[-1])
    assert [r["status"] for r in results] == ["finished", "finished"], results
    assert all(r["epochs_done"] == 1 and r["train_samples"] == 512 and r["test_acc"] is not None for r in results)
    assert "packing:" not in sweep.stdout + sweep.stderr  # Tune's cap bounds isolated trials, not warm slots
    assert run.sweep["cluster"]["nodes"] == 2 and run.sweep["cluster"]["packing"] == "cap"
    used = []
    for trial in run.trials:
        system = trial.meta["system"]
        assert len(system["nodes"]) == system["world_size"] == 1 and system["hostnames"] == [socket.gethostname()]
        assert trial.meta["driver"]["node_id"] in cluster_nodes
        assert [row["epoch"] for row in trial.epochs] == [1]
        used += system["nodes"]
    # 1 CPU per node and both trials at once: the second trial's worker had to go to the other node
    assert set(used) == cluster_nodes, (used, cluster_nodes)


def test_sweep_through_ray_client_interrupted_and_resumed(tmp_path):
    """`--address ray://HOST:PORT`: Tune then runs in an actor on the cluster. Two 1-worker trials
    at once on a 2-CPU node only run if every trial keeps its zero-CPU driver there (through the
    client they had Tune's default 1 CPU each and starved their own workers); the epoch lines
    printed there must reach the client's terminal; Ctrl-C on the client leaves the trials
    unfinished, not failed, and --resume through the client finishes them."""
    (tmp_path / "sweep.yaml").write_text(
        "name: via-client\n"
        "base: {dataset: synthetic, train_subset: 1024, test_subset: 128, "
        "width: 8, epochs: 3, batch_size: 64, workers: 1}\n"
        "grid:\n  seed: [0, 1]\n"
    )
    storage = tmp_path / "shared"
    cluster = LocalCluster(nodes=1, cpus_per_node=2, resources={"cifar_ray_cpu": 2})
    command = [
        str(BIN / "cifar-ray"),
        "sweep",
        str(tmp_path / "sweep.yaml"),
        "--storage",
        str(storage),
        "--address",
        f"ray://127.0.0.1:{cluster.client_port}",
    ]
    try:
        cluster.start()
        first = subprocess.Popen(
            command, env=cluster.env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        seen = []
        for line in first.stdout:  # the relayed epoch lines arrive while the sweep runs
            seen.append(line)
            if " epoch 1/3 " in line:
                first.send_signal(signal.SIGINT)
                break
        seen += first.stdout.readlines()
        assert first.wait(timeout=60) == 130, "".join(seen)[-3000:]
        interrupted = {t.name: t.status for t in runlog.load_run(storage / "via-client").trials}
        resumed = subprocess.run(
            command + ["--resume", "--json"], env=cluster.env, cwd=tmp_path, capture_output=True, text=True, timeout=240
        )
    finally:
        left = cluster.stop()
    assert not left, f"processes of the test cluster still alive: {[(p.pid, p.name()) for p in left]}"
    output = "".join(seen)
    assert "--resume" in output and "failed" not in interrupted.values() and "running" in interrupted.values(), (
        interrupted,
        output[-3000:],
    )
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    run = runlog.load_run(storage / "via-client")
    assert [t.status for t in run.trials] == ["finished", "finished"]
    assert all([row["epoch"] for row in t.epochs] == [1, 2, 3] for t in run.trials)
    progress = re.findall(r"^(t00\d-seed=\d)\s+epoch 3/3 ", resumed.stderr, re.MULTILINE)  # --json: progress on stderr
    assert sorted(progress) == [t.name for t in run.trials], resumed.stderr[-3000:]
    started = sorted(t.meta["started_unix"] for t in run.trials)
    finished = sorted(t.meta["finished_unix"] for t in run.trials)
    assert started[1] < finished[0]  # side by side, as the 2 slots allow


@pytest.mark.skipif(not os.environ.get("CIFAR_RAY_LONG_TESTS"), reason="~75 s more; set CIFAR_RAY_LONG_TESTS=1")
def test_slot_packing_on_a_cluster_spans_a_ddp_trial_over_both_nodes(tmp_path):
    """Nodes started with --resources='{"cifar_ray_cpu": 1}': exact packing. Two 1-worker trials
    side by side, then 2-worker trials whose ranks sit on different nodes (DDP over gloo)."""
    sweep_yaml = (
        "name: slots\n"
        "base: {dataset: synthetic, train_subset: 512, test_subset: 128, width: 8, epochs: 1, batch_size: 64}\n"
        "grid:\n  workers: [1, 2]\n  seed: [0, 1]\n"
    )
    cluster = LocalCluster(nodes=2, cpus_per_node=1, resources={"cifar_ray_cpu": 1})
    sweep, run, cluster_nodes = run_sweep(cluster, tmp_path, sweep_yaml, "--max-concurrent", "4")
    assert run.sweep["cluster"]["packing"] == "slots" and "packing:" not in sweep.stdout + sweep.stderr
    assert [t.status for t in run.trials] == ["finished"] * 4
    by_workers = {w: [t.meta["system"]["nodes"] for t in run.trials if t.config["workers"] == w] for w in (1, 2)}
    assert {n for nodes in by_workers[1] for n in nodes} == cluster_nodes
    assert all(len(nodes) == 2 and set(nodes) == cluster_nodes for nodes in by_workers[2])
