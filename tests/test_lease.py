"""One live driver per run folder (core/lease.py): the lease logic with a fake clock, fake hosts and fake pids; the
read-back on storage without a conditional write; the refusal of a second driver before Ray starts; status."""

from __future__ import annotations

import json
import os
import time

import pytest
from faults import FaultyFiles, faulty_storage

from cifar_ray.cli import main
from cifar_ray.core import lease, runlog, status
from cifar_ray.core.checkpoints import CHECKPOINT_FILE, CHECKPOINTS, epoch_folder
from cifar_ray.core.errors import RunInUseError, StorageError, UserError
from cifar_ray.core.storage import StoragePath

T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def driver(run_dir: StoragePath, clock: Clock, pid: int, alive: set[int], host: str = "here") -> lease.DriverLease:
    return lease.DriverLease(run_dir, clock=clock, host=host, pid=pid, alive=alive.__contains__, sleep=lambda s: None)


def test_a_second_driver_is_refused_in_one_line_naming_the_live_one(tmp_path):
    run_dir, clock, alive = StoragePath.of(tmp_path / "run"), Clock(), {101, 202}
    first = driver(run_dir, clock, 101, alive)
    first.acquire()
    record = lease.read_lease(run_dir)
    assert (record.host, record.pid, record.heartbeat_unix, record.token) == ("here", 101, T0, first.token)
    clock.now += 12
    with pytest.raises(RunInUseError) as refused:
        driver(run_dir, clock, 202, alive).acquire()
    message = str(refused.value)
    assert isinstance(refused.value, UserError) and "\n" not in message
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(T0))
    assert f"in use by a live driver (host here, pid 101, since {since}, last heartbeat 12 s ago)" in message
    assert "--resume" not in message and "--name NEW" in message
    assert lease.read_lease(run_dir).token == first.token  # the refused driver wrote nothing
    # another host's live driver: its pid means nothing here, its heartbeat holds
    with pytest.raises(RunInUseError):
        driver(run_dir, clock, 303, set(), host="elsewhere").acquire()


def test_a_lease_without_heartbeat_for_n_intervals_is_taken_over_and_the_old_driver_learns_it(tmp_path):
    run_dir, clock, alive, lines = StoragePath.of(tmp_path / "run"), Clock(), {101, 202}, []
    first = driver(run_dir, clock, 101, alive, host="a")
    first.acquire()
    clock.now += lease.STALE_INTERVALS * lease.INTERVAL_S  # just not stale yet
    with pytest.raises(RunInUseError):
        driver(run_dir, clock, 202, alive, host="b").acquire()
    clock.now += 1
    second = driver(run_dir, clock, 202, alive, host="b")
    second.acquire(lines.append)
    assert lines == [
        f"{run_dir}: taking over from a driver that is gone (host a, pid 101, since "
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(T0))}: no heartbeat for 31 s)"
    ]
    assert lease.read_lease(run_dir).token == second.token
    assert first.renew() is False and first.lost.pid == 202  # the old driver's next heartbeat finds it lost
    first.release()
    assert lease.read_lease(run_dir).token == second.token  # a lost lease is not deleted by its old holder
    second.release()
    assert lease.read_lease(run_dir) is None


def test_a_lease_of_a_dead_process_on_this_host_is_taken_over_at_once(tmp_path):
    run_dir, clock, lines = StoragePath.of(tmp_path / "run"), Clock(), []
    driver(run_dir, clock, 101, {101}).acquire()
    clock.now += 1  # heartbeat fresh, but pid 101 is gone now
    driver(run_dir, clock, 202, {202}).acquire(lines.append)
    assert len(lines) == 1 and lines[0].endswith("process 101 of here is gone)")
    assert lease.read_lease(run_dir).pid == 202


