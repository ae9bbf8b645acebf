"""`cifar-ray bench`: where the time goes (loop, orchestration, data path, scaling), measured in one run and written
as bench.json and the README.md rendered from it."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from ..core.errors import UsageError
from ..core.storage import local_write_refusal
from .common import add_command

HELP = "measure loop, orchestration, data-path and scaling speed; writes runs/bench/"
OUT, RENDER_OUT = "runs/bench", "reports/bench"  # what is measured here; the committed record and its page
EXAMPLES = (
    ("a smaller, faster run (what CI runs)", "cifar-ray bench --quick --out runs/bench-quick"),
    ("the full benchmark, written where reports/bench/README.md is committed", "cifar-ray bench --out reports/bench"),
    ("re-render reports/bench/README.md and docs/measurements.md from their records", "cifar-ray bench --render"),
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    bench = add_command(subparsers, "bench", HELP, EXAMPLES)
    bench.add_argument("--quick", action="store_true", help="a smaller, faster run (for CI and a first look)")
    bench.add_argument(
        "--out",
        default=None,
        help=f"output folder for README.md and bench.json (default: {OUT}; with --render {RENDER_OUT}, the "
        "committed record)",
    )
    bench.add_argument(
        "--render",
        action="store_true",
        help="measure nothing: write OUT/README.md from OUT/bench.json, and docs/measurements.md from "
        "reports/measurements.json (run from the repository's root)",
    )


def run_bench(
    quick: bool = False,
    out_dir: str | Path = OUT,
    storage: str | Path | None = None,
    say: Callable[[str], None] = print,
) -> Path:
    """Runs every section, writes bench.json and README.md into out_dir, returns the README path."""
    from ..cluster.bench import measure
    from ..report.bench import render

    out_dir = Path(out_dir)
    refusal = local_write_refusal(out_dir)  # before the minutes of measuring, not after
    if refusal:
        raise UsageError(f"--out {out_dir}: cannot write there: {refusal}; allowed: a folder you can write")
    out_dir.mkdir(parents=True, exist_ok=True)
    record = measure(quick, storage, say)
    (out_dir / "bench.json").write_text(json.dumps(record, indent=2) + "\n")
    readme = out_dir / "README.md"
    readme.write_text(render(record))
    return readme


def render_pages(out_dir: str | Path = RENDER_OUT) -> list[Path]:
    """The benchmark's page from its bench.json, and the measurements page from its record; returns both."""
    from ..report import bench, measurements

    readme, page = Path(out_dir) / "README.md", Path(measurements.PAGE)
    readme.write_text(bench.render(json.loads((Path(out_dir) / "bench.json").read_text())))
    page.write_text(measurements.render(json.loads(Path(measurements.RECORD).read_text())))
    return [readme, page]


def run(args: argparse.Namespace) -> int:
    if args.render:
        print("\n".join(map(str, render_pages(args.out or RENDER_OUT))))
        return 0
    print(run_bench(quick=args.quick, out_dir=args.out or OUT, say=lambda line: print(line, flush=True)))
    return 0
