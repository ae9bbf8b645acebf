"""`sweep --until-settled`: the sequential procedure (report/sequential.py) proven by simulation, the rounds planned
from hand-made run folders (report/settle.py), the per-configuration extension of a plan and its replay on resume
(core/sweep.py), the refusals before Ray starts, and one real run of two rounds."""

from __future__ import annotations

import itertools
import json
import random
import re
import time
from pathlib import Path

import pytest
from helpers import factorial_epochs, ranked_correct, trial_name, write_correct, write_sweep, write_trial

from cifar_ray import api, settling
from cifar_ray.cli import main
from cifar_ray.core import lease, runlog
from cifar_ray.core.errors import UsageError
from cifar_ray.core.run import RunFolder
from cifar_ray.core.status import (
    BUDGET,
    MAX_SEEDS,
    SETTLED,
    has_ended,
    load_state,
    progress_lines,
    render,
    settle_text,
)
from cifar_ray.core.storage import StoragePath
from cifar_ray.core.sweep import build_plan, extended_plan, resumed_plan
from cifar_ray.report import build_report
from cifar_ray.report.effects import DIFFERS, EQUIVALENT, OPEN
from cifar_ray.report.findings import answer_lines
from cifar_ray.report.header import settle_line
from cifar_ray.report.sequential import Comparison, look_level, look_verdict, max_looks
from cifar_ray.report.settle import answer_first, asked, look, settle_record
from cifar_ray.report.tables import paired_table
from cifar_ray.report.verdicts import ALPHA, pairs_needed

# The simulation: paired differences (value − baseline) over seeds, in units of their spread; looks from 3 seeds
# to 10, one pair per seed, stopping at the first verdict.
FIRST, MOST, RUNS = 3, 10, 4000


def stop_verdicts(truth: float, margin: float, level: float, seed: int) -> tuple[list[str], list[int]]:
    """Each simulated comparison's verdict where it stopped (or "" at MOST seeds still open) and its seeds then."""
    rng = random.Random(seed)
    verdicts, stopped = [], []
    for _ in range(RUNS):
        diffs = [rng.gauss(truth, 1.0) for _ in range(MOST)]
        verdict, n = "", MOST
        for n in range(FIRST, MOST + 1):
            sample = diffs[:n]
            mean = sum(sample) / n
            se = (sum((d - mean) ** 2 for d in sample) / (n - 1) / n) ** 0.5
            judged = look_verdict(mean, se, n, margin, level)
            if judged in (DIFFERS, EQUIVALENT):
                verdict = judged
                break
        verdicts.append(verdict)
        stopped.append(n)
    return verdicts, stopped


def test_repeated_looks_keep_false_real_effects_at_alpha_where_naive_looks_do_not():
    looks = max_looks(FIRST, MOST)
    assert looks == 8
    level = look_level(1, looks)
    sequential, _ = stop_verdicts(0.0, 0.25, level, seed=1)
    naive, _ = stop_verdicts(0.0, 0.25, ALPHA, seed=1)  # the same data, every look at the full α
    # 4000 null comparisons: the binomial standard error at 5 % is 0.34 pp
    assert sequential.count(DIFFERS) / RUNS <= ALPHA
    assert naive.count(DIFFERS) / RUNS > ALPHA + 0.03  # about 0.15: what the procedure exists to prevent


def test_the_equivalence_test_spends_its_alpha_too():
    """A true effect exactly at the margin: "equivalent" is a false claim, at most α of the time over the looks."""
    looks = max_looks(FIRST, MOST)
    sequential, _ = stop_verdicts(1.0, 1.0, look_level(1, looks), seed=2)
    naive, _ = stop_verdicts(1.0, 1.0, ALPHA, seed=2)
    assert sequential.count(EQUIVALENT) / RUNS <= ALPHA
    assert naive.count(EQUIVALENT) / RUNS > ALPHA + 0.03


def test_a_clear_effect_stops_at_the_first_look():
    """40 times the seed spread: with 3 pairs (2 degrees of freedom) at α / 8, no sample of seeds leaves it open."""
    verdicts, stopped = stop_verdicts(40.0, 0.25, look_level(1, max_looks(FIRST, MOST)), seed=3)
    assert set(verdicts) == {DIFFERS} and set(stopped) == {FIRST}