def test_a_failing_heartbeat_is_said_once_when_the_lease_could_be_taken_over(tmp_path, monkeypatch):
    """A full disk fails each heartbeat's write. Said at every beat, the warning came before the driver's own refusal
    of the same fault (cannot write sweep.json), two lines for one full disk; now said once per outage, when the
    lease has gone without a heartbeat long enough to be taken over."""
    run_dir, clock, lines = StoragePath.of(tmp_path / "run"), Clock(), []
    ours = driver(run_dir, clock, 101, {101})
    ours.acquire()
    write = StoragePath.write_bytes

    def full(path, data):
        raise StorageError(f"cannot write {path} (5 tries): [Errno 28] No space left on device")

    monkeypatch.setattr(StoragePath, "write_bytes", full)
    for _ in range(2 * lease.STALE_INTERVALS):
        clock.now += lease.INTERVAL_S
        assert ours.heartbeat(lines.append)
        assert len(lines) == (clock.now - T0 >= lease.STALE_INTERVALS * lease.INTERVAL_S)
    assert lines == [
        f"{run_dir}: no heartbeat of this driver's lease for 30 s (cannot write {ours.file} (5 tries): [Errno 28] No "
        "space left on device); another driver may now take the run over"
    ]
    monkeypatch.setattr(StoragePath, "write_bytes", write)
    assert ours.heartbeat(lines.append) and lease.read_lease(run_dir).heartbeat_unix == clock.now
    monkeypatch.setattr(StoragePath, "write_bytes", full)
    clock.now += lease.STALE_INTERVALS * lease.INTERVAL_S
    assert ours.heartbeat(lines.append) and len(lines) == 2  # a new outage, said again


def test_heartbeats_renew_the_lease_and_release_removes_it_with_the_folder_it_made(tmp_path, monkeypatch):
    monkeypatch.setattr(lease, "INTERVAL_S", 0.02)
    run_dir = StoragePath.of(tmp_path / "runs" / "new")
    ours = lease.DriverLease(run_dir)
    ours.acquire()
    first_beat = lease.read_lease(run_dir).heartbeat_unix
    ours.start_heartbeat()
    deadline = time.monotonic() + 60  # ends a hang: a loaded machine may run the heartbeat's thread late
    while lease.read_lease(run_dir).heartbeat_unix == first_beat and time.monotonic() < deadline:
        time.sleep(0.01)
    assert lease.read_lease(run_dir).heartbeat_unix > first_beat
    assert lease.live_driver_refusal(run_dir) is not None and lease.driver_gone(run_dir, time.time()) is None
    ours.release()
    assert not (tmp_path / "runs").exists()  # the folders it made, left empty


def test_hold_is_reentrant_in_one_process(tmp_path):
    run_dir = StoragePath.of(tmp_path / "run")
    with lease.hold(run_dir) as outer:
        with lease.hold(run_dir) as inner:  # run_plan inside api.execute_plan
            assert inner is outer
        assert lease.read_lease(run_dir).token == outer.token
    assert lease.read_lease(run_dir) is None


def test_without_a_conditional_write_the_later_of_two_writers_holds_and_the_earlier_is_refused(tmp_path):
    """On storage without os.link (an object store; here FaultyFiles failing nothing): both drivers found no lease;
    the second writes while the first waits to read back."""
    run_dir = faulty_storage(tmp_path / "run", FaultyFiles(tmp_path / "faults", share=0.0))
    clock = Clock()
    first, second = driver(run_dir, clock, 101, {101, 202}), driver(run_dir, clock, 202, {101, 202})
    first.sleep = lambda seconds: second.file.write_bytes(second._ours(clock()))
    with pytest.raises(RunInUseError) as refused:
        first.acquire()
    assert "pid 202" in str(refused.value)
    assert lease.read_lease(run_dir).token == second.token


def test_a_local_lease_is_created_only_where_none_is(tmp_path):
    file = StoragePath.of(tmp_path / "f")
    assert file.create_bytes(b"one") and not file.create_bytes(b"two")
    assert file.read_bytes() == b"one" and os.listdir(tmp_path) == ["f"]  # no temp file left


# --------------------------------------------------------------- a second driver on the command line


def live_lease(run_dir, pid: int | None = None) -> lease.LeaseRecord:
    """A lease of a live driver on this host (this test's process, or `pid`) with a fresh heartbeat."""
    held = lease.DriverLease(StoragePath.of(run_dir), pid=pid)
    held.acquire()
    return lease.read_lease(StoragePath.of(run_dir))


