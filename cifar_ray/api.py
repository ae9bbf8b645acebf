"""cifar-ray from Python (a notebook, a script): the functions the `cifar-ray` command itself is built on.

    import cifar_ray
    run = cifar_ray.sweep("sweeps/quickstart.yaml", {"epochs": 1})  # a sweep file or a dict -> Run
    run = cifar_ray.train({"dataset": "synthetic", "epochs": 1})    # one configuration -> Run
    run = cifar_ray.load("runs/quickstart")                          # a run folder -> Run
    with cifar_ray.pool(): cifar_ray.sweep(...); cifar_ray.sweep(...)  # the second reuses the first's warm slots
    run.trials, run.epochs                                           # pandas frames, as the report reads them
    run.report()                                                     # runs/quickstart/report/README.md, ...

Bad input raises the command line's one-line refusals as UserError subclasses (core/errors.py), before Ray starts
where it can; nothing here calls sys.exit. A Ray already initialised (ray.init in the notebook) is used as is and
left running; otherwise each run starts a local Ray (or connects to `address`) and shuts it down at the end.
Importing this module imports neither torch, Ray nor pandas: each function imports what it needs. docs/api.md walks
through it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from .core import lease
from .core.errors import RunInUseError, StorageError, UsageError
from .core.run import RunFolder, RunOptions
from .core.storage import StoragePath, local_write_refusal
from .core.text import rough_duration

if TYPE_CHECKING:
    import pandas as pd

    from .core.config import Overrides
    from .core.sweep import SweepPlan
    from .settling import Settle


def sweep_plan(
    source: str | os.PathLike | Mapping[str, Any],
    overrides: Overrides = None,
    name: str | None = None,
    repeats: int | None = None,
) -> SweepPlan:
    """The validated trials of a sweep file or of a sweep given as a dict (the file's keys: name, base, grid,
    repeats, ...), with `overrides` applied to every trial, `name` for the run folder and `repeats` seeds per grid
    point instead of the file's; runs nothing (`cifar-ray sweep FILE --dry-run`). Returns a core.sweep.SweepPlan;
    ConfigError for bad input."""
    from .core.config import override_values
    from .core.sweep import DICT_SOURCE, build_plan, load_sweep

    values = override_values(overrides)
    if isinstance(source, Mapping):
        return build_plan(dict(source), values, DICT_SOURCE, name, repeats)
    return load_sweep(source, values, name, repeats)


def resumed_sweep_plan(
    source: str | os.PathLike | Mapping[str, Any],
    overrides: Overrides = None,
    name: str | None = None,
    repeats: int | None = None,
    storage: str | os.PathLike | StoragePath = "runs",
) -> SweepPlan:
    """The plan a resume of the run in storage/<name> continues: its trials as it planned them, and new seeds'
    trials where `repeats` asks for more than it has (`sweep FILE --resume --repeats N`); the plain plan when the
    folder holds no run (the resume then says there is nothing to resume)."""
    from .core.config import override_values
    from .core.sweep import DICT_SOURCE, resumed_plan

    plan = sweep_plan(source, overrides, name, repeats)
    recorded = RunFolder(StoragePath.of(storage) / plan.name).sweep()
    if not recorded:
        return plan
    label = DICT_SOURCE if isinstance(source, Mapping) else None
    return resumed_plan(source, override_values(overrides), name, repeats, recorded, label)


def train_plan(overrides: Overrides = None, name: str | None = None) -> SweepPlan:
    """One trial: the default config with `overrides`, in a run named `name` (default train-<date>-<time>)."""
    from .core.config import override_values
    from .core.sweep import single_run_plan

    return single_run_plan(override_values(overrides), name or time.strftime("train-%Y%m%d-%H%M%S"))


def ensure_local_data(plan: SweepPlan) -> None:
    """CIFAR-10 in every data_dir of the plan, found or downloaded here before Ray starts: no data is then
    one DataError line in seconds, not a failed trial's traceback after 36 s of Ray start-up (measured
    offline). For the embedded Ray only: its workers read this machine's folders; a cluster node reads its own."""
    data_dirs = dict.fromkeys(t.config.data_dir for t in plan.trials if t.config.dataset == "cifar10")
    if data_dirs:
        from .training.data import ensure_cifar10  # imports torch: only for a plan that needs CIFAR-10

        for data_dir in data_dirs:
            ensure_cifar10(data_dir)


def check_local_gpus(plan: SweepPlan) -> None:
    """amp=bf16 on this machine's GPUs refused before the embedded Ray starts when one is older than Ampere
    (use_gpu auto or true: auto takes the GPUs where there are any). A cluster's workers refuse it themselves."""
    if any(t.config.amp == "bf16" and t.config.use_gpu != "false" for t in plan.trials):
        from .training.gpu import check_local_gpus_for_bf16  # imports torch: only for a plan that may need it

        check_local_gpus_for_bf16()


