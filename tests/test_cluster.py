"""A real 2-node Ray cluster on this machine: two `ray start` (1 CPU each, own temp dir, own
token), driven by `cifar-ray sweep --address` in a subprocess. The pytest process never
connects to it (other tests' embedded Ray may be running alongside), and it is stopped by
killing exactly the processes it started, never with `ray stop` (which stops every Ray here)."""

from __future__ import annotations

import contextlib
import importlib.util
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
from helpers import PROGRESS_S

from cifar_ray.core import runlog

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
MARKER = "CIFAR_RAY_TEST_CLUSTER"  # in the environment of every process of our cluster, inherited


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


class LocalCluster:
    """`ray start --head` plus `ray start --address`, each with --num-cpus 1, on 127.0.0.1."""

    def __init__(self, nodes: int = 2, cpus_per_node: int = 1, resources: dict | None = None, dashboard: bool = False):
        self.nodes, self.cpus, self.resources = nodes, cpus_per_node, resources
        # the head's dashboard, for `ray job submit` (it needs ray[default]); None: started without one
        self.dashboard_url = f"http://127.0.0.1:{free_port()}" if dashboard else None
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
        # Token authentication as docs/cluster.md sets it up: RAY_AUTH_MODE=token and one RAY_AUTH_TOKEN for every
        # node and client (Ray 2.60 turns it on for `ray start --head` by itself when ~/.ray/auth_token exists, but
        # not for the other nodes and clients). This cluster (and only its clients) gets a token of its own.
        self.env = env | {
            MARKER: self.temp_dir,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": secrets.token_hex(32),
            "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        }

    def ray(self, *args: str, cwd: Path | None = None, timeout: float = 90) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(BIN / "ray"), *args], env=self.env, capture_output=True, text=True, timeout=timeout, cwd=cwd
        )

    def start(self) -> None:
        common = [
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={self.cpus}",
            "--num-gpus=0",
            "--disable-usage-stats",
            *([f"--resources={json.dumps(self.resources)}"] if self.resources else []),
        ]
        if self.dashboard_url:
            dashboard = ["--dashboard-host=127.0.0.1", f"--dashboard-port={self.dashboard_url.rsplit(':', 1)[1]}"]
        else:
            dashboard = ["--include-dashboard=false"]
        head = self.ray(
            "start",
            "--head",
            f"--port={self.port}",
            *dashboard,
            f"--dashboard-agent-listen-port={free_port()}",
            f"--ray-client-server-port={self.client_port}",
            f"--temp-dir={self.temp_dir}",
            *common,
        )
        assert head.returncode == 0, head.stderr[-3000:]
        self.started_by_node = [self.processes()]  # what each node's `ray start` left running, in node order
        for i in range(1, self.nodes):
            # a temp dir of its own, as on another machine: nodes sharing one also shared the runtime envs' files,
            # and one node's cleanup deleted a Ray job's working_dir under the driver on the other (its next import
            # failed: "Intel oneMKL FATAL ERROR: Cannot load .../libtorch_cpu.so", or FileNotFoundError)
            node = self.ray(
                "start",
                f"--address={self.address}",
                f"--dashboard-agent-listen-port={free_port()}",
                f"--temp-dir={self.temp_dir}{os.sep}n{i}",
                *common,
            )
            assert node.returncode == 0, node.stderr[-3000:]
            seen = {p.pid for started in self.started_by_node for p in started}
            self.started_by_node.append([p for p in self.processes() if p.pid not in seen])
        deadline = time.monotonic() + 45
        while self.alive_nodes() < self.nodes:
            assert time.monotonic() < deadline, f"the cluster has {self.alive_nodes()} of {self.nodes} nodes after 45 s"
            time.sleep(0.5)
        # the head's Ray Client server starts in a process of its own, after `ray start` returns (with the dashboard,
        # on a loaded machine, it refused connections for a while)
        while not listening(self.client_port):
            assert time.monotonic() < deadline + 60, f"no Ray Client server on port {self.client_port} after 105 s"
            time.sleep(0.5)

    def alive_nodes(self) -> int:
        status = self.ray("status", f"--address={self.address}")
        active = status.stdout.split("Active:", 1)[-1].split("Pending:", 1)[0] if "Active:" in status.stdout else ""
        return len(re.findall(r"^\s*\d+ node_[0-9a-f]+", active, re.MULTILINE))

    def processes(self) -> list[psutil.Process]:
        """Every live process of this cluster: its marker is in their environment (workers rename
        themselves, so command lines do not tell), its temp dir on their command line, or a file of it
        open (its logs): a raylet's agents renamed themselves over their environment (it reads empty), and
        they outlive their raylet."""
        found = []
        for proc in psutil.process_iter():
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                if (
                    proc.environ().get(MARKER) == self.temp_dir
                    or any(self.temp_dir in part for part in proc.cmdline())
                    or any(f.path.startswith(self.temp_dir + os.sep) for f in proc.open_files())
                ):
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass
        return found

    def raylets(self) -> dict[str, psutil.Process]:
        """Node id -> the node's raylet (its command line has --node_id=<hex>, and --head on the head)."""
        found = {}
        for proc in self.processes():
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                flags = dict(part.split("=", 1) for part in proc.cmdline() if part.startswith("--node_id="))
                if flags:
                    found[flags["--node_id"]] = proc
        return found

    def head_node_id(self) -> str:
        heads = [node for node, raylet in self.raylets().items() if "--head" in raylet.cmdline()]
        assert len(heads) == 1, heads
        return heads[0]

    def kill_node(self, node_id: str, spare: psutil.Process) -> list[str]:
        """SIGKILL one node as the loss of its machine would: its raylet, every process the raylet started, and
        what its `ray start` left (the log monitor). The other nodes' processes and `spare` (a driver), with
        their descendants, are kept. The raylet is frozen first so that it starts nothing while its tree is
        read; its agents outlive it (NOTES: Scale and faults): the sweep repeats until a round finds nothing.
        Returns what it killed: each process's title (a Ray worker's title names its actor or task)."""
        raylets = self.raylets()
        victim = raylets.pop(node_id)
        victim.suspend()
        kept = [spare, *raylets.values()]
        kept += [p for started in self.started_by_node if victim not in started for p in started]
        killed: dict[int, str] = {}
        for _ in range(10):
            found = self.processes()  # before the kept trees are read: a process they start meanwhile is theirs
            spared = set()
            for proc in kept:
                with contextlib.suppress(psutil.NoSuchProcess):
                    spared |= {proc.pid} | {child.pid for child in proc.children(recursive=True)}
            targets = [p for p in found if p.pid not in spared]
            if not targets and killed:
                break
            for proc in targets:
                with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    title = " ".join(os.path.basename(part) for part in proc.cmdline()[:3])[:60]
                    proc.kill()
                    killed[proc.pid] = title
            psutil.wait_procs(targets, timeout=5)
            time.sleep(0.5)
        assert victim.pid in killed and victim.pid not in {p.pid for p in self.processes()}, killed
        return sorted(killed.values())

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
            timeout=PROGRESS_S,  # bounds a hang only
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


