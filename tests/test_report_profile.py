"""The report's profile section (--profile): each profiled trial's top operators by self time, read from the summary
its worker wrote (runlog.PROFILE_FILE), never from the trace."""

from __future__ import annotations

import json

from helpers import make_run, trial_name

from cifar_ray.core import runlog
from cifar_ray.report import build_report
from cifar_ray.report.document import Heading, Table, to_markdown
from cifar_ray.report.profile import SHOWN_OPERATORS, profile_blocks, profile_rows


def summary(operators: list[tuple[str, int, float]], steps: int = 2) -> dict:
    return {
        "epoch": 1,
        "skipped_steps": 3,
        "steps": steps,
        "time": "CPU self time",
        "self_s_all": 1.0,
        "operators": [{"name": n, "calls": c, "self_s": s, "total_s": s} for n, c, s in operators],
        "trace": runlog.PROFILE_TRACE_FILE,
    }


def test_the_top_operators_of_each_profiled_trial_per_step(tmp_path):
    make_run(tmp_path)
    many = [(f"aten::op{i}", 4, 0.5 / (i + 1)) for i in range(SHOWN_OPERATORS + 3)]
    (tmp_path / trial_name(0) / runlog.PROFILE_FILE).write_text(json.dumps(summary(many)))
    (tmp_path / trial_name(3) / runlog.PROFILE_FILE).write_text(json.dumps(summary([("aten::mm", 6, 0.4)], 3)))
    report = build_report(tmp_path)

    rows = profile_rows(report)
    assert [row["trial"] for row in rows] == [trial_name(0)] * SHOWN_OPERATORS + [trial_name(3)]
    first, last = rows[0], rows[-1]
    assert (first["rank"], first["operator"], first["calls_per_step"], first["self_s_per_step"]) == (
        1,
        "aten::op0",
        2.0,
        0.25,
    )
    assert first["self_share"] == 0.5 and last["self_s_per_step"] == 0.4 / 3

    blocks = profile_blocks(report)
    assert blocks[0] == Heading("Profile")
    tables = [block for block in blocks if isinstance(block, Table)]
    assert [table.name for table in tables] == [f"profile-{trial_name(0)}", f"profile-{trial_name(3)}"]
    assert tables[0].rows[0] == ("1", "`aten::op0`", "2.00", "250.0", "50 %")
    assert tables[0].headers[-1] == "share of all CPU self time"  # which time a share is of
    assert runlog.PROFILE_TRACE_FILE in to_markdown(blocks)


def test_no_profile_section_without_profiled_trials(tmp_path):
    make_run(tmp_path)
    assert profile_blocks(build_report(tmp_path)) == []