def check_max_concurrent(max_concurrent: int | None) -> None:
    if max_concurrent is not None and max_concurrent < 1:
        raise UsageError(f"--max-concurrent must be >= 1, got {max_concurrent}")


def settle_options(
    plan: SweepPlan,
    source: str | os.PathLike | Mapping[str, Any],
    overrides: Overrides = None,
    *,
    name: str | None = None,
    until_settled: bool = False,
    max_seeds: int | None = None,
    budget_s: float | None = None,
) -> Settle | None:
    """--until-settled's options checked against `plan` before Ray starts (one-line UsageError each): max_seeds and
    budget_s only with it; a grid with an accuracy comparison (a factor with two values or more), seeds added as
    repeats (not grid.seed), the sweep's metric test_acc (the report's verdicts are on it), max_seeds at least the
    plan's seeds and within REPEATS_MAX, a positive budget. None without until_settled."""
    from .core.sweep import REPEATS_MAX
    from .settling import Settle

    if not until_settled:
        given = [option for option, value in (("--max-seeds", max_seeds), ("--budget", budget_s)) if value is not None]
        if given:
            raise UsageError(f"{' and '.join(given)} bound the rounds of --until-settled; add --until-settled")
        return None
    if not any(len(values) > 1 for key, values in plan.grid.items() if key != "seed"):
        raise UsageError(
            "--until-settled adds seeds until the grid's comparisons are settled, but this grid compares nothing; "
            "allowed: a grid with a factor of two values or more"
        )
    if "seed" in plan.grid:
        raise UsageError("--until-settled adds seeds as repeats; allowed: a grid without a seed key")
    if plan.metric != "test_acc":
        raise UsageError(
            f"--until-settled settles the report's accuracy comparisons, but the sweep's metric is {plan.metric}; "
            "allowed: metric: test_acc"
        )
    if max_seeds is not None and not plan.repeats <= max_seeds <= REPEATS_MAX:
        raise UsageError(
            f"--max-seeds {max_seeds}: allowed: from the sweep's {plan.repeats} seeds per grid point to {REPEATS_MAX}"
        )
    if budget_s is not None and not budget_s > 0:
        raise UsageError(f"--budget {budget_s:g} s: allowed: a wall time above 0, e.g. 30m")
    return Settle(source, overrides, name, max_seeds, budget_s)


def execute_plan(
    plan: SweepPlan,
    storage: str | os.PathLike | StoragePath = "runs",
    *,
    resume: bool = False,
    resumable: bool = True,
    max_concurrent: int | None = None,
    address: str | None = None,
    isolate: bool = False,
    verbose: bool = False,
    estimate: bool = False,
    profile: bool = False,
    command: str | None = None,
    print_line: Callable[[str], None] = print,
    stream: TextIO | None = None,
    until_settled: Settle | None = None,
) -> StoragePath:
    """Run every trial of `plan` into storage/<plan name>; returns that folder. What `cifar-ray train` and `sweep`
    run once their arguments are parsed. Refused before Ray starts and before anything is written: a bad max_concurrent
    (None: the sweep file's, else as many as fit) or storage, a folder a live driver holds (RunInUseError;
    core/lease.py: the lease is held from here to the end), a folder that already holds a run (unless `resume`;
    `resumable`: whether the refusal offers --resume), a resume of no run or of another sweep's, and on the embedded
    Ray amp=bf16 on an old GPU and CIFAR-10 that cannot be had. Trial failures do not raise: each trial's status
    says how it ended. `command`: the shell command that runs this again, recorded in sweep.json (None from Python);
    `print_line` gets the progress lines, `stream` is where it prints them (a terminal gets a live progress
    bar instead). `estimate`: time the sweep's distinct steps here before Ray starts; the
    sweep's header repeats the estimate (sweep --estimate). `profile`: torch.profiler over a few steps of one epoch
    per trial (--profile; a trace in each trial folder). `until_settled` (settle_options): then rounds of added seeds
    until the comparisons are settled (settling.settle_rounds), on the same Ray; with a budget, the grid's estimate
    must fit it (refused before Ray starts)."""
    from .cluster import orchestrate, session  # these import Ray inside their functions only
    from .settling import rounds_pool, settle_resolved, settle_rounds

    check_max_concurrent(max_concurrent)
    options = RunOptions(
        storage=storage,
        resume=resume,
        max_concurrent=max_concurrent or plan.max_concurrent,
        isolate=isolate,
        address=address,
        profile=profile,
        command=command,
        print_line=print_line,
        stream=stream,
    )
    run = RunFolder(options.run_dir(plan.name))
    if until_settled:
        until_settled = settle_resolved(until_settled, plan, run, resume)
    _refuse_before_ray(run, plan, options, resumable)
    with lease.hold(run.path, print_line):  # before anything is written; run_plan holds it again, re-entrantly
        local = session.cluster_address(address) is None
        if local:
            check_local_gpus(plan)  # a refusal before the data download writes anything
            ensure_local_data(plan)
        budget = until_settled.budget_s if until_settled else None
        if estimate or (budget is not None and not resume and local):
            options = dataclasses.replace(options, estimate_s=_estimate_within(plan, options, budget))
        owns_ray = session.init_ray(address=address, verbose=verbose)
        try:
            with rounds_pool(until_settled is not None):
                run_dir = orchestrate.run_plan(plan, options, run)
                if until_settled:
                    resumed = dataclasses.replace(options, resume=True, estimate_s=None)
                    settle_rounds(
                        plan, until_settled, run, lambda more: orchestrate.run_plan(more, resumed, run), print_line
                    )
            return run_dir
        finally:
            if owns_ray:
                import ray

                ray.shutdown()


