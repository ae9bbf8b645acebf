"""What a running sweep prints: a header, a line per trial start, per finished epoch and per failure, and after
each trial ends where the sweep stands (status.progress_lines, what `cifar-ray status` counts), or on a terminal a
live bar. The lines come from the Dispatcher's events, read by a thread of the driver as they happen.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from ..core import runlog, status
from ..core.storage import StoragePath
from ..core.sweep import SweepPlan
from ..core.text import counted, rough_duration
from .dispatcher import RunTrial
from .placement import trials_at_once


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
    estimate_s: float | None = None,
) -> str:
    """The first thing a sweep prints: what runs, how many at once, where the logs go, and with `estimate_s`
    (sweep --estimate) how long it should take. `unfinished`: the trials a --resume still has to run."""
    shapes = trials_at_once(plan, capacity, limit)
    at_once = ", ".join(f"{fit} of {count} with {label}" for label, (count, fit) in shapes.items())
    nodes = capacity["nodes"]
    cpus, gpus = (counted(f"{capacity[kind]:g}", kind[:-1].upper()) for kind in ("cpus", "gpus"))
    where = f"{cpus}, {gpus} on {counted(nodes, 'node')}"
    trials = f"{len(plan.trials)} trial{'s' * (len(plan.trials) > 1)}"
    what = f"{plan.name}: {trials}"
    if unfinished is not None:
        what = f"resuming {plan.name}: {unfinished} of {trials} unfinished"
    expected = f"; estimated wall time ~{rough_duration(estimate_s)} (--estimate)" if estimate_s is not None else ""
    return f"{what}, at once: {at_once} ({where}); logs and checkpoints in {run_dir}{expected}"


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


class SweepProgress:
    """What a sweep prints as its trials go, from the Dispatcher's events in the order it got them: a line when a slot
    takes a trial (it starts or continues), per finished epoch and per failure, and where the sweep stands after each
    trial ends (the counts and ETA of `cifar-ray status`). Elapsed is this session's running time, from `started`
    (Unix time, `clock`'s): a resumed sweep does not count the time since its first session began.

    On a terminal (`stream.isatty()`) the lines go above a live bar of the epochs this session trains (those logged
    before it count as done), with the elapsed time and where the sweep stands; elsewhere every line is printed with
    `print_line`, the counts after each trial's end, as before."""

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
        self.specs = {spec.name: spec for spec in specs}
        self.bar = None
        if stream is not None and stream.isatty():
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

    def tick(self) -> None:
        """The bar's elapsed time moves on while no event comes."""
        if self.bar is not None:
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


FOLLOW_WAIT_S = 1.0  # the longest one read of the Dispatcher's events waits; the bar's clock ticks as often


@contextlib.contextmanager
def follow(
    read: Callable[[int, float], list], view: SweepProgress, wake: Callable[[], Any] | None = None
) -> Iterator[None]:
    """Prints the sweep's events while the body runs: a thread here reads them as they come, `read(since, wait_s)`
    giving the (trial, event) pairs from index `since` on (waiting up to wait_s for one), and hands each to `view` in
    that order; on the way out it prints what is left (`wake`: ends the thread's waiting read at once). Through Ray
    Client too: the thread runs in the client, and the Dispatcher it reads lives on the cluster."""
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
            view.tick()
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
