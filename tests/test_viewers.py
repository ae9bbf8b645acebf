"""`cifar-ray export` read back with the viewers' own readers: TensorBoard's EventAccumulator and MLflow's client.

The run is the committed quickstart sweep (reports/quickstart/logs, written by a real sweep) plus two hand-written
trials: one that failed after a restart (its metrics.jsonl holds epoch 2 twice, the later copy counts) and one that
never started.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cifar_ray.cli import main
from cifar_ray.core import runlog
from cifar_ray.export.viewers import DEFAULT_OUT, EXPORT_MARK, MLFLOW_UI_VENV, RUN_STARTED_TAG, ViewerError, export_run

QUICKSTART_LOGS = Path(__file__).resolve().parent.parent / "reports" / "quickstart" / "logs"
FAILED, PENDING = "t004-restarted-then-failed", "t005-pending"
NOT_PLOTTED = ("epoch", "end_unix")


def epoch_row(epoch: int, test_acc: float, **extra) -> dict:
    return {
        "epoch": epoch,
        "train_loss": 2.0 / epoch,
        "test_acc": test_acc,
        "samples_per_s": 1000.0 + epoch,
        "train_samples": 4992,
        "end_unix": 1795302000.0 + 10 * epoch,
        **extra,
    }


@pytest.fixture
def run_dir(tmp_path) -> Path:
    run_dir = tmp_path / "quickstart"
    shutil.copytree(QUICKSTART_LOGS, run_dir)
    config = runlog.read_json(next(run_dir.glob("t000-*")) / runlog.TRIAL_FILE)["config"]
    for name, status, error in [(FAILED, "failed", "RuntimeError: worker 1 died"), (PENDING, "pending", None)]:
        meta = {"name": name, "config": config | {"lr": 0.3}, "status": status, "error": error}
        runlog.write_json(run_dir / name / runlog.TRIAL_FILE, meta | {"started_unix": 1795302000.0})
    lines = [
        epoch_row(1, 0.4),
        epoch_row(2, 0.5),  # lost in the restart: the epoch is trained again
        epoch_row(2, 0.55, train_loss=None, diverged=False, future_key=3.0),  # null: a non-finite loss
    ]
    (run_dir / FAILED / runlog.EPOCHS_FILE).write_text("".join(json.dumps(line) + "\n" for line in lines))
    return run_dir


def logged_rows(trial_dir: Path) -> dict[int, dict]:
    """metrics.jsonl read here on its own: the last line of each epoch counts."""
    rows = [json.loads(line) for line in (trial_dir / runlog.EPOCHS_FILE).read_text().splitlines()]
    return {row["epoch"]: row for row in rows}


def expected_scalars(trial_dir: Path) -> dict[str, list[tuple[int, float, float]]]:
    """{metric: [(epoch, value, end_unix)]}: every number of every epoch named in runlog.EPOCH_METRICS, and an older
    log's under its new name (the recorded quickstart's `lr` is lr_first)."""
    if not (trial_dir / runlog.EPOCHS_FILE).exists():
        return {}
    series: dict[str, list] = {}
    known = {**runlog.EPOCH_METRICS, **runlog.OLD_EPOCH_METRICS}
    for epoch, row in sorted(logged_rows(trial_dir).items()):
        for key, value in row.items():
            key = runlog.RENAMED_EPOCH_KEYS.get(key, key)
            numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
            if numeric and key in known and key not in NOT_PLOTTED:
                series.setdefault(key, []).append((epoch, value, row["end_unix"]))
    return series


def shown(value) -> str | float:
    """A config value as the viewers show it: numbers as numbers, the rest as trial.json writes it."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return value if isinstance(value, str) else json.dumps(value)


def metric_values(run_dir: Path) -> int:
    return sum(len(points) for trial_dir in trial_dirs(run_dir) for points in expected_scalars(trial_dir).values())


def trial_dirs(run_dir: Path) -> list[Path]:
    return sorted(path for path in run_dir.iterdir() if (path / runlog.TRIAL_FILE).exists())


def test_the_hand_written_trials_are_what_the_tests_claim(run_dir):
    restarted = expected_scalars(run_dir / FAILED)
    assert restarted["test_acc"] == [(1, 0.4, 1795302010.0), (2, 0.55, 1795302020.0)]
    assert [epoch for epoch, _, _ in restarted["train_loss"]] == [1]  # epoch 2's loss was null
    assert "future_key" not in restarted and "diverged" not in restarted
    assert len(trial_dirs(run_dir)) == 6 and expected_scalars(run_dir / PENDING) == {}