def _estimate_within(plan: SweepPlan, options: RunOptions, budget_s: float | None) -> float:
    """The sweep's expected wall time (sweep --estimate), timed here before Ray starts; refused when it cannot fit
    --until-settled's `budget_s`."""
    from .cluster.estimate import estimate_plan

    wall_s = estimate_plan(plan, options.max_concurrent, options.isolate, options.print_line).sweep.wall_s
    if budget_s is not None and wall_s > budget_s:
        raise UsageError(
            f"--budget {rough_duration(budget_s)} cannot fit the first round: its {len(plan.trials)} trials are "
            f"estimated at ~{rough_duration(wall_s)} here (sweep --estimate); allowed: a budget above that, or fewer "
            "or shorter trials"
        )
    return wall_s


def _refuse_before_ray(run: RunFolder, plan: SweepPlan, options: RunOptions, resumable: bool) -> None:
    """execute_plan's refusals, before Ray starts and before anything is written: storage that cannot be written, a
    live driver (first: the others would advise --resume on a run that another driver is training), a folder that
    holds a run (a new run) or none of this plan's (a resume)."""
    unwritable = local_write_refusal(run.path.path) if run.path.is_local else None  # a URI: the proof on Ray
    if unwritable:
        raise StorageError(
            f"--storage {options.storage} cannot be written: {unwritable}; allowed: a folder you can write"
        )
    refusal = lease.live_driver_refusal(run.path)
    if refusal:
        raise RunInUseError(refusal)
    run.admit(plan, options.resume, resumable)


def sweep(
    source: str | os.PathLike | Mapping[str, Any],
    overrides: Overrides = None,
    *,
    name: str | None = None,
    storage: str | os.PathLike = "runs",
    resume: bool = False,
    repeats: int | None = None,
    max_concurrent: int | None = None,
    address: str | None = None,
    isolate: bool = False,
    verbose: bool = False,
    profile: bool = False,
    print_line: Callable[[str], None] = print,
    until_settled: bool = False,
    max_seeds: int | None = None,
    budget_s: float | None = None,
) -> Run:
    """Run a sweep file, or a sweep given as a dict, with `overrides` on every trial (`cifar-ray sweep`); returns
    the run folder loaded (Run). `resume`: finish an interrupted run of the same sweep, overrides and name;
    `repeats`: seeds per grid point instead of the file's (with `resume`, more than the run has adds the new seeds'
    trials to it); `profile`: a torch.profiler trace of a few steps of each trial (`--profile`). `until_settled`:
    then add seeds, round by round, where comparisons are open, up to `max_seeds` per configuration and within
    `budget_s` seconds of wall time (docs/settle.md)."""
    plan = (
        resumed_sweep_plan(source, overrides, name, repeats, storage)
        if resume
        else sweep_plan(source, overrides, name, repeats)
    )
    settle = settle_options(
        plan,
        source,
        overrides,
        name=name,
        until_settled=until_settled,
        max_seeds=max_seeds,
        budget_s=budget_s,
    )
    run_dir = execute_plan(
        plan,
        storage,
        resume=resume,
        max_concurrent=max_concurrent,
        address=address,
        isolate=isolate,
        verbose=verbose,
        profile=profile,
        print_line=print_line,
        until_settled=settle,
    )
    return load(run_dir)


@contextlib.contextmanager
def pool(address: str | None = None, verbose: bool = False) -> Iterator[None]:
    """Warm slots that outlive a sweep: inside `with cifar_ray.pool():`, a sweep of the same trial shape as the
    one before reuses its worker slots (no Ray Train start-up); a change of shape or of cifar_ray's code gets fresh
    ones (cluster/pool.py). Uses a running Ray (ray.init() first) and leaves it running, else starts one (or
    connects to `address`) and shuts it down at the end; every slot ends with the context."""
    from .cluster import session
    from .cluster.pool import activate

    owns_ray = session.init_ray(address=address, verbose=verbose)
    try:
        with activate():
            yield
    finally:
        if owns_ray:
            import ray

            ray.shutdown()


