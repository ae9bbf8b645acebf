"""`cifar-ray status`: where a sweep stands, from its run folder alone; the counting and the ETA on hand-written
run folders, then a real tiny sweep read back in a fresh Python that must import neither torch nor Ray."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import pytest

from cifar_ray.cli import main
from cifar_ray.core import lease, runlog, status
from cifar_ray.core.errors import UserError

START = 1_800_000_000.0  # the hand-written sweep's start (Unix time); each trial's times are seconds after it
# The lease of a live driver: this test's process, its heartbeat after every time the tests ask about.
LIVE_DRIVER = {"host": lease.this_host(), "pid": os.getpid(), "started_unix": START, "heartbeat_unix": START + 1e6}
LIVE_DRIVER |= {"token": "test"}


def write_run(
    run_dir: Path, trials: dict[str, dict], sweep: dict | None = None, epoch_ends: dict[str, list[float]] | None = None
) -> Path:
    """A run folder as the driver leaves it: sweep.json, and per trial trial.json (times given as seconds after
    START) and metrics.jsonl with an epoch ending at each of `epoch_ends[name]`."""
    started_at = datetime.fromtimestamp(START, timezone.utc).strftime(status.ISO_FORMAT)
    runlog.write_json(run_dir / runlog.SWEEP_FILE, {"name": "hand", "trials": list(trials), "started_at": started_at})
    runlog.update_json(run_dir / runlog.SWEEP_FILE, **(sweep or {}))
    for index, (name, meta) in enumerate(trials.items()):
        meta = {"swept": {"lr": 0.1 * (index + 1)}, "config": {"epochs": meta.pop("epochs", 2)}} | meta
        if "started" in meta:
            meta["started_unix"] = START + meta.pop("started")
        runlog.write_json(run_dir / name / runlog.TRIAL_FILE, meta)
        for epoch, end in enumerate((epoch_ends or {}).get(name, []), 1):
            runlog.append_epoch(run_dir / name, {"epoch": epoch, "epoch_time_s": 1.0, "end_unix": START + end})
    if any(meta.get("status") == "running" for meta in trials.values()):  # its driver lives throughout the test
        runlog.write_json(run_dir / lease.LEASE_FILE, LIVE_DRIVER)
    return run_dir


@pytest.fixture
def mixed_run(tmp_path) -> Path:
    """Every state at START + 400: 100 s of wall time per epoch everywhere; t1 and t2 have 4 epochs left."""
    return write_run(
        tmp_path / "mixed",
        {
            "t0": {"status": "finished", "started": 0},
            "t1": {"status": "running", "started": 0, "epochs": 3},
            "t2": {"status": "pending"},
            "t3": {"status": "failed", "started": 300, "error": "RuntimeError: boom\n  more detail"},
            "t4": {"status": "diverged", "started": 200, "diverged_epoch": 1},
        },
        epoch_ends={"t0": [100, 200], "t1": [100], "t4": [300]},
    )


def test_every_state_is_counted_and_the_eta_is_wall_time_per_epoch_x_epochs_left_over_trials_at_once(mixed_run):
    state = status.load_state(mixed_run, now=START + 400)
    assert [(t.trial, t.state) for t in state.trials] == [
        ("t0", "finished"),
        ("t1", "running"),
        ("t2", "pending"),
        ("t3", "failed"),
        ("t4", "diverged"),
    ]
    # t0 and t1 ran together, then t4 took t0's place: 2 at once; t1 and t2 left, so 2 still fit
    [shape] = state.shapes  # every trial has the same workers
    assert (shape.epoch_wall_s, shape.epochs_left, shape.at_once) == (100.0, 4, 2)
    assert state.eta_s == 100.0 * 4 / 2 and state.elapsed_s == 400.0
    assert (
        status.totals_line(state)
        == "[1/5 done · 1 running · 1 pending · 1 failed · 1 diverged] 7 min elapsed · ETA ~3 min"
    )
    text = status.render(mixed_run, now=START + 400).splitlines()
    assert text[0] == f"hand: 5 trials, started {state.started_at}"
    assert text[2].split() == ["t1", "lr=0.2", "running:", "epoch", "2", "of", "3", "1/3", "epochs"]
    assert text[3].split() == ["t2", "lr=0.30000000000000004", "pending", "0/2", "epochs"]
    assert "failed: RuntimeError: boom  " in text[4] and "more detail" not in text[4]
    assert "diverged at epoch 1" in text[5]
    assert text[-1].endswith("ETA ~3 min (wall time per epoch x epochs left / trials at once: 100 s x 4 / 2)")


def test_json_holds_the_same_per_trial_and_totals(mixed_run):
    data = json.loads(status.render(mixed_run, as_json=True, now=START + 400))
    assert data["counts"] == {
        "finished": 1,
        "running": 1,
        "stalled": 0,
        "incomplete": 0,
        "interrupted": 0,
        "pending": 1,
        "failed": 1,
        "diverged": 1,
        "oom": 0,
    }
    assert (data["eta_s"], data["eta"]) == (200.0, "ETA ~3 min")
    assert [(s["epoch_wall_s"], s["epochs_left"], s["at_once"], s["eta_s"]) for s in data["shapes"]] == [
        (100.0, 4, 2, 200.0)
    ]
    running = data["trials"][1]
    assert (running["trial"], running["state"], running["epochs_done"], running["epochs"]) == ("t1", "running", 1, 3)
    assert running["idle_s"] == 300.0 and data["trials"][3]["error"] == "RuntimeError: boom"


def test_eta_unknown_until_an_epoch_has_finished_and_none_when_nothing_is_left(tmp_path):
    starting = write_run(tmp_path / "a", {"t0": {"status": "running", "started": 0}, "t1": {"status": "pending"}})
    state = status.load_state(starting, now=START + 30)
    assert (state.eta_s, state.eta) == (None, "ETA unknown (no epoch has finished yet)")
    assert (
        status.totals_line(state)
        == "[0/2 done · 1 running · 1 pending] 30 s elapsed · ETA unknown (no epoch has finished yet)"
    )

    ended = {"finished_at": datetime.fromtimestamp(START + 250, timezone.utc).strftime(status.ISO_FORMAT)}
    done = write_run(
        tmp_path / "b",
        {"t0": {"status": "finished", "started": 0}, "t1": {"status": "oom", "started": 0, "error": "out of memory"}},
        sweep=ended,
        epoch_ends={"t0": [100, 200]},
    )
    state = status.load_state(done, now=START + 9999)
    assert (state.eta_s, state.eta, state.elapsed_s) == (None, "", 250.0)  # elapsed ends with the sweep
    assert status.totals_line(state) == "[1/2 done · 1 oom] 4 min elapsed"
    assert "oom: out of memory" in status.render(done, now=START + 9999)


def test_a_resumed_trial_counts_only_the_epochs_since_it_started_again(tmp_path):
    run_dir = write_run(
        tmp_path / "r",
        {"t0": {"status": "running", "started": 1000, "epochs": 4}},
        epoch_ends={"t0": [100, 200, 1050]},  # epochs 1-2 before the driver died, epoch 3 50 s after the restart
    )
    state = status.load_state(run_dir, now=START + 1060)
    assert [(s.epoch_wall_s, s.epochs_left) for s in state.shapes] == [(50.0, 1)] and state.eta_s == 50.0


def test_trials_one_after_another_in_a_slot_are_one_at_a_time(tmp_path):
    """A warm slot takes its next trial when the last epoch ends, before the driver writes finished_unix."""
    run_dir = write_run(
        tmp_path / "slot",
        {
            "t0": {"status": "finished", "started": 0, "finished_unix": START + 205},
            "t1": {"status": "running", "started": 200},
            "t2": {"status": "pending"},
        },
        epoch_ends={"t0": [100, 200], "t1": [300]},
    )
    state = status.load_state(run_dir, now=START + 310)
    assert [(s.at_once, s.epochs_left) for s in state.shapes] == [(1, 3)] and state.eta_s == 300.0


def test_each_trial_shape_counts_its_own_epochs_wall_time_and_trials_at_once(tmp_path):
    """Two 1-worker trials ran side by side at 100 s per epoch; the 2-worker trials run one at a time, 40 s per
    epoch: the sweep has 2 x 2 epochs of 1-worker trials and 1 + 2 epochs of 2-worker trials left."""
    one, two = {"config": {"epochs": 2, "workers": 1}}, {"config": {"epochs": 2, "workers": 2}}
    run_dir = write_run(
        tmp_path / "shapes",
        {
            "a0": one | {"status": "running", "started": 0},
            "a1": one | {"status": "running", "started": 0},
            "a2": one | {"status": "pending"},
            "a3": one | {"status": "pending"},
            "b0": two | {"status": "finished", "started": 0},
            "b1": two | {"status": "running", "started": 80},
            "b2": two | {"status": "pending"},
        },
        epoch_ends={"a0": [100], "a1": [100], "b0": [40, 80], "b1": [120]},
    )
    state = status.load_state(run_dir, now=START + 130)
    assert [(s.shape["workers"], s.epoch_wall_s, s.epochs_left, s.at_once) for s in state.shapes] == [
        (1, 100.0, 6, 2),
        (2, 40.0, 3, 1),
    ]
    assert state.eta_s == 100.0 * 6 / 2 + 40.0 * 3 / 1
    assert status.render(run_dir, now=START + 130).endswith(
        "ETA ~7 min (wall time per epoch x epochs left / trials at once, summed over trial shapes: "
        "100 s x 6 / 2 + 40 s x 3 / 1)"
    )


def test_running_trials_of_a_dead_driver_are_stalled_and_get_no_eta(tmp_path):
    trials = {"t0": {"status": "running", "started": 0}, "t1": {"status": "pending"}}
    run_dir = write_run(tmp_path / "dead", trials, epoch_ends={"t0": [100]})
    state = status.load_state(run_dir, now=START + 100 + 2 * 3600)  # 2 h without an epoch of 100 s
    assert [t.state for t in state.trials] == ["stalled", "pending"] and state.eta_s is None
    assert state.eta.startswith("no ETA: no trial is progressing")
    line = status.render(run_dir, now=START + 100 + 2 * 3600).splitlines()[1]
    assert "running per trial.json, but stalled, last epoch 2 h 00 min ago" in line
    assert status.load_state(run_dir, now=START + 150).trials[0].state == "running"  # 50 s after an epoch: alive

    # Ray Client: the sweep marks its interruption; a trial that started before it is not running, however recent
    interrupted = write_run(
        tmp_path / "client", trials, sweep={"interrupted_unix": START + 120}, epoch_ends={"t0": [100]}
    )
    assert status.load_state(interrupted, now=START + 130).trials[0].state == "stalled"


def test_a_driver_killed_between_trials_gets_no_eta(tmp_path):
    run_dir = write_run(
        tmp_path / "between",
        {"t0": {"status": "finished", "started": 0, "epochs": 1}, "t1": {"status": "pending"}},
        epoch_ends={"t0": [100]},
    )
    assert status.load_state(run_dir, now=START + 110).eta == "ETA ~3 min"  # 100 s x 2 epochs
    assert status.load_state(run_dir, now=START + 3600).eta.startswith("no ETA")


def test_a_folder_without_sweep_json_is_one_line_naming_it(tmp_path, capsys):
    (tmp_path / "t0").mkdir()
    with pytest.raises(UserError) as error:
        status.render(tmp_path)
    assert str(tmp_path) in str(error.value) and runlog.SWEEP_FILE in str(error.value)
    assert main(["status", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"cifar-ray: error: {tmp_path / 'missing'} holds no run"), err


def status_in_fresh_python(*argv: str) -> str:
    """stdout of `cifar-ray status ARGV` in a fresh Python, which must import neither torch, Ray nor pyarrow."""
    script = (
        "import sys\n"
        "from cifar_ray.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "imported = {'torch', 'ray', 'pyarrow'} & set(sys.modules)\n"
        "assert code == 0 and not imported, (code, imported)\n"
    )
    done = subprocess.run([sys.executable, "-c", script, "status", *argv], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_local_folder_is_read_without_torch_ray_or_pyarrow(mixed_run):
    assert status_in_fresh_python(str(mixed_run)).splitlines()[0].startswith("hand: 5 trials")


@pytest.mark.slow
def test_a_real_sweep_prints_where_it_stands_and_status_reads_it(ray_cluster, tmp_path, capsys):
    """Two 1-worker trials on the session's Ray: one finishes, one diverges at its first epoch."""
    sweep = tmp_path / "tiny.yaml"
    sweep.write_text(
        "name: tiny\n"
        "max_concurrent: 1\n"  # one slot: its start, not the trials, is what costs here
        "base: {dataset: synthetic, train_subset: 512, test_subset: 128, width: 4, epochs: 2, batch_size: 64, "
        "workers: 1, norm: none}\n"
        "grid:\n  lr: [0.05, 1.0e+12]\n"  # the second diverges
    )
    assert main(["sweep", str(sweep), "--storage", str(tmp_path / "runs")]) == 0
    totals = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    # a line after each trial ends; after the first an epoch has finished and a trial is left: an ETA
    assert len(totals) == 2, totals
    assert re.fullmatch(r"\[[01]/2 done · .*\] \d+ (s|min) elapsed this session · ETA ~\d+ (s|min)", totals[0]), totals
    assert re.fullmatch(r"\[1/2 done · 1 diverged\] \d+ (s|min) elapsed this session", totals[1]), totals

    run_dir = tmp_path / "runs" / "tiny"
    text = status_in_fresh_python(str(run_dir)).splitlines()
    assert len(text) == 4 and text[0].startswith("tiny: 2 trials, started ")
    assert text[1].split()[-3:] == ["finished", "2/2", "epochs"] and "lr=0.05" in text[1]
    assert text[2].endswith("diverged at epoch 1  1/2 epochs") and "lr=1000000000000.0" in text[2]
    assert re.fullmatch(r"\[1/2 done · 1 diverged\] \d+ (s|min) elapsed", text[3]), text  # as the sweep ended
    data = json.loads(status_in_fresh_python(str(run_dir), "--json"))
    assert data["counts"]["finished"] == 1 and data["counts"]["diverged"] == 1 and data["eta"] == ""
    assert [t["epochs_done"] for t in data["trials"]] == [len(t.epochs) for t in runlog.load_run(run_dir).trials]


