"""The sweep's progress, without running a sweep: the Dispatcher's log of events, and the lines and bar made from
fake events over real run logs, with a fake clock."""

from __future__ import annotations

import asyncio
import io
import os
import sys
import threading
import time

from cifar_ray.cluster import progress
from cifar_ray.cluster.dispatcher import Dispatcher, RunTrial
from cifar_ray.core import runlog, status
from cifar_ray.core.config import TrainConfig
from cifar_ray.core.run import RunFolder
from cifar_ray.core.storage import StoragePath
from cifar_ray.core.sweep import TrialSpec


def spec(run_dir: StoragePath, index: int = 0, epochs: int = 2, logged: int = 0, status: str = "pending") -> RunTrial:
    """A trial of the run in `run_dir` with its trial.json and `logged` epochs in its metrics.jsonl."""
    lr = round(0.1 * (index + 1), 1)
    trial = TrialSpec(index, f"t{index:03d}-lr={lr}", {"lr": lr}, TrainConfig(lr=lr, epochs=epochs))
    runlog.write_json(run_dir / trial.name / runlog.TRIAL_FILE, trial.as_dict() | {"status": status})
    for epoch in range(1, logged + 1):
        runlog.append_epoch(run_dir / trial.name, epoch_row(epoch))
    return RunTrial.of(trial, run_dir)


def epoch_row(epoch: int) -> dict:
    return {
        "epoch": epoch,
        "train_loss": 1.0,
        "train_acc": 0.5,
        "test_loss": 1.0,
        "test_acc": 0.5,
        "epoch_time_s": 1.0,
        "samples_per_s": 100.0,
        "peak_mem_mb": 10.0,
        "diverged": False,
    }


class FakeClock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    """A stream that says whether it is a terminal, as sys.stdout does."""

    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_tune_adds_no_progress_printer_of_its_own():
    """Tune's default TrialProgressCallback printed `Trial ... completed. Last result:` during --resume, even
    with verbose=0; it is added only when no TrialProgressCallback is among the callbacks."""
    from ray.tune.progress_reporter import TrialProgressCallback
    from ray.tune.utils.callback import _create_default_callbacks

    ours = progress.progress_callback()
    callbacks = _create_default_callbacks([ours], metric=None)
    assert [c for c in callbacks if isinstance(c, TrialProgressCallback)] == [ours]


def test_the_dispatcher_logs_every_trials_news_in_the_order_it_came(tmp_path):
    """The one log the driver prints from: two trials' news interleaved as they were told, read from any index."""
    run_dir = StoragePath.of(tmp_path)
    a, b = spec(run_dir, 0), spec(run_dir, 1)
    d = Dispatcher([a, b], {a.shape: ["slot-a", "slot-b"]})
    assert asyncio.run(d.take(a.shape, "slot-a")) == a
    assert asyncio.run(d.take(a.shape, "slot-b")) == b
    asyncio.run(d.epoch(b.name, {"epoch": 1}))
    asyncio.run(d.epoch(a.name, {"epoch": 1}))
    told = [
        (a.name, {"start": 0, "logged": 0}),
        (b.name, {"start": 0, "logged": 0}),
        (b.name, {"epoch": {"epoch": 1}}),
        (a.name, {"epoch": {"epoch": 1}}),
    ]
    assert asyncio.run(d.events(0, 0.01)) == told
    assert asyncio.run(d.events(3, 0.01)) == told[3:]
    assert asyncio.run(d.events(4, 0.01)) == []


def test_lines_come_as_the_events_happen_in_their_order(tmp_path):
    """While the sweep runs (inside `follow`), each event is printed within a read's wait of its telling, in the
    Dispatcher's order across trials (Tune's thin trials, started a few at a time, once printed them minutes late
    and out of order), and where the sweep stands right after each trial ends."""
    run_dir = StoragePath.of(tmp_path)
    runlog.write_json(run_dir / runlog.SWEEP_FILE, {"name": "p", "started_at": runlog.now_iso()})
    a, b = spec(run_dir, 0, epochs=1), spec(run_dir, 1, epochs=2, logged=1)
    log: list[tuple[str, dict]] = []
    lines: list[str] = []
    said = threading.Condition()

    def print_line(line: str) -> None:
        with said:
            lines.append(line)
            said.notify_all()

    view = progress.SweepProgress(run_dir, [a, b], print_line, started=time.time())

    def read(since: int, wait_s: float) -> list:
        time.sleep(min(wait_s, 0.05))
        return log[since:]

    def printed(count: int) -> list[str]:
        """The lines once `count` are printed; the deadline ends a hang (the thread may be slow on a loaded machine)."""
        with said:
            said.wait_for(lambda: len(lines) >= count, timeout=60)
            return lines[:]

    with progress.follow(read, view):
        log.append((b.name, {"start": 1}))
        assert printed(1) == ["t001-lr=0.2  continues after epoch 1/2  lr=0.2"]
        log.extend([(a.name, {"start": 0}), (a.name, {"epoch": epoch_row(1)}), (b.name, {"epoch": epoch_row(2)})])
        runlog.append_epoch(run_dir / a.name, epoch_row(1))  # what the Dispatcher logs before it tells the epoch
        RunFolder(run_dir).record_outcome(a.name)
        log.append((a.name, {"done": True}))
        assert len(printed(5)) == 5
    assert [line.split("  ")[:2] for line in lines[1:4]] == [
        ["t000-lr=0.1", "starts"],
        ["t000-lr=0.1", "epoch 1/1"],
        ["t001-lr=0.2", "epoch 2/2"],
    ]
    assert lines[4].startswith("[1/2 done · 1 pending] "), lines


