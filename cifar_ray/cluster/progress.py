"""What a running sweep prints: a header, a line per trial start, per finished epoch and per failure, and after
each trial ends where the sweep stands (status.progress_lines, what `cifar-ray status` counts), or on a terminal a
live bar. The lines come from the Dispatcher's events, read by a thread of the driver as they happen.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from ..core import runlog, status, sysinfo
from ..core.estimate import rough_estimate, rough_line
from ..core.run import RunOptions
from ..core.storage import StoragePath
from ..core.sweep import SweepPlan
from ..core.text import counted, rough_duration
from .dispatcher import RunTrial
from .placement import trials_at_once
from .session import cluster_address


def format_epoch(trial: str, result: dict, epochs: int) -> str:
    return (
        f"{trial}  epoch {result['epoch']}/{epochs}  "
        f"train loss {result['train_loss']:.3f} acc {100 * result['train_acc']:5.1f}%  "
        f"test loss {result['test_loss']:.3f} acc {100 * result['test_acc']:5.1f}%  "
        f"{result['epoch_time_s']:.1f}s  {result['samples_per_s']:.0f} img/s  "
        f"{result['peak_mem_mb']:.0f} MB/worker peak" + ("  DIVERGED" if result.get("diverged") else "")
    )


def sweep_header(
    plan: SweepPlan,
    capacity: dict[str, Any],
    limit: int | None,
    run_dir: StoragePath,
    unfinished: int | None = None,
    options: RunOptions | None = None,
) -> str:
    """The first thing a sweep prints: what runs, how many at once, where the logs go, and how long it should take:
    with `options.estimate_s` (sweep --estimate) the timed estimate, else for a new run a rough one from default CPU
    speeds (`options.isolate`: a slot per trial), which above 100 trials or an hour suggests timing it first
    (`options.command`: the command line that runs it, None from Python). `unfinished`: the trials a --resume still
    has to run."""
    options = options or RunOptions()
    shapes = trials_at_once(plan, capacity, limit)
    at_once = ", ".join(f"{fit} of {count} with {label}" for label, (count, fit) in shapes.items())
    nodes = capacity["nodes"]
    cpus, gpus = (counted(f"{capacity[kind]:g}", kind[:-1].upper()) for kind in ("cpus", "gpus"))
    where = f"{cpus}, {gpus} on {counted(nodes, 'node')}"
    trials = f"{len(plan.trials)} trial{'s' * (len(plan.trials) > 1)}"
    what = f"{plan.name}: {trials}"
    if unfinished is not None:
        what = f"resuming {plan.name}: {unfinished} of {trials} unfinished"
    if options.estimate_s is not None:
        expected = f"; estimated wall time ~{rough_duration(options.estimate_s)} (--estimate)"
    elif unfinished is None:
        fits = {label: fit for label, (_, fit) in shapes.items()}
        rough = rough_estimate([t.config for t in plan.trials], fits, options.isolate)
        load = sysinfo.machine_load() if capacity["nodes"] == 1 and cluster_address(options.address) is None else None
        expected = "; " + rough_line(rough, len(plan.trials), estimate_command(options.command), load)
    else:
        expected = ""
    return f"{what}, at once: {at_once} ({where}); logs and checkpoints in {run_dir}{expected}"


def estimate_command(command: str | None) -> str:
    """The command that times a sweep before it runs: the sweep's own command line (a `cifar-ray sweep ...`) with
    --dry-run --estimate, else the general form."""
    words = (command or "").split()
    if words[1:2] == ["sweep"] and "--dry-run" not in words:
        return f"{command} --dry-run --estimate"
    return "cifar-ray sweep FILE --dry-run --estimate"


def start_line(trial: RunTrial, done: int, logged: int) -> str:
    """`starts`, `continues after epoch 2/3`, `has trained every epoch: closes it` (a trial whose driver died before
    it was marked), or `starts again from epoch 1` (epochs logged, but no checkpoint to continue from)."""
    epochs = trial.config.epochs
    if done >= epochs:
        what = f"has trained all {epochs} epochs: closes it"
    elif done:
        what = f"continues after epoch {done}/{epochs}"
    else:
        what = "starts again from epoch 1 (no checkpoint to continue from)" if logged else "starts"
    return f"{trial.name}  {what}  {status.swept_text(trial.swept)}".rstrip()


def progress_callback():
    """A Tune callback that prints nothing: a TrialProgressCallback among the callbacks keeps Tune from adding its
    own, whose `Trial ... completed. Last result:` lines printed during --resume even with verbose=0. The sweep's
    lines come from the Dispatcher's events (`follow`), not from Tune's thin trials, which Tune starts only a few at a
    time and whose results reach it late and interleaved."""
    from ray.tune.progress_reporter import TrialProgressCallback

    class Silent(TrialProgressCallback):
        def on_trial_start(self, iteration, trials, trial, **info):
            pass

        def on_trial_result(self, iteration, trials, trial, result, **info):
            pass

        def on_trial_error(self, iteration, trials, trial, **info):
            pass

        def on_trial_complete(self, iteration, trials, trial, **info):
            pass

    return Silent()


def terminal_columns(stream: TextIO) -> int:
    """The width of the terminal `stream` writes to; 0 when it has none or reports none (a size of 0x0: CI logs,
    `script`, some IDE consoles), where a bar would draw nothing."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
        return 0
    return size.columns if size.lines > 0 else 0