def read_tensorboard(logdir: Path) -> dict:
    """Everything the export wrote for one trial, as TensorBoard's own reader sees it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata
    from tensorboard.util import tensor_util

    accumulator = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    tags = accumulator.Tags()
    content = accumulator.PluginTagToContent("hparams")
    start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    hparams = {}
    for key, value in start.hparams.items():
        hparams[key] = value.number_value if value.WhichOneof("kind") == "number_value" else value.string_value
    experiment = metadata.parse_experiment_plugin_data(content[metadata.EXPERIMENT_TAG])
    end = metadata.parse_session_end_info_plugin_data(content[metadata.SESSION_END_INFO_TAG])
    texts = {
        tag.split("/")[0]: [tensor_util.make_ndarray(event.tensor_proto).item().decode() for event in events]
        for tag in tags["tensors"]
        for events in [accumulator.Tensors(tag)]
    }
    return {
        "scalars": {
            tag: [(event.step, event.value, event.wall_time) for event in accumulator.Scalars(tag)]
            for tag in tags["scalars"]
        },
        "hparams": hparams,
        "hparam_metrics": [info.name.tag for info in experiment.metric_infos],
        "session_status": end.status,
        "texts": texts,
        "event_files": sorted(path.name for path in logdir.iterdir() if "tfevents" in path.name),
        "mark": json.loads((logdir / EXPORT_MARK).read_text()),
    }


def test_tensorboard_holds_every_epoch_metric_the_config_and_the_status(run_dir, capsys):
    from tensorboard.plugins.hparams import api_pb2

    assert main(["export", str(run_dir), "--to", "tensorboard"]) == 0
    out = capsys.readouterr().out
    logdir = run_dir / "tensorboard"
    assert metric_values(run_dir) == 12 * 26 + 7  # quickstart: 26 numbers an epoch; the restarted trial: 4 + 3
    assert out.splitlines() == [
        f"tensorboard: 6 trials, 14 epochs, {metric_values(run_dir)} metric values written to {logdir}",
        f"open it: tensorboard --logdir {logdir}",
    ]
    first = {}
    for trial_dir in trial_dirs(run_dir):
        meta = runlog.read_json(trial_dir / runlog.TRIAL_FILE)
        seen = first[trial_dir.name] = read_tensorboard(logdir / trial_dir.name)
        expected = expected_scalars(trial_dir)
        assert set(seen["scalars"]) == set(expected), trial_dir.name
        for tag, points in expected.items():  # TensorBoard stores float32 values and float64 wall times
            assert seen["scalars"][tag] == [(step, np.float32(value), end) for step, value, end in points], tag
        assert seen["hparams"] == {key: shown(value) for key, value in meta["config"].items()}
        assert seen["hparam_metrics"] == [key for key in runlog.OBJECTIVES if key in expected]
        assert seen["texts"]["status"] == [meta["status"]]
        assert seen["texts"].get("error") == ([meta["error"]] if meta["error"] else None)
        assert seen["mark"] == {
            "cifar_ray.run_dir": str(run_dir),
            RUN_STARTED_TAG: runlog.read_json(run_dir / runlog.SWEEP_FILE)["started_at"],
            "cifar_ray.trial": trial_dir.name,
        }
    assert first[FAILED]["session_status"] == api_pb2.STATUS_FAILURE
    assert first[PENDING]["session_status"] == api_pb2.STATUS_UNKNOWN and first[PENDING]["scalars"] == {}
    assert all(first[d.name]["session_status"] == api_pb2.STATUS_SUCCESS for d in trial_dirs(QUICKSTART_LOGS))

    # Again: each trial's dir is written anew, one event file with the same content, not a second copy.
    assert main(["export", str(run_dir), "--to", "tensorboard", "--out", str(logdir)]) == 0
    again = {trial_dir.name: read_tensorboard(logdir / trial_dir.name) for trial_dir in trial_dirs(run_dir)}
    assert all(len(seen["event_files"]) == 1 for seen in again.values())
    assert {name: {k: v for k, v in seen.items() if k != "event_files"} for name, seen in again.items()} == {
        name: {k: v for k, v in seen.items() if k != "event_files"} for name, seen in first.items()
    }
    assert sorted(path.name for path in logdir.iterdir()) == sorted(first)


def files_under(folder: Path) -> dict[str, bytes | None]:
    """Every file's bytes and every folder (None) under `folder`, by relative path."""
    return {str(path.relative_to(folder)): None if path.is_dir() else path.read_bytes() for path in folder.rglob("*")}


