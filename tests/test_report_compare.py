"""Several runs in one report: the runs become the factor `run`, their trials paired on their configs
(RUN_MATCH_RULE). Hand-made run folders (tests/helpers.py) for the logic, one real pair of tiny sweeps."""

from __future__ import annotations

import json
import shlex
import statistics
from pathlib import Path

import pandas as pd
import pytest
from helpers import healthy_epochs, report_text, trial_name, write_sweep, write_trial

from cifar_ray.cli import main
from cifar_ray.core import runlog
from cifar_ray.core.config import ConfigError
from cifar_ray.core.storage import StoragePath
from cifar_ray.report import RUN_MATCH_RULE, build_report, write_report
from cifar_ray.report.compare import run_labels

SEEDS = [0, 1]


def write_run(run_dir: Path, workers: list[int], config: dict | None = None, shift: float = 0.0, **sweep) -> dict:
    """A finished run of grid workers x SEEDS; `config` is set in every trial (run-level keys), `shift` is added to
    every final test accuracy. Returns the final test accuracy per (workers, seed)."""
    combos = [{"batch_size": 64, "workers": w, "seed": s} for w in workers for s in SEEDS]
    write_sweep(run_dir, [trial_name(i) for i in range(len(combos))], grid={"workers": workers}, **sweep)
    finals = {}
    for i, swept in enumerate(combos):
        epochs = healthy_epochs(i, swept)
        epochs[-1]["test_acc"] += shift + 0.003 * swept["seed"] * (run_dir.name == "after")
        write_trial(run_dir, i, swept, "finished", epochs, gpus=False)
        trial_file = run_dir / trial_name(i) / "trial.json"
        meta = json.loads(trial_file.read_text())
        meta["config"] |= config or {}
        trial_file.write_text(json.dumps(meta))
        finals[swept["workers"], swept["seed"]] = epochs[-1]["test_acc"]
    return finals


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path, dict, dict]:
    """`before` and `after`: the same grid, after with amp=bf16 everywhere (a run-level key) and +2 pp."""
    root = tmp_path_factory.mktemp("runs")
    before = write_run(
        root / "before", [1, 2], {"amp": "off"}, command="cifar-ray sweep sweeps/x.yaml", git_revision="1111111"
    )
    after = write_run(
        root / "after",
        [1, 2],
        {"amp": "bf16"},
        0.02,
        command="cifar-ray sweep sweeps/x.yaml --set amp=bf16",
        git_revision="2222222",
        host={"hostname": "box", "cpu_model": "Other CPU", "cpu_count": 64, "platform": "Linux"},
    )
    return root / "before", root / "after", before, after


def test_the_run_factor_pairs_trials_with_equal_configs(pair):
    before_dir, after_dir, before, after = pair
    report = build_report([before_dir, after_dir])
    assert report.factors == ["run", "workers"] and report.grid["run"] == ["before", "after"]
    assert report.baseline["run"] == "before"
    assert report.comparison.run_level == {"amp": {"before": "off", "after": "bf16"}}
    assert "seed" in report.comparison.matched and "workers" in report.comparison.matched
    effect = report.effects["run"]["final_test_acc"].set_index("run").loc["after"]
    diffs = [after[key] - before[key] for key in before]  # each trial of after minus its twin in before
    assert effect["n_pairs"] == 4 and effect["mean_diff"] == pytest.approx(statistics.mean(diffs))
    assert effect["std_diff"] == pytest.approx(statistics.stdev(diffs))
    # a swept key's pairs stay within a run: workers=2 vs 1 with the same seed, in each of the two runs
    workers = report.effects["workers"]["final_test_acc"].iloc[0]
    assert workers["n_pairs"] == 4
    expected = [runs[2, s] - runs[1, s] for runs in (before, after) for s in SEEDS]
    assert workers["mean_diff"] == pytest.approx(statistics.mean(expected))
    assert report.trials["trial"].iloc[0] == f"before/{trial_name(0)}"
    assert report.trials["run"].tolist() == ["before"] * 4 + ["after"] * 4

    flipped = build_report([before_dir, after_dir], baseline={"run": "after"})
    effect = flipped.effects["run"]["final_test_acc"].set_index("run").loc["before"]
    assert effect["mean_diff"] == pytest.approx(-statistics.mean(diffs))