@pytest.fixture
def no_ray(monkeypatch) -> None:
    """Starting Ray fails the test: a second driver is refused before."""
    from cifar_ray.cluster import session

    def init_ray(**options):
        raise AssertionError("Ray started")

    monkeypatch.setattr(session, "init_ray", init_ray)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


@pytest.mark.usefixtures("no_ray")
@pytest.mark.parametrize("resume", [False, True])
def test_a_second_sweep_on_a_live_run_is_refused_before_ray_starts_without_advising_resume(tmp_path, capsys, resume):
    sweep_file = tmp_path / "fake.yaml"
    sweep_file.write_text("name: fake\nbase: {dataset: synthetic}\ngrid: {seed: [0, 1]}\n")
    run_dir = tmp_path / "runs" / "fake"
    trials = ["t000-seed=0", "t001-seed=1"]
    runlog.write_json(run_dir / runlog.SWEEP_FILE, {"name": "fake", "trials": trials, "slots": True})
    for trial in trials:
        runlog.write_json(run_dir / trial / runlog.TRIAL_FILE, {"name": trial, "status": "running"})
    held = live_lease(run_dir)
    argv = ["sweep", str(sweep_file), "--storage", str(tmp_path / "runs")] + ["--resume"] * resume
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"pid {os.getpid()}" in err and "in use by a live driver" in err
    assert "--resume" not in err
    assert lease.read_lease(StoragePath.of(run_dir)) == held  # untouched


