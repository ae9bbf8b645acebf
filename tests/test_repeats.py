"""`cifar-ray sweep FILE --resume --repeats N`: a finished or interrupted sweep extended with new seeds."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from cifar_ray.cli import main
from cifar_ray.core import runlog
from cifar_ray.core.errors import ConfigError
from cifar_ray.core.sweep import build_plan, extended_plan, resumed_plan

TINY_SWEEP = (
    "name: seeds\n"
    "max_concurrent: 1\n"  # one slot: its start, not the trials, is what costs here
    "base: {dataset: synthetic, train_subset: 256, test_subset: 64, width: 4, depth: 2, epochs: 1, batch_size: 32}\n"
    "grid:\n  lr: [0.05, 0.1]\n"
)
SWEEP = {"name": "seeds", "grid": {"lr": [0.05, 0.1]}}


def test_extended_plan_keeps_the_trials_names_and_numbers_the_new_seeds_after_them():
    plan = extended_plan(build_plan(SWEEP), build_plan(SWEEP, repeats=3))
    assert [t.name for t in plan.trials] == [
        "t000-lr=0.05",
        "t001-lr=0.1",
        "t002-lr=0.05-seed=1",
        "t003-lr=0.05-seed=2",
        "t004-lr=0.1-seed=1",
        "t005-lr=0.1-seed=2",
    ]
    assert [(t.index, t.config.lr, t.config.seed) for t in plan.trials[2:4]] == [(2, 0.05, 1), (3, 0.05, 2)]
    assert (plan.repeats, plan.repeat_counts) == (3, (1, 3))
    again = extended_plan(plan, build_plan(SWEEP, repeats=4))  # a second extension numbers on
    assert [t.name for t in again.trials[6:]] == ["t006-lr=0.05-seed=3", "t007-lr=0.1-seed=3"]
    assert again.trials[:6] == plan.trials and again.summary()["repeat_counts"] == [1, 3, 4]


def test_a_resume_rebuilds_the_plan_through_its_recorded_extensions(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(SWEEP))
    extended = extended_plan(build_plan(SWEEP, source=str(path)), build_plan(SWEEP, source=str(path), repeats=3))
    recorded = extended.summary()
    assert resumed_plan(path, {}, None, 3, recorded).trials == extended.trials
    assert [t.name for t in resumed_plan(path, {}, None, 4, recorded).trials][6:] == [
        "t006-lr=0.05-seed=3",
        "t007-lr=0.1-seed=3",
    ]
    with pytest.raises(ConfigError, match=r"^--repeats 2 is fewer seeds than the 3 per grid point the run already"):
        resumed_plan(path, {}, None, 2, recorded)
    with pytest.raises(ConfigError, match=rf"^{path}: repeats: 1 is fewer seeds .* allowed: --repeats 3 to resume"):
        resumed_plan(path, {}, None, None, recorded)


def test_repeats_replaces_the_files_repeats(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(TINY_SWEEP)
    assert main(["sweep", str(path), "--repeats", "3", "--dry-run", "--json"]) == 0
    trials = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert [(t["config"]["lr"], t["config"]["seed"]) for t in trials] == [
        (lr, s) for lr in (0.05, 0.1) for s in range(3)
    ]


@pytest.mark.parametrize("repeats", ["0", "101"])
def test_repeats_out_of_range_is_one_line(tmp_path, capsys, repeats):
    path = tmp_path / "s.yaml"
    path.write_text(TINY_SWEEP)
    assert main(["sweep", str(path), "--repeats", repeats, "--dry-run"]) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"cifar-ray: error: --repeats {repeats}: allowed: 1 to 100 seeds per grid point"
    )


def folder_hashes(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_resume_with_more_repeats_runs_only_the_new_seeds_and_keeps_the_finished_trials(tmp_path, capsys):
    (tmp_path / "s.yaml").write_text(TINY_SWEEP)
    sweep = ["sweep", str(tmp_path / "s.yaml"), "--storage", str(tmp_path / "runs")]
    run_dir = tmp_path / "runs" / "seeds"
    assert main(sweep) == 0, capsys.readouterr().err
    capsys.readouterr()  # the first run's lines: the resumed run's are read below
    old = [t.name for t in runlog.load_run(run_dir).trials]
    assert old == ["t000-lr=0.05", "t001-lr=0.1"]
    before = {name: folder_hashes(run_dir / name) for name in old}
    assert all(runlog.EPOCHS_FILE in files and runlog.TRIAL_FILE in files for files in before.values())

    assert main([*sweep, "--resume", "--repeats", "2"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    run = runlog.load_run(run_dir)
    assert [t.name for t in run.trials] == [*old, "t002-lr=0.05-seed=1", "t003-lr=0.1-seed=1"]
    assert [t.status for t in run.trials] == ["finished"] * 4
    assert [(t.config["lr"], t.config["seed"], len(t.epochs)) for t in run.trials] == [
        (0.05, 0, 1),
        (0.1, 0, 1),
        (0.05, 1, 1),
        (0.1, 1, 1),
    ]
    assert {name: folder_hashes(run_dir / name) for name in old} == before  # byte for byte, nothing added
    assert "resuming seeds: 2 of 4 trials unfinished" in out
    assert "t002-lr=0.05-seed=1  starts" in out and "t003-lr=0.1-seed=1  starts" in out
    assert not any(f"{name}  starts" in out or f"{name}  continues" in out for name in old)
    assert run.sweep["trials"] == [t.name for t in run.trials]
    assert (run.sweep["repeats"], run.sweep["repeat_counts"], "finished_at" in run.sweep) == (2, [1, 2], True)

    # the refusal of changed configs still holds for the trials the run has, before anything is written
    everything = folder_hashes(run_dir)
    assert main([*sweep, "--resume", "--repeats", "3", "--set", "epochs=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "t000-lr=0.05 (epochs 1 -> 2)" in err, err
    assert folder_hashes(run_dir) == everything


def test_the_resume_hint_of_an_extension_asks_for_the_same_seeds():
    import argparse

    from cifar_ray.commands.common import resume_command

    args = argparse.Namespace(file="s.yaml", storage="runs", name=None, address=None, set=["epochs=1"], repeats=4)
    assert resume_command(args) == "cifar-ray sweep s.yaml --resume --storage runs --repeats 4 --set epochs=1"