def dashboard_installed() -> bool:
    """`ray job submit` needs the head's dashboard, which needs ray[default] (aiohttp and more)."""
    return importlib.util.find_spec("aiohttp") is not None


@pytest.fixture(scope="module")
def token_cluster():
    """Two 1-CPU nodes with token authentication, and a dashboard where ray[default] is installed: one cluster
    start for the tests below (started lazily by the first that asks), stopped and swept after the last."""
    cluster = LocalCluster(nodes=2, cpus_per_node=1, dashboard=dashboard_installed())
    try:
        cluster.start()
        yield cluster
    finally:
        left = cluster.stop()
    assert not left, f"processes of the test cluster still alive: {[(p.pid, p.name()) for p in left]}"


def test_a_sweep_through_ray_client_interrupted_and_resumed_on_both_nodes(tmp_path, token_cluster):
    """Two 1-CPU nodes without cifar_ray_cpu resources (a cluster started without them): cap packing. The first
    session goes through Ray Client (`--address ray://HOST:PORT`: Tune then runs in an actor on the cluster); the
    epoch lines printed there must reach the client's terminal, and Ctrl-C on the client leaves the trials
    interrupted, not failed. The resume connects as a driver (`--address HOST:PORT`) and finishes them. Two
    1-worker trials at once only run if every trial keeps its zero-CPU driver (through the client they had Tune's
    default 1 CPU each and starved their own workers), and with 1 CPU per node the second one's worker goes to the
    other node."""
    (tmp_path / "sweep.yaml").write_text(
        "name: via-client\n"
        "base: {dataset: synthetic, train_subset: 1024, test_subset: 128, "
        "width: 8, epochs: 3, batch_size: 64, workers: 1}\n"
        "grid:\n  seed: [0, 1]\n"
    )
    storage = tmp_path / "shared"  # one folder every node sees: here, the same disk
    cluster = token_cluster
    command = [str(BIN / "cifar-ray"), "sweep", str(tmp_path / "sweep.yaml"), "--storage", str(storage)]
    first = subprocess.Popen(
        [*command, "--address", f"ray://127.0.0.1:{cluster.client_port}"],
        env=cluster.env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
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
        [*command, "--address", cluster.address, "--resume", "--json"],
        env=cluster.env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=PROGRESS_S,  # bounds a hang only
    )
    status = cluster.ray("status", f"--address={cluster.address}").stdout
    output = "".join(seen)
    # the driver marks the trials it stopped interrupted at once (issue 24); none is left "running" or failed
    assert "--resume" in output and "interrupted" in interrupted.values(), (interrupted, output[-3000:])
    assert set(interrupted.values()) <= {"interrupted", "pending"}, (interrupted, output[-3000:])
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "packing:" not in output + resumed.stdout + resumed.stderr  # Tune's cap bounds no warm slot
    assert not list(storage.glob(".cifar-ray-storage-check-*"))  # the shared-storage probe cleans up
    cluster_nodes = set(re.findall(r"node_([0-9a-f]{20,})", status))
    assert len(cluster_nodes) == 2, status

    run = runlog.load_run(storage / "via-client")
    assert run.sweep["cluster"]["nodes"] == 2 and run.sweep["cluster"]["packing"] == "cap"
    assert [t.status for t in run.trials] == ["finished", "finished"]
    progress = re.findall(r"^(t00\d-seed=\d)\s+epoch 3/3 ", resumed.stderr, re.MULTILINE)  # --json: progress on stderr
    assert sorted(progress) == [t.name for t in run.trials], resumed.stderr[-3000:]
    used = []
    for trial in run.trials:
        assert [row["epoch"] for row in trial.epochs] == [1, 2, 3]
        system = trial.meta["system"]
        assert len(system["nodes"]) == system["world_size"] == 1 and system["hostnames"] == [socket.gethostname()]
        assert trial.meta["driver"]["node_id"] in cluster_nodes
        used += system["nodes"]
    started = sorted(t.meta["started_unix"] for t in run.trials)
    finished = sorted(t.meta["finished_unix"] for t in run.trials)
    assert started[1] < finished[0]  # side by side, as the 2 slots allow
    assert set(used) == cluster_nodes, (used, cluster_nodes)  # 1 CPU per node: a trial on each
    # the resumed session's lines, as each trial's epochs end, in order; its elapsed time is its own
    for trial in run.trials:
        epochs = re.findall(rf"^{re.escape(trial.name)}\s+epoch (\d)/3 ", resumed.stderr, re.MULTILINE)
        assert epochs == sorted(epochs) and epochs[-1] == "3", resumed.stderr[-3000:]
    totals = re.findall(r"^\[\d/2 done[^\]]*\] \d+ (?:s|min) elapsed this session", resumed.stderr, re.MULTILINE)
    assert len(totals) == 2, resumed.stderr[-3000:]