def test_elapsed_is_this_sessions_running_time(tmp_path):
    """A run whose first session began 17 h ago, resumed 125 s ago: the line after a trial ends says 2 min, and what
    it measures; the ETA is status's (t000: 30 s per epoch; t001's 2 epochs left, one at a time: 60 s). Both are read
    at one moment of the view's clock (here a day in 2023: the ETA read at the machine's own clock found the run idle
    since, and gave none)."""
    run_dir, now = StoragePath.of(tmp_path), 1_700_000_000.0
    first_began = time.strftime(status.ISO_FORMAT, time.localtime(now - 17 * 3600))
    runlog.write_json(run_dir / runlog.SWEEP_FILE, {"name": "p", "started_at": first_began})
    a, b = spec(run_dir, 0, epochs=2), spec(run_dir, 1, epochs=2)
    runlog.update_json(a.trial_file, started_unix=now - 60)
    for epoch, end in ((1, now - 30), (2, now)):
        runlog.append_epoch(a.trial_dir, epoch_row(epoch) | {"end_unix": end})
    a.run.record_outcome(a.name)
    lines: list[str] = []
    view = progress.SweepProgress(run_dir, [a, b], lines.append, started=now - 125, clock=FakeClock(now))
    view.event(a.name, {"done": True})
    assert lines == ["[1/2 done · 1 pending] 2 min elapsed this session · ETA ~60 s"]

    runlog.update_json(b.trial_file, status="failed", error="RuntimeError: boom")
    view.clock.now = now + 65
    view.event(b.name, {"failed": "RuntimeError: boom", "status": "failed"})
    assert lines[1:] == ["t001-lr=0.2  FAILED: RuntimeError: boom", "[1/2 done · 1 failed] 3 min elapsed this session"]


def test_a_terminal_gets_a_live_bar_any_other_stream_plain_lines(tmp_path, monkeypatch):
    """The same events on a stream that is a terminal and on one that is not (a pipe, a file). The bar counts the
    epochs this session trains (t001's logged one done), drops a failed trial's epochs left, shows this session's
    elapsed time and the counts, and keeps the trial lines above it; the lines print no bar."""
    run_dir, began = StoragePath.of(tmp_path), time.time()
    runlog.write_json(run_dir / runlog.SWEEP_FILE, {"name": "p", "started_at": runlog.now_iso(began)})
    a, b = spec(run_dir, 0, epochs=3), spec(run_dir, 1, epochs=2, logged=1)
    events = [(a.name, {"start": 0}), (a.name, {"epoch": epoch_row(1)}), (b.name, {"start": 1})]
    monkeypatch.setattr(progress, "terminal_columns", lambda stream: 80)  # a StringIO has no size of its own
    outputs = {}
    for tty in (True, False):
        stream = Terminal(tty)
        view = progress.SweepProgress(
            run_dir, [a, b], lambda line, s=stream: print(line, file=s), began, stream, FakeClock(began + 65)
        )
        for trial, event in events:
            view.event(trial, event)
        if tty:
            assert (view.bar.n, view.bar.total) == (2, 5)
        runlog.update_json(a.trial_file, status="failed", error="boom")
        view.event(a.name, {"failed": "boom", "status": "failed"})
        if tty:
            assert (view.bar.n, view.bar.total) == (2, 3)  # t000's 2 epochs left are not trained
        view.close()
        outputs[tty] = stream.getvalue()
    bar, plain = outputs[True], outputs[False]
    assert "\r" in bar and "2/3 epochs |" in bar and "01:05 this session" in bar, bar
    assert bar.startswith("\r1/5 epochs |") and "00:00" not in bar, bar
    assert "[0/2 done · 1 pending · 1 failed]" in bar.rsplit("\r", 1)[-1], bar
    assert "t000-lr=0.1  epoch 1/3" in bar and "t000-lr=0.1  FAILED: boom" in bar
    assert "\r" not in plain and "epochs |" not in plain, plain
    assert plain.splitlines() == [
        "t000-lr=0.1  starts  lr=0.1",
        "t000-lr=0.1  epoch 1/3  train loss 1.000 acc  50.0%  test loss 1.000 acc  50.0%  1.0s  100 img/s  "
        "10 MB/worker peak",
        "t001-lr=0.2  continues after epoch 1/2  lr=0.2",
        "t000-lr=0.1  FAILED: boom",
        "[0/2 done · 1 pending · 1 failed] 65 s elapsed this session · ETA unknown (no epoch has finished yet)",
    ]