def test_the_markdown_lists_each_run_and_says_what_the_run_effect_includes(pair, tmp_path):
    before_dir, after_dir, before, after = pair
    readme = write_report([before_dir, after_dir], tmp_path)
    text = readme.read_text(encoding="utf-8")
    assert text.startswith("# before vs after\n")
    header = text.split("## Setup")[1].split("\n## ")[0]
    rows = {line.split(" | ")[0].lstrip("| "): line for line in header.splitlines() if line.startswith("| ")}
    assert "`1111111`" in rows["before"] and "| `cifar-ray sweep sweeps/x.yaml` |" in rows["before"]
    assert "| 4: 4 finished, 0 failed, 0 diverged, 0 oom |" in rows["before"]
    assert "CPU only: Test CPU, 16 cores" in rows["before"] and "CPU only: Other CPU, 64 cores" in rows["after"]
    assert "`2222222`" in rows["after"] and "`cifar-ray sweep sweeps/x.yaml --set amp=bf16`" in rows["after"]
    assert "| Run-level keys | amp: off in before, bf16 in after |" in header
    assert RUN_MATCH_RULE in text.split("## Findings")[1]  # below the first screen: a long rule
    diffs = [after[key] - before[key] for key in before]
    findings = text.split("## Findings")[1].split("\n## ")[0]
    finding = next(line for line in findings.splitlines() if line.startswith("- **run=after**"))
    assert finding.startswith("- **run=after** vs before: time per epoch ")  # paired on RUN_MATCH_RULE too
    assert f"; final test accuracy {100 * statistics.mean(diffs):+.2f} pp, 4 of 4 pairs" in finding
    assert "part of this effect: amp: off in before, bf16 in after." in finding
    section = text.split("## Effect of `run`")[1].split("\n## ")[0]
    assert "| run=after | 4 of 4 |" in section and "vs run](run_accuracy.png)" in section
    assert (tmp_path / "run_accuracy.png").read_bytes()[:4] == b"\x89PNG" and (tmp_path / "run_cost.png").is_file()


def test_csv_and_json_have_the_run_column(pair, tmp_path):
    before_dir, after_dir, _, _ = pair
    trials = pd.read_csv(write_report([before_dir, after_dir], tmp_path, fmt="csv"))
    assert trials.columns[:4].tolist() == ["trial", "status", "run", "workers"]
    assert trials["run"].tolist() == ["before"] * 4 + ["after"] * 4
    epochs = pd.read_csv(tmp_path / "epochs.csv")
    assert epochs.columns[:2].tolist() == ["trial", "run"] and set(epochs["run"]) == {"before", "after"}
    effect = pd.read_csv(tmp_path / "effect_run.csv")
    assert effect["run"].tolist() == ["after"] * 3 and effect["n_pairs"].tolist() == [4, 4, 4]  # accuracy, time, memory
    assert pd.read_csv(tmp_path / "factor_run.csv")["n"].tolist() == [4, 4]

    data = json.loads(write_report([before_dir, after_dir], tmp_path, fmt="json").read_text(encoding="utf-8"))
    assert [row["run"] for row in data["trials"]] == ["before"] * 4 + ["after"] * 4
    runs = data["sweep"]["compared_runs"]
    assert [(r["label"], r["git_revision"], r["trials"]) for r in runs] == [
        ("before", "1111111", 4),
        ("after", "2222222", 4),
    ]
    assert runs[1]["command"] == "cifar-ray sweep sweeps/x.yaml --set amp=bf16"
    assert data["sweep"]["run_level_keys"] == {"amp": {"before": "off", "after": "bf16"}}
    assert data["factors"]["run"]["baseline"] == "before"


def test_one_run_is_todays_report_with_the_command_that_reruns_it(pair, tmp_path):
    before_dir = pair[0]
    text = write_report(before_dir, tmp_path / "one").read_text(encoding="utf-8")
    assert "| Re-run with | `cifar-ray sweep sweeps/x.yaml` |" in text and "run" not in build_report(before_dir).factors
    assert write_report([before_dir], tmp_path / "list").read_bytes() == (tmp_path / "one" / "README.md").read_bytes()
    trials = pd.read_csv(write_report(before_dir, tmp_path / "csv", fmt="csv"))
    assert "run" not in trials.columns
    unrecorded = tmp_path / "unrecorded"
    write_run(unrecorded, [1])
    assert "Re-run with" not in report_text(build_report(unrecorded))