# Hand-made runs: batch 64 (baseline), 128, 512 x workers 1, 2 over seeds; final accuracies from `accuracy`.
GRID = {"batch_size": [64, 128, 512], "workers": [1, 2]}


def settle_run(run_dir: Path, accuracy, seeds: int, status=None, wall_s: float = 100.0) -> Path:
    """A finished run of GRID at `seeds` seeds: `accuracy(swept)` its final test accuracy (whole images of 10,000),
    `status(swept)` a status other than finished; each trial 30 s, two at once."""
    combos = [
        dict(zip(GRID, values)) | {"seed": s} for values in itertools.product(*GRID.values()) for s in range(seeds)
    ]
    write_sweep(run_dir, [trial_name(i) for i in range(len(combos))], grid=GRID, repeats=seeds, wall_time_s=wall_s)
    for i, swept in enumerate(combos):
        acc = round(accuracy(swept), 4)
        state = (status or (lambda s: "finished"))(swept)
        write_trial(run_dir, i, swept, state, factorial_epochs(acc, 1 - acc, 10.0), gpus=False, planned=3)
        write_correct(run_dir, i, ranked_correct(acc, 10_000), 3)
        folder = run_dir / trial_name(i)
        start = 1000.0 + 30.0 * (i // 2)
        meta = json.loads((folder / runlog.TRIAL_FILE).read_text())
        (folder / runlog.TRIAL_FILE).write_text(json.dumps(meta | {"started_unix": start}))
        rows = [json.loads(line) for line in (folder / runlog.EPOCHS_FILE).read_text().splitlines()]
        lines = [json.dumps(r | {"end_unix": start + 10.0 * (e + 1)}) for e, r in enumerate(rows)]
        (folder / runlog.EPOCHS_FILE).write_text("\n".join(lines) + "\n")
    return run_dir


def noisy(effects: dict, noise: float = 0.01, seed: int = 0, workers: float = 0.10):
    """accuracy(swept): 0.60 + effects[batch_size] + `workers` for workers=2 (by default 10 pp: a clear effect,
    settled at the first look) + per-trial noise (`noise` std), drawn once per trial."""
    rng = random.Random(seed)
    drawn = {}

    def accuracy(swept: dict) -> float:
        key = tuple(swept.values())
        drawn.setdefault(key, rng.gauss(0.0, noise))
        return 0.60 + effects[swept["batch_size"]] + workers * (swept["workers"] == 2) + drawn[key]

    return accuracy


def test_a_look_settles_the_clear_comparison_and_adds_seeds_only_where_one_is_open(tmp_path):
    run = settle_run(tmp_path / "r", noisy({64: 0.0, 128: -0.15, 512: -0.01}), seeds=3)
    record = settle_record(3, 10, None, 3)
    taken = look(build_report(run), record)
    assert taken.verdicts["batch_size=128 vs 64"]["verdict"] == DIFFERS
    assert taken.open == ["batch_size=512 vs 64"] and taken.stop is None
    assert {p["batch_size"] for p in taken.points} == {64, 512}  # batch 128's configurations get no seeds
    assert 3 < taken.seeds <= 10 and taken.trials == 4 * (taken.seeds - 3)
    assert taken.estimate_s == pytest.approx(taken.trials * 30.0 / 2)  # this run's trial times, two at once


def test_the_configurations_in_the_most_open_comparisons_run_first(tmp_path):
    run = settle_run(tmp_path / "r", noisy({64: 0.0, 128: -0.15, 512: -0.01}, workers=-0.01), seeds=3)
    taken = look(build_report(run), settle_record(3, 10, None, 3))
    assert taken.open == ["batch_size=512 vs 64", "workers=2 vs 1"]
    # batch 64 and 512 are in both open comparisons, batch 128 only in the workers one: last, not in grid order
    assert [p["batch_size"] for p in taken.points] == [64, 64, 512, 512, 128, 128]


def test_answer_first_orders_by_the_open_comparisons_a_configuration_informs_not_by_when_it_came():
    """The workers comparison lists every configuration first; batch 64 and 512 inform the batch one too."""
    ordered = answer_first(GRID, [Comparison("workers", 2, 1), Comparison("batch_size", 512, 64)])
    assert [(p["batch_size"], p["workers"], len(labels)) for p, labels in ordered] == [
        (64, 1, 2),
        (64, 2, 2),
        (512, 1, 2),
        (512, 2, 2),
        (128, 1, 1),
        (128, 2, 1),
    ]


def test_failed_trials_count_as_losses_in_the_next_round(tmp_path):
    accuracy = noisy({64: 0.0, 128: -0.15, 512: -0.03})
    whole = look(build_report(settle_run(tmp_path / "a", accuracy, seeds=3)), settle_record(3, 100, None, 3))
    report = build_report(
        settle_run(
            tmp_path / "b",
            accuracy,
            seeds=3,
            status=lambda s: "diverged" if s["batch_size"] == 512 and s["seed"] == 0 else "finished",
        )
    )
    lossy = look(report, settle_record(3, 100, None, 3))
    assert lossy.verdicts["batch_size=512 vs 64"]["n_pairs"] == 4
    assert lossy.seeds > whole.seeds
    # Enough pairs once the new seeds lose pairs at the rate so far (4 of 6 kept), not just once they all pair.
    row = report.effects["batch_size"]["final_test_acc"].iloc[1]
    needed = pairs_needed(row["mean_diff"], row["std_diff"] ** 2, report.margin, look_level(3, 98), row["testset_var"])
    assert 4 + (lossy.seeds - 3) * 2 * 4 / 6 >= needed > 4 + (lossy.seeds - 4) * 2 * 4 / 6


def test_the_rounds_stop_when_settled_at_max_seeds_and_at_the_budget(tmp_path):
    settled = settle_run(tmp_path / "s", noisy({64: 0.0, 128: -0.15, 512: 0.2}), seeds=3)
    record = settle_record(3, 10, None, 3)
    record["rounds"].append(look(build_report(settled), record).record())
    assert record["rounds"][-1]["stop"] == SETTLED
    assert settle_text(record) == "settled after 3 seeds (1 look)"
    runlog.update_json(settled / runlog.SWEEP_FILE, settle=record)
    assert render(settled).splitlines()[-4:] == [  # cifar-ray status
        "settled after 3 seeds (1 look)",
        "  batch_size=128 vs 64: differs at 3 seeds (look 1)",
        "  batch_size=512 vs 64: differs at 3 seeds (look 1)",
        "  workers=2 vs 1: differs at 3 seeds (look 1)",
    ]
    assert json.loads(render(settled, as_json=True))["settled"] == "settled after 3 seeds (1 look)"
    run = build_report(settle_run(tmp_path / "o", noisy({64: 0.0, 128: -0.01, 512: -0.01}), seeds=3, wall_s=100.0))
    at_max = settle_record(3, 3, None, 3)
    at_max["rounds"].append(look(run, at_max).record())
    assert at_max["rounds"][-1]["stop"] == MAX_SEEDS
    assert settle_text(at_max) == "stopped at --max-seeds 3 with 2 comparisons open (1 look)"
    budget = settle_record(3, 10, 150.0, 3)  # 100 s spent; the next round's 6+ trials at 15 s each pass 150 s
    budget["rounds"].append(look(run, budget).record())
    assert budget["rounds"][-1]["stop"] == BUDGET
    assert budget["rounds"][-1]["seeds"] is None and budget["rounds"][-1]["points"] == []  # nothing for a resume
    assert settle_text(budget).startswith("stopped at the budget with 2 comparisons open (3 seeds, 1 look;")


def test_the_next_rounds_estimate_uses_every_finished_trials_time(tmp_path):
    """The last two trials (a later round's, say) took 90 s, the 16 before them 30 s: the mean over all 18, two at
    once, with or without --address (the look reads the run folder, not a step timed here)."""
    run = settle_run(tmp_path / "r", noisy({64: 0.0, 128: -0.15, 512: -0.01}), seeds=3)
    for index in (16, 17):  # they started last, at 1240 s: stretched, they overlap nothing more
        folder = run / trial_name(index)
        rows = [json.loads(line) for line in (folder / runlog.EPOCHS_FILE).read_text().splitlines()]
        lines = [json.dumps(r | {"end_unix": 1240.0 + 30.0 * (e + 1)}) for e, r in enumerate(rows)]
        (folder / runlog.EPOCHS_FILE).write_text("\n".join(lines) + "\n")
    taken = look(build_report(run), settle_record(3, 10, None, 3))
    assert taken.estimate_s == pytest.approx(taken.trials * (16 * 30.0 + 2 * 90.0) / 18 / 2)


def test_a_verdict_once_reached_is_kept_not_judged_again(tmp_path):
    run = build_report(settle_run(tmp_path / "r", noisy({64: 0.0, 128: -0.01, 512: -0.01}), seeds=3))
    record = settle_record(3, 10, None, 3)
    kept = {"verdict": EQUIVALENT, "mean_diff": 0.0, "n_pairs": 6, "seeds": 3, "round": 1}
    record["rounds"].append({"verdicts": {"batch_size=128 vs 64": kept}, "open": [], "stop": None})
    taken = look(run, record)
    assert taken.round == 2 and taken.verdicts["batch_size=128 vs 64"] == kept
    assert taken.open == ["batch_size=512 vs 64"] and {p["batch_size"] for p in taken.points} == {64, 512}


def round_under_way(tmp_path: Path) -> tuple[Path, dict]:
    """A run of GRID at 3 seeds whose look 1 settled batch 128 and left batch 512 and workers open, in round 2:
    its first two trials (at batch 64, informing both open comparisons) ended, the third runs, the rest wait."""
    run = settle_run(tmp_path / "r", noisy({64: 0.0, 128: -0.15, 512: -0.01}, workers=-0.01), seeds=3)
    record = settle_record(3, 10, None, 3)
    taken = look(build_report(run), record)
    added, first = [], 6 * 3
    for point in taken.points:
        for seed in range(3, taken.seeds):
            index = first + len(added)
            swept = point | {"seed": seed}
            state = "finished" if len(added) < 2 else "running" if len(added) == 2 else "pending"
            epochs = factorial_epochs(0.6, 0.4, 10.0) if state == "finished" else []
            write_trial(run, index, swept, state, epochs, gpus=False, planned=3)
            runlog.update_json(run / trial_name(index) / runlog.TRIAL_FILE, started_unix=time.time())
            added.append((trial_name(index), swept))
    record["rounds"].append(taken.record() | {"added": [name for name, _ in added]})
    record["rounds"][-1]["questions"] = asked(taken, added)
    runlog.update_json(run / runlog.SWEEP_FILE, settle=record, trials=[trial_name(i) for i in range(len(added) + 18)])
    return run, record


def test_status_shows_each_comparison_settled_so_far_and_what_runs_for_each_open_one(tmp_path):
    run, record = round_under_way(tmp_path)
    added = record["rounds"][-1]["added"]
    per_config = record["rounds"][-1]["seeds"] - 3
    workers, batch = (
        record["rounds"][-1]["questions"]["workers=2 vs 1"],
        record["rounds"][-1]["questions"]["batch_size=512 vs 64"],
    )
    assert set(workers) == set(added) and len(batch) == 4 * per_config  # batch 128's inform workers only
    with lease.hold(StoragePath.of(run), lambda line: None):  # a live driver: the running trial runs
        lines = render(run).splitlines()
        questions = json.loads(render(run, as_json=True))["questions"]
        round_line = progress_lines(run, time.time(), None)[1]
    assert lines[-3:] == [
        "  batch_size=128 vs 64: differs at 3 seeds (look 1)",
        f"  batch_size=512 vs 64: open, 2 of {len(batch)} added trials ended; running {added[2]}",
        f"  workers=2 vs 1: open, 2 of {len(added)} added trials ended; running {added[2]}",
    ]
    assert questions[1] == {
        "comparison": "batch_size=512 vs 64",
        "verdict": "open",
        "look": 1,
        "seeds": 3,
        "trials": batch,
        "ended": 2,
        "running": [added[2]],
    }
    assert round_line == (
        f"until settled, this round: batch_size=512 vs 64: open, 2 of {len(batch)} added trials ended; running "
        f"{added[2]}; workers=2 vs 1: open, 2 of {len(added)} added trials ended; running {added[2]}"
    )


def test_the_live_view_prints_the_rounds_questions_as_trials_end(tmp_path):
    from cifar_ray.cluster.progress import SweepProgress

    run, record = round_under_way(tmp_path)
    lines: list[str] = []
    view = SweepProgress(StoragePath.of(run), [], lines.append, started=time.time())
    view._stands()  # what a trial's end prints
    assert lines[0].startswith("[20/36 done ·") and len(lines) == 2
    assert lines[1].startswith("until settled, this round: batch_size=512 vs 64: open, 2 of 12 added trials ended")


def test_watch_goes_on_between_rounds_until_a_look_stops_them(tmp_path):
    grid = settle_run(tmp_path / "g", noisy({64: 0.0, 128: -0.15, 512: -0.01}), seeds=3)  # before look 1 is recorded
    assert has_ended(load_state(grid))  # no driver: nothing more comes
    with lease.hold(StoragePath.of(grid), lambda line: None):
        assert not has_ended(load_state(grid))  # its driver may look and add a round
    run, record = round_under_way(tmp_path)
    for name in record["rounds"][-1]["added"]:  # round 2 ended; look 2 not taken yet
        runlog.update_json(run / name / runlog.TRIAL_FILE, status="failed")
    with lease.hold(StoragePath.of(run), lambda line: None):  # a live driver
        assert not has_ended(load_state(run))
        record["rounds"].append(record["rounds"][-1] | {"round": 2, "stop": SETTLED, "open": []})
        runlog.update_json(run / runlog.SWEEP_FILE, settle=record)
        assert has_ended(load_state(run))


def test_the_reports_body_gives_the_looks_verdicts_the_header_gives(tmp_path):
    """Batch 512's -2 pp at 3 seeds passes Holm's single look, not the looks' level: the body, the effects table and
    the header all say not conclusive; a verdict an earlier look reached stays, whatever the pairs since say."""
    run = settle_run(tmp_path / "r", noisy({64: 0.0, 128: -0.15, 512: -0.02}, noise=0.005, workers=0.0), seeds=3)
    single = build_report(run)  # no look recorded: Holm's single-look verdicts
    assert single.effects["batch_size"]["final_test_acc"]["verdict"].tolist() == [DIFFERS, DIFFERS]
    record = settle_record(3, 10, None, 3)
    record["rounds"].append(look(single, record).record())
    runlog.update_json(run / runlog.SWEEP_FILE, settle=record)
    report = build_report(run)
    assert report.effects["batch_size"]["final_test_acc"]["verdict"].tolist() == [DIFFERS, OPEN]
    at_look = "not conclusive (look 1 of --until-settled)"
    assert f"6 of 6 pairs: {at_look}; about" in answer_lines(report, "batch_size")[1]
    assert f"batch_size=512 vs 64: {at_look}; workers=2 vs 1: equivalent at 3 seeds (look 1" in settle_line(report)
    rows = paired_table(report, "batch_size").rows
    assert [row[3] for row in rows] == ["CI excludes 0 at 3 seeds (look 1 of --until-settled)", at_look]
    assert rows[1][2].endswith("] (99.8 % CI, repeated looks)")  # 1 − 0.05 / 24: the level its verdict used
    narrower = paired_table(build_report(run, margin_pp=0.5), "workers").rows[0][3]  # report --margin 0.5
    assert narrower == "equivalent within ±1 pp at 3 seeds (look 1 of --until-settled)"  # the margin the look used
    kept = {"verdict": EQUIVALENT, "mean_diff": 0.0, "n_pairs": 6, "seeds": 3, "round": 1}
    record["rounds"] = [{"verdicts": {"batch_size=512 vs 64": kept}, "open": [], "stop": None}, record["rounds"][0]]
    record["rounds"][1]["verdicts"]["batch_size=512 vs 64"] = kept
    runlog.update_json(run / runlog.SWEEP_FILE, settle=record)
    assert paired_table(build_report(run), "batch_size").rows[1][3] == (
        "equivalent within ±1 pp at 3 seeds (look 1 of --until-settled)"
    )


SWEEP = {"name": "settle", "grid": {"batch_size": [64, 128, 512], "workers": [1, 2]}, "repeats": 2}


def test_a_round_adds_seeds_at_its_configurations_in_their_order_and_a_resume_replays_it(tmp_path):
    points = [{"batch_size": 512, "workers": 2}, {"batch_size": 64, "workers": 1}]
    plan = extended_plan(build_plan(SWEEP), build_plan(SWEEP, repeats=4), points)
    assert [t.name for t in plan.trials[6 * 2 :]] == [
        "t012-batch_size=512-workers=2-seed=2",
        "t013-batch_size=512-workers=2-seed=3",
        "t014-batch_size=64-workers=1-seed=2",
        "t015-batch_size=64-workers=1-seed=3",
    ]
    assert (plan.repeats, plan.repeat_counts) == (2, (2,))  # the grid's repeats: no seed for the others
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(SWEEP))
    recorded = plan.summary() | {"settle": {"rounds": [{"seeds": 4, "points": points}, {"seeds": None}]}}
    assert resumed_plan(path, {}, None, None, recorded).trials == plan.trials


