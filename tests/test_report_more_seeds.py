"""More-seeds advice that can be followed (report/verdicts.more_seeds, findings.seeds_text), on hand-made run
folders whose truth is known: losses raise the count, unfinished trials are neither done nor lost, the command is
one the sweep command accepts (its own parser and refusals, no Ray), seeds in the grid get what to change instead,
the time comes from the run's own trials, and a test set too small for the question is named as what keeps it open."""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path

import pytest
from helpers import (
    FACTORIAL_EPOCHS,
    factorial_epochs,
    ranked_correct,
    trial_name,
    write_correct,
    write_sweep,
    write_trial,
)

from cifar_ray.api import resumed_sweep_plan, sweep_plan
from cifar_ray.cli import build_parser, main
from cifar_ray.core import runlog
from cifar_ray.core.errors import ConfigError
from cifar_ray.core.run import RunFolder
from cifar_ray.core.sweep import REPEATS_MAX
from cifar_ray.core.text import rough_duration
from cifar_ray.report import build_report
from cifar_ray.report.document import to_markdown
from cifar_ray.report.sections import document
from cifar_ray.report.verdicts import ALPHA, pairs_needed

TRIAL_S = 30.0  # each hand-made trial: 3 epochs of 10 s, two at a time


def timed(run_dir: Path, i: int) -> None:
    """Start and epoch end times for trial i: trials run two at once, TRIAL_S each."""
    folder = run_dir / trial_name(i)
    meta = json.loads((folder / runlog.TRIAL_FILE).read_text())
    start = 1000.0 + TRIAL_S * (i // 2)
    (folder / runlog.TRIAL_FILE).write_text(json.dumps(meta | {"started_unix": start}))
    rows = [json.loads(line) for line in (folder / runlog.EPOCHS_FILE).read_text().splitlines()]
    lines = [json.dumps(row | {"end_unix": start + TRIAL_S * (e + 1) / len(rows)}) for e, row in enumerate(rows)]
    (folder / runlog.EPOCHS_FILE).write_text("\n".join(lines) + "\n")


def workers_run(run_dir: Path, accuracy: dict, status: dict | None = None, test_subset: int = 0) -> Path:
    """workers 1 vs 2 over seeds: `accuracy` maps (workers, seed) to the final test accuracy, `status` to a status
    other than finished (diverged: at its second epoch; pending: nothing logged); finished trials log which of the
    test images they got right (ranked_correct: two trials disagree on the fewest images they can)."""
    combos = [{"workers": w, "seed": s} for w, s in accuracy]
    seeds = len({s for _, s in accuracy})
    write_sweep(run_dir, [trial_name(i) for i in range(len(combos))], grid={"workers": [1, 2]}, repeats=seeds)
    for i, swept in enumerate(combos):
        key = (swept["workers"], swept["seed"])
        state = (status or {}).get(key, "finished")
        epochs = factorial_epochs(accuracy[key], 0.5, 10.0)
        if state == "diverged":
            epochs = epochs[:2]
            epochs[1] |= {"train_loss": None, "test_loss": None, "test_acc": 0.1, "diverged": True}
        write_trial(
            run_dir,
            i,
            swept,
            state,
            [] if state == "pending" else epochs,
            diverged_epoch=2 if state == "diverged" else None,
            gpus=False,
            planned=FACTORIAL_EPOCHS,
        )
        if test_subset:
            path = run_dir / trial_name(i) / runlog.TRIAL_FILE
            meta = json.loads(path.read_text())
            meta["config"] |= {"dataset": "synthetic", "test_subset": test_subset}
            path.write_text(json.dumps(meta))
        if state == "finished":  # the final evaluation's per-image log, as new versions write it
            write_correct(run_dir, i, ranked_correct(accuracy[key], test_subset or 10_000), FACTORIAL_EPOCHS)
        if state != "pending":
            timed(run_dir, i)
    return run_dir


# workers=2 is +0.3 pp with a 1.2 pp spread: open at 3 pairs, settled by some tens.
SPREAD = [0.012, -0.012, 0.003, -0.009, 0.006, 0.0]


def accuracy(seeds: int) -> dict:
    return {(w, s): 0.80 + (0.003 + SPREAD[s]) * (w == 2) for w in (1, 2) for s in range(seeds)}


def effect(report):
    return report.effects["workers"]["final_test_acc"].iloc[0]


def findings_line(report, start: str = "- **workers=2**") -> str:
    text = to_markdown(document(report, {})).split("## Findings")[1].split("\n## ")[0]
    return next(line for line in text.splitlines() if line.startswith(start))


def test_losses_ask_for_proportionally_more_seeds(tmp_path):
    """Six seeds, workers=2 diverged in three (seeds 3-5): the three pairs left are those of a clean three-seed run,
    so both runs need the same pairs; with half the pairs lost the advice asks for twice the seeds, and says so."""
    clean = build_report(workers_run(tmp_path / "clean", accuracy(3)))
    lossy = build_report(workers_run(tmp_path / "lossy", accuracy(6), status={(2, s): "diverged" for s in (3, 4, 5)}))
    a, b = effect(clean), effect(lossy)
    assert (b["n_pairs"], b["n_planned"], b["n_open"], b["survival"]) == (3, 6, 0, 0.5)
    assert a["mean_diff"] == pytest.approx(b["mean_diff"]) and a["verdict"] == b["verdict"] == "not conclusive"
    needed = pairs_needed(a["mean_diff"], a["std_diff"] ** 2, 0.01, ALPHA, a["testset_var"])
    assert a["pairs_needed"] == b["pairs_needed"] == needed and needed > 5
    assert (a["more_seeds"], b["more_seeds"]) == (needed - 3, 2 * (needed - 3))
    line = findings_line(lossy)
    assert (
        f"about {2 * (needed - 3)} more seeds per grid point would resolve it at this spread, allowing for the 3 of 6"
    )
    assert " ended pairs lost: `cifar-ray sweep FILE --resume --repeats " in line
    trials = 2 * (needed - 3) * 2  # seeds x grid points
    assert (
        f"--repeats {6 + 2 * (needed - 3)}`, ~{rough_duration(trials * TRIAL_S / 2)} ({trials} trials at this run's "
        "mean of 30.0 s per finished trial, 2 at once: an estimate from this run's trial times)"
    ) in line


def test_unfinished_trials_are_neither_done_nor_lost(tmp_path):
    """Seeds 0-2 finished, seed 3 pending on both sides: three pairs done, one still to run (its trials count
    toward what a resume yields, not toward what is there), none lost."""
    run_dir = workers_run(tmp_path / "run", accuracy(4), status={(w, 3): "pending" for w in (1, 2)})
    row = effect(build_report(run_dir))
    assert (row["n_pairs"], row["n_planned"], row["n_open"], row["survival"]) == (3, 4, 1, 1.0)
    needed = int(row["pairs_needed"])
    assert row["more_seeds"] == needed - 3 - 1
    line = findings_line(build_report(run_dir))
    assert (
        f"about {needed - 4} more seeds per grid point would resolve it at this spread, besides its 1 unfinished"
        " pair (not counted as done): `cifar-ray sweep FILE --resume --repeats "
    ) in line
    assert f"({(needed - 4) * 2 + 2} trials at this run's mean" in line  # the new seeds' and the two pending


SWEEP = (
    "name: seeds\n"
    "base: {dataset: synthetic, train_subset: 256, width: 4, depth: 2, epochs: 3, batch_size: 32}\n"
    "grid:\n  lr: [0.05, 0.1]\n"
)


def planned_run(tmp_path: Path, sweep: str, repeats: int | None, status: dict) -> tuple[Path, Path, Path]:
    """A sweep file, and its run folder written as the sweep writes it (sweep.json from the plan, each trial.json
    with its resolved config), started by `cifar-ray sweep FILE --storage S [--repeats N] --estimate`; trials
    finished at 80 % (+0.3 pp for lr=0.1, SPREAD per seed) unless `status` maps (lr, seed) to another status."""
    path, storage = tmp_path / "sweep.yaml", tmp_path / "runs"
    path.write_text(sweep)
    plan = sweep_plan(path, repeats=repeats)
    run_dir = storage / plan.name
    run_dir.mkdir(parents=True)
    command = f"cifar-ray sweep {path} --storage {storage}" + (f" --repeats {repeats}" if repeats else "")
    (run_dir / runlog.SWEEP_FILE).write_text(
        json.dumps(plan.summary() | {"command": command + " --estimate", "warm": True, "slots": True})
    )
    for trial in plan.trials:
        key = (trial.config.lr, trial.config.seed)
        state = status.get(key, "finished")
        acc = 0.80 + (0.003 + SPREAD[trial.config.seed]) * (trial.config.lr == 0.1)
        epochs = [row | {"end_unix": 1000.0 + 10 * row["epoch"]} for row in factorial_epochs(acc, 0.5, 10.0)]
        meta = {
            "name": trial.name,
            "index": trial.index,
            "swept": trial.swept,
            "config": json.loads(json.dumps(trial.config.model_dump())),
            "status": state,
            "started_unix": 1000.0,
        }
        (run_dir / trial.name).mkdir()
        (run_dir / trial.name / runlog.TRIAL_FILE).write_text(json.dumps(meta))
        if state != "pending":
            (run_dir / trial.name / runlog.EPOCHS_FILE).write_text("".join(json.dumps(r) + "\n" for r in epochs))
        if state == "finished":
            write_correct(run_dir, trial.name, ranked_correct(acc, 10_000), FACTORIAL_EPOCHS)
    return path, storage, run_dir


def test_the_suggested_command_is_one_the_sweep_command_accepts(tmp_path, capsys):
    """Started with --repeats 4 and --estimate; seed 2 of lr=0.1 failed, seed 3 of lr=0.05 is pending: the command
    in the advice parses, and resuming with it is refused by none of the sweep's checks (the plan, its trials'
    names and configs against the run folder), and adds exactly the seeds the advice names."""
    path, storage, run_dir = planned_run(tmp_path, SWEEP, 4, {(0.1, 2): "failed", (0.05, 3): "pending"})
    report = build_report(run_dir)
    row = report.effects["lr"]["final_test_acc"].iloc[0]
    assert (row["n_pairs"], row["n_open"], row["survival"], row["verdict"]) == (2, 1, 2 / 3, "no verdict")
    line = findings_line(report, "- **lr=0.1**")
    command = re.search(r"`(cifar-ray sweep [^`]+)`", line).group(1)
    words = shlex.split(command)[1:]
    args = build_parser().parse_args(words)
    assert (args.command, args.resume, args.estimate, args.file) == ("sweep", True, False, str(path))
    plan = resumed_sweep_plan(args.file, args.set, args.name, args.repeats, args.storage)
    run = RunFolder(run_dir)
    assert run.resume_refusal(plan) is None and run.changed_configs_refusal(plan) is None
    assert args.repeats == report.seeds + int(row["more_seeds"]) and len(plan.trials) == 2 * args.repeats
    assert main([*words, "--dry-run"]) == 0
    capsys.readouterr()


def test_seeds_in_the_grid_get_what_to_change_not_a_refused_command(tmp_path):
    """seed is a grid key: `--resume --repeats N` is refused by the sweep itself (repeats beside grid.seed), so the
    advice names no such command and says what to change instead."""
    sweep = SWEEP.replace("lr: [0.05, 0.1]", "lr: [0.05, 0.1]\n  seed: [0, 1, 2]")
    path, storage, run_dir = planned_run(tmp_path, sweep, None, {})
    report = build_report(run_dir)
    more = int(report.effects["lr"]["final_test_acc"].iloc[0]["more_seeds"])
    line = findings_line(report, "- **lr=0.1**")
    assert (
        f"seed is a grid key, which `--resume --repeats` refuses: list {3 + more} seeds under grid.seed and run it "
        "as a new run (`--name NEW`)"
    ) in line
    assert "`cifar-ray sweep" not in line
    with pytest.raises(ConfigError, match="grid.seed and repeats=.* both vary the seed"):
        resumed_sweep_plan(path, None, None, 3 + more, storage)


def test_a_test_set_too_small_for_the_question_is_named_not_more_seeds(tmp_path):
    """200 test images, +1.5 pp (3 images) in each of three seeds, the two sides disagreeing on those 3 images only:
    the test set's part of the effect's noise, measured per image (sd sqrt(3/200 x 197/200 / 200) = 0.86 pp), keeps
    +1.5 pp below 1.96 sd and above the ±1 pp margin, and it does not shrink with seeds: the advice says more seeds
    cannot settle it and from how many test images they could (about 1.3 times as many), not a seed count."""
    run_dir = workers_run(
        tmp_path / "run", {(w, s): 0.80 + 0.015 * (w == 2) + 0.001 * s for w in (1, 2) for s in (0, 1, 2)}, None, 200
    )
    report = build_report(run_dir)
    row = effect(report)
    assert row["testset_limited"] and math.isnan(row["more_seeds"])
    line = findings_line(report)
    assert "more seeds cannot settle it: the shared test set's own noise in this difference (sd 0.86" in line
    assert "pp on 200 test images) does not shrink with seeds; a larger `test_subset` would" in line
    images = int(re.search(r"from about (\d+) test images on \(of 10000\), with enough seeds", line).group(1))
    assert 240 < images < 270  # 1.96 sd at sd 0.86 pp x sqrt(200 / images) = 1.5 pp: 0.86² x 1.96² / 1.5² x 200
    assert "per grid point" not in line  # no seed count


def test_more_seeds_than_a_run_takes_is_said_not_suggested(tmp_path):
    """+1 pp exactly on the ±1 pp margin with a 6 pp spread: never equivalent, and a difference only from about 150
    pairs: more than the 100 seeds per grid point a sweep accepts (REPEATS_MAX), so no --repeats command is given."""
    diffs = [0.07, -0.05, 0.01]
    run_dir = workers_run(tmp_path / "run", {(w, s): 0.80 + diffs[s] * (w == 2) for w in (1, 2) for s in range(3)})
    report = build_report(run_dir)
    more = int(effect(report)["more_seeds"])
    assert more + 3 > REPEATS_MAX
    line = findings_line(report)
    assert line.endswith(
        f"would resolve it at this spread: {more + 3} seeds per grid point, more than the 100 one run takes; "
        "test-set noise measured per image."
    )
    with pytest.raises(ConfigError, match=r"--repeats \d+: allowed: 1 to 100 seeds per grid point"):
        sweep_plan({"name": "x", "grid": {"workers": [1, 2]}}, repeats=more + 3)
