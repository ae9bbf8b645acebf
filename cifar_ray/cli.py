"""`cifar-ray` command line: a thin layer over the library (config, sweep, orchestrate, report).

torch, Ray and pyarrow are imported only by the commands that use them, so `--help`, usage errors,
`--dry-run` and the refusals before a run answer in well under a second instead of 3-4 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

from . import runlog
from .config import ConfigError, parse_overrides
from .errors import UserError
from .storage import StoragePath, redact
from .viewers import TARGETS

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


class UsageError(Exception):
    """A one-line usage error, printed as `PROG: error: MESSAGE`; `prog` names the (sub)command."""

    def __init__(self, message: str, prog: str = PROG) -> None:
        super().__init__(message)
        self.prog = prog


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse prints usage + exits 2; we want one line
        raise UsageError(message, self.prog)


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


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="config overrides, e.g. --set dataset=synthetic epochs=1",
    )
    parser.add_argument(
        "--storage",
        default="runs",
        help="where run logs and checkpoints go: a folder (default: runs/) or a URI such as s3://bucket/runs; on a Ray cluster, a folder every node mounts at the same path or a URI",
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
        help="existing Ray cluster: auto, HOST:PORT, or ray://HOST:10001 for Ray Client (default: $RAY_ADDRESS, else start a local Ray)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON on the last line")
    parser.add_argument(
        "--isolate",
        action="store_true",
        help="run each trial in a Ray Train run of its own (fresh worker processes per trial, ~20 s "
        "more per trial on 2 CPU cores) instead of warm worker slots",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="show Ray's own logs")


def build_parser() -> Parser:
    parser = Parser(prog=PROG, description="Ray-based sweep orchestrator for CIFAR-10 CNN training.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    train = commands.add_parser("train", help="train one configuration data-parallel through Ray Train")
    add_common(train)
    sweep = commands.add_parser("sweep", help="run a sweep file (a grid of trials) through Ray Tune")
    sweep.add_argument("file", help="sweep YAML file, e.g. sweeps/quickstart.yaml")
    add_common(sweep)
    sweep.add_argument("--dry-run", action="store_true", help="print the trial table and exit")
    sweep.add_argument(
        "--resume",
        action="store_true",
        help="finish an interrupted run of this sweep: finished trials are kept, the rest continue from their checkpoints",
    )
    bench = commands.add_parser(
        "bench", help="measure loop, orchestration, data-path and scaling speed; writes reports/bench/"
    )
    bench.add_argument("--quick", action="store_true", help="a smaller, faster run (for CI and a first look)")
    bench.add_argument(
        "--out", default="reports/bench", help="output folder for README.md and bench.json (default: reports/bench)"
    )
    report = commands.add_parser("report", help="write a Markdown report (with plots) from a run folder")
    report.add_argument("run_dir", help="a run folder or URI, e.g. runs/quickstart or s3://bucket/runs/quickstart")
    report.add_argument("--out", default=None, help="output folder (default: reports/<name>)")
    report.add_argument(
        "--baseline",
        default=None,
        metavar="KEY=VALUE",
        help="grid value the deltas are measured against (default: each factor's first value)",
    )
    report.add_argument(
        "--format",
        default="md",
        choices=("md", "csv", "json"),
        help="md: README.md + PNG plots; csv/json: the aggregated tables",
    )
    check = commands.add_parser(
        "check",
        help="prove the training semantics on this machine (accumulation, DDP, seeds, AMP); one PASS/FAIL line each",
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
    export = commands.add_parser("export", help="write a run folder into TensorBoard logs or an MLflow experiment")
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


def run_plan_command(plan, args: argparse.Namespace) -> int:
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
    # Tune stops gracefully on SIGINT (saving its state); give SIGTERM the same treatment.
    signal.signal(signal.SIGTERM, lambda *_: os.kill(os.getpid(), signal.SIGINT))
    try:
        run_dir = run_plan(
            plan,
            storage=args.storage,
            max_concurrent=args.max_concurrent,
            resume=resume,
            warm=not args.isolate,
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:  # bare `cifar-ray`: what it can do, not "the following arguments are required"
        print(parser.format_help(), end="", file=sys.stderr)
        return USAGE_ERROR
    try:
        args = parser.parse_args(argv)
        if args.command == "report":
            from .config import parse_value
            from .report import write_report

            baseline = None
            if args.baseline:
                key, sep, value = args.baseline.partition("=")
                if not sep:
                    raise UsageError(f"--baseline expects KEY=VALUE, got '{args.baseline}'")
                baseline = {key.strip(): parse_value(value.strip())}
            print(write_report(args.run_dir, out_dir=args.out, baseline=baseline, fmt=args.format))
            return 0
        if args.command == "check":
            from .check import run_checks

            results = run_checks(
                workers=args.workers,
                use_gpu=args.use_gpu,
                address=args.address,
                verbose=args.verbose,
                print_line=lambda line: print(line, flush=True),
            )
            return 1 if any(r.status == "FAIL" for r in results) else 0
        if args.command == "export":
            from .viewers import export_run

            print(export_run(args.run_dir, args.to, args.out))
            return 0
        if args.command == "bench":
            from .bench import run_bench

            print(run_bench(quick=args.quick, out_dir=args.out, say=lambda line: print(line, flush=True)))
            return 0
        overrides = parse_overrides(args.set)
        if args.command == "train":
            from .sweep import single_run_plan

            return run_plan_command(single_run_plan(overrides, args.name or time.strftime("train-%Y%m%d-%H%M%S")), args)
        from .sweep import load_sweep, trial_table, work_summary

        plan = load_sweep(args.file, overrides, args.name)
        if args.dry_run:
            print(f"{plan.name}: {plan.description}".rstrip(": "))
            rows = trial_table(plan)
            print(text_table(rows, list(rows[0])))
            print(work_summary(plan))
            if args.json:
                print(json.dumps([t.as_dict() for t in plan.trials]))
            return 0
        return run_plan_command(plan, args)
    except UsageError as error:
        print(f"{error.prog}: error: {error}", file=sys.stderr)
        return USAGE_ERROR
    except (UserError, FileNotFoundError) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        print("cifar-ray: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
