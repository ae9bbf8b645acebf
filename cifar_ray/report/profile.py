"""Where a profiled trial's time goes (`--profile`): the top operators by self time of each trial, read from the
summary its rank 0 wrote beside its Chrome trace (runlog.PROFILE_FILE; the trace is not parsed here). The data is
`profile_rows`; `profile_blocks` is the report's section."""

from __future__ import annotations

from typing import Any

from ..core.runlog import PROFILE_FILE, PROFILE_TRACE_FILE, read_json
from .build import Report
from .document import Block, Heading, Paragraph, Table
from .format import fmt_num

SHOWN_OPERATORS = 8  # per trial in the report; the summary keeps more


def profile_summaries(report: Report) -> dict[str, dict]:
    """Trial name (as the report names it) -> its profile summary, for the trials that have one, in trial order."""
    found = {}
    for source in report.sources:
        prefix = f"{source.label}/" if report.comparison else ""
        for trial in source.log.trials:
            summary = read_json(source.log.path / trial.name / PROFILE_FILE)
            if summary:
                found[prefix + trial.name] = summary
    return found


def profile_rows(report: Report, top: int = SHOWN_OPERATORS) -> list[dict[str, Any]]:
    """One row per profiled trial and operator among its `top` by self time: trial, rank (1 = the most self time),
    operator, calls, self seconds per recorded step, and the operator's share of the self time of all operators."""
    rows = []
    for trial, summary in profile_summaries(report).items():
        steps, total = summary.get("steps") or 1, summary.get("self_s_all") or 0.0
        for place, operator in enumerate(summary.get("operators", [])[:top], 1):
            rows.append(
                {
                    "trial": trial,
                    "rank": place,
                    "operator": operator["name"],
                    "calls_per_step": operator["calls"] / steps,
                    "self_s_per_step": operator["self_s"] / steps,
                    "self_share": operator["self_s"] / total if total else None,
                }
            )
    return rows


def profile_blocks(report: Report) -> list[Block]:
    """`## Profile`: per profiled trial, its top operators by self time; nothing when no trial was profiled."""
    summaries = profile_summaries(report)
    if not summaries:
        return []
    first = next(iter(summaries.values()))
    blocks: list[Block] = [
        Heading("Profile"),
        Paragraph(
            f"Top operators by self time over {first.get('steps')} step(s) of each trial's first epoch after "
            f"{first.get('skipped_steps')} warm-up step(s) (`--profile`, rank 0): on a GPU the CUDA kernels' GPU time, "
            "on a CPU the operators' CPU time, each counted once; each table's last column says which. The full trace "
            f"is `<trial>/{PROFILE_TRACE_FILE}`: open it in https://ui.perfetto.dev or TensorBoard's profiler."
        ),
    ]
    rows = profile_rows(report)
    for trial, summary in summaries.items():
        blocks += [
            Heading(f"`{trial}`", level=3),
            Table(
                headers=(
                    "#",
                    "operator",
                    "calls/step",
                    "self ms/step",
                    f"share of all {summary.get('time', 'self time')}",
                ),
                rows=tuple(
                    (
                        str(row["rank"]),
                        f"`{row['operator']}`",
                        fmt_num(row["calls_per_step"]),
                        fmt_num(1000 * row["self_s_per_step"]),
                        "—" if row["self_share"] is None else f"{100 * row['self_share']:.0f} %",
                    )
                    for row in rows
                    if row["trial"] == trial
                ),
                align="rlrrr",
                name=f"profile-{trial}",
            ),
        ]
    return blocks