def deny_reads(monkeypatch, denied: Path) -> None:
    """Reading `denied` fails as a file of another user's, mode 0600, does (a test as root reads anything)."""
    from cifar_ray.core import storage
    from cifar_ray.core.storage import StoragePath

    real_read = StoragePath.read_bytes

    def read_bytes(self: StoragePath) -> bytes:
        if self.path == str(denied):
            raise PermissionError(13, "Permission denied", self.path)
        return real_read(self)

    monkeypatch.setattr(StoragePath, "read_bytes", read_bytes)
    monkeypatch.setattr(storage, "RETRY_S", 0.0)


@pytest.mark.parametrize("unreadable", ["t1/" + runlog.EPOCHS_FILE, "t2/" + runlog.TRIAL_FILE, runlog.SWEEP_FILE])
@pytest.mark.parametrize("command", ["status", "report"])
def test_an_unreadable_file_is_one_line_naming_it_not_a_pending_trial(
    mixed_run, monkeypatch, capsys, command, unreadable
):
    deny_reads(monkeypatch, mixed_run / unreadable)
    assert (
        main([command, str(mixed_run), *(["--out", str(mixed_run.parent / "report")] if command == "report" else [])])
        == 2
    )
    out, err = capsys.readouterr()
    assert err.startswith(f"cifar-ray: error: cannot read {mixed_run / unreadable} (") and err.count("\n") == 1, err
    assert "Permission denied" in err and "pending" not in out


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file of mode 000")
def test_a_file_of_mode_000_is_one_line_naming_it(mixed_run, monkeypatch, capsys):
    from cifar_ray.core import storage

    monkeypatch.setattr(storage, "RETRY_S", 0.0)
    (mixed_run / "t1" / runlog.EPOCHS_FILE).chmod(0)
    assert main(["status", str(mixed_run)]) == 2
    assert capsys.readouterr().err.startswith(f"cifar-ray: error: cannot read {mixed_run / 't1' / runlog.EPOCHS_FILE}")


