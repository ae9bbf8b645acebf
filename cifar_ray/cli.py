"""`cifar-ray` command line: a thin layer over the library (config, sweep, orchestrate, report).

torch, Ray, pyarrow and pydantic are imported only by the commands that use them, so `--help`, `--version`,
usage errors, `--dry-run` and the refusals before a run answer in well under a second instead of 3-4 s.
Each subcommand is a subparser in build_parser and a handler in HANDLERS.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from . import runlog
from .errors import UserError
from .storage import StoragePath, redact
from .viewers import TARGETS  # viewers.py imports its viewer packages only when it writes

if TYPE_CHECKING:
    from .sweep import SweepPlan

PROG = "cifar-ray"
USAGE_ERROR = 2
# train_acc: running mean over the epoch; train_eval_acc: training images evaluated like the test set.
# peak_mem_mb: the largest worker's peak; peak_mem_total_mb: the sum over workers (README, "Semantics").
SUMMARY_COLUMNS = (
    "trial",
    "status",
    "epochs",
    "test_acc",
    "best_test_acc",
    "train_acc",
    "train_eval_acc",
    "epoch_time_s",
    "samples_per_s",
    "peak_mem_mb",
    "peak_mem_total_mb",
)
# The shortest abbreviation argparse resolves to each option (no other option of train or sweep begins with it).
SET_OPTION, SET_SHORTEST = "--set", "--se"
RESUME_OPTION, RESUME_SHORTEST = "--resume", "--r"


class UsageError(UserError):
    """A one-line usage error, printed as `PROG: error: MESSAGE`; `prog` names the (sub)command."""

    def __init__(self, message: str, prog: str = PROG) -> None:
        super().__init__(message)
        self.prog = prog


def spells(word: str, option: str, shortest: str) -> bool:
    """Whether argparse reads `word` as `option`: the option or an abbreviation no shorter than `shortest`,
    alone or as `option=VALUE`."""
    flag = word.partition("=")[0]
    return flag.startswith(shortest) and option.startswith(flag)


def is_override(word: str) -> bool:
    return "=" in word and not word.startswith("-")


def overrides_apart(argv: Sequence[str]) -> list[str]:
    """`argv` with every KEY=VALUE that follows --set made a `--set=KEY=VALUE` word of its own, so that --set takes
    the KEY=VALUE words after it and no more: `--set a=1 b=2 FILE` -> `--set=a=1 --set=b=2 FILE`, the sweep file
    before or after. The first word without "=" ends them. A --set followed by no KEY=VALUE is left as it is, for
    argparse and parse_overrides to refuse as they always did."""
    words = list(argv)
    apart: list[str] = []
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if word == "--":  # what follows is positional
            return apart + words[index - 1 :]
        if not spells(word, SET_OPTION, SET_SHORTEST):
            apart.append(word)
            continue
        _, sep, first = word.partition("=")
        overrides = [first] if sep else []
        while index < len(words) and is_override(words[index]):
            overrides.append(words[index])
            index += 1
        apart += [f"{SET_OPTION}={item}" for item in overrides] if overrides else [word]
    return apart


class Parser(argparse.ArgumentParser):
    takes_overrides = False  # add_overrides sets it on the subcommands with --set

    def error(self, message: str) -> None:  # argparse prints usage + exits 2; we want one line
        raise UsageError(message, self.prog)

    def parse_known_args(self, args=None, namespace=None):
        if self.takes_overrides:  # a subcommand's parser: argparse hands it the list of its words
            args = overrides_apart(args)
        return super().parse_known_args(args, namespace)


class VersionAction(argparse.Action):
    """--version: the installed package's version, looked up only when asked (importlib.metadata imports email,
    zipfile and more: tens of ms that every other command would pay)."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"{PROG} {version(PROG)}")
        except PackageNotFoundError:
            raise UsageError(f"the {PROG} package is not installed, so it has no version; pip install -e .") from None
        parser.exit()


