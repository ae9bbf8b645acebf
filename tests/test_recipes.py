"""The cluster recipes of docs/cluster.md, checked without a cluster: the Slurm batch script parsed by bash and run
on localhost with Slurm's commands, `ray` and `cifar-ray` faked on PATH (every command it runs is recorded, then
parsed by the real `ray start` and `cifar-ray sweep` parsers), and the KubeRay RayJob manifest loaded and held to the
fields KubeRay documents for a RayJob. Neither was run on a real Slurm or Kubernetes cluster."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import yaml

from cifar_ray.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
SLURM = ROOT / "docs" / "recipes" / "slurm.sbatch"
RAYJOB = ROOT / "docs" / "recipes" / "rayjob.yaml"

# Each fake appends one JSON line to $RECORD: its name, its arguments and the token-auth environment it saw. One
# os.write on a file opened O_APPEND per line: fakes run at once (the `ray start`s in the background) and print()'s
# lines from several processes could interleave.
RECORD = (
    "#!/bin/bash\n{python} -c 'import json, os, sys; line = json.dumps([sys.argv[1], sys.argv[2:], "
    '{{k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}}]) + "\\n"; '
    'fd = os.open(os.environ["RECORD"], os.O_WRONLY | os.O_APPEND | os.O_CREAT); os.write(fd, line.encode())\' '
    '{name} "$@"\n'
)
FAKES = {
    # two nodes in the allocation
    "scontrol": 'printf "node-a\\nnode-b\\n"\n',
    # runs the command it is given here, as on the node it names: the options before the command are srun's
    "srun": 'while [[ $# -gt 0 && $1 == -* ]]; do [[ $1 == -w ]] && shift; shift; done\nexec "$@"\n',
    "hostname": 'echo "127.0.0.1 ::1"\n',
    # `ray status` fails until a node started, then lists one node per `ray start` recorded so far (both run in the
    # background, so the sweep may run before a worker's start only if the script does not wait for it);
    # `ray start --block` blocks until the script's end kills it
    "ray": '[[ $1 == status ]] && { n=$(grep -c \'^\\["ray", \\["start"\' "$RECORD"); [[ $n -gt 0 ]] || exit 1; '
    'echo Active:; for ((i = 0; i < n; i++)); do echo " 1 node_$i"; done; }\n'
    "[[ $1 == start ]] && exec sleep 60\nexit 0\n",
    "cifar-ray": "exit 0\n",
}
# Not recorded: the script's polls (`sleep 5`) wait 0.1 s here; other sleeps are real.
FAST_POLLS = f'#!/bin/bash\n[[ $* == 5 ]] && set -- 0.1\nexec {shlex.quote(shutil.which("sleep"))} "$@"\n'


def slurm_job(
    tmp_path: Path, fakes: dict[str, str], storage: str = "/shared/runs", *options: str
) -> tuple[list[str], dict[str, str], Path]:
    """The command line and environment that run the Slurm script here on a 2-node allocation with `fakes` on PATH,
    on sweeps/quickstart.yaml with `storage` and `options` after --max-concurrent 2; and the record's path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in fakes.items():
        (bin_dir / name).write_text(RECORD.format(python=shlex.quote(sys.executable), name=name) + body)
        (bin_dir / name).chmod(0o755)
    (bin_dir / "sleep").write_text(FAST_POLLS)
    (bin_dir / "sleep").chmod(0o755)
    record = tmp_path / "record.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SLURM_"))}
    env |= {
        "PATH": f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "RECORD": str(record),
        "SLURM_JOB_NODELIST": "node-[a-b]",
        "SLURM_CPUS_PER_TASK": "4",
    }
    return ["bash", str(SLURM), "sweeps/quickstart.yaml", storage, "--max-concurrent", "2", *options], env, record


def run_slurm_script(
    tmp_path: Path, fakes: dict[str, str], storage: str = "/shared/runs", *options: str
) -> tuple[subprocess.CompletedProcess, Path]:
    """The Slurm script run to its end (slurm_job); returns its result and the record."""
    command, env, record = slurm_job(tmp_path, fakes, storage, *options)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60), record