def test_a_trial_folder_that_cannot_be_looked_into_is_one_line_not_a_missing_trial(mixed_run, monkeypatch, capsys):
    """A trial folder of another user (mode 0700) fails os.stat inside it with EACCES: os.path.exists said False
    there, and status and report left the trial out without a word."""
    hidden = str(mixed_run / "t2" / runlog.TRIAL_FILE)
    real_stat = os.stat

    def stat(path, *args, **kwargs):
        if os.fspath(path) == hidden:
            raise PermissionError(13, "Permission denied", hidden)
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    assert main(["status", str(mixed_run)]) == 2
    out, err = capsys.readouterr()
    assert err == f"cifar-ray: error: cannot tell whether {hidden} exists: Permission denied\n" and not out


class SweepAdvancing:
    """The injected clock and sleep of a watch: each sleep moves the clock on and the sweep one step further."""

    def __init__(self, run_dir: Path, steps: list):
        self.run_dir, self.steps, self.now, self.pauses = run_dir, steps, START + 10, []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds
        self.steps.pop(0)(self.run_dir, self.now - START)


def advancing_run(tmp_path: Path) -> SweepAdvancing:
    """t0 running, t1 pending; then t0's epoch 1, t0 finished and t1 started, t1's epoch, t1 and the sweep finished."""
    run_dir = write_run(tmp_path / "w", {"t0": {"status": "running", "started": 0}, "t1": {"status": "pending"}})

    def epoch(name: str, n: int) -> Callable[[Path, float], None]:
        return lambda run, at: runlog.append_epoch(
            run / name, {"epoch": n, "epoch_time_s": 1.0, "end_unix": START + at}
        )

    def trial(name: str, **meta) -> Callable[[Path, float], None]:
        return lambda run, at: runlog.update_json(run / name / runlog.TRIAL_FILE, **meta)

    steps = [
        epoch("t0", 1),
        lambda run, at: (
            epoch("t0", 2)(run, at),
            trial("t0", status="finished")(run, at),
            trial("t1", status="running", started_unix=START + at)(run, at),
        ),
        epoch("t1", 1),
        epoch("t1", 2),
        lambda run, at: (
            trial("t1", status="finished")(run, at),
            runlog.update_json(
                run / runlog.SWEEP_FILE,
                finished_at=datetime.fromtimestamp(START + at, timezone.utc).strftime(status.ISO_FORMAT),
            ),
            (run / lease.LEASE_FILE).unlink(),  # the driver ends: while it lives, it may add trials (--until-settled)
        ),
    ]
    return SweepAdvancing(run_dir, steps)