def trial_result(trial: runlog.TrialLog) -> dict[str, Any]:
    """One trial as the --json output and summary see it: config, status, final metrics."""
    last = trial.epochs[-1] if trial.epochs else {}
    accs = [row["test_acc"] for row in trial.epochs if row.get("test_acc") is not None]
    return {
        "trial": trial.name,
        "status": trial.status,
        "error": trial.meta.get("error"),
        "swept": trial.swept,
        **trial.config,
        "epochs_done": len(trial.epochs),
        "best_test_acc": max(accs) if accs else None,
        # the epoch's "lr" is the scheduled value; the config key lr (peak LR) keeps its name
        **{("final_lr" if k == "lr" else k): v for k, v in last.items() if k != "epoch"},
    }


def _cell(value: Any, key: str) -> str:
    if value is None:
        return "-"
    if key.endswith("acc"):
        return f"{100 * value:.1f}%"
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"
    return str(value)


def text_table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    cells = [[_cell(row.get(c), c) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) if cells else len(c) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)


def best_trial_line(rows: list[dict[str, Any]], metric: str, mode: str) -> str | None:
    """The sweep file's `metric`/`mode` say what "best" is: the finished trial with the best final
    value of that epoch metric, or None when no finished trial logged it."""
    scored = [r for r in rows if r["status"] == "finished" and isinstance(r.get(metric), (int, float))]
    if not scored:
        return None
    best = (max if mode == "max" else min)(scored, key=lambda r: r[metric])
    return (
        f"best by the sweep's metric ({metric}, {mode}, final epoch): {best['trial']} at {_cell(best[metric], metric)}"
    )


def summary_rows(run_dir: runlog.Where) -> list[dict[str, Any]]:
    return [
        trial_result(t) | {"epochs": f"{len(t.epochs)}/{t.config.get('epochs', '?')}"}
        for t in runlog.load_run(run_dir).trials
    ]


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
        help="run at most N trials at once (default: as many as fit)",
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
        "processes per trial, ~20 s more per trial on 2 CPU cores), instead of warm worker slots",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="show Ray's own logs")


# Shown at the end of each subcommand's --help: (what it does, the command). tests/test_cli.py parses and checks
# every command, so they stay correct.
EXAMPLES = {
    "train": (
        (
            "synthetic data (nothing to download), 2 data-parallel workers, 3 epochs",
            "cifar-ray train --set dataset=synthetic train_subset=5000 test_subset=1000 workers=2 epochs=3",
        ),
        (
            "CIFAR-10 (downloaded on first use) with ResNet-9; logs in runs/resnet9",
            "cifar-ray train --set model=resnet9 epochs=5 --name resnet9",
        ),
        (
            "on the Ray cluster that `ray start` runs on this machine, logs in a folder every node mounts",
            "cifar-ray train --address auto --storage /mnt/shared/runs --set workers=2",
        ),
    ),
    "sweep": (
        (
            "the trial table and the work to do, without running anything",
            "cifar-ray sweep sweeps/batch_size.yaml --dry-run",
        ),
        ("the demo: synthetic data, 4 trials; logs in runs/quickstart", "cifar-ray sweep sweeps/quickstart.yaml"),
        (
            "every trial shorter, on synthetic data (--set before or after the file); logs in runs/batch-size-short",
            "cifar-ray sweep --set dataset=synthetic epochs=1 sweeps/batch_size.yaml --name batch-size-short",
        ),
        (
            "finish an interrupted run (with the --storage, --name and --set it was started with)",
            "cifar-ray sweep sweeps/quickstart.yaml --resume",
        ),
    ),
    "report": (
        ("README.md with tables and plots in reports/quickstart", "cifar-ray report runs/quickstart"),
        (
            "deltas measured against batch size 128, written beside the run",
            "cifar-ray report runs/batch-size --baseline batch_size=128 --out runs/batch-size-report",
        ),
        ("the aggregated tables as CSV files in reports/batch-size", "cifar-ray report runs/batch-size --format csv"),
        (
            "the quickstart run here vs the same sweep run on a GPU box (its run folder copied into gpu-runs/): "
            "one more factor, run; -> reports/runs-quickstart-vs-gpu-runs-quickstart",
            "cifar-ray report runs/quickstart gpu-runs/quickstart",
        ),
    ),
    "check": (
        ("every check, on the GPU when torch sees one", "cifar-ray check"),
        ("every check on the CPU, with Ray's own logs", "cifar-ray check --use-gpu false -v"),
    ),
    "status": (
        (
            "a line per trial (finished, running: epoch k of n, ...), the totals and an ETA",
            "cifar-ray status runs/quickstart",
        ),
        ("the same as one JSON object, for scripts", "cifar-ray status runs/quickstart --json"),
    ),
    "export": (
        (
            "TensorBoard logs in runs/quickstart/tensorboard (open: tensorboard --logdir runs/quickstart/tensorboard)",
            "cifar-ray export runs/quickstart --to tensorboard",
        ),
        (
            "an MLflow experiment in runs/quickstart/mlflow.db (SQLite, offline)",
            "cifar-ray export runs/quickstart --to mlflow",
        ),
        ("to an MLflow tracking server", "cifar-ray export runs/quickstart --to mlflow --out http://localhost:5000"),
    ),
    "keys": (
        ("every key --set and sweep files take: type, allowed values, default, meaning", "cifar-ray keys"),
        ("the same as the Markdown table in README.md", "cifar-ray keys --markdown"),
    ),
    "bench": (
        ("a smaller, faster run (what CI runs)", "cifar-ray bench --quick --out reports/bench-quick"),
        ("the full benchmark behind reports/bench/README.md", "cifar-ray bench"),
    ),
}