LOOP = {"name": "loop", "grid": {"batch_size": [64, 128, 512]}, "repeats": 3}
LOOP_EFFECTS = {64: 0.0, 128: -0.25, 512: -0.04}  # 128: clear at the first look; 512: open there


def fake_run(run_dir: Path, stop_after: int | None = None):
    """What execute_plan's run does to the run folder, without Ray: sweep.json lists the plan's trials, each new one
    finishes at 0.60 + LOOP_EFFECTS + 0.5 pp of noise drawn from its batch and seed; `stop_after`: Ctrl-C after that
    many new trials."""

    def run(plan, resume: bool = False, **_) -> Path:
        kept = runlog.read_json(run_dir / runlog.SWEEP_FILE) if run_dir.exists() else {}  # as add_trials keeps it
        write_sweep(run_dir, [t.name for t in plan.trials], grid=plan.grid, repeats=plan.repeats, name=plan.name)
        runlog.update_json(run_dir / runlog.SWEEP_FILE, **{k: v for k, v in kept.items() if k == "settle"})
        new = [t for t in plan.trials if not (run_dir / t.name).exists()]
        for count, trial in enumerate(new):
            if count == stop_after:
                raise KeyboardInterrupt
            batch, seed = trial.config.batch_size, trial.config.seed
            acc = round(0.60 + LOOP_EFFECTS[batch] + random.Random(f"{batch}-{seed}").gauss(0.0, 0.005), 4)
            swept = trial.swept | {"seed": seed}
            write_trial(run_dir, 0, swept, "finished", factorial_epochs(acc, 1 - acc, 10.0), gpus=False, planned=3)
            (run_dir / trial_name(0)).rename(run_dir / trial.name)
            meta = json.loads((run_dir / trial.name / runlog.TRIAL_FILE).read_text())
            (run_dir / trial.name / runlog.TRIAL_FILE).write_text(json.dumps(meta | {"name": trial.name}))
        return run_dir

    return run