def test_watch_refreshes_in_place_until_the_sweep_ends(tmp_path):
    sweep, frames = advancing_run(tmp_path), []
    last = status.watch(sweep.run_dir, 5.0, frames.append, True, status.Clock(sweep.clock, sweep.sleep))
    assert sweep.pauses == [5.0] * 5 and not sweep.steps  # read once more after each step, then it ended
    assert len(frames) == 6 and all(frame.startswith(status.CLEAR_SCREEN) for frame in frames)
    assert "every 5 s until the sweep ends · Ctrl-C stops watching" in frames[0]
    assert "running: epoch 1 of 2" in frames[0] and "running: epoch 2 of 2" in frames[1]
    assert frames[-1].rstrip().endswith("[2/2 done] 35 s elapsed") and status.has_ended(last)


def test_watch_without_a_terminal_appends_plain_lines_for_what_changed(tmp_path):
    sweep, written = advancing_run(tmp_path), []
    status.watch(sweep.run_dir, 2.5, written.append, False, status.Clock(sweep.clock, sweep.sleep))
    text = "".join(written)
    assert "\x1b" not in text and len(sweep.pauses) == 5
    lines = text.splitlines()
    assert lines[0] == f"hand: 2 trials, started {status.load_state(sweep.run_dir).started_at}"

    def at(seconds: float) -> str:
        return time.strftime("%H:%M:%S", time.localtime(START + seconds))

    # ETA: 12.5 s per epoch x 3 left; 15 s per 2 epochs x 2 left; 17.5 s per 3 x 1 left (status.py docstring)
    assert lines[4:] == [
        f"{at(12.5)} t0: running: epoch 2 of 2, 1/2 epochs",
        f"{at(12.5)} [0/2 done · 1 running · 1 pending] 12 s elapsed · ETA ~38 s",
        f"{at(15)} t0: finished, 2/2 epochs",
        f"{at(15)} t1: running: epoch 1 of 2, 0/2 epochs",
        f"{at(15)} [1/2 done · 1 running] 15 s elapsed · ETA ~15 s",
        f"{at(17.5)} t1: running: epoch 2 of 2, 1/2 epochs",
        f"{at(17.5)} [1/2 done · 1 running] 18 s elapsed · ETA ~6 s",
        f"{at(20)} t1: running: epoch 2 of 2, 2/2 epochs",
        f"{at(20)} [1/2 done · 1 running] 20 s elapsed · ETA ~0 s",
        f"{at(22.5)} t1: finished, 2/2 epochs",
        f"{at(22.5)} [2/2 done] 22 s elapsed",
    ]


