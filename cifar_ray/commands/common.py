"""What several commands share: the parser class, the option groups of `train` and `sweep`, and running a plan
(through api.execute_plan; the end-of-run summary table, the resume and rerun commands).

Importing this module imports neither torch nor Ray: the functions that need them import them when called.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import re
import shlex
import signal
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..core import runlog
from ..core.errors import UsageError
from ..core.storage import StoragePath, redact
from ..core.text import text_table

if TYPE_CHECKING:
    from ..core.sweep import SweepPlan

PROG = "cifar-ray"
INTERRUPTED = 130  # the exit status of a run stopped by Ctrl-C, as a shell reports SIGINT
TERMINATED = 143  # ... and by SIGTERM (kill, a scheduler's time limit, Slurm's or Kubernetes' stop)
_TERMINATED = threading.Event()  # the stop that came was SIGTERM


def _stop_as_ctrl_c(signum: int, frame: Any) -> None:
    """SIGTERM handled as Ctrl-C (trials marked interrupted, the summary, the resume command), its exit status 143.
    The KeyboardInterrupt is raised here, as Python's own SIGINT handler raises it, not sent as a SIGINT: a SIGTERM
    that Ray's start took (cluster/ray_start.ray_starting hands it on to this handler) stops at once, not at some later
    line."""
    _TERMINATED.set()
    raise KeyboardInterrupt


def stopped_status() -> int:
    """The exit status of a run that was stopped: TERMINATED after SIGTERM, else INTERRUPTED."""
    return TERMINATED if _TERMINATED.is_set() else INTERRUPTED


# train_acc: running mean over the epoch; train_eval_acc: training images evaluated like the test set.
# time_per_epoch_s: runlog.TIME_PER_EPOCH_RULE, as the report's; peak_mem_mb: the largest worker's peak;
# peak_mem_total_mb: the sum over workers (docs/semantics.md).
SUMMARY_COLUMNS = (
    "trial",
    "status",
    "epochs",
    "test_acc",
    "best_test_acc",
    "train_acc",
    "train_eval_acc",
    "time_per_epoch_s",
    "samples_per_s",
    "peak_mem_mb",
    "peak_mem_total_mb",
)
SET_OPTION, RESUME_OPTION, REPEATS_OPTION = "--set", "--resume", "--repeats"


def is_override(word: str) -> bool:
    return "=" in word and not word.startswith("-")


def overrides_apart(argv: Sequence[str]) -> list[str]:
    """`argv` with every KEY=VALUE that follows --set made a `--set=KEY=VALUE` word of its own, so that --set takes
    the KEY=VALUE words after it and no more: `--set a=1 b=2 FILE` -> `--set=a=1 --set=b=2 FILE`, the sweep file
    before or after. The first word without "=" ends them. A --set followed by no KEY=VALUE is left as it is, for
    argparse and parse_overrides to refuse as they always did. The parsers take no abbreviations (allow_abbrev=False),
    so --set is spelled out."""
    words = list(argv)
    apart: list[str] = []
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if word == "--":  # what follows is positional
            return apart + words[index - 1 :]
        option, sep, first = word.partition("=")
        if option != SET_OPTION:
            apart.append(word)
            continue
        overrides = [first] if sep else []
        while index < len(words) and is_override(words[index]):
            overrides.append(words[index])
            index += 1
        apart += [f"{SET_OPTION}={item}" for item in overrides] if overrides else [word]
    return apart


class Parser(argparse.ArgumentParser):
    """An argparse parser that takes no abbreviated options and raises a one-line UsageError for bad usage."""

    takes_overrides = False  # add_overrides sets it on the subcommands with --set

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message: str) -> None:  # argparse prints usage + exits 2; we want one line
        choice = re.match(r"argument \w+: invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if choice:  # a misspelt subcommand: `swep`
            word, choices = choice.group(1), re.findall(r"'([^']*)'", choice.group(2))
            close = difflib.get_close_matches(word, choices, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            message = f"unknown command '{word}'{hint}; allowed: {', '.join(choices)}"
        raise UsageError(message, self.prog)

    def parse_known_args(self, args=None, namespace=None):
        if self.takes_overrides:  # a subcommand's parser: argparse hands it the list of its words
            args = overrides_apart(args)
        return super().parse_known_args(args, namespace)


def add_command(subparsers: argparse._SubParsersAction, name: str, help: str, examples: Sequence[tuple[str, str]]):
    """A subcommand's parser, with `examples` ((what it does, the command), ...) at the end of its --help."""
    epilog = "examples:\n" + "\n".join(f"  # {what}\n  {line}" for what, line in examples)
    return subparsers.add_parser(
        name, help=help, description=help, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def add_overrides(parser: Parser) -> None:
    parser.add_argument(
        SET_OPTION,
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help="config overrides, before or after the other arguments, e.g. --set dataset=synthetic epochs=1",
    )
    parser.takes_overrides = True


def add_common(parser: Parser) -> None:
    """The options of the commands that run trials (train, sweep)."""
    add_overrides(parser)
    parser.add_argument(
        "--storage",
        default="runs",
        help="where run logs and checkpoints go: a folder (default: runs/) or a URI such as s3://bucket/runs; "
        "on a Ray cluster, a folder every node mounts at the same path or a URI",
    )
    parser.add_argument("--name", help="run name (folder under --storage)")
    parser.add_argument(
        "--max-concurrent",
        type=int,
        default=None,
        metavar="N",
        help="run at most N trials at once (default: the sweep file's max_concurrent, else as many as fit)",
    )
    parser.add_argument(
        "--address",
        default=None,
        help="existing Ray cluster: auto, HOST:PORT, or ray://HOST:10001 for Ray Client "
        "(default: $RAY_ADDRESS, else start a local Ray)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON on the last line")
    parser.add_argument(
        "--isolate",
        action="store_true",
        help="run each trial in a slot of its own, a Ray Train run that ends with the trial (fresh worker "
        "processes per trial: slower, see docs/measurements.md), instead of warm worker slots",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="profile a few steps of each trial's first epoch (torch.profiler, after warm-up steps): a Chrome trace "
        "and its top operators in the trial folder, shown by the report (docs/usage.md)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="show Ray's own logs")


def trial_result(trial: runlog.TrialLog) -> dict[str, Any]:
    """One trial as the --json output and summary see it: config, status, final metrics."""
    last = trial.epochs[-1] if trial.epochs else {}
    accs = [row["test_acc"] for row in trial.epochs if row.get("test_acc") is not None]
    per_epoch = runlog.time_per_epoch([row.get("epoch_time_s") for row in trial.epochs])
    return {
        "trial": trial.name,
        "status": trial.status,
        "error": trial.record.error,
        "swept": trial.swept,
        **trial.config,
        "epochs_done": len(trial.epochs),
        "best_test_acc": max(accs) if accs else None,
        **{k: v for k, v in last.items() if k != "epoch"},  # lr_last, lr_max: the config key lr is the peak
        "time_per_epoch_s": None if math.isnan(per_epoch) else per_epoch,
    }


def _cell(value: Any, key: str) -> str:
    if value is None:
        return "-"
    if key.endswith("acc"):
        return f"{100 * value:.1f}%"
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"
    return str(value)


def rows_table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    """`rows` as a terminal table of `columns`, each value formatted for its key (_cell)."""
    return text_table([[_cell(row.get(c), c) for c in columns] for row in rows], header=columns)


def best_trial_line(rows: list[dict[str, Any]], metric: str, mode: str) -> str | None:
    """The sweep's `metric`/`mode` (runlog.sweep_objective) say what "best" is: the finished trial with the best
    final value of that epoch metric, or None when no finished trial logged it. A trial, not a configuration: the
    report ranks configurations, seeds averaged."""
    scored = [r for r in rows if r["status"] == "finished" and isinstance(r.get(metric), (int, float))]
    if not scored:
        return None
    best = (max if mode == "max" else min)(scored, key=lambda r: r[metric])
    return (
        f"best trial by the sweep's metric ({metric}, {mode}, final epoch): {best['trial']} at "
        f"{_cell(best[metric], metric)}"
    )


def answer_lines(report) -> list[str]:
    """The report's first screen for the terminal (report/screen.py: the configurations, one answer line per factor
    value), the summary's last lines; none where the report has nothing to say yet (no trial finished)."""
    from ..report.screen import answer_text, config_text

    lines = answer_text(report)
    if not lines:
        return []
    return [
        "configurations:",
        *(f"  {line}" for line in config_text(report)),
        "answer:",
        *(f"  {line}" for line in lines),
    ]


def summary_rows(run: runlog.RunLog) -> list[dict[str, Any]]:
    return [trial_result(t) | {"epochs": f"{len(t.epochs)}/{t.config.get('epochs', '?')}"} for t in run.trials]


def run_plan_command(plan: SweepPlan, args: argparse.Namespace) -> int:
    from ..api import execute_plan

    # Ctrl-C (SIGINT) stops the sweep: run_plan marks the running trials interrupted, Ray stops, the summary and the
    # resume command follow. SIGTERM gets the same treatment.
    signal.signal(signal.SIGTERM, _stop_as_ctrl_c)  # kept across Ray's start (cluster/ray_start.ray_starting)
    # A shell starts a background job (`cifar-ray sweep ... &`) with SIGINT ignored, so Python sets no handler: Ctrl-C,
    # `kill -INT` and the SIGTERM above would do nothing.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if len(plan.trials) > 1 and os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR"):
        # A Ray job's code may come from its working_dir, which a node can delete while the sweep runs
        # (orchestrate.outliving_the_working_folder): what the summary imports is imported before
        from ..report import build_report  # noqa: F401
        from ..report.screen import answer_text  # noqa: F401
    try:
        run_dir = execute_plan(
            plan,
            args.storage,
            resume=getattr(args, "resume", False),  # `train` has no --resume
            resumable=args.command == "sweep",
            max_concurrent=args.max_concurrent,
            address=args.address,
            isolate=args.isolate,
            verbose=args.verbose,
            estimate=getattr(args, "estimate", False),  # `train` has no --estimate
            profile=args.profile,
            command=rerun_command(args.argv),
            print_line=lambda line: print(line, file=sys.stderr if args.json else sys.stdout, flush=True),
            stream=sys.stderr if args.json else sys.stdout,
            until_settled=getattr(args, "settle", None),  # sweep --until-settled
        )
    except KeyboardInterrupt:  # Ctrl-C: the trials are marked and Ray is stopped; say where the run stands
        run_dir = StoragePath.of(args.storage) / plan.name
        if not (run_dir / runlog.SWEEP_FILE).exists():  # stopped before the run began: nothing to show
            raise
    built = None
    if len(plan.trials) > 1:  # the report gives the answer, and the run it read gives the table
        from ..report import build_report

        built = build_report(run_dir)
    run = built.run if built else runlog.load_run(run_dir)
    rows = summary_rows(run)
    out = sys.stderr if args.json else sys.stdout
    print(f"\n{plan.name}: {len(rows)} trial(s), logs in {run_dir}", file=out)
    print(rows_table(rows, SUMMARY_COLUMNS), file=out)
    best = best_trial_line(rows, *runlog.sweep_objective(run.sweep)) if len(rows) > 1 else None
    if best:
        print(best, file=out)
    for line in answer_lines(built) if built else []:
        print(line, file=out)
    print(f"report: cifar-ray report {run_dir}", file=out)
    unfinished = [r["trial"] for r in rows if r["status"] not in runlog.FINAL_STATUSES]
    if unfinished and args.command == "sweep":
        print(f"interrupted: {len(unfinished)} trial(s) unfinished; continue with:\n  {resume_command(args)}", file=out)
    if args.json:
        results = [{k: v for k, v in r.items() if k != "epochs"} for r in rows]
        print(json.dumps(results[0] if args.command == "train" else results))
    if unfinished:
        return stopped_status()
    return 1 if any(r["status"] == "failed" for r in rows) else 0


def resume_command(args: argparse.Namespace) -> str:
    parts = [
        "cifar-ray",
        "sweep",
        shlex.quote(args.file),
        RESUME_OPTION,
        "--storage",
        shlex.quote(redact(args.storage)),
    ]
    if args.name:
        parts += ["--name", shlex.quote(args.name)]
    if args.address:
        parts += ["--address", shlex.quote(args.address)]
    if args.repeats is not None:
        parts += [REPEATS_OPTION, str(args.repeats)]
    if getattr(args, "until_settled", False):  # the looks go on; the run keeps its --max-seeds
        parts += ["--until-settled"] + (["--budget", f"{args.budget:g}s"] if args.budget is not None else [])
    if args.set:
        parts += [SET_OPTION, *map(shlex.quote, args.set)]
    return " ".join(parts)


def rerun_command(argv: Sequence[str]) -> str:
    """The command that runs this again as a user types it: `cifar-ray` and the words given (`argv`, without the
    program), --resume left out, shell-quoted, with no URI's user:secret@."""
    return shlex.join([PROG, *(redact(word) for word in argv if word != RESUME_OPTION)])