def test_the_loop_records_every_look_and_a_killed_round_resumes_the_same_rounds(tmp_path):
    run_dir = tmp_path / "loop"
    settle = settling.Settle(LOOP, None, None, 6, None)
    plan = api.sweep_plan(LOOP)
    fake_run(run_dir)(plan)
    with pytest.raises(KeyboardInterrupt):  # killed two trials into the second round
        settling.settle_rounds(
            plan, settle, RunFolder(run_dir), fake_run(run_dir, stop_after=2), print_line=lambda line: None
        )
    first = runlog.read_json(run_dir / runlog.SWEEP_FILE)["settle"]["rounds"]
    assert [r["round"] for r in first] == [1] and first[0]["open"] == ["batch_size=512 vs 64"]
    assert first[0]["verdicts"]["batch_size=128 vs 64"]["verdict"] == DIFFERS
    added = first[0]["added"]
    assert {n.split("-")[1] for n in added} == {"batch_size=64", "batch_size=512"}  # none at batch 128
    assert len(added) == 2 * (first[0]["seeds"] - 3)
    # The resume: the plan replays the round's trials, the run finishes them, the looks go on from look 2.
    resumed = api.resumed_sweep_plan(LOOP, storage=tmp_path)
    assert [t.name for t in resumed.trials[9:]] == added
    fake_run(run_dir)(resumed, resume=True)
    settling.settle_rounds(resumed, settle, RunFolder(run_dir), fake_run(run_dir), print_line=lambda line: None)
    rounds = runlog.read_json(run_dir / runlog.SWEEP_FILE)["settle"]["rounds"]
    assert rounds[0] == first[0] and [r["round"] for r in rounds] == list(range(1, len(rounds) + 1))
    assert rounds[-1]["stop"] in (SETTLED, MAX_SEEDS) and len(rounds) >= 2
    assert rounds[-1]["verdicts"]["batch_size=128 vs 64"] == first[0]["verdicts"]["batch_size=128 vs 64"]
    with pytest.raises(UsageError, match=r"^--max-seeds 7: this run settles with --max-seeds 6, which fixed its"):
        api.sweep(LOOP, storage=tmp_path, resume=True, until_settled=True, max_seeds=7)  # refused before Ray