def examples_epilog(command: str) -> str:
    return "examples:\n" + "\n".join(f"  # {what}\n  {line}" for what, line in EXAMPLES[command])


def build_parser() -> Parser:
    parser = Parser(prog=PROG, description="Ray-based sweep orchestrator for CIFAR-10 CNN training.")
    parser.add_argument("--version", action=VersionAction, help="print the version and exit")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    def add_command(name: str, help: str) -> Parser:
        return commands.add_parser(
            name, help=help, epilog=examples_epilog(name), formatter_class=argparse.RawDescriptionHelpFormatter
        )

    train = add_command("train", "train one configuration data-parallel through Ray Train")
    add_common(train)
    sweep = add_command("sweep", "run a sweep file (a grid of trials) through Ray Tune")
    sweep.add_argument("file", help="sweep YAML file, e.g. sweeps/quickstart.yaml")
    add_common(sweep)
    sweep.add_argument("--dry-run", action="store_true", help="print the trial table and exit")
    sweep.add_argument(
        RESUME_OPTION,
        action="store_true",
        help="finish an interrupted run of this sweep: finished trials are kept, "
        "the rest continue from their checkpoints",
    )
    bench = add_command("bench", "measure loop, orchestration, data-path and scaling speed; writes reports/bench/")
    bench.add_argument("--quick", action="store_true", help="a smaller, faster run (for CI and a first look)")
    bench.add_argument(
        "--out", default="reports/bench", help="output folder for README.md and bench.json (default: reports/bench)"
    )
    report = add_command("report", "write a Markdown report (with plots) from a run folder, or compare several")
    report.add_argument(
        "run_dir",
        nargs="+",
        help="a run folder or URI, e.g. runs/quickstart or s3://bucket/runs/quickstart; several: the runs become one "
        "more factor, run (labelled by folder name), their trials paired where their configs agree on every key but "
        "the run-level ones (constant within each run, different between runs)",
    )
    report.add_argument(
        "--out",
        default=None,
        help="output folder (default: reports/<sweep name>; for several runs reports/<label>-vs-<label>...)",
    )
    report.add_argument(
        "--baseline",
        default=None,
        metavar="KEY=VALUE",
        help="grid value the deltas are measured against (default: each factor's first value; for several runs, "
        "run=LABEL picks the run, default the first)",
    )
    report.add_argument(
        "--format",
        default="md",
        choices=("md", "csv", "json"),
        help="md: README.md + PNG plots; csv/json: the aggregated tables",
    )
    keys = add_command("keys", "list every config key (--set, sweep files): type, allowed values, default, meaning")
    keys.add_argument("--markdown", action="store_true", help="print README.md's Markdown table instead")
    status = add_command("status", "where a sweep stands, from its run folder: a line per trial, totals, an ETA")
    status.add_argument("run_dir", help="a run folder or URI, e.g. runs/quickstart or s3://bucket/runs/quickstart")
    status.add_argument("--json", action="store_true", help="print it as one JSON object")
    check = add_command(
        "check",
        "prove the training semantics on this machine (accumulation, DDP, seeds, AMP); one PASS/FAIL line each",
    )
    check.add_argument("--workers", type=int, default=2, metavar="N", help="DDP workers of the DDP check (default: 2)")
    check.add_argument(
        "--use-gpu",
        default="auto",
        choices=("auto", "true", "false"),
        help="run the checks on the GPU (DDP with nccl): auto (if CUDA is there), true, false",
    )
    check.add_argument("--address", default=None, help="Ray cluster to use (default: start a local Ray)")
    check.add_argument("-v", "--verbose", action="store_true", help="show Ray's own logs")
    export = add_command("export", "write a run folder into TensorBoard logs or an MLflow experiment")
    export.add_argument("run_dir", help="a run folder or URI, e.g. runs/quickstart or s3://bucket/runs/quickstart")
    export.add_argument("--to", required=True, choices=TARGETS, help="the viewer to write for")
    export.add_argument(
        "--out",
        default=None,
        help="tensorboard: a folder (default: RUN_DIR/tensorboard); mlflow: a tracking URI such as "
        "http://host:5000 or file:/path/mlruns (default: sqlite:///RUN_DIR/mlflow.db); required for a run at a URI",
    )
    return parser