@pytest.mark.usefixtures("no_ray")
def test_a_train_into_a_folder_another_train_holds_is_refused_before_it_writes(tmp_path, capsys):
    """The first `cifar-ray train` holds its folder's lease before it writes sweep.json: a second of the same
    --name is refused by the lease alone, naming the first driver."""
    held = live_lease(tmp_path / "runs" / "mine", pid=os.getppid())  # another live process of this host
    argv = ["train", "--storage", str(tmp_path / "runs"), "--name", "mine", "--set", "dataset=synthetic"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"in use by a live driver (host {held.host}, pid {held.pid}, since" in err
    assert os.listdir(tmp_path / "runs" / "mine") == [lease.LEASE_FILE]


def test_status_says_when_the_driver_of_running_trials_is_gone(tmp_path):
    run_dir = tmp_path / "run"
    runlog.write_json(run_dir / runlog.SWEEP_FILE, {"name": "r", "trials": ["t0"]})
    runlog.write_json(run_dir / "t0" / runlog.TRIAL_FILE, {"status": "running", "config": {"epochs": 12}})
    for epoch in range(1, 7):
        runlog.append_epoch(run_dir / "t0", {"epoch": epoch, "end_unix": time.time() - 60 + epoch})
    runlog.update_json(run_dir / "t0" / runlog.TRIAL_FILE, started_unix=time.time() - 70)
    held = live_lease(run_dir)
    state = status.load_state(run_dir)
    assert state.trials[0].state == "running" and state.eta.startswith("ETA") and state.driver_gone is None
    runlog.write_json(run_dir / lease.LEASE_FILE, {**held.__dict__, "heartbeat_unix": time.time() - 31})
    state = status.load_state(run_dir)
    assert state.trials[0].state == "stalled" and state.eta_s is None
    gone = f"(its driver ({held.host}, pid {held.pid}) is gone: no heartbeat for 31 s)"
    assert gone in state.eta and state.eta.count("gone") == 1  # it said "its driver is gone: its driver ... is gone"
    (run_dir / lease.LEASE_FILE).unlink()
    text = status.render(run_dir)
    assert "running: epoch 7 of 12" not in text and f"no driver holds {lease.LEASE_FILE}" in text


def test_a_killed_driver_not_yet_waited_for_is_gone():
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert lease.pid_alive(child.pid)
        child.kill()
        deadline = time.monotonic() + 60  # ends a hang, not a speed: a loaded machine may reap the kill late
        while lease.pid_alive(child.pid) and time.monotonic() < deadline:  # a zombie until waited for
            time.sleep(0.05)
        assert not lease.pid_alive(child.pid)
    finally:
        child.wait()
    assert not lease.pid_alive(child.pid)


# ------------------------------------------------------------------------------- real Ray, real drivers

TWO_TRIALS = (
    "name: two\n"
    "max_concurrent: 1\n"  # one slot: its start, not the trials, is what costs here
    "base: {dataset: synthetic, train_subset: 512, test_subset: 128, width: 4, depth: 2, epochs: 3, batch_size: 32,\n"
    "       norm: none, workers: 1, keep_checkpoints: 3}\n"
    "grid:\n  seed: [0, 1]\n"
)


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_a_second_driver_is_refused_and_a_damaged_run_resumes_from_what_loads(tmp_path, capsys):
    """A sweep's driver (a process of its own) trains; a second one, with and without --resume, is refused in one
    line naming it, and no epoch is logged twice. Then the finished run is damaged: each trial's last metrics line
    cut, and the second's newest loggable checkpoint cut in half. --resume retrains both from what loads."""
    import subprocess
    import sys

    from helpers import PROGRESS_S, wait_for

    (tmp_path / "two.yaml").write_text(TWO_TRIALS)
    storage = tmp_path / "runs"
    run_dir = storage / "two"
    argv = ["sweep", str(tmp_path / "two.yaml"), "--storage", str(storage)]
    errors = tmp_path / "first.err"
    with open(errors, "w") as err_file:
        first = subprocess.Popen(
            [sys.executable, "-m", "cifar_ray.cli", *argv], stdout=subprocess.DEVNULL, stderr=err_file
        )

    def epoch_logged() -> bool:
        return run_dir.exists() and any(runlog.read_epochs(run_dir / t) for t in runlog.trial_folders(run_dir))

    try:
        wait_for(epoch_logged, PROGRESS_S, "the first driver's first epoch", first)
        for extra in ([], ["--resume"]):
            assert main([*argv, *extra]) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and f"in use by a live driver (host {lease.this_host()}, pid {first.pid}" in err
            assert "--resume" not in err
        assert first.wait(timeout=PROGRESS_S) == 0, errors.read_text()
    finally:
        first.kill()
        first.wait()
    run = runlog.load_run(run_dir)
    assert [t.status for t in run.trials] == ["finished", "finished"] and not (run_dir / lease.LEASE_FILE).exists()
    for trial in run.trials:  # every epoch once: the refused drivers trained nothing
        lines = (run_dir / trial.name / runlog.EPOCHS_FILE).read_text().splitlines()
        assert [json.loads(line)["epoch"] for line in lines] == [1, 2, 3]
    [session] = run.sweep["sessions"]
    assert "end" not in session and session["wall_s"] > 0  # the live driver's session was not closed as killed

    before = {t.name: t.epochs for t in run.trials}
    for trial in run.trials:
        log = run_dir / trial.name / runlog.EPOCHS_FILE
        log.write_text(log.read_text()[:-20])  # epoch 3's line cut short: the trial is incomplete
    second = run.trials[1].name
    stored = run_dir / second / CHECKPOINTS / epoch_folder(2) / CHECKPOINT_FILE
    stored.write_bytes(stored.read_bytes()[: stored.stat().st_size // 2])
    assert [t.state for t in status.load_state(run_dir).trials] == ["incomplete", "incomplete"]
    assert main([*argv, "--resume"]) == 0
    out = capsys.readouterr().out
    assert f"{second}  checkpoint epoch-0002 (" in out and "does not load: continues from epoch-0001" in out
    run = runlog.load_run(run_dir)
    assert [t.status for t in run.trials] == ["finished", "finished"]
    assert [[row["epoch"] for row in t.epochs] for t in run.trials] == [[1, 2, 3], [1, 2, 3]]
    first_name = run.trials[0].name
    assert run.trials[0].epochs[:2] == before[first_name][:2]  # continued from epoch 2's checkpoint
    assert run.trials[1].epochs[:1] == before[second][:1]  # from epoch 1's: epoch 2's was damaged
    assert "does not load: continues from epoch-0001" in run.trials[1].meta["notes"][0]