class AboveBar(io.TextIOBase):
    """sys.stdout or sys.stderr while `bar` is drawn: each whole line written goes above the bar (cleared, the line
    written, the bar drawn again, under tqdm's lock), not into the bar's row, where it left a copy of the bar behind.
    What Ray prints in the driver while a sweep runs (its workers' and the raylet's lines, its logger's) looks these
    streams up as it prints (ray._private.worker.print_to_stdstream, ray._private.log.PlainRayHandler)."""

    def __init__(self, stream: TextIO, bar: Any):
        super().__init__()
        self.stream, self.bar = stream, bar
        self._pending = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            lines = (self._pending + text).split("\n")
            self._pending = lines.pop()
        if lines:
            with self.bar.get_lock():
                self.bar.clear()
                self.stream.write("".join(line + "\n" for line in lines))
                self.stream.flush()
                self.bar.refresh()
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def close_line(self) -> None:
        """What is left of a line not ended, written as it is."""
        with self._lock:
            pending, self._pending = self._pending, ""
        if pending:
            self.stream.write(pending)

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", "utf-8")


def route_above(bar: Any) -> Callable[[], None]:
    """Sends what is printed to sys.stdout and sys.stderr above `bar` (AboveBar) until the returned function is
    called; a stream replaced meanwhile by someone else is left as it is then."""
    routed = {name: AboveBar(getattr(sys, name), bar) for name in ("stdout", "stderr")}
    for name, stream in routed.items():
        setattr(sys, name, stream)

    def unroute() -> None:
        for name, stream in routed.items():
            if getattr(sys, name) is stream:
                setattr(sys, name, stream.stream)
            stream.close_line()

    return unroute


QUIET_S = 60.0  # how long a sweep with no event goes before SweepProgress asks what waits for the cluster