def ensure_local_data(plan) -> None:
    """CIFAR-10 in every data_dir of the plan, found or downloaded here before Ray starts: no data is then
    one DataError line in seconds, not a failed trial's traceback after 36 s of Ray start-up (measured
    offline). For the embedded Ray only: its workers read this machine's folders; a cluster node reads its own."""
    data_dirs = dict.fromkeys(t.config.data_dir for t in plan.trials if t.config.dataset == "cifar10")
    if data_dirs:
        from .data import ensure_cifar10  # imports torch: only for a plan that needs CIFAR-10

        for data_dir in data_dirs:
            ensure_cifar10(data_dir)


def run_plan_command(plan: SweepPlan, args: argparse.Namespace) -> int:
    from .config import ConfigError
    from .orchestrate import run_plan  # these import Ray inside their functions only
    from .ray_session import cluster_address, init_ray

    if args.max_concurrent is not None and args.max_concurrent < 1:
        raise UsageError(f"--max-concurrent must be >= 1, got {args.max_concurrent}")
    resume = getattr(args, "resume", False)  # `train` has no --resume
    run_dir = StoragePath.of(args.storage) / plan.name  # a refused --storage fails before Ray starts
    refusal = None if resume else runlog.existing_run_refusal(run_dir, plan.name, resumable=args.command == "sweep")
    if refusal:
        raise ConfigError(refusal)
    if cluster_address(args.address) is None:
        ensure_local_data(plan)
    owns_ray = init_ray(address=args.address, verbose=args.verbose)
    # Tune stops gracefully on SIGINT (saving its state; run_plan then marks the running trials interrupted);
    # give SIGTERM the same treatment.
    signal.signal(signal.SIGTERM, lambda *_: os.kill(os.getpid(), signal.SIGINT))
    try:
        run_dir = run_plan(
            plan,
            storage=args.storage,
            max_concurrent=args.max_concurrent,
            resume=resume,
            warm=not args.isolate,
            command=rerun_command(args.argv),
            print_line=lambda line: print(line, file=sys.stderr if args.json else sys.stdout, flush=True),
        )
    finally:
        if owns_ray:
            import ray

            ray.shutdown()
    rows = summary_rows(run_dir)
    out = sys.stderr if args.json else sys.stdout
    print(f"\n{plan.name}: {len(rows)} trial(s), logs in {run_dir}", file=out)
    print(text_table(rows, SUMMARY_COLUMNS), file=out)
    best = best_trial_line(rows, plan.metric, plan.mode) if len(rows) > 1 else None
    if best:
        print(best, file=out)
    print(f"report: cifar-ray report {run_dir}", file=out)
    unfinished = [r["trial"] for r in rows if r["status"] not in runlog.FINAL_STATUSES]
    if unfinished and args.command == "sweep":
        print(f"interrupted: {len(unfinished)} trial(s) unfinished; continue with:\n  {resume_command(args)}", file=out)
    if args.json:
        results = [{k: v for k, v in r.items() if k != "epochs"} for r in rows]
        print(json.dumps(results[0] if args.command == "train" else results))
    if unfinished:
        return 130
    return 1 if any(r["status"] == "failed" for r in rows) else 0