def test_a_taken_trial_says_where_it_really_continues(tmp_path):
    """ "continues after epoch 2/3" was printed from the epochs logged, also for a trial with no checkpoint (it
    starts again from epoch 1) and for one that had trained every epoch (it only closes). The Dispatcher now tells
    where the trial continues: its newest complete checkpoint at or before its last logged epoch."""
    from cifar_ray.cluster.dispatcher import resume_point
    from cifar_ray.core.checkpoints import CHECKPOINT_FILE, CHECKPOINTS, epoch_folder

    run_dir = StoragePath.of(tmp_path)
    trial = spec(run_dir, epochs=3)
    folder = tmp_path / trial.name
    for epoch in (1, 2):
        runlog.append_epoch(run_dir / trial.name, epoch_row(epoch))
    assert resume_point(run_dir / trial.name) == (0, 2)  # no checkpoint: from epoch 1 again
    assert (
        progress.start_line(trial, 0, 2).split("  ")[1] == "starts again from epoch 1 (no checkpoint to continue from)"
    )
    for epoch in (1, 2, 3):  # epoch 3's checkpoint is after the last logged epoch: not resumed from
        (folder / CHECKPOINTS / epoch_folder(epoch)).mkdir(parents=True)
        (folder / CHECKPOINTS / epoch_folder(epoch) / CHECKPOINT_FILE).write_bytes(b"x")
    assert resume_point(run_dir / trial.name) == (2, 2)
    assert progress.start_line(trial, 2, 2).split("  ")[1] == "continues after epoch 2/3"
    runlog.append_epoch(run_dir / trial.name, epoch_row(3))
    assert resume_point(run_dir / trial.name) == (3, 3)
    assert progress.start_line(trial, 3, 3).split("  ")[1] == "has trained all 3 epochs: closes it"
    assert progress.start_line(spec(run_dir, index=1), 0, 0).split("  ")[1] == "starts"


class SizedTerminal(Terminal):
    """A terminal stream with a file descriptor for os.get_terminal_size (faked by the tests)."""

    def fileno(self) -> int:
        return 99


def fake_size(monkeypatch, size) -> None:
    """os.get_terminal_size reports `size` (columns, lines) for any descriptor, or raises it when an exception."""

    def get_terminal_size(fd: int = 1) -> os.terminal_size:
        if isinstance(size, Exception):
            raise size
        return os.terminal_size(size)

    monkeypatch.setattr(progress.os, "get_terminal_size", get_terminal_size)


def test_a_terminal_of_size_0x0_or_unknown_gets_the_lines_not_a_bar_that_draws_nothing(tmp_path, monkeypatch):
    """CI logs, `script` and some IDE consoles are terminals that report a size of 0x0 (or none): the bar drew nothing
    there and no line was printed. They get the line mode, as a pipe does; a terminal of a real size gets the bar."""
    run_dir = StoragePath.of(tmp_path)
    runlog.write_json(run_dir / runlog.SWEEP_FILE, {"name": "p", "started_at": runlog.now_iso()})
    a = spec(run_dir, 0, epochs=2)
    assert progress.terminal_columns(io.StringIO()) == 0  # no descriptor at all
    for size, bar in (((0, 0), False), (OSError(25, "Inappropriate ioctl for device"), False), ((120, 40), True)):
        fake_size(monkeypatch, size)
        stream = SizedTerminal(tty=True)
        assert progress.terminal_columns(stream) == (120 if bar else 0)
        view = progress.SweepProgress(run_dir, [a], lambda line, s=stream: print(line, file=s), 1000.0, stream)
        view.event(a.name, {"start": 0})
        view.close()
        printed = stream.getvalue()
        assert (view.bar is not None) == bar, size
        assert ("epochs |" in printed) == bar and "t000-lr=0.1  starts  lr=0.1" in printed, printed
        if not bar:
            assert printed == "t000-lr=0.1  starts  lr=0.1\n"