def test_each_look_builds_the_report_once(tmp_path, monkeypatch):
    """The first look too: the comparisons the levels are spent over come from the plan's grid, not a report."""
    import cifar_ray.report

    run_dir, built = tmp_path / "loop", []
    plan = api.sweep_plan(LOOP)
    fake_run(run_dir)(plan)
    build = cifar_ray.report.build_report
    monkeypatch.setattr(cifar_ray.report, "build_report", lambda path: built.append(path) or build(path))
    settling.settle_rounds(
        plan, settling.Settle(LOOP, None, None, 6, None), RunFolder(run_dir), fake_run(run_dir), print
    )
    rounds = runlog.read_json(run_dir / runlog.SWEEP_FILE)["settle"]["rounds"]
    assert len(built) == len(rounds) and rounds[0]["round"] == 1


def test_a_resume_keeps_the_recorded_budget_unless_another_is_given(tmp_path):
    """A resumed --until-settled without --budget goes on with the budget the run recorded (it dropped it)."""
    run_dir = tmp_path / "loop"
    plan = api.sweep_plan(LOOP)
    fake_run(run_dir)(plan)
    runlog.update_json(run_dir / runlog.SWEEP_FILE, settle={"max_seeds": 6, "budget_s": 600.0, "rounds": []})
    asked = settling.Settle(LOOP, None, None, None, None)
    assert settling.settle_resolved(asked, plan, RunFolder(run_dir), resume=True).budget_s == 600.0
    given = settling.Settle(LOOP, None, None, None, 900.0)
    assert settling.settle_resolved(given, plan, RunFolder(run_dir), resume=True).budget_s == 900.0
    assert settling.settle_resolved(asked, plan, RunFolder(run_dir), resume=False).budget_s is None


