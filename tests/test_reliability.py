"""Things really die here: the sweep driver (a worker killed: test_slots.py, test_fault_injection.py); a run really
diverges. The live view and each session's provenance across a killed driver and --resume."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from helpers import (
    PROGRESS_S,
    assert_tensorboard_holds_every_epoch,
    logged_and_checkpointed,
    stored_checkpoint,
    wait_for,
)

from cifar_ray.cli import main
from cifar_ray.cluster.live_view import logged_epochs
from cifar_ray.core import provenance, runlog

pytestmark = pytest.mark.slow
ON_RAY = pytest.mark.usefixtures("ray_cluster")  # the tests that run a sweep in this process too


def _sweep_file(tmp_path: Path) -> Path:
    path = tmp_path / "kill.yaml"
    path.write_text(
        "name: kill\n"
        "description: driver kill and resume\n"
        # Epochs of seconds: the kill needs a finished trial beside a running one past its first checkpoint, and
        # with shorter ones the running trial could finish between two looks at the run folder.
        "base: {dataset: synthetic, train_subset: 8192, test_subset: 256, width: 8, epochs: 3, batch_size: 64,\n"
        "       workers: 1, norm: none}\n"
        "grid:\n  lr: [0.05, 1.0e+12, 0.02]\n"  # the middle one diverges
    )
    return path


@ON_RAY
def test_killed_driver_resumes_without_rerunning_finished_trials_and_tensorboard_holds_every_epoch(tmp_path, capsys):
    sweep, storage = _sweep_file(tmp_path), tmp_path / "runs"
    run_dir = storage / "kill"
    driver = subprocess.Popen(
        [sys.executable, "-m", "cifar_ray.cli", "sweep", str(sweep), "--storage", str(storage)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:

        def progress() -> tuple[list[str], list[str]]:
            """(trials done, unfinished trials with a checkpoint on disk)"""
            trials = runlog.load_run(run_dir).trials if run_dir.exists() else []
            done = [t.name for t in trials if t.status in ("finished", "diverged")]
            checkpointed = [t.name for t in trials if t.name not in done and stored_checkpoint(run_dir / t.name)]
            return done, checkpointed

        # Live: an epoch in metrics.jsonl reaches the run folder's event files while the driver runs (Tune's own
        # logger copies them there every 10 s or more; the live writer's interval: test_live_view.py). Its lag is
        # printed, not bounded: the deadline only ends a hang.
        first = run_dir / "t000-lr=0.05"
        wait_for(lambda: len(runlog.read_epochs(first)) >= 1, PROGRESS_S, "epoch 1 of the first trial", driver)
        logged = time.monotonic()
        wait_for(lambda: 1 in logged_epochs(first), 60, "epoch 1 in the run folder's TensorBoard files", driver)
        with capsys.disabled():  # printed past the test's capture of the commands' output
            print(f"live view: epoch 1 in the TensorBoard files {time.monotonic() - logged:.1f} s after metrics.jsonl")
        # Kill once a trial is done and another is cut off after its first checkpoint.
        wait_for(lambda: all(progress()), PROGRESS_S, "a finished trial and a checkpointed running one", driver)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver and the local Ray it started, no cleanup
        driver.wait()
    done_before, cut_off = progress()
    snapshots = {name: (run_dir / name / runlog.EPOCHS_FILE).read_text() for name in done_before}
    assert len(done_before) < 3
    # Trials cut off mid-run: their checkpointed epochs must be kept, not trained again.
    partial = {t.name: t.epochs[0] for t in runlog.load_run(run_dir).trials if t.name in cut_off}

    assert main(["sweep", str(sweep), "--storage", str(storage)]) == 2  # refuses to clobber the old run
    assert "pass --resume to finish it" in capsys.readouterr().err

    code = main(["sweep", str(sweep), "--storage", str(storage), "--resume", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    results = {r["trial"]: r for r in json.loads(out.strip().splitlines()[-1])}
    assert len(results) == 3
    for name, text in snapshots.items():
        assert (run_dir / name / runlog.EPOCHS_FILE).read_text() == text, f"{name} was re-run"
    for name, first_epoch in partial.items():
        assert runlog.read_epochs(run_dir / name)[0] == first_epoch, (
            f"{name} restarted from scratch instead of its checkpoint"
        )
    statuses = {name: r["status"] for name, r in results.items()}
    diverged = [name for name, r in results.items() if r["lr"] > 1]
    assert statuses[diverged[0]] == "diverged", statuses
    assert runlog.read_json(run_dir / diverged[0] / runlog.TRIAL_FILE)["diverged_epoch"] == 1
    for name, result in results.items():
        epochs = [row["epoch"] for row in runlog.read_epochs(run_dir / name)]
        if name in diverged:
            assert epochs == [1] and result["train_loss"] is None
        else:
            assert result["status"] == "finished" and epochs == [1, 2, 3], (name, epochs)
    assert runlog.read_json(run_dir / runlog.SWEEP_FILE).get("finished_at")
    for name in results:  # the killed driver's epochs too, filled in from metrics.jsonl by the resumed session
        assert_tensorboard_holds_every_epoch(run_dir / name)

    run = runlog.load_run(run_dir)
    records = provenance.read_sessions(run_dir, run.sweep)
    assert [r["session"] for r in records] == [1, 2]  # one per session, the first kept
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(provenance.__file__).parent, capture_output=True)
    for record in records:
        assert record["git"]["commit"] == head.stdout.decode().strip()
        assert (run_dir / record["git"]["diff"]).exists()
        assert {"ray", "torch"} <= set(record["packages"])
        assert record["gpu"] == {"gpus": [], "why": "no CUDA GPU visible to the sweep's driver process"}


# Loaded by every Python process of the sweep below (driver, Dispatcher, Ray Train workers): each local write of a
# trial.json (runlog writes a temp file, then os.replace) appends the writer's command line to $TRIAL_WRITERS.
WRITER_LOG = """
import os

