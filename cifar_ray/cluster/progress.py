"""What a running sweep prints: a header, a line per trial start, per finished epoch and per failure, and after
each trial ends where the sweep stands (status.progress_line, what `cifar-ray status` counts).

Through Ray Client, Tune and its callbacks run in an actor on the cluster; a ProgressRelay actor carries
their lines to the client's terminal.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from ..core import runlog, status
from ..core.storage import StoragePath
from ..core.sweep import SweepPlan
from ..core.text import counted, rough_duration
from .dispatcher import RunTrial, tune_run_trial
from .placement import trials_at_once
from .slots import NOTE, STARTED


def format_epoch(trial: str, result: dict, epochs: int) -> str:
    return (
        f"{trial}  epoch {result['epoch']}/{epochs}  "
        f"train loss {result['train_loss']:.3f} acc {100 * result['train_acc']:5.1f}%  "
        f"test loss {result['test_loss']:.3f} acc {100 * result['test_acc']:5.1f}%  "
        f"{result['epoch_time_s']:.1f}s  {result['samples_per_s']:.0f} img/s  "
        f"{result['peak_mem_mb']:.0f} MB/worker peak" + ("  DIVERGED" if result.get("diverged") else "")
    )


def print_progress(line: str) -> None:
    """Where the progress callback writes; run_plan points it at the caller's printer. A module-level hook,
    not a closure, because Tune pickles its callbacks with the experiment and a restored sweep
    must print to the new process's terminal."""
    progress_printer[0](line)


PROGRESS_RELAY = "cifar-ray-progress"  # a named actor in the client's job (its own namespace)


def _relay_or_print(line: str) -> None:
    """The printer where run_plan set none: in Tune's actor on the cluster (Ray Client) it hands
    the line to the client's ProgressRelay, found by name (a restored sweep has a new one)."""
    import ray

    try:
        relay = ray.get_actor(PROGRESS_RELAY)
    except ValueError:  # no relay: not under Ray Client
        print(line, flush=True)
        return
    ray.get(relay.put.remote(line))  # waited for: the client's last take must see every line


progress_printer: list[Callable[[str], None]] = [_relay_or_print]


class ProgressRelay:
    """Holds progress lines from Tune's actor until the Ray Client driver takes them."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def put(self, line: str) -> None:
        self.lines.append(line)

    def take(self) -> list[str]:
        lines, self.lines = self.lines, []
        return lines


@contextlib.contextmanager
def progress_relay(print_line: Callable[[str], None], every_s: float = 0.5) -> Iterator[None]:
    """Through Ray Client, Tune and its callbacks run in an actor on the cluster, whose prints do
    not reach this terminal (log_to_driver is off unless --verbose): a ProgressRelay actor
    collects the epoch lines, and a thread here prints them while Tuner.fit() blocks. Enter it
    only when connected through Ray Client."""
    import threading

    import ray

    relay = ray.remote(num_cpus=0)(ProgressRelay).options(name=PROGRESS_RELAY).remote()
    stop = threading.Event()

    def forward() -> None:
        while True:
            last = stop.wait(every_s)
            try:
                lines = ray.get(relay.take.remote())
            except ray.exceptions.RayError:  # the connection or the relay is gone: nothing more to print
                return
            for line in lines:
                print_line(line)
            if last:
                return

    thread = threading.Thread(target=forward, name="cifar-ray-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)
        with contextlib.suppress(ConnectionError, ray.exceptions.RayError):  # a lost connection took it already
            ray.kill(relay)


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


def start_line(trial: RunTrial, done: int) -> str:
    what = f"continues after epoch {done}/{trial.config.epochs}" if done else "starts"
    return f"{trial.name}  {what}  {status.swept_text(trial.swept)}".rstrip()


def progress_callback():
    """The Tune callback that prints a sweep's progress from its thin trials' results. It only prints: the
    Dispatcher records every trial's state (slots.py)."""
    from ray.tune.progress_reporter import TrialProgressCallback

    class SweepProgress(TrialProgressCallback):
        """Our progress lines: one when a trial's slot takes it (starts or continues), one per finished epoch,
        one when a trial fails, and where the sweep stands after a trial ends. A TrialProgressCallback, so
        Tune adds none of its own: its `Trial ... completed. Last result:` line printed during --resume
        even with verbose=0."""

        def on_trial_start(self, iteration, trials, trial, **info):
            pass  # said when its slot takes it (the STARTED result): the thin trial starts before that

        def on_trial_result(self, iteration, trials, trial, result, **info):
            spec = tune_run_trial(trial.config)
            if STARTED in result:
                print_progress(start_line(spec, int(result[STARTED])))
            elif NOTE in result:
                print_progress(f"{spec.name}  {result[NOTE]}")
            elif "epoch" in result:
                print_progress(format_epoch(spec.name, result, spec.config.epochs))
                if result["epoch"] == spec.config.epochs or result.get("diverged"):
                    print_progress(status.progress_line(spec.run_dir))  # the Dispatcher recorded its end first

        def on_trial_error(self, iteration, trials, trial, **info):
            spec = tune_run_trial(trial.config)
            meta = runlog.read_json(spec.trial_file)
            error = meta.get("error") or f"see {runlog.ERROR_FILE}"
            print_progress(f"{spec.name}  {meta.get('status', 'failed').upper()}: {error}")
            print_progress(status.progress_line(spec.run_dir))

        def on_trial_complete(self, iteration, trials, trial, **info):
            pass

    return SweepProgress()