def test_runs_pair_on_configs_not_on_grid_labels(tmp_path):
    """One run sweeps `optimizer` as labelled bundles (optimizer and lr); the other ran adam at lr 0.002 alone: its
    trial pairs with the bundle that has the same config."""
    swept = tmp_path / "swept"
    labels = {"momentum (lr=0.05)": ("momentum", 0.05), "adam (lr=0.002)": ("adam", 0.002)}
    write_sweep(swept, [trial_name(0), trial_name(1)], grid={"optimizer": list(labels)}, repeats=1)
    for i, (label, (optimizer, lr)) in enumerate(labels.items()):
        write_trial(
            swept,
            i,
            {"optimizer": label, "workers": 1, "seed": 0},
            "finished",
            healthy_epochs(i, {"batch_size": 64, "workers": 1, "seed": 0}),
            gpus=False,
        )
        meta = json.loads((swept / trial_name(i) / "trial.json").read_text())
        meta["config"] |= {"optimizer": optimizer, "lr": lr}
        (swept / trial_name(i) / "trial.json").write_text(json.dumps(meta))
    single = tmp_path / "single"
    write_sweep(single, [trial_name(0)], grid={}, repeats=1)
    write_trial(
        single,
        0,
        {"workers": 1, "seed": 0},
        "finished",
        healthy_epochs(5, {"batch_size": 64, "workers": 1, "seed": 0}),
        gpus=False,
    )
    meta = json.loads((single / trial_name(0) / "trial.json").read_text())
    meta["config"] |= {"optimizer": "adam", "lr": 0.002}
    (single / trial_name(0) / "trial.json").write_text(json.dumps(meta))
    report = build_report([swept, single])
    effect = report.effects["run"]["final_test_acc"].iloc[0]
    adam = report.trials.set_index("trial")["final_test_acc"]
    assert effect["n_pairs"] == 1
    assert effect["mean_diff"] == pytest.approx(adam[f"single/{trial_name(0)}"] - adam[f"swept/{trial_name(1)}"])


def test_runs_with_nothing_to_pair_are_refused_naming_what_differs(pair, tmp_path, capsys):
    before_dir = pair[0]
    other = tmp_path / "four-workers"
    write_run(other, [4])
    with pytest.raises(
        ConfigError,
        match=r"runs before and four-workers have no trials to compare.*workers: 1, 2 in before, 4 in four-workers",
    ):
        build_report([before_dir, other])
    assert main(["report", str(before_dir), str(other), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("cifar-ray: error: runs before and four-workers have no trials to compare")
        and err.count("\n") == 1
    )
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match="run folder given twice"):
        build_report([before_dir, before_dir])


def test_runs_of_the_same_name_are_labelled_with_their_parent(tmp_path, monkeypatch):
    for box in ("here", "there"):
        write_run(tmp_path / box / "quickstart", [1, 2])
    report = build_report([tmp_path / "here" / "quickstart", tmp_path / "there" / "quickstart"])
    assert report.grid["run"] == ["here/quickstart", "there/quickstart"]
    assert report.effects["run"]["final_test_acc"]["n_pairs"].tolist() == [4]  # the same logs: equal configs
    monkeypatch.chdir(tmp_path)
    assert main(["report", "here/quickstart", "there/quickstart", "--format", "json"]) == 0
    assert Path("reports/here-quickstart-vs-there-quickstart/report.json").is_file()