TINY = {
    "name": "tiny",
    "base": {
        "dataset": "synthetic",
        "train_subset": 256,
        "test_subset": 64,
        "width": 4,
        "depth": 2,
        "epochs": 1,
        "batch_size": 32,
    },
    "grid": {"lr": [0.05, 0.5]},
}


@pytest.mark.parametrize(
    ("sweep", "options", "refusal"),
    [
        (TINY, {"max_seeds": 3}, "--max-seeds bound the rounds of --until-settled; add --until-settled"),
        (TINY, {"budget_s": 60.0}, "--budget bound the rounds of --until-settled; add --until-settled"),
        (
            TINY | {"grid": {"lr": [0.05]}},
            {"until_settled": True},
            "--until-settled adds seeds until the grid's comparisons are settled, but this grid compares nothing; "
            "allowed: a grid with a factor of two values or more",
        ),
        (
            TINY | {"repeats": 3},
            {"until_settled": True, "max_seeds": 2},
            "--max-seeds 2: allowed: from the sweep's 3 seeds per grid point to 100",
        ),
        (
            TINY | {"metric": "epoch_time_s", "mode": "min"},
            {"until_settled": True},
            "--until-settled settles the report's accuracy comparisons, but the sweep's metric is epoch_time_s; "
            "allowed: metric: test_acc",
        ),
    ],
)
def test_bad_options_are_refused_in_one_line_before_ray(tmp_path, sweep, options, refusal):
    with pytest.raises(UsageError) as error:
        api.sweep(sweep, storage=tmp_path, **options)
    assert str(error.value) == refusal
    assert not (tmp_path / "tiny").exists()