def train(
    overrides: Overrides = None,
    *,
    name: str | None = None,
    storage: str | os.PathLike = "runs",
    address: str | None = None,
    isolate: bool = False,
    verbose: bool = False,
    profile: bool = False,
    print_line: Callable[[str], None] = print,
) -> Run:
    """Train one configuration, the default config with `overrides` (`cifar-ray train`); returns the run folder
    loaded (Run) with its one trial. `profile`: as for sweep."""
    run_dir = execute_plan(
        train_plan(overrides, name),
        storage,
        resumable=False,
        address=address,
        isolate=isolate,
        verbose=verbose,
        profile=profile,
        print_line=print_line,
    )
    return load(run_dir)


def _baseline_values(baseline: Mapping[str, Any] | str | None) -> dict[str, Any] | None:
    from .core.strict_yaml import parse_value

    if baseline is None or isinstance(baseline, Mapping):
        return dict(baseline) if baseline else None
    key, sep, value = baseline.partition("=")
    if not sep:
        raise UsageError(f"--baseline expects KEY=VALUE, got '{baseline}'")
    return {key.strip(): parse_value(value.strip())}


def report(
    runs: str | os.PathLike | StoragePath | Sequence[str | os.PathLike | StoragePath],
    out: str | os.PathLike | None = None,
    baseline: Mapping[str, Any] | str | None = None,
    fmt: str = "md",
    margin_pp: float | None = None,
    force: bool = False,
    target: float | None = None,
) -> Path:
    """Write the report of one run folder, or of several compared (a list), into `out` (default: RUN_DIR/report
    for a local run, else reports/<sweep name>, refused where git tracks files unless `force`), as `cifar-ray
    report` does; returns its main file: README.md with plots (fmt="md"), or that of another format of
    report.FORMATS (trials.csv, report.json, ...). `baseline`: {key: grid value} or "KEY=VALUE", the reference of
    the deltas; `margin_pp`: the equivalence margin of accuracy effects (None: the report's default); `target`: a
    test accuracy (0.85) whose time to reach is compared (None: the sweep file's, if any). ConfigError or UsageError
    for bad input."""
    from .report import write_report

    judging = {} if margin_pp is None else {"margin_pp": margin_pp}
    judging |= {} if target is None else {"target": target}
    return write_report(runs, out_dir=out, baseline=_baseline_values(baseline), fmt=fmt, force=force, **judging)


def load(run_dir: str | os.PathLike | StoragePath) -> Run:
    """A run folder (or URI) read once into a Run; ConfigError when it holds no run or no trial.
    A sweep still running: load it again for newer epochs."""
    from .report import build_report

    built = build_report(run_dir)
    return Run(built.run.path, built.name, built.run.sweep.get("description", ""), built.trials, built.epochs)


@dataclass(frozen=True, repr=False)
class Run:
    """A run folder as frames: `trials` has one row per trial (status, swept values, final and best accuracy,
    time per epoch, memory, ...), `epochs` one row per trial and epoch, both as the report computes them
    (report/load.py). Displayed in a notebook, it shows its trial table."""

    path: StoragePath
    name: str
    description: str
    trials: pd.DataFrame
    epochs: pd.DataFrame

    def report(
        self,
        out: str | os.PathLike | None = None,
        baseline: Mapping[str, Any] | str | None = None,
        fmt: str = "md",
        margin_pp: float | None = None,
        force: bool = False,
        target: float | None = None,
    ) -> Path:
        """This run's report (see the module's `report`)."""
        return report(self.path, out, baseline, fmt, margin_pp, force, target)

    def status_counts(self) -> dict[str, int]:
        """How many trials ended (or stand) in each status: {"finished": 3, "failed": 1}."""
        return {str(status): int(count) for status, count in self.trials["status"].value_counts(sort=False).items()}

    def _summary(self) -> str:
        counts = ", ".join(f"{count} {status}" for status, count in self.status_counts().items())
        return f"{self.name}: {len(self.trials)} trial(s) ({counts}) in {self.path}"

    def __repr__(self) -> str:
        return f"<Run {self._summary()}>"

    def _repr_html_(self) -> str:
        """The notebook's view: a line naming the run, then the trial table."""
        description = f"<br>{escape(self.description)}" if self.description else ""
        table = self.trials.to_html(index=False, na_rep="—", float_format="{:.4g}".format)
        return f"<p><b>{escape(self._summary())}</b>{description}</p>\n{table}"