def test_labels_are_folder_names_with_as_much_of_the_path_as_tells_them_apart():
    def local(path: str) -> StoragePath:
        return StoragePath(None, path)

    bucket = StoragePath(None, "bucket/runs/quickstart", "s3", "endpoint_override=localhost:9000")
    assert run_labels([local("/w/runs/a"), local("/w/runs/b")]) == ["a", "b"]
    assert run_labels([local("/w/runs/quickstart"), bucket]) == ["w/runs/quickstart", "bucket/runs/quickstart"]
    assert run_labels([local("/x/runs/q"), local("/y/runs/q"), local("/y/runs/r")]) == ["x/runs/q", "y/runs/q", "r"]


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.slow
def test_two_real_runs_of_one_sweep_compared(tmp_path, capsys):
    """The same tiny sweep run twice, the second with --set batch_size=64: the run effect pairs each optimizer's trial
    with its twin, batch_size is a run-level key, and the header shows the commands as typed."""
    sweep = tmp_path / "tiny.yaml"
    sweep.write_text(
        "name: tiny\n"
        "max_concurrent: 1\n"  # one slot: its start, not the trials, is what costs here
        "base: {dataset: synthetic, train_subset: 256, test_subset: 128, train_eval_size: 0, width: 8, epochs: 1, "
        "batch_size: 32, augment: none}\n"
        "grid:\n  optimizer: [{optimizer: momentum, lr: 0.05}, {optimizer: adam, lr: 0.003}]\n"
    )
    storage = tmp_path / "runs"
    first = ["sweep", str(sweep), "--storage", str(storage), "--name", "tiny"]
    second = ["sweep", "--set", "batch_size=64", str(sweep), "--storage", str(storage), "--name", "tiny-b64"]
    for argv in (first, second):
        assert main(argv) == 0, capsys.readouterr().err
    capsys.readouterr()
    runs = [storage / "tiny", storage / "tiny-b64"]
    assert main(["report", *map(str, runs), "--out", str(tmp_path / "report")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "report" / "README.md")

    report = build_report(runs)
    assert report.comparison.run_level == {"batch_size": {"tiny": 32, "tiny-b64": 64}}
    finals = {
        (run.name, trial): runlog.read_epochs(run / trial)[-1]["test_acc"]
        for run in runs
        for trial in json.loads((run / "sweep.json").read_text())["trials"]
    }
    trials = sorted({trial for _, trial in finals})
    assert len(trials) == 2
    diffs = [finals["tiny-b64", trial] - finals["tiny", trial] for trial in trials]
    effect = report.effects["run"]["final_test_acc"].iloc[0]
    assert effect["run"] == "tiny-b64" and effect["n_pairs"] == 2
    assert effect["mean_diff"] == pytest.approx(statistics.mean(diffs))

    text = (tmp_path / "report" / "README.md").read_text(encoding="utf-8")
    header = text.split("## Setup")[1].split("\n## ")[0]
    for label, argv in (("tiny", first), ("tiny-b64", second)):
        row = next(line for line in header.splitlines() if line.startswith(f"| {label} |"))
        assert f"| 2: 2 finished, 0 failed, 0 diverged, 0 oom | `{shlex.join(['cifar-ray', *argv])}` |" in row
    assert "| Run-level keys | batch_size: 32 in tiny, 64 in tiny-b64 |" in header
    assert "| run=tiny-b64 | 2 of 2 |" in text.split("## Effect of `run`")[1]
    trials_csv = pd.read_csv(write_report(runs, tmp_path / "csv", fmt="csv"))
    assert trials_csv["run"].tolist() == ["tiny", "tiny", "tiny-b64", "tiny-b64"]


def test_the_default_output_is_beside_a_run_and_never_replaces_a_file_git_tracks(pair, tmp_path, monkeypatch, capsys):
    """`cifar-ray report runs/quickstart` (the sweep's last line) used to overwrite the committed reports/quickstart."""
    import shutil
    import subprocess

    before_dir, after_dir, _, _ = pair
    monkeypatch.chdir(tmp_path)
    for run_dir in (before_dir, after_dir):
        shutil.copytree(run_dir, tmp_path / "runs" / run_dir.name)
    assert main(["report", "runs/before", "--format", "json"]) == 0
    assert capsys.readouterr().out == f"{tmp_path}/runs/before/report/report.json\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["runs"]  # nothing in reports/

    # Several runs have no folder of their own: reports/<a>-vs-<b>, unless git tracks a file there.
    committed = tmp_path / "reports" / "before-vs-after" / "report.json"
    committed.parent.mkdir(parents=True)
    committed.write_text("committed\n")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "reports"], check=True)
    assert main(["report", "runs/before", "runs/after", "--format", "json"]) == 2
    assert capsys.readouterr().err == (
        "cifar-ray: error: report: the default output folder reports/before-vs-after holds 1 file tracked by git "
        "(report.json), which this would replace; pass --out FOLDER to write elsewhere, or --force to replace them\n"
    )
    assert committed.read_text() == "committed\n"
    assert main(["report", "runs/before", "runs/after", "--format", "json", "--out", "reports/before-vs-after"]) == 0
    assert committed.read_text() != "committed\n"  # asked for by name: replaced
    committed.write_text("committed\n")
    assert main(["report", "runs/before", "runs/after", "--format", "json", "--force"]) == 0
    assert committed.read_text() != "committed\n"


def test_a_report_out_that_cannot_be_written_is_one_line(pair, tmp_path, capsys):
    """It was a NotADirectoryError traceback. Tests run as root, whom a folder's mode does not stop: a folder under
    a file is one that nobody can make."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["report", str(pair[0]), "--format", "json", "--out", str(blocker / "out")]) == 2
    assert capsys.readouterr().err == (
        f"cifar-ray: error: report --out {blocker / 'out'}: cannot write there: {blocker} is a file, not a folder; "
        "allowed: a folder you can write\n"
    )