class SweepProgress:
    """What a sweep prints as its trials go, from the Dispatcher's events in the order it got them: a line when a slot
    takes a trial (it starts or continues), per finished epoch and per failure, and where the sweep stands after each
    trial ends (the counts and ETA of `cifar-ray status`). Elapsed is this session's running time, from `started`
    (Unix time, `clock`'s): a resumed sweep does not count the time since its first session began.

    On a terminal (`stream.isatty()`, of a known size: terminal_columns) the lines go above a live bar of the epochs
    this session trains (those logged before it count as done), with the elapsed time and where the sweep stands, and
    so do the lines Ray prints meanwhile (route_above); elsewhere (a pipe, a file, a terminal of size 0x0 or unknown:
    CI logs, `script`, some IDE consoles) every line is printed with `print_line`, the counts after each trial's
    end."""

    def __init__(
        self,
        run_dir: StoragePath,
        specs: list[RunTrial],
        print_line: Callable[[str], None],
        started: float,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.run_dir, self.print_line, self.started, self.clock = run_dir, print_line, started, clock
        self.quiet_since, self.told_awaited = clock(), False
        self.specs = {spec.name: spec for spec in specs}
        self.bar = None
        self._unroute: Callable[[], None] | None = None
        if stream is not None and stream.isatty() and terminal_columns(stream) > 0:
            from tqdm import tqdm

            self.logged = {spec.name: len(runlog.read_epochs(spec.trial_dir)) for spec in specs}
            self.bar = tqdm(
                total=sum(spec.config.epochs for spec in specs),
                initial=sum(self.logged.values()),
                file=stream,
                bar_format="{n_fmt}/{total_fmt} epochs |{bar}| {elapsed} this session · {desc}",
                desc=f"{len(specs)} trial{'s' * (len(specs) != 1)} to train",
                dynamic_ncols=True,
                delay=1e-9,  # shown first below, once its clock is this session's
            )
            self.bar._time = clock  # the bar's elapsed is this session's, as the lines' is
            self.bar.start_t = started
            self.bar.refresh()
            self._unroute = route_above(self.bar)

    def elapsed_s(self) -> float:
        return self.clock() - self.started

    def _say(self, line: str) -> None:
        if self.bar is None:
            self.print_line(line)
        else:
            self.bar.write(line, file=self.bar.fp)

    def _stands(self) -> None:
        """Where the sweep stands, once a trial ended: a line, or the bar's description; in a round of --until-settled
        also what its open comparisons wait for (a line, above the bar)."""
        now = self.clock()  # read once: the elapsed time and the ETA are of one moment
        if self.bar is None:
            totals, round_line = status.progress_lines(self.run_dir, now, self.started)
            self.print_line(totals)
        else:
            totals, round_line = status.progress_lines(self.run_dir, now, None)
            self.bar.set_description_str(totals, refresh=True)
        if round_line:
            self._say(round_line)

    def _epochs(self, trial: str, logged: int) -> None:
        if self.bar is not None and logged > self.logged[trial]:
            self.bar.update(logged - self.logged[trial])
            self.logged[trial] = logged

    def _ended_early(self, trial: str) -> None:
        """A trial that failed or diverged trains no more epochs: the bar's total stops counting them."""
        if self.bar is not None:
            self.bar.total -= self.specs[trial].config.epochs - self.logged[trial]
            self.logged[trial] = self.specs[trial].config.epochs
            self.bar.refresh()

    def event(self, trial: str, event: dict) -> None:
        """One of the Dispatcher's events about `trial` (dispatcher.Dispatcher._tell)."""
        self.quiet_since, self.told_awaited = self.clock(), False
        spec = self.specs[trial]
        if "start" in event:
            self._say(start_line(spec, event["start"], event.get("logged", event["start"])))
            self._epochs(trial, event["start"])
        elif "epoch" in event:
            self._say(format_epoch(trial, event["epoch"], spec.config.epochs))
            self._epochs(trial, event["epoch"]["epoch"])
        elif "note" in event:  # a line its trial's log must say (Dispatcher.note: a checkpoint passed over)
            self._say(f"{trial}  {event['note']}")
        elif "failed" in event:
            self._say(f"{trial}  {event.get('status', 'failed').upper()}: {event['failed']}")
            self._ended_early(trial)
            self._stands()
        elif "done" in event:
            self._ended_early(trial)  # a diverged trial ends before its last epoch
            self._stands()

    def tick(self, awaited: Callable[[], str | None] | None = None) -> None:
        """The bar's elapsed time moves on while no event comes. After QUIET_S without one, and again each QUIET_S,
        `awaited` is asked whether placement groups wait for the cluster's resources: its line is said once per
        quiet spell (a slot waiting for cores held by other work prints nothing else, for as long as they are)."""
        if self.bar is not None:
            self.bar.refresh()
        now = self.clock()
        if awaited is not None and not self.told_awaited and now - self.quiet_since >= QUIET_S:
            self.quiet_since = now
            try:
                line = awaited()
            except Exception:  # a look at the cluster that fails tells nothing; the sweep's own errors come as events
                line = None
            if line:
                self._say(line)
                self.told_awaited = True

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self._unroute is not None:
            self._unroute()
            self._unroute = None


FOLLOW_WAIT_S = 1.0  # the longest one read of the Dispatcher's events waits; the bar's clock ticks as often


@contextlib.contextmanager
def follow(
    read: Callable[[int, float], list],
    view: SweepProgress,
    wake: Callable[[], Any] | None = None,
    awaited: Callable[[], str | None] | None = None,
) -> Iterator[None]:
    """Prints the sweep's events while the body runs: a thread here reads them as they come, `read(since, wait_s)`
    giving the (trial, event) pairs from index `since` on (waiting up to wait_s for one), and hands each to `view` in
    that order, then ticks it (`awaited`: its look at what waits for the cluster); on the way out it prints what is
    left (`wake`: ends the thread's waiting read at once). Through Ray Client too: the thread runs in the client, and
    the Dispatcher it reads lives on the cluster."""
    import threading

    stop = threading.Event()

    def forward() -> None:
        seen = 0
        while True:
            last = stop.is_set()
            try:
                events = read(seen, 0.0 if last else FOLLOW_WAIT_S)
            except Exception:  # the Dispatcher or the connection is gone: nothing more to print
                return
            seen += len(events)
            for trial, event in events:
                view.event(trial, event)
            view.tick(awaited)
            if last:
                return

    thread = threading.Thread(target=forward, name="cifar-ray-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        if wake is not None:
            wake()
        thread.join(timeout=10)
        view.close()


def dispatcher_events(dispatcher) -> Callable[[int, float], list]:
    """`follow`'s read of a running Dispatcher actor."""
    import ray

    return lambda since, wait_s: ray.get(dispatcher.events.remote(since, wait_s))
