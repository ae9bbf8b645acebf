"""A real sweep on storage that fails: a share of every read and write of the run's files fails for a while
(tests/faults.py), one checkpoint write fails for good, a Ray Train worker is killed, then the driver is killed
and the sweep resumed. Every epoch is logged exactly once, every trial ends in the status its history calls for,
and nothing is written outside the run folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from faults import FAILURE_LOG, FaultyFiles, failures
from helpers import PROGRESS_S, wait_for

from cifar_ray.core import runlog, storage
from cifar_ray.core.checkpoints import CHECKPOINT_FILE, CHECKPOINTS, epoch_folder

TESTS = Path(__file__).parent
EPOCHS = 4
SWEEP = (
    "name: faulty\n"
    f"base: {{dataset: synthetic, train_subset: 2048, test_subset: 128, width: 4, depth: 2, epochs: {EPOCHS},\n"
    "       batch_size: 64, workers: 1, norm: none, max_failures: 1}\n"
    "grid:\n  seed: [0, 1, 2]\n"
)
LOST = "t002-seed=2"  # its epoch-2 checkpoint can never be written: it must end failed, naming the file
# The sweep's driver: run_plan on the faulty storage (the CLI takes a folder or a URI; a fault-injecting
# filesystem is a Python object). A second run with "resume" continues the run folder.
DRIVER = """
import sys
sys.path.insert(0, {tests!r})
from faults import FaultyFiles, faulty_storage
from cifar_ray.cluster.orchestrate import run_plan
from cifar_ray.core.run import RunOptions
from cifar_ray.cluster.session import init_ray
from cifar_ray.core.sweep import load_sweep

init_ray(num_cpus=2, num_gpus=0)
handler = FaultyFiles({faults!r}, seed={seed}, share={share}, permanent=0.0, burst=2)
run_plan(load_sweep({sweep!r}), RunOptions(faulty_storage({runs!r}, handler), resume={resume}))
"""


def driver(tmp_path: Path, resume: bool, seed: int) -> subprocess.Popen:
    script = DRIVER.format(
        tests=str(TESTS),
        faults=str(tmp_path / "faults"),
        seed=seed,
        share=0.1,
        sweep=str(tmp_path / "faulty.yaml"),
        runs=str(tmp_path / "runs"),
        resume=resume,
    )
    log = open(tmp_path / f"driver-{'resume' if resume else 'first'}.log", "w")  # the child keeps it; closed with it
    return subprocess.Popen(
        [sys.executable, "-c", script], stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path
    )


def raw_epochs(trial_dir: Path) -> list[int]:
    """The epochs metrics.jsonl holds, line by line (runlog.read_epochs would hide a repeated one)."""
    path = trial_dir / runlog.EPOCHS_FILE
    return [json.loads(line)["epoch"] for line in path.read_text().splitlines()] if path.exists() else []


def descendants(proc: subprocess.Popen) -> list[psutil.Process]:
    """The processes the driver started, and theirs: the local Ray (its workers have a session of their own)."""
    try:
        return psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def kill_group(proc: subprocess.Popen) -> None:
    """The driver and the local Ray it started, with no cleanup (SIGKILL)."""
    started = descendants(proc)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for child in started:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait()
    psutil.wait_procs(started, timeout=10)


@pytest.mark.slow
def test_a_sweep_on_failing_storage_with_a_worker_and_a_driver_killed_loses_nothing(tmp_path):
    (tmp_path / "faulty.yaml").write_text(SWEEP)
    run_dir = tmp_path / "runs" / "faulty"
    FaultyFiles(tmp_path / "faults").fail_for_good(
        "write", str(run_dir / LOST / CHECKPOINTS / epoch_folder(2) / CHECKPOINT_FILE)
    )
    before = sorted(p.name for p in tmp_path.iterdir())

    first = driver(tmp_path, resume=False, seed=1)
    killed_worker = []
    try:
        # A worker killed mid-trial: its trial continues from its last checkpoint (max_failures=1).
        wait_for(lambda: any(len(raw_epochs(d)) >= 1 for d in run_dir.glob("t00*")), 300, "a first epoch", first)
        time.sleep(0.3)
        workers = [p for p in descendants(first) if "RayTrainWorker" in " ".join(p.cmdline())]  # ours only
        assert workers, "no Ray Train worker to kill"
        workers[0].kill()
        killed_worker.append(workers[0].pid)

        # The driver killed once a trial has finished and another is part-way, its checkpoints on disk.
        def mid_sweep() -> bool:
            states = {d.name: runlog.read_json(d / runlog.TRIAL_FILE).get("status") for d in run_dir.glob("t00*")}
            part_way = [
                d for d in run_dir.glob("t00*") if 1 <= len(raw_epochs(d)) < EPOCHS and states[d.name] == "running"
            ]
            return "finished" in states.values() and bool(part_way)

        wait_for(mid_sweep, 400, "a finished trial and one part-way", first)
    finally:
        kill_group(first)
    cut_off = {d.name: raw_epochs(d) for d in run_dir.glob("t00*")}

    second = driver(tmp_path, resume=True, seed=2)
    try:
        assert second.wait(timeout=PROGRESS_S) == 0, (tmp_path / "driver-resume.log").read_text()[-4000:]
    finally:
        kill_group(second)

    run = runlog.load_run(run_dir)
    statuses = {t.name: t.status for t in run.trials}
    assert statuses == {"t000-seed=0": "finished", "t001-seed=1": "finished", LOST: "failed"}, (statuses, cut_off)
    lost = next(t for t in run.trials if t.name == LOST)
    assert "cannot write" in lost.meta["error"] and f"{epoch_folder(2)}/{CHECKPOINT_FILE}" in lost.meta["error"]
    for trial in run.trials:  # every epoch logged exactly once, in order, on disk
        expected = list(range(1, EPOCHS + 1)) if trial.name != LOST else [1, 2]
        assert raw_epochs(run_dir / trial.name) == expected, (trial.name, cut_off)
    assert len(run.sweep["sessions"]) == 2 and run.sweep.get("finished_at")

    injected = failures(tmp_path / "faults")
    reads = [f for f in injected if f[0] == "read" and f[1] == "transient"]
    writes = [f for f in injected if f[0] == "write" and f[1] == "transient"]
    permanent = [f for f in injected if f[1] == "permanent"]
    processes = {line.split(" ", 3)[2] for line in (tmp_path / "faults" / FAILURE_LOG).read_text().splitlines()}
    print(
        f"injected: {len(reads)} transient read and {len(writes)} transient write failures, {len(permanent)} "
        f"permanent, in {len(processes)} processes; a worker killed ({killed_worker}); trials cut off by the driver "
        f"kill: {cut_off}"
    )
    assert reads and writes and permanent and len(processes) >= 2
    # Nothing outside the run folder: the storage holds the run alone, the test folder what the test made.
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["faulty"]
    made = {"runs", "faults", "driver-first.log", "driver-resume.log"}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(set(before) | made)
    assert storage.TRIES > 2  # burst=2: every transient failure is absorbed by the retries