_replace = os.replace


def _logged_replace(src, dst, *args, **kwargs):
    if str(dst).endswith("trial.json") and os.environ.get("TRIAL_WRITERS"):
        with open(os.environ["TRIAL_WRITERS"], "a") as log, open("/proc/self/cmdline", "rb") as cmdline:
            log.write(cmdline.read().replace(b"\\0", b" ").decode() + "\\n")
    return _replace(src, dst, *args, **kwargs)


os.replace = _logged_replace
"""


def stop_in_its_second_trial(
    driver: subprocess.Popen, second: Path, stop
) -> tuple[list[tuple[float, str]], float, float]:
    """`stop(pid)` once the driver's second trial (folder `second`) logged an epoch and stored its checkpoint whole
    (helpers.logged_and_checkpointed); its output lines with when each came, when the stop was sent, and how long the
    driver took to end after it (printed by the tests, never bounded: the 120 s deadline ends a hang). Kills what is
    left after."""
    printed: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: printed.extend((time.monotonic(), line) for line in driver.stdout))
    reader.start()
    try:
        wait_for(
            lambda: logged_and_checkpointed(second),
            PROGRESS_S,
            "epoch 1 of the second trial and its checkpoint",
            driver,
        )
        stop(driver.pid)
        sent = time.monotonic()
        driver.wait(timeout=120)
        ended = time.monotonic() - sent
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)  # the local Ray the driver started
        driver.wait()
        reader.join()
    return printed, sent, ended


@ON_RAY
def test_ctrl_c_marks_running_trials_interrupted_and_only_the_driver_side_writes_trial_json(tmp_path, capsys):
    """A sweep gets Ctrl-C (SIGINT to its process group, as a terminal sends it) in the middle of its second trial's
    second epoch: the driver exits 130 with the resume command printed once (how long each took is printed, not
    asserted: 2.8 to 3.5 s and 6 to 15 s on a busy 2-core machine); that trial is `interrupted`, not running (status
    gives no ETA), the session's wall time is recorded, and --resume finishes it from its checkpoint, adding its own
    session. Every trial.json write of the first session came from the driver or the Dispatcher, never from a Ray
    Train worker."""
    (tmp_path / "guard").mkdir()
    (tmp_path / "guard" / "sitecustomize.py").write_text(WRITER_LOG)
    writers = tmp_path / "writers.log"
    sweep_file, storage = tmp_path / "int.yaml", tmp_path / "runs"
    sweep_file.write_text(
        "name: int\nbase: {dataset: synthetic, train_subset: 4096, test_subset: 256, width: 8, epochs: 3,\n"
        "       batch_size: 64, workers: 1, norm: none}\ngrid:\n  seed: [0, 1]\n"
    )
    run_dir, second = storage / "int", storage / "int" / "t001-seed=1"
    sweep = ["sweep", str(sweep_file), "--storage", str(storage), "--max-concurrent", "1"]
    path = os.pathsep.join([str(tmp_path / "guard"), str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])
    env = os.environ | {"PYTHONPATH": path, "TRIAL_WRITERS": str(writers)}
    driver = subprocess.Popen(
        [sys.executable, "-m", "cifar_ray.cli", *sweep],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=env | {"PYTHONUNBUFFERED": "1"},
        text=True,
    )
    printed, pressed, ended = stop_in_its_second_trial(driver, second, lambda pid: os.killpg(pid, signal.SIGINT))
    resume = f"cifar-ray sweep {sweep_file} --resume --storage {storage}"
    shown = [at - pressed for at, line in printed if line.strip() == resume]
    with capsys.disabled():  # printed past the test's capture of the commands' output
        print(f"Ctrl-C: the resume command after {shown} s, the driver's exit after {ended:.1f} s")
    output = "".join(line for _, line in printed)
    assert driver.returncode == 130 and len(shown) == 1, (driver.returncode, shown, output[-2000:])
    run = runlog.load_run(run_dir)
    assert [t.status for t in run.trials] == ["finished", "interrupted"]
    assert main(["status", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "interrupted" in out and "ETA ~" not in out, out
    sessions = run.sweep["sessions"]
    assert len(sessions) == 1 and sessions[0]["wall_s"] > 0 and run.sweep["wall_time_s"] == sessions[0]["wall_s"]

    lines = writers.read_text().splitlines()
    assert any("cifar_ray.cli" in line for line in lines) and any("Dispatcher" in line for line in lines), lines
    assert all("cifar_ray.cli" in line or "Dispatcher" in line for line in lines), lines  # never a worker

    first_epoch = run.trials[1].epochs[0]
    code = main([*sweep, "--resume", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    run = runlog.load_run(run_dir)
    assert [t.status for t in run.trials] == ["finished", "finished"]
    assert [row["epoch"] for row in run.trials[1].epochs] == [1, 2, 3] and run.trials[1].epochs[0] == first_epoch
    walls = [s["wall_s"] for s in run.sweep["sessions"]]
    assert len(walls) == 2 and run.sweep["wall_time_s"] == pytest.approx(sum(walls))


def test_sigterm_stops_a_sweep_like_ctrl_c_with_exit_143_and_no_ray_dump(tmp_path):
    """SIGTERM to the driver alone (kill, a scheduler's time limit, Slurm's and Kubernetes' stop) in its second
    trial: Ray's init had replaced the command's handler, so the driver died in Ray's `*** SIGTERM received ***`
    dump with no summary and no resume command. Now it stops as Ctrl-C does: the trial interrupted, the resume
    command printed once, exit 143, no dump (how long it took is printed, not asserted). The driver starts with
    SIGINT ignored, as a shell starts a background job: SIGTERM, handled as SIGINT, must still stop it."""
    sweep_file, storage = tmp_path / "term.yaml", tmp_path / "runs"
    sweep_file.write_text(
        "name: term\nbase: {dataset: synthetic, train_subset: 4096, test_subset: 256, width: 8, epochs: 3,\n"
        "       batch_size: 64, workers: 1, norm: none}\ngrid:\n  seed: [0, 1]\n"
    )
    second = storage / "term" / "t001-seed=1"
    sweep = ["sweep", str(sweep_file), "--storage", str(storage), "--max-concurrent", "1"]
    driver = subprocess.Popen(
        [sys.executable, "-m", "cifar_ray.cli", *sweep],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=os.environ | {"PYTHONUNBUFFERED": "1"},
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # a background job's
    )
    printed, sent, ended = stop_in_its_second_trial(driver, second, lambda pid: os.kill(pid, signal.SIGTERM))
    resume = f"cifar-ray sweep {sweep_file} --resume --storage {storage}"
    shown = [at - sent for at, line in printed if line.strip() == resume]
    output = "".join(line for _, line in printed)
    print(f"SIGTERM: the resume command after {shown} s, the driver's exit after {ended:.1f} s")
    assert driver.returncode == 143 and len(shown) == 1, (driver.returncode, shown, output[-2000:])
    assert "SIGTERM received" not in output
    assert [t.status for t in runlog.load_run(storage / "term").trials] == ["finished", "interrupted"]


# Runs a command (argv[2:], its output to the file argv[1]) as the child of a child subreaper (Linux's prctl): a process
# the command started stays a descendant of this one when its parent dies, so what the command leaves behind is found
# here whatever Ray renamed it to. Prints the command's pid, its exit status, then as JSON the descendants still
# running when none is left or LEFT_DEADLINE_S have passed, and kills those.
SUBREAPER = """
import ctypes, json, os, subprocess, sys, time
import psutil

assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
with open(sys.argv[1], "w") as out:
    command = subprocess.Popen(sys.argv[2:], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
print(command.pid, flush=True)
print(command.wait(), flush=True)


def running_descendants():
    while True:  # reap the orphans that ended
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                break
        except ChildProcessError:
            break
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            pass
    return found


deadline = time.monotonic() + float(os.environ["LEFT_DEADLINE_S"])
while (left := running_descendants()) and time.monotonic() < deadline:
    time.sleep(0.2)
names = []
for proc in left:
    try:
        names.append(" ".join(proc.cmdline()).strip()[:120] or proc.name())
        proc.kill()
    except psutil.Error:
        pass
print(json.dumps(names), flush=True)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="a child subreaper (prctl) finds what the command left")
@pytest.mark.parametrize(
    ("stop", "status", "moment"),
    [("ctrl-c", 130, "raylet"), ("sigterm", 143, "raylet"), ("sigterm", 143, "ray::IDLE")],
)
def test_a_stop_while_ray_starts_leaves_no_ray_process_behind(tmp_path, stop, status, moment):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) or SIGTERM to the driver once its embedded Ray's
    raylet (or its first idle worker) has started, before `ray.init` returned: the half-started node's processes were
    left running, the agents the raylet had started (`ray::DashboardAgent`, `ray::RuntimeEnvAgent`) for over 40 s;
    SIGTERM exited with Ray's status 15 and no message; at the first idle worker, while Ray builds the driver's core
    worker, the command printed its line and then died of SIGSEGV in the interpreter's teardown (-11). Now the command
    stops as it does later on: exit 130 or 143, its "interrupted" line, no traceback, and no process it started is
    left within 30 s (each is found as a descendant, see SUBREAPER). Where the signal lands in the start does not
    matter: any moment from the raylet's start on must pass."""
    sweep_file, output = tmp_path / "start.yaml", tmp_path / "output.txt"
    sweep_file.write_text(
        "name: start\nbase: {dataset: synthetic, train_subset: 256, test_subset: 64, width: 4, depth: 2, epochs: 1,\n"
        "       batch_size: 32, workers: 1}\ngrid:\n  seed: [0, 1]\n"
    )
    sweep = [sys.executable, "-m", "cifar_ray.cli", "sweep", str(sweep_file), "--storage", str(tmp_path / "runs")]
    wrapper = subprocess.Popen(
        [sys.executable, "-c", SUBREAPER, str(output), *sweep],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONUNBUFFERED": "1", "LEFT_DEADLINE_S": "30"},
    )
    driver = None
    try:
        driver = psutil.Process(int(wrapper.stdout.readline()))

        def started() -> bool:  # the raylet (by its name), or an idle worker (by the title Ray gives it)
            for proc in driver.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if proc.name() == moment or " ".join(proc.cmdline()).startswith(moment):
                        return True
            return False

        wait_for(started, 240, f"{moment} of the sweep's own Ray", wrapper)
        if stop == "ctrl-c":
            os.killpg(driver.pid, signal.SIGINT)
        else:
            os.kill(driver.pid, signal.SIGTERM)
        exit_status, left = wrapper.communicate(timeout=240)[0].splitlines()
    finally:
        if wrapper.poll() is None:  # the test failed before the wrapper's end: nothing may outlive it
            with contextlib.suppress(ProcessLookupError, AttributeError):
                os.killpg(driver.pid, signal.SIGKILL)
            wrapper.kill()
            wrapper.wait()
    printed = output.read_text()
    assert int(exit_status) == status and json.loads(left) == [], (exit_status, left, printed[-2000:])
    assert "interrupted" in printed and "Traceback" not in printed and "SIGTERM received" not in printed, printed