@pytest.fixture
def other_run(run_dir) -> Path:
    """Another run of the same sweep: the same sweep name and trial names, in another storage."""
    other = run_dir.parent / "other-storage" / run_dir.name
    shutil.copytree(run_dir, other)
    return other


REFUSED_OUTS = {  # (viewer, --out from (run_dir, other_run), what the refusal says of it)
    "tb-the-run": ("tensorboard", lambda run, other: run, lambda run, other: "is a run folder (sweep.json there)"),
    "tb-in-a-trial": (
        "tensorboard",
        lambda run, other: next(run.glob("t000-*")) / "tb",
        lambda run, other: f"is inside a run folder, {next(run.glob('t000-*'))} (trial.json there)",
    ),
    "tb-another-run": (
        "tensorboard",
        lambda run, other: other,
        lambda run, other: "is a run folder (sweep.json there)",
    ),
    "tb-another-runs-default": (
        "tensorboard",
        lambda run, other: other / "tensorboard",
        lambda run, other: f"is inside a run folder, {other} (sweep.json there)",
    ),
    "tb-a-storage-of-runs": (
        "tensorboard",
        lambda run, other: other.parent,
        lambda run, other: f"holds a run folder, {other} (sweep.json there)",
    ),
    "mlflow-file-store-the-run": (
        "mlflow",
        lambda run, other: run,
        lambda run, other: "is a run folder (sweep.json there)",
    ),
    "mlflow-sqlite-in-a-trial": (
        "mlflow",
        lambda run, other: f"sqlite:///{next(run.glob('t000-*')) / 'mlflow.db'}",
        lambda run, other: f"is inside a run folder, {next(run.glob('t000-*'))} (trial.json there)",
    ),
    "mlflow-another-runs-default": (
        "mlflow",
        lambda run, other: f"sqlite:///{other / 'mlflow.db'}",
        lambda run, other: f"is inside a run folder, {other} (sweep.json there)",
    ),
}


@pytest.mark.parametrize("case", REFUSED_OUTS)
def test_an_out_reaching_a_run_folder_is_refused_and_nothing_is_touched(run_dir, other_run, case, capsys):
    viewer, out_of, what_of = REFUSED_OUTS[case]
    out = out_of(run_dir, other_run)
    before = files_under(run_dir.parent)
    assert main(["export", str(run_dir), "--to", viewer, "--out", str(out)]) == 2
    shown_out = out if isinstance(out, Path) else Path(out.removeprefix("sqlite:///"))
    assert capsys.readouterr().err == (
        f"cifar-ray: error: export --out {shown_out} {what_of(run_dir, other_run)}; pass an --out outside every run "
        f"folder, or none for the default RUN_DIR/{DEFAULT_OUT[viewer]}\n"
    )
    assert files_under(run_dir.parent) == before  # every run file byte for byte, and nothing new anywhere