def test_watch_ends_at_once_on_a_stopped_sweep_and_ctrl_c_exits_0_quietly(tmp_path, capsys, monkeypatch):
    stopped = write_run(
        tmp_path / "s",
        {"t0": {"status": "interrupted", "started": 0}, "t1": {"status": "pending"}},
        epoch_ends={"t0": [5]},
    )
    assert main(["status", str(stopped), "--watch"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and out.rstrip().endswith("`cifar-ray sweep FILE --resume` continues it")

    running = write_run(tmp_path / "r", {"t0": {"status": "running", "started": 0}}, epoch_ends={"t0": [5]})
    monkeypatch.setattr(time, "time", lambda: START + 10)

    def ctrl_c(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(time, "sleep", ctrl_c)
    assert main(["status", str(running), "--watch", "--interval", "1"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("hand: 1 trial") and err == ""


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--watch", "--interval", "0"], "--interval must be a number of seconds above 0, got 0"),
        (["--interval", "3"], "--interval sets how often --watch refreshes; pass --watch too"),
        (["--watch", "--json"], "--watch refreshes a table; --json prints one object: pass one of them"),
    ],
)
def test_bad_watch_options_are_one_line(mixed_run, capsys, argv, message):
    assert main(["status", str(mixed_run), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message in err, err


def test_a_finished_trial_whose_last_metrics_line_was_cut_is_incomplete(tmp_path):
    run_dir = write_run(
        tmp_path / "cut",
        {"t0": {"status": "finished", "started": 0, "epochs": 3}, "t1": {"status": "finished", "started": 0}},
        sweep={"finished_at": "2027-01-15T08:00:00+0000"},
        epoch_ends={"t0": [10, 20, 30], "t1": [10, 20]},
    )
    log = run_dir / "t0" / runlog.EPOCHS_FILE
    log.write_text(log.read_text()[:-9])  # epoch 3's line cut short: read as never logged
    state = status.load_state(run_dir, now=START + 40)
    assert [t.state for t in state.trials] == ["incomplete", "finished"]
    assert state.counts["incomplete"] == 1 and state.stopped
    line = status.render(run_dir, now=START + 40).splitlines()[1]
    assert "incomplete: finished per trial.json, but only 2 of 3 epochs in metrics.jsonl; --resume trains it" in line


def test_watch_started_with_the_sweep_waits_for_its_run_saying_how_long(tmp_path, capsys, monkeypatch):
    """It used to exit at once ("holds no run: no sweep.json") when started together with the sweep."""
    finished = write_run(
        tmp_path / "made", {"t0": {"status": "finished", "started": 0, "epochs": 1}}, epoch_ends={"t0": [5]}
    )
    target, written, now = tmp_path / "runs" / "hand", [], [START]

    def sleep(seconds: float) -> None:  # the run appears on the third look
        now[0] += seconds
        if now[0] >= START + 3:
            target.parent.mkdir(exist_ok=True)
            finished.rename(target)

    last = status.watch(target, 5.0, written.append, False, status.Clock(lambda: now[0], sleep), wait_s=60)
    assert written[0] == f"waiting up to 60 s for {target} to hold a run (its sweep.json); Ctrl-C stops\n"
    assert written[1].startswith("hand: 1 trial") and status.has_ended(last) and now[0] == START + 3

    # Nothing comes: refused after the time it said, one line, exit 2.
    monkeypatch.setattr(time, "time", lambda: now[0])
    monkeypatch.setattr(time, "sleep", lambda seconds: now.__setitem__(0, now[0] + seconds))
    empty, start = tmp_path / "never", now[0]
    assert main(["status", str(empty), "--watch", "--interval", "10"]) == 2
    out, err = capsys.readouterr()
    assert out == f"waiting up to {status.WATCH_WAIT_S:g} s for {empty} to hold a run (its sweep.json); Ctrl-C stops\n"
    assert err.startswith(f"cifar-ray: error: {empty} holds no run after waiting 60 s: no sweep.json there; a run")
    assert err.count("\n") == 1 and now[0] >= start + status.WATCH_WAIT_S
    assert main(["status", str(empty)]) == 2  # without --watch: at once, as before
    assert capsys.readouterr().err.startswith(f"cifar-ray: error: {empty} holds no run: no sweep.json")