def records(record: Path) -> list[list]:
    return [json.loads(line) for line in record.read_text().splitlines()]


def test_the_slurm_script_parses():
    result = subprocess.run(["bash", "-n", str(SLURM)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_slurm_script_runs_a_head_a_worker_and_the_sweep_on_localhost(tmp_path):
    """The head starts on the first node, a worker on the other pointed at the head's address, the sweep on the head
    with --address, the file, the storage and the extra options given; every command with RAY_AUTH_MODE=token and
    one token. Each `ray start` parses with Ray's own options, the sweep with cifar-ray's."""
    from ray.scripts.scripts import start

    result, record = run_slurm_script(tmp_path, FAKES)
    assert result.returncode == 0, result.stderr
    calls = records(record)
    ran = [(name, args) for name, args, _ in calls if name in ("ray", "cifar-ray")]
    starts = [args for name, args in ran if name == "ray" and args[0] == "start"]
    # both starts run in the background, so their records may come in either order
    heads = [args for args in starts if "--head" in args]
    workers = [args for args in starts if "--head" not in args]
    assert len(heads) == 1 and len(workers) == 1 and "--address=127.0.0.1:6379" in workers[0], ran
    for args in starts:
        assert "--block" in args and "--num-cpus=4" in args and "--num-gpus=0" in args
        start.make_context("start", list(args[1:]))  # raises on an option `ray start` does not take
    sweeps = [args for name, args in ran if name == "cifar-ray"]
    assert sweeps == [
        ["sweep", "sweeps/quickstart.yaml", "--address", "127.0.0.1:6379", "--storage", "/shared/runs"]
        + ["--max-concurrent", "2"]
    ]
    parsed = build_parser().parse_args(sweeps[0])
    assert (parsed.address, parsed.storage, parsed.max_concurrent) == ("127.0.0.1:6379", "/shared/runs", 2)
    auth = {(env["RAY_AUTH_MODE"], env["RAY_AUTH_TOKEN"]) for name, _, env in calls if name in ("ray", "cifar-ray")}
    assert len(auth) == 1 and next(iter(auth))[0] == "token" and len(next(iter(auth))[1]) == 64, auth
    # the sweep starts once the head answers and every node has joined (the `ray start`s run in the background)
    waits = [f"{name} {args[0]}" for name, args in ran if args[0] != "start"]
    assert waits[-1] == "cifar-ray sweep" and set(waits[:-1]) == {"ray status"} and ran[-1][0] == "cifar-ray", ran


def test_the_rayjob_manifest_has_the_fields_kuberay_documents():
    """KubeRay's RayJob (ray.io/v1): spec.entrypoint, spec.rayClusterSpec with headGroupSpec (rayStartParams,
    template) and workerGroupSpecs (groupName, replicas, minReplicas <= replicas <= maxReplicas, rayStartParams,
    template), each template a pod spec with containers; rayStartParams values are strings. The entrypoint is a
    cifar-ray sweep of a sweep file of this checkout (at the head container's workingDir in the image), which parses
    with cifar-ray's own options."""
    manifest = yaml.safe_load(RAYJOB.read_text())
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == "RayJob"
    assert manifest["metadata"]["name"]
    spec = manifest["spec"]
    known = {"entrypoint", "rayClusterSpec", "shutdownAfterJobFinishes", "ttlSecondsAfterFinished", "runtimeEnvYAML"}
    assert set(spec) <= known | {"submissionMode", "activeDeadlineSeconds", "suspend"}, set(spec) - known
    entrypoint = shlex.split(spec["entrypoint"])
    cluster = spec["rayClusterSpec"]
    checkout = cluster["headGroupSpec"]["template"]["spec"]["containers"][0][
        "workingDir"
    ]  # this checkout, in the image
    assert entrypoint[:2] == ["cifar-ray", "sweep"] and entrypoint[2].startswith(checkout + "/")
    assert (ROOT / Path(entrypoint[2]).relative_to(checkout)).is_file()
    assert build_parser().parse_args(entrypoint[1:]).storage
    assert cluster["rayVersion"] == "2.60.0"
    assert cluster.get("authOptions", {"mode": "token"})["mode"] in ("token", "disabled")
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for group in cluster["workerGroupSpecs"]:
        assert group["groupName"] and group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    for group in groups:
        assert all(isinstance(value, str) for value in group["rayStartParams"].values()), group["rayStartParams"]
        containers = group["template"]["spec"]["containers"]
        assert containers and all(c["name"] and c["image"] for c in containers)


def test_the_slurm_script_stops_when_the_head_does_not_start(tmp_path):
    """A head whose `ray start` fails ends the job with one line saying so, instead of waiting for it until the
    job's time limit; no sweep is started."""
    failing = FAKES | {"ray": "exit 1\n"}
    result, record = run_slurm_script(tmp_path, failing)
    assert result.returncode == 1 and "the Ray head on node-a did not start" in result.stderr, result.stderr
    assert "cifar-ray" not in record.read_text()


# `cifar-ray sweep` as the Slurm script runs it, faked: a trial that logs an epoch and runs until SIGTERM, which it
# takes as the real command does (the trial marked interrupted, the resume command printed, exit 143), taking a
# while over it; with --resume, the trial finishes.
SWEEP_UNTIL_TERM = """
import json, signal, sys, time
from pathlib import Path

args = sys.argv[1:]
trial = Path(args[args.index("--storage") + 1]) / "fake" / "t000"
trial.mkdir(parents=True, exist_ok=True)


def status(value):
    (trial / "trial.json").write_text(json.dumps({"status": value}))


def stop(signum, frame):
    time.sleep(1)  # a stop takes a while: the batch script must wait for it
    status("interrupted")
    print("interrupted: 1 trial(s) unfinished; continue with:", "cifar-ray", *args, "--resume", flush=True)
    sys.exit(143)


if "--resume" in args:
    status("finished")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
status("running")
(trial / "metrics.jsonl").write_text(json.dumps({"epoch": 1}) + "\\n")
while True:
    signal.pause()
"""


def processes_of(record: Path) -> list[str]:
    """The live processes of a job: those with its $RECORD in their environment (every fake, their children)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("RECORD") == str(record) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(" ".join(proc.cmdline()))
        except psutil.Error:
            pass
    return found


def test_the_slurm_script_stops_the_sweep_at_the_time_limit_and_the_next_job_resumes_it(tmp_path):
    """#SBATCH --signal=B:TERM@120: SIGTERM to the batch script (Slurm's B: signals the batch shell alone) while the
    sweep runs reaches the sweep, whose own stop the script waits for (its trial marked interrupted, its resume
    command printed) before it stops the Ray nodes it started; the job ends with the sweep's 143 and leaves nothing
    running. The next job, submitted with --resume, passes it to the sweep, which finishes."""
    assert "#SBATCH --signal=B:TERM@120" in SLURM.read_text().splitlines()
    (tmp_path / "sweep.py").write_text(SWEEP_UNTIL_TERM)
    fakes = FAKES | {"cifar-ray": f'exec {shlex.quote(sys.executable)} {tmp_path / "sweep.py"} "$@"\n'}
    storage, trial = tmp_path / "runs", tmp_path / "runs" / "fake" / "t000"
    command, env, record = slurm_job(tmp_path, fakes, str(storage))
    job = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60  # bounds a hang only
        while not (trial / "metrics.jsonl").exists():
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()
            time.sleep(0.05)
        job.send_signal(signal.SIGTERM)
        out, err = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == 143, (out, err)
    assert json.loads((trial / "trial.json").read_text())["status"] == "interrupted"
    assert "interrupted: 1 trial(s) unfinished; continue with:" in out and "--resume" in out, out
    assert "submit the job again with --resume" in err, err
    assert processes_of(record) == []  # the sweep and both `ray start`s ended before the script did

    result, _ = run_slurm_script(tmp_path, fakes, str(storage), "--resume")
    assert result.returncode == 0, result.stderr
    sweeps = [args for name, args, _ in records(record) if name == "cifar-ray"]
    assert len(sweeps) == 2 and sweeps[1] == [*sweeps[0], "--resume"], sweeps
    assert json.loads((trial / "trial.json").read_text())["status"] == "finished"
    assert processes_of(record) == []