def test_a_folder_export_did_not_mark_is_never_deleted(run_dir, tmp_path, capsys):
    out = tmp_path / "tb"
    kept = out / trial_dirs(run_dir)[-1].name / "notes.txt"  # the user's own folder, named as a trial
    kept.parent.mkdir(parents=True)
    kept.write_text("mine")
    assert main(["export", str(run_dir), "--to", "tensorboard", "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"cifar-ray: error: export --out {out}: {kept.parent} is there but holds no {EXPORT_MARK} naming this run, "
        "and export deletes only what it wrote for the same run: remove it yourself or pass another --out\n"
    )
    assert files_under(out) == {kept.parent.name: None, str(kept.relative_to(out)): b"mine"}  # nothing written


def test_another_runs_export_of_the_same_trial_names_is_never_deleted(run_dir, other_run, tmp_path, capsys):
    out = tmp_path / "tb"
    assert main(["export", str(other_run), "--to", "tensorboard", "--out", str(out)]) == 0
    exported = files_under(out)
    assert main(["export", str(run_dir), "--to", "tensorboard", "--out", str(out)]) == 2
    assert f"holds no {EXPORT_MARK} naming this run" in capsys.readouterr().err
    assert files_under(out) == exported
    assert main(["export", str(other_run), "--to", "tensorboard", "--out", str(out)]) == 0  # its own: replaced


def read_mlflow(uri: str, experiment_name: str) -> dict:
    """Every active run of the experiment, by trial, as MLflow's client reads it back."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(experiment_name)
    runs = client.search_runs([experiment.experiment_id])
    by_trial: dict[str, list] = {}
    for mlflow_run in runs:
        history = {
            key: sorted(
                (metric.step, metric.value, metric.timestamp)
                for metric in client.get_metric_history(mlflow_run.info.run_id, key)
            )
            for key in mlflow_run.data.metrics
        }
        tags = {k: v for k, v in mlflow_run.data.tags.items() if not k.startswith("mlflow.") or "git" in k}
        by_trial.setdefault(mlflow_run.data.tags["cifar_ray.trial"], []).append(
            {
                "name": mlflow_run.info.run_name,
                "status": mlflow_run.info.status,
                "start_time": mlflow_run.info.start_time,
                "params": mlflow_run.data.params,
                "tags": tags,
                "metrics": history,
            }
        )
    return by_trial


def test_mlflow_holds_every_epoch_metric_the_config_and_the_status(run_dir, capsys, monkeypatch):
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)  # the default store needs no opt-in
    assert main(["export", str(run_dir), "--to", "mlflow"]) == 0
    out = capsys.readouterr().out.splitlines()
    uri = f"sqlite:///{run_dir / 'mlflow.db'}"
    assert out[0].startswith(
        f"mlflow: 6 trials, 14 epochs, {metric_values(run_dir)} metric values logged to experiment"
    )
    assert out[1:] == [f"open it: mlflow ui --backend-store-uri {uri} ({MLFLOW_UI_VENV})"]
    assert "MLFLOW_ALLOW_FILE_STORE" not in os.environ  # nor left behind
    first = read_mlflow(uri, "quickstart")
    sweep = runlog.read_json(run_dir / runlog.SWEEP_FILE)
    assert sorted(first) == [d.name for d in trial_dirs(run_dir)]
    for trial_dir in trial_dirs(run_dir):
        meta = runlog.read_json(trial_dir / runlog.TRIAL_FILE)
        [seen] = first[trial_dir.name]
        assert seen["name"] == trial_dir.name and seen["start_time"] == int(meta["started_unix"] * 1000)
        assert seen["params"] == {key: str(shown(value)) for key, value in meta["config"].items()}
        status_tags = {"cifar_ray.status": meta["status"]} | (
            {"cifar_ray.error": meta["error"]} if meta["error"] else {}
        )
        assert seen["tags"] == {
            "cifar_ray.trial": trial_dir.name,
            "cifar_ray.run_dir": str(run_dir),
            RUN_STARTED_TAG: sweep["started_at"],
            "mlflow.source.git.commit": sweep["git_revision"],
            **status_tags,
        }
        expected = {
            key: [(step, value, int(end * 1000)) for step, value, end in points]
            for key, points in expected_scalars(trial_dir).items()
        }
        assert seen["metrics"] == expected, trial_dir.name  # float64: exact
    assert first[FAILED][0]["status"] == "FAILED" and first[PENDING][0]["status"] == "SCHEDULED"
    assert all(first[d.name][0]["status"] == "FINISHED" for d in trial_dirs(QUICKSTART_LOGS))

    # Again: the earlier export's runs are replaced, one active run per trial with the same content.
    assert main(["export", str(run_dir), "--to", "mlflow", "--out", uri]) == 0
    assert "6 runs of an earlier export deleted" in capsys.readouterr().out
    assert read_mlflow(uri, "quickstart") == first


def test_mlflow_re_export_replaces_only_the_runs_of_the_same_run_folder(run_dir, other_run, tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    for run in (run_dir, other_run):  # the same sweep name and trial names, into one store
        assert main(["export", str(run), "--to", "mlflow", "--out", uri]) == 0
    both = runs_by_folder(uri)
    assert sorted(both) == sorted([str(run_dir), str(other_run)]) and all(len(runs) == 6 for runs in both.values())
    capsys.readouterr()

    assert main(["export", str(run_dir), "--to", "mlflow", "--out", uri]) == 0
    assert "6 runs of an earlier export deleted" in capsys.readouterr().out
    assert runs_by_folder(uri) == both

    # A new sweep in the same folder (its old run removed) is another run: the old one's MLflow runs stay.
    sweep = runlog.read_json(run_dir / runlog.SWEEP_FILE)
    runlog.write_json(run_dir / runlog.SWEEP_FILE, sweep | {"started_at": "2026-11-23T09:00:00+0000"})
    assert main(["export", str(run_dir), "--to", "mlflow", "--out", uri]) == 0
    assert "deleted" not in capsys.readouterr().out
    assert all(len(runs) == 3 for runs in read_mlflow(uri, "quickstart").values())


def runs_by_folder(uri: str) -> dict[str, dict[str, dict]]:
    """{run folder: {trial: its one MLflow run}}, from the tag naming the run folder."""
    by_folder: dict[str, dict[str, dict]] = {}
    for trial, runs in read_mlflow(uri, "quickstart").items():
        for mlflow_run in runs:
            folder = by_folder.setdefault(mlflow_run["tags"]["cifar_ray.run_dir"], {})
            assert trial not in folder, f"two runs of {trial} from one run folder"
            folder[trial] = mlflow_run
    return by_folder


def test_mlflow_file_store_when_out_names_one(run_dir, capsys, monkeypatch):
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    store = run_dir.parent / "mlruns"
    assert main(["export", str(run_dir), "--to", "mlflow", "--out", str(store)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == (
        f"open it: MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri {store.as_uri()} ({MLFLOW_UI_VENV})"
    )
    assert "MLFLOW_ALLOW_FILE_STORE" not in os.environ
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow reads a file store back only when allowed
    seen = read_mlflow(store.as_uri(), "quickstart")
    assert sorted(seen) == [d.name for d in trial_dirs(run_dir)] and all(len(runs) == 1 for runs in seen.values())
    assert seen[FAILED][0]["metrics"]["test_acc"] == [(1, 0.4, 1795302010000), (2, 0.55, 1795302020000)]


@pytest.mark.parametrize("viewer", ["tensorboard", "mlflow"])
def test_a_missing_viewer_package_is_one_line_naming_the_extra(run_dir, viewer, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, viewer, None)  # what `import` meets when the package is not installed
    assert main(["export", str(run_dir), "--to", viewer]) == 2
    message = f'export --to {viewer} needs {viewer}: pip install -e ".[{viewer}]"'
    assert capsys.readouterr().err == f"cifar-ray: error: {message}\n"
    assert not (run_dir / "tensorboard").exists() and not (run_dir / "mlflow.db").exists()


def test_an_unusable_tracking_uri_is_one_line(run_dir, capsys):
    assert main(["export", str(run_dir), "--to", "mlflow", "--out", "s3://bucket/mlflow"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cifar-ray: error: mlflow at s3://bucket/mlflow: ") and err.count("\n") == 1, err


@pytest.mark.parametrize(
    "to, out",
    [
        ("tensorboard", "{}/logs"),
        ("mlflow", "{}/mlruns"),
        ("mlflow", "file:{}/mlruns"),
        ("mlflow", "sqlite:///{}/m.db"),
    ],
)
def test_an_out_that_cannot_be_written_is_one_line(run_dir, tmp_path, to, out, capsys):
    """It was a NotADirectoryError traceback. Tests run as root, whom a folder's mode does not stop: a folder under
    a file is one that nobody can make."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["export", str(run_dir), "--to", to, "--out", out.format(blocker)]) == 2
    folder = blocker / ("logs" if to == "tensorboard" else "mlruns" if "mlruns" in out else "")
    assert capsys.readouterr().err == (
        f"cifar-ray: error: export --out {str(folder).rstrip('/')}: cannot write there: {blocker} is a file, not a "
        "folder; allowed: a folder you can write\n"
    )


def test_tensorboard_out_must_be_a_local_folder(run_dir):
    with pytest.raises(ViewerError, match="export --to tensorboard writes to a local folder; got --out s3://b/tb"):
        export_run(run_dir, "tensorboard", "s3://b/tb")


def test_export_help_and_a_refusal_import_no_viewer_nor_torch_nor_ray(tmp_path):
    script = (
        "import contextlib, io, sys\n"
        "from cifar_ray.cli import main\n"
        "for argv in (['--help'], ['export', '--help'], ['export', sys.argv[1], '--to', 'mlflow']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "        try:\n"
        "            main(argv)\n"
        "        except SystemExit:\n"
        "            pass\n"
        "print(sorted({'torch', 'ray', 'tensorboard', 'mlflow'} & set(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "no-run")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_summary_of_one_trial_of_one_epoch_is_in_the_singular(tmp_path):
    from cifar_ray.export.viewers import _summary_counts

    run = runlog.RunLog(tmp_path, {}, [runlog.TrialLog.of("t0", {}, [{"epoch": 1}])])
    assert _summary_counts(run, 1) == "1 trial, 1 epoch, 1 metric value"