def test_what_ray_prints_while_the_bar_is_drawn_goes_above_it(tmp_path, monkeypatch):
    """Ray's lines in the driver (the raylet's and its workers', its logger's) are printed to sys.stdout or sys.stderr
    as they come; while the bar was drawn they landed in the bar's row, after the bar, and left a copy of it. Now
    each goes on a row of its own above the bar, which is drawn again below it; the streams are given back after."""
    from ray._private.worker import print_worker_logs

    run_dir = StoragePath.of(tmp_path)
    runlog.write_json(run_dir / runlog.SWEEP_FILE, {"name": "p", "started_at": runlog.now_iso()})
    a = spec(run_dir, 0, epochs=2)
    monkeypatch.setattr(progress, "terminal_columns", lambda stream: 80)
    stream = Terminal(tty=True)
    monkeypatch.setattr(sys, "stdout", stream)  # the terminal the bar and Ray's lines share
    monkeypatch.setattr(sys, "stderr", stream)
    view = progress.SweepProgress(run_dir, [a], print, 1000.0, stream, FakeClock(1005.0))
    assert sys.stdout is not stream and sys.stderr is not stream
    raylet = {"pid": "raylet", "ip": "10.0.0.1", "localhost": "10.0.0.1", "lines": ["a raylet line", "another"]}
    print_worker_logs(raylet, sys.stdout)  # as ray._private.worker.print_to_stdstream does
    print("a warning", end="", file=sys.stderr)  # a line written in parts
    print(" in two parts", file=sys.stderr)
    view.event(a.name, {"start": 0})
    view.close()
    assert sys.stdout is stream and sys.stderr is stream
    rows = stream.getvalue().split("\n")
    for text in ("a raylet line", "another", "a warning in two parts", "t000-lr=0.1  starts"):
        [row] = [row for row in rows if text in row]
        shown = row.rsplit("\r", 1)[-1]  # what the row shows: what was written after its last carriage return
        assert text in shown and "epochs |" not in shown, rows
    assert rows[-1] == "" and rows[-2].rsplit("\r", 1)[-1].startswith("0/2 epochs |"), rows  # the bar, drawn again


def test_a_stream_that_is_no_terminal_is_left_as_it_is(tmp_path, monkeypatch):
    run_dir = StoragePath.of(tmp_path)
    stream = Terminal(tty=False)
    monkeypatch.setattr(sys, "stdout", stream)
    view = progress.SweepProgress(run_dir, [spec(run_dir, 0)], print, 1000.0, stream)
    assert sys.stdout is stream and view.bar is None
    view.close()


def test_a_quiet_sweep_says_once_per_quiet_spell_what_waits_for_the_cluster(tmp_path):
    """A slot whose worker group waits for cores that other work holds prints nothing else: after QUIET_S with no
    event, the view asks what waits (follow's look: placement.cores_awaited) and says it once; asked again only
    QUIET_S later, and once more after a new quiet spell. A look that fails says nothing and stops nothing."""
    run_dir, clock = StoragePath.of(tmp_path), FakeClock(1000.0)
    a = spec(run_dir, 0)
    answers = iter(["waiting for the cluster", None, RuntimeError("connection lost"), "waiting again"])
    looks: list[float] = []

    def awaited() -> str | None:
        looks.append(clock.now)
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    lines: list[str] = []
    view = progress.SweepProgress(run_dir, [a], lines.append, started=1000.0, clock=clock)
    for now in (1000 + progress.QUIET_S - 1, 1000 + progress.QUIET_S, 1500):
        clock.now = now
        view.tick(awaited)
    assert looks == [1000 + progress.QUIET_S] and lines == ["waiting for the cluster"]  # said once
    view.event(a.name, {"start": 0})  # a new quiet spell begins
    for now in (1500 + progress.QUIET_S, 1500 + 1.5 * progress.QUIET_S, 1500 + 2 * progress.QUIET_S):
        clock.now = now
        view.tick(awaited)  # nothing waits, then the look fails: nothing said
    for now in (1500 + 3 * progress.QUIET_S, 1500 + 4 * progress.QUIET_S):
        clock.now = now
        view.tick(awaited)
    assert looks == [1000 + progress.QUIET_S, *(1500 + k * progress.QUIET_S for k in (1, 2, 3))]
    assert lines[1:] == [lines[1], "waiting again"] and lines[1].startswith(a.name)