@pytest.mark.parametrize("client", [False, True], ids=["driver", "ray-client"])
def test_a_connection_refused_for_its_token_says_token_and_the_address_typed_once(tmp_path, token_cluster, client):
    """Without a token, and with a wrong one, `--address localhost:PORT` (as typed, never the address Ray resolves)
    is refused in one line naming the token and that address, exit 2: no Ray retry loop (InvalidAuthToken once a
    second for 20 s) and no traceback. The same through Ray Client (ray://)."""
    (tmp_path / "sweep.yaml").write_text(
        "name: no-token\nbase: {dataset: synthetic, train_subset: 256, test_subset: 64, width: 8, epochs: 1}\n"
        "grid:\n  seed: [0]\n"
    )
    port = token_cluster.client_port if client else token_cluster.port
    typed = f"{'ray://' if client else ''}localhost:{port}"
    without = {k: v for k, v in token_cluster.env.items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    # RAY_AUTH_TOKEN set (to a wrong token): Ray reads it before RAY_AUTH_TOKEN_PATH and ~/.ray/auth_token
    wrong = token_cluster.env | {"RAY_AUTH_TOKEN": secrets.token_hex(32)}
    for env, why in ((without, "none was sent"), (wrong, "refused this machine's token")):
        done = subprocess.run(
            [str(BIN / "cifar-ray"), "sweep", str(tmp_path / "sweep.yaml"), "--address", typed]
            + ["--storage", str(tmp_path / "runs")],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,  # bounds a hang only
        )
        printed = (done.stdout + done.stderr).strip().splitlines()
        assert done.returncode == 2, printed
        assert len(printed) == 1, printed
        assert printed[0].startswith(f"cifar-ray: error: cannot connect to the Ray cluster at {typed} "), printed
        assert "token" in printed[0] and why in printed[0], printed
        assert not (tmp_path / "runs").exists()


@pytest.mark.skipif(
    not dashboard_installed(), reason="`ray job submit` needs the dashboard: pip install 'ray[default]'"
)
def test_a_sweep_submitted_as_a_ray_job_with_token_auth(tmp_path, token_cluster):
    """docs/cluster.md's `ray job submit`, as written but for the addresses and files: this checkout shipped as the
    job's working directory, the sweep's driver on the head (the job inherits the head's token), its progress
    tailed back by `ray job submit`, both nodes used."""
    (tmp_path / "sweep.yaml").write_text(
        "name: as-job\n"
        "base: {dataset: synthetic, train_subset: 2048, test_subset: 64, width: 8, epochs: 2, batch_size: 64, "
        "workers: 1}\n"
        "grid:\n  seed: [0, 1]\n"
    )
    storage = tmp_path / "shared"
    runtime_env = {"working_dir": ".", "excludes": [".venv", "runs", "reports", ".git"]}
    deadline = time.monotonic() + 600  # bounds a hang only: the agent registers late on a busy machine
    while True:  # the head's dashboard agent registers a while after `ray start`: Ray says to try again
        submit = token_cluster.ray(
            "job",
            "submit",
            "--address",
            token_cluster.dashboard_url,
            "--runtime-env-json",
            json.dumps(runtime_env),
            "--",
            "python",
            "-m",
            "cifar_ray.cli",
            "sweep",
            str(tmp_path / "sweep.yaml"),
            "--storage",
            str(storage),
            cwd=Path(__file__).resolve().parent.parent,
            timeout=PROGRESS_S,  # the job runs the whole sweep: bounds a hang only
        )
        if "No available agent to submit job" not in submit.stderr or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert submit.returncode == 0, (submit.stdout + submit.stderr)[-4000:]
    assert "succeeded" in submit.stdout + submit.stderr
    run = runlog.load_run(storage / "as-job")
    assert [t.status for t in run.trials] == ["finished", "finished"]
    assert all([row["epoch"] for row in t.epochs] == [1, 2] for t in run.trials)
    # 1 CPU per node: a slot each, started side by side; a trial of seconds (not one of under a second, which a warm
    # slot finished and followed with the second before the other node's slot asked) leaves each one trial
    assert len({node for t in run.trials for node in t.meta["system"]["nodes"]}) == 2
    for trial in run.trials:  # the job's log, tailed back: each trial's epochs in order
        assert re.findall(rf"{re.escape(trial.name)}\s+epoch (\d)/2 ", submit.stdout) == ["1", "2"], submit.stdout[
            -3000:
        ]


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


def trial_progress(run_dir: Path) -> dict[str, tuple[dict, list[dict]]]:
    """Trial name -> (its trial.json, its metrics.jsonl rows as written, repeats and all), while a sweep runs."""
    found = {}
    for trial_dir in sorted(run_dir.glob("*/")):
        meta = runlog.read_json(trial_dir / runlog.TRIAL_FILE)
        epochs_file = trial_dir / runlog.EPOCHS_FILE
        rows = [json.loads(line) for line in epochs_file.read_text().splitlines()] if epochs_file.exists() else []
        if meta:
            found[trial_dir.name] = (meta, rows)
    return found


@pytest.mark.skipif(not os.environ.get("CIFAR_RAY_LONG_TESTS"), reason="~170 s; set CIFAR_RAY_LONG_TESTS=1")
def test_a_sweep_that_loses_a_node_finishes_every_trial_with_every_epoch_once(tmp_path):
    """Two nodes of 1 CPU with slot resources: a warm slot on each. Once a trial on the second node has
    logged 2 epochs (so its epoch-1 checkpoint is stored), that node is SIGKILLed whole. The sweep must end
    by itself: the lost trial continues from its checkpoint on the head node, and every trial finishes
    with each of its epochs logged once."""
    epochs = 4
    (tmp_path / "sweep.yaml").write_text(
        "name: node-lost\n"
        f"base: {{dataset: synthetic, train_subset: 2048, test_subset: 128, width: 8, epochs: {epochs}, "
        "batch_size: 64, workers: 1}\n"
        "grid:\n  seed: [0, 1, 2, 3]\n"
    )
    storage = tmp_path / "shared"
    run_dir = storage / "node-lost"
    cluster = LocalCluster(nodes=2, cpus_per_node=1, resources={"cifar_ray_cpu": 1})
    out, err = tmp_path / "sweep.out", tmp_path / "sweep.err"
    sweep = None
    try:
        cluster.start()
        head = cluster.head_node_id()
        other = next(node for node in cluster.raylets() if node != head)
        with out.open("w") as stdout, err.open("w") as stderr:  # the sweep holds its own copies
            sweep = subprocess.Popen(
                [str(BIN / "cifar-ray"), "sweep", str(tmp_path / "sweep.yaml"), "--address", cluster.address]
                + ["--storage", str(storage), "--json"],
                env=cluster.env,
                cwd=tmp_path,
                stdout=stdout,
                stderr=stderr,
            )
        started = time.monotonic()
        lost = None
        while lost is None:
            assert sweep.poll() is None, f"the sweep ended before a trial ran on {other}: {err_tail(err)}"
            assert time.monotonic() < started + 180, f"no trial on {other} logged 2 epochs in 180 s: {err_tail(err)}"
            time.sleep(0.2)
            for name, (meta, rows) in trial_progress(run_dir).items():
                on_other = meta.get("status") == "running" and (meta.get("system") or {}).get("nodes") == [other]
                if on_other and 2 <= len(rows) < epochs:
                    lost = name
        killed = cluster.kill_node(other, spare=psutil.Process(sweep.pid))
        killed_at = time.monotonic()
        print("killed:", *killed, sep="\n  ")
        assert {"raylet", "ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= {title.split()[0] for title in killed}
        # only workers live off the driver's node: the Dispatcher, the slots' controllers and thin trials
        # are pinned to it (any of them lost with the node once failed or hung the sweep)
        pinned = ("Dispatcher", "TrainController", "thin_trial", "ImplicitFunc")
        assert not [title for title in killed if any(name in title for name in pinned)], killed
        before = trial_progress(run_dir)[lost][1]
        assert len(before) < epochs, f"{lost} ended before its node was lost: {before}"
        try:
            returncode = sweep.wait(timeout=PROGRESS_S)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"the sweep did not end in {PROGRESS_S} s after {lost}'s node was lost: {report(run_dir, killed, err)}"
            )
        ended = time.monotonic() - killed_at
        print(f"node lost {killed_at - started:.1f} s into the sweep, which ended {ended:.1f} s later")
        nodes_left = cluster.alive_nodes()
    finally:
        if sweep is not None and sweep.poll() is None:
            sweep.kill()
            sweep.wait()
        left = cluster.stop()
    assert not left, f"processes of the test cluster still alive: {[(p.pid, p.name()) for p in left]}"
    assert returncode == 0, report(run_dir, killed, err)
    assert nodes_left == 1
    results = json.loads(out.read_text().strip().splitlines()[-1])
    assert [(r["status"], r["epochs_done"]) for r in results] == [("finished", epochs)] * 4, results
    run = runlog.load_run(run_dir)
    progress = trial_progress(run_dir)
    for trial in run.trials:
        assert trial.status == "finished"
        assert [row["epoch"] for row in progress[trial.name][1]] == list(range(1, epochs + 1)), trial.name
    # continued, not redone: the epochs up to its stored checkpoint are the ones logged before the loss
    assert run.trials[[t.name for t in run.trials].index(lost)].meta["system"]["nodes"] == [head]
    assert progress[lost][1][: len(before) - 1] == before[:-1]


def report(run_dir: Path, killed: list[str], err: Path) -> str:
    """What a failure message shows: each trial's status, nodes and epochs, what the node's loss killed,
    and the end of the sweep's stderr."""
    states = {
        name: (meta.get("status"), (meta.get("system") or {}).get("nodes"), [row["epoch"] for row in rows])
        for name, (meta, rows) in trial_progress(run_dir).items()
    }
    return f"{states}\nkilled: {killed}\n{err_tail(err)}"


def err_tail(err: Path) -> str:
    return err.read_text()[-4000:]