@ON_RAY
def test_resume_with_another_config_is_refused_naming_the_keys_before_anything_is_written(tmp_path, capsys):
    (tmp_path / "s.yaml").write_text(
        "name: mixed\nbase: {dataset: synthetic, train_subset: 256, test_subset: 64, width: 4, depth: 2, epochs: 1,\n"
        "       batch_size: 32}\ngrid:\n  seed: [0, 1]\n"
    )
    sweep = ["sweep", str(tmp_path / "s.yaml"), "--storage", str(tmp_path / "runs")]
    run_dir = tmp_path / "runs" / "mixed"
    run_dir.mkdir(parents=True)
    # An interrupted run of the file: its trials recorded with the configs the file resolves to.
    from cifar_ray.cluster.placement import cluster_capacity, resolve_plan
    from cifar_ray.core.sweep import load_sweep

    plan = resolve_plan(load_sweep(tmp_path / "s.yaml"), cluster_capacity())
    runlog.write_json(run_dir / runlog.SWEEP_FILE, plan.summary() | {"warm": True, "slots": True})
    for trial in plan.trials:
        runlog.write_json(run_dir / trial.name / runlog.TRIAL_FILE, trial.as_dict() | {"status": "running"})
    before = {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}

    assert main([*sweep, "--resume", "--set", "lr=0.5", "epochs=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "t000-seed=0 (epochs 1 -> 2, lr 0.05 -> 0.5)" in err and "t001-seed=1" in err, err
    assert {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()} == before