def test_a_budget_that_cannot_fit_the_grid_is_refused_with_its_estimate(tmp_path, capsys):
    path = tmp_path / "tiny.yaml"
    path.write_text(json.dumps(TINY))
    assert main(["sweep", str(path), "--until-settled", "--budget", "1s", "--storage", str(tmp_path)]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("cifar-ray: error: --budget 1 s cannot fit the first round: its 2 trials are estimated at ~")
    assert not (tmp_path / "tiny" / runlog.SWEEP_FILE).exists()


@pytest.mark.slow
def test_two_rounds_run_and_sweep_json_records_them(tmp_path, ray_cluster):
    """1 seed: a pair per look, too few for a verdict; --max-seeds 2: round 2 adds seed 1, then the rounds stop.
    Round 2 trains in the slots round 1 started (a warm pool for the rounds), not in slots of its own. The elapsed
    time counts from the command's start in every round (it began again at each: 8 s shown after a 57 s run)."""
    lines = []
    run = api.sweep(TINY, storage=tmp_path, until_settled=True, max_seeds=2, print_line=lines.append)
    shown = [m.groups() for line in lines if (m := re.search(r"\] (\d+) (s|min) elapsed this session", line))]
    elapsed = [int(number) * (60 if unit == "min" else 1) for number, unit in shown]
    assert len(elapsed) >= 4 and elapsed == sorted(elapsed), lines
    assert sorted(run.trials["trial"]) == ["t000-lr=0.05", "t001-lr=0.5", "t002-lr=0.05-seed=1", "t003-lr=0.5-seed=1"]
    slot = {t.name: t.meta["slot"] for t in runlog.load_run(tmp_path / "tiny").trials}
    assert {slot["t002-lr=0.05-seed=1"], slot["t003-lr=0.5-seed=1"]} <= {slot["t000-lr=0.05"], slot["t001-lr=0.5"]}
    settle = runlog.read_json(tmp_path / "tiny" / runlog.SWEEP_FILE)["settle"]
    assert [(r["round"], r["seeds"], r["trials"], r["stop"]) for r in settle["rounds"]] == [
        (1, 2, 2, None),
        (2, None, 0, MAX_SEEDS),
    ]
    assert settle["rounds"][1]["verdicts"]["lr=0.5 vs 0.05"]["seeds"] == 2
    assert settle_line(build_report(tmp_path / "tiny")).startswith("stopped at --max-seeds 2 with 1 comparison open")


def test_the_dry_run_says_what_the_rounds_will_do(tmp_path, capsys):
    path = tmp_path / "tiny.yaml"
    path.write_text(json.dumps(TINY))
    assert main(["sweep", str(path), "--until-settled", "--max-seeds", "4", "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "--until-settled: then seeds added where a comparison is open, up to 4 per configuration; Bonferroni "
        "alpha-spending over looks and comparisons: at most 4 looks at 1 comparison, each test at α = 0.05 / 4 = "
        "0.0125, so the chance of any false real effect (or any false equivalence) in the sweep stays at most 0.05"
    )


def test_the_resume_command_after_an_interrupt_goes_on_settling():
    from cifar_ray.cli import build_parser
    from cifar_ray.commands.common import resume_command

    args = build_parser().parse_args(["sweep", "s.yaml", "--until-settled", "--max-seeds", "6", "--budget", "20m"])
    assert resume_command(args) == "cifar-ray sweep s.yaml --resume --storage runs --until-settled --budget 1200s"