def resume_command(args: argparse.Namespace) -> str:
    parts = ["cifar-ray", "sweep", shlex.quote(args.file), "--resume", "--storage", shlex.quote(redact(args.storage))]
    if args.name:
        parts += ["--name", shlex.quote(args.name)]
    if args.address:
        parts += ["--address", shlex.quote(args.address)]
    if args.set:
        parts += ["--set", *map(shlex.quote, args.set)]
    return " ".join(parts)


def rerun_command(argv: Sequence[str]) -> str:
    """The command that runs this again as a user types it: `cifar-ray` and the words given (`argv`, without the
    program), --resume left out, shell-quoted, with no URI's user:secret@."""
    return shlex.join([PROG, *(redact(word) for word in argv if not spells(word, RESUME_OPTION, RESUME_SHORTEST))])


def run_report(args: argparse.Namespace) -> int:
    from .config import parse_value
    from .report import write_report

    baseline = None
    if args.baseline:
        key, sep, value = args.baseline.partition("=")
        if not sep:
            raise UsageError(f"--baseline expects KEY=VALUE, got '{args.baseline}'")
        baseline = {key.strip(): parse_value(value.strip())}
    runs = args.run_dir if len(args.run_dir) > 1 else args.run_dir[0]
    print(write_report(runs, out_dir=args.out, baseline=baseline, fmt=args.format))
    return 0


def run_status(args: argparse.Namespace) -> int:
    from .status import render

    print(render(args.run_dir, args.json))
    return 0


def run_export(args: argparse.Namespace) -> int:
    from .viewers import export_run

    print(export_run(args.run_dir, args.to, args.out))
    return 0


def run_keys(args: argparse.Namespace) -> int:
    from .config import format_keys_text, key_rows, markdown_keys_table

    rows = key_rows()
    text = markdown_keys_table(rows) if args.markdown else format_keys_text(rows, shutil.get_terminal_size().columns)
    print(text, end="")
    return 0


def run_check(args: argparse.Namespace) -> int:
    from .check import run_checks

    results = run_checks(
        workers=args.workers,
        use_gpu=args.use_gpu,
        address=args.address,
        verbose=args.verbose,
        print_line=lambda line: print(line, flush=True),
    )
    return 1 if any(r.status == "FAIL" for r in results) else 0


def run_bench(args: argparse.Namespace) -> int:
    from .bench import run_bench as bench

    print(bench(quick=args.quick, out_dir=args.out, say=lambda line: print(line, flush=True)))
    return 0


def run_train(args: argparse.Namespace) -> int:
    from .config import parse_overrides
    from .sweep import single_run_plan

    plan = single_run_plan(parse_overrides(args.set), args.name or time.strftime("train-%Y%m%d-%H%M%S"))
    return run_plan_command(plan, args)


def run_sweep(args: argparse.Namespace) -> int:
    from .config import parse_overrides
    from .sweep import load_sweep, trial_table, work_summary

    plan = load_sweep(args.file, parse_overrides(args.set), args.name)
    if not args.dry_run:
        return run_plan_command(plan, args)
    print(f"{plan.name}: {plan.description}".rstrip(": "))
    rows = trial_table(plan)
    print(text_table(rows, list(rows[0])))
    print(work_summary(plan))
    if args.json:
        print(json.dumps([t.as_dict() for t in plan.trials]))
    return 0


# subcommand -> its handler: parsed arguments in, exit status out. A new subcommand: its subparser in
# build_parser (with its EXAMPLES) and one entry here.
HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "train": run_train,
    "sweep": run_sweep,
    "report": run_report,
    "status": run_status,
    "export": run_export,
    "keys": run_keys,
    "check": run_check,
    "bench": run_bench,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:  # bare `cifar-ray`: what it can do, not "the following arguments are required"
        print(parser.format_help(), end="", file=sys.stderr)
        return USAGE_ERROR
    try:
        args = parser.parse_args(argv)
        args.argv = argv  # the words as given: a run records them (rerun_command)
        return HANDLERS[args.command](args)
    except UserError as error:
        prog = error.prog if isinstance(error, UsageError) else PROG
        print(f"{prog}: error: {error}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        print("cifar-ray: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
