"""`cifar-ray export`: a run folder written into the viewers people already use, TensorBoard and MLflow.

Both read the run with runlog.load_run (each epoch once, however often a trial restarted) and write the same things:
every numeric epoch metric at step = epoch with the epoch's end as its time, the trial's config as hyper-parameters,
and its status and error.

- TensorBoard: one log dir per trial, `<out>/<trial name>` (default out: RUN_DIR/tensorboard): scalars, the config
  in the HPARAMS view (with the final objectives as its metrics and the trial's status as the session's), and the
  status and error as text. Written with torch.utils.tensorboard (torch is a dependency anyway); the `tensorboard`
  package is needed to write and to view. Each log dir carries a mark, EXPORT_MARK, naming the run it came from.
- MLflow: one experiment named after the sweep, one run per trial, found again by its tags: the trial and the run
  (TRIAL_TAG, RUN_DIR_TAG, RUN_STARTED_TAG). The default store is a SQLite file, RUN_DIR/mlflow.db: MLflow 3
  refuses its ./mlruns file store unless MLFLOW_ALLOW_FILE_STORE=true ("maintenance mode"), and recommends SQLite;
  a file store is still written when --out names one (file:/path or a plain folder), opting in for this process.

Exporting again gives the same content, not a second copy: a trial's TensorBoard dir is deleted and written anew,
only if it carries the mark of this same run (a folder without it is refused, never deleted); its MLflow runs from
an earlier export of this same run are deleted once the new run is logged (MLflow keeps deleted runs restorable
until `mlflow gc`); another run's, with the same sweep and trial names, stay.

A run's data is never in reach: a local --out inside a run folder, holding one, or being one is refused before
anything is written. The defaults, RUN_DIR/tensorboard and RUN_DIR/mlflow.db, are the one exception: names no run
file takes, made by export itself, so that the export travels with the run.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import shlex
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

from ..core import runlog
from ..core.errors import ViewerError
from ..core.storage import URI, local_write_refusal, redact
from ..core.text import counted

TARGETS = ("tensorboard", "mlflow")
TRIAL_TAG = "cifar_ray.trial"
# Which run an export came from: its folder (a URI without credentials) and when its sweep started (a new sweep in
# the same folder, after the old one was removed, is another run). MLflow tags, and the TensorBoard mark's keys.
RUN_DIR_TAG, RUN_STARTED_TAG = "cifar_ray.run_dir", "cifar_ray.run_started_at"
# In each TensorBoard log dir an export writes: {RUN_DIR_TAG: ..., RUN_STARTED_TAG: ..., TRIAL_TAG: ...}.
EXPORT_MARK = "cifar-ray-export.json"
# The default outputs in RUN_DIR, by viewer: the one place inside a run folder that an export writes to.
DEFAULT_OUT = {"tensorboard": "tensorboard", "mlflow": "mlflow.db"}
RUN_FILES = (runlog.SWEEP_FILE, runlog.TRIAL_FILE)
# Not plotted: the step itself, the epoch's time stamp (each point's time instead) and the divergence flag (the
# trial's status says it).
NOT_PLOTTED = ("epoch", "end_unix", "diverged")
TENSORBOARD_STATUS = {
    "finished": "STATUS_SUCCESS",
    "diverged": "STATUS_FAILURE",
    "failed": "STATUS_FAILURE",
    "oom": "STATUS_FAILURE",
    "running": "STATUS_RUNNING",
    "interrupted": "STATUS_UNKNOWN",
    "pending": "STATUS_UNKNOWN",
}

# `mlflow ui` needs the full mlflow package (flask and more), which cifar-ray's extra leaves out.
MLFLOW_UI_VENV = "from a venv of its own: pip install mlflow; its pins clash with cifar-ray's"

MLFLOW_STATUS = {
    "finished": "FINISHED",
    "diverged": "FAILED",
    "failed": "FAILED",
    "oom": "FAILED",
    "running": "RUNNING",
    "interrupted": "KILLED",
    "pending": "SCHEDULED",
}
assert set(TENSORBOARD_STATUS) == set(MLFLOW_STATUS) == set(runlog.STATUSES)
# MLflow's own loggers and the database migrations it runs: a few INFO lines per export that say nothing to a user.
QUIETED_LOGGERS = ("mlflow", "alembic")


def export_run(run_dir: runlog.Where, to: str, out: str | os.PathLike | None = None) -> str:
    """Export the run at `run_dir` (a folder or URI) to `to` (tensorboard or mlflow); returns what was written where
    and the command that opens it, in a few lines."""
    if to not in TARGETS:
        raise ViewerError(f"cannot export to '{to}'; allowed: {', '.join(TARGETS)}")
    run = runlog.load_run(run_dir)
    return export_tensorboard(run, out) if to == "tensorboard" else export_mlflow(run, out)


def epoch_scalars(row: dict) -> dict[str, float]:
    """The numbers of one metrics.jsonl line that a viewer plots, in runlog.EPOCH_METRICS order."""
    known = {**runlog.EPOCH_METRICS, **runlog.OLD_EPOCH_METRICS}
    return {key: row[key] for key in known if key not in NOT_PLOTTED and _is_number(row.get(key))}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _as_text(value: Any) -> str:
    """A config value as trial.json writes it: strings as they are, the rest as JSON (false, null, 0.05)."""
    return value if isinstance(value, str) else json.dumps(value)


def _epoch_unix(trial: runlog.TrialLog, row: dict) -> float:
    """When the epoch ended; a line without end_unix falls back to the trial's start, so exports stay identical."""
    return row.get("end_unix") or trial.record.started_unix or 0.0


def _require(to: str, *modules: str) -> None:
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            raise ViewerError(f'export --to {to} needs {module}: pip install -e ".[{to}]"') from None


def run_identity(run: runlog.RunLog) -> dict[str, str]:
    """What tells this run from another of the same sweep and trial names: its folder and when its sweep started."""
    return {RUN_DIR_TAG: redact(str(run.path)), RUN_STARTED_TAG: str(run.sweep.get("started_at", ""))}


def _export_mark(run: runlog.RunLog, trial_name: str) -> dict[str, str]:
    """What EXPORT_MARK holds in the log dir of `trial_name` exported from `run`."""
    return run_identity(run) | {TRIAL_TAG: trial_name}


def _check_out(out: Path, run: runlog.RunLog, to: str) -> None:
    """Refuse a local output that reaches run data: inside a run folder (this run's own default output aside), a
    run folder itself, or a folder holding one. A run folder: sweep.json or trial.json in it."""
    allowed = f"pass an --out outside every run folder, or none for the default RUN_DIR/{DEFAULT_OUT[to]}"
    own_default = Path(run.path.path) / DEFAULT_OUT[to] if run.path.is_local else None
    try:
        for folder in out.parents:
            found = next((name for name in RUN_FILES if (folder / name).exists()), None)
            if found and not (out == own_default and folder == own_default.parent):
                raise ViewerError(f"export --out {out} is inside a run folder, {folder} ({found} there); {allowed}")
        if out.is_dir():
            for folder, _, files in os.walk(out, onerror=_raise):
                found = next((name for name in RUN_FILES if name in files), None)
                if found:
                    what = "is a run folder" if Path(folder) == out else f"holds a run folder, {folder}"
                    raise ViewerError(f"export --out {out} {what} ({found} there); {allowed}")
    except OSError as error:  # unreadable: it may hold run data
        raise ViewerError(
            f"export --out {out}: cannot tell whether {error.filename or out} holds run data ({error.strerror}); "
            + allowed
        ) from None


def _check_writable(folder: Path) -> None:
    refusal = local_write_refusal(folder)
    if refusal:
        raise ViewerError(f"export --out {folder}: cannot write there: {refusal}; allowed: a folder you can write")


def _raise(error: OSError) -> None:
    raise error


def _replaced_dirs(logdir: Path, run: runlog.RunLog) -> list[Path]:
    """The trials' log dirs already in `logdir`: each must carry the mark of this run's export, or it is refused."""
    replaced = []
    for trial in run.trials:
        trial_dir = logdir / trial.name
        if not os.path.lexists(trial_dir):
            continue
        if trial_dir.is_symlink() or not trial_dir.is_dir() or _mark(trial_dir) != _export_mark(run, trial.name):
            raise ViewerError(
                f"export --out {logdir}: {trial_dir} is there but holds no {EXPORT_MARK} naming this run, and export "
                "deletes only what it wrote for the same run: remove it yourself or pass another --out"
            )
        replaced.append(trial_dir)
    return replaced


def _mark(trial_dir: Path) -> dict | None:
    """The export mark in `trial_dir`; None when absent or unreadable (then the folder is never deleted)."""
    try:
        return json.loads((trial_dir / EXPORT_MARK).read_text())
    except (OSError, ValueError):
        return None


def _summary_counts(run: runlog.RunLog, values: int) -> str:
    epochs = sum(len(trial.epochs) for trial in run.trials)
    return f"{counted(len(run.trials), 'trial')}, {counted(epochs, 'epoch')}, {counted(values, 'metric value')}"


def export_tensorboard(run: runlog.RunLog, out: str | os.PathLike | None = None) -> str:
    _require("tensorboard", "tensorboard")
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams

    logdir = _tensorboard_dir(run, out)
    _check_out(logdir, run, "tensorboard")
    _check_writable(logdir)
    replaced = _replaced_dirs(logdir, run)  # every refusal comes before the first write
    values = 0
    for trial in run.trials:
        trial_dir = logdir / trial.name
        if trial_dir in replaced:
            shutil.rmtree(trial_dir)
        trial_dir.mkdir(parents=True)
        # Marked first: a folder left by an export that broke off is still replaced by the next one.
        (trial_dir / EXPORT_MARK).write_text(json.dumps(_export_mark(run, trial.name)) + "\n")
        started = trial.record.started_unix
        with SummaryWriter(trial_dir) as writer:
            for row in trial.epochs:
                for key, value in epoch_scalars(row).items():
                    writer.add_scalar(key, value, global_step=row["epoch"], walltime=_epoch_unix(trial, row))
                    values += 1
            # The HPARAMS view's metric columns show each tag's last value: the final epoch's.
            logged = {key for row in trial.epochs for key in epoch_scalars(row)}
            objectives = dict.fromkeys(key for key in runlog.OBJECTIVES if key in logged)
            experiment, session_start, _ = hparams({k: _hparam(v) for k, v in trial.config.items()}, objectives)
            # torch marks every session a success; the trial's own status goes in instead.
            session_end = plugin_data_pb2.HParamsPluginData(
                session_end_info=plugin_data_pb2.SessionEndInfo(
                    status=api_pb2.Status.Value(TENSORBOARD_STATUS.get(trial.status, "STATUS_UNKNOWN")),
                    end_time_secs=trial.record.finished_unix or 0.0,
                )
            )
            end_summary = Summary(
                value=[
                    Summary.Value(
                        tag=metadata.SESSION_END_INFO_TAG, metadata=metadata.create_summary_metadata(session_end)
                    )
                ]
            )
            for summary in (experiment, session_start, end_summary):
                writer.file_writer.add_summary(summary, walltime=started)
            writer.add_text("status", trial.status, walltime=started)
            if trial.record.error:
                writer.add_text("error", trial.record.error, walltime=started)
    return (
        f"tensorboard: {_summary_counts(run, values)} written to {logdir}\n"
        f"open it: tensorboard --logdir {shlex.quote(str(logdir))}"
    )


def _tensorboard_dir(run: runlog.RunLog, out: str | os.PathLike | None) -> Path:
    if out is None:
        if not run.path.is_local:
            raise ViewerError(
                f"export --to tensorboard of a run at {redact(str(run.path))} needs --out, a local folder"
            )
        logdir = (Path(run.path.path) / DEFAULT_OUT["tensorboard"]).resolve()
    elif URI.match(os.fspath(out)):
        raise ViewerError(f"export --to tensorboard writes to a local folder; got --out {redact(os.fspath(out))}")
    else:
        logdir = Path(out).expanduser().resolve()
    if logdir.exists() and not logdir.is_dir():
        raise ViewerError(f"export --to tensorboard writes to a folder; --out {logdir} is a file")
    return logdir


def _hparam(value: Any) -> float | str:
    """Numbers stay numbers (sortable, plotted on an axis); everything else is shown as trial.json writes it."""
    return value if _is_number(value) else _as_text(value)


def export_mlflow(run: runlog.RunLog, out: str | os.PathLike | None = None) -> str:
    uri, file_store = _tracking_uri(run, out)
    store = _local_store(uri)
    if store is not None:
        _check_out(store, run, "mlflow")
        _check_writable(store if file_store else store.parent)  # a file store is a folder, SQLite a file in one
    _require("mlflow", "mlflow", *(("sqlalchemy", "alembic") if uri.startswith("sqlite:") else ()))
    # For this export only, and a user's own setting wins: no usage data sent to MLflow's servers; no "View run"
    # line per trial from a tracking server (ours names the experiment); a server that does not answer fails in
    # ~10 s, not minutes (with MLflow's default 7 retries still retrying after 200 s, measured); a file store in
    # --out is the user's choice over MLflow's refusal.
    defaults = {
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    }
    if file_store:
        defaults["MLFLOW_ALLOW_FILE_STORE"] = "true"
    with _environ_defaults(defaults):
        return _log_to_mlflow(run, uri, file_store)


@contextmanager
def _environ_defaults(defaults: dict[str, str]) -> Iterator[None]:
    added = {name: value for name, value in defaults.items() if name not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def _log_to_mlflow(run: runlog.RunLog, uri: str, file_store: bool) -> str:
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param
    from mlflow.exceptions import MlflowException
    from mlflow.utils.validation import MAX_METRICS_PER_BATCH, MAX_PARAMS_TAGS_PER_BATCH, MAX_TAG_VAL_LENGTH

    for name in QUIETED_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    experiment_name = run.sweep.get("name") or run.path.name
    shown = redact(uri)
    try:  # where an unusable URI shows: an unknown scheme, a database without its driver, no server
        client = MlflowClient(uri)
        experiment_id = _experiment_id(client, experiment_name, run.sweep.get("description", ""))
    except MlflowException as error:
        reason = next((line.strip() for line in error.message.splitlines() if line.strip()), type(error).__name__)
        raise ViewerError(f"mlflow at {shown}: {redact(reason)[:300]}") from None
    except ImportError as error:
        raise ViewerError(f"mlflow at {shown} needs {error.name}: pip install {error.name}") from None
    identity = run_identity(run)
    earlier = _runs_by_trial(client, experiment_id, identity)
    values = 0
    for trial in run.trials:
        tags = identity | {
            TRIAL_TAG: trial.name,
            "cifar_ray.status": trial.status,
            "mlflow.source.git.commit": run.sweep.get("git_revision", "unknown"),
        }
        if trial.record.error:
            tags["cifar_ray.error"] = trial.record.error[:MAX_TAG_VAL_LENGTH]
        run_id = client.create_run(
            experiment_id, start_time=_ms(trial.record.started_unix), tags=tags, run_name=trial.name
        ).info.run_id
        params = [Param(key, _as_text(value)) for key, value in trial.config.items()]
        metrics = [
            Metric(key, float(value), _ms(_epoch_unix(trial, row)), row["epoch"])
            for row in trial.epochs
            for key, value in epoch_scalars(row).items()
        ]
        for start in range(0, len(params), MAX_PARAMS_TAGS_PER_BATCH):
            client.log_batch(run_id, params=params[start : start + MAX_PARAMS_TAGS_PER_BATCH])
        for start in range(0, len(metrics), MAX_METRICS_PER_BATCH):
            client.log_batch(run_id, metrics=metrics[start : start + MAX_METRICS_PER_BATCH])
        values += len(metrics)
        status = MLFLOW_STATUS.get(trial.status, "RUNNING")
        if trial.status in runlog.FINAL_STATUSES:
            client.set_terminated(run_id, status, end_time=_ms(trial.record.finished_unix))
        else:
            client.update_run(run_id, status=status)
        for earlier_id in earlier.get(trial.name, []):  # only once the new run is complete
            client.delete_run(earlier_id)
    replaced = sum(len(earlier.get(trial.name, [])) for trial in run.trials)
    if urlparse(uri).scheme in ("http", "https"):
        opener = f"{shown.rstrip('/')}/#/experiments/{experiment_id}"
    else:
        opener = f"mlflow ui --backend-store-uri {shlex.quote(shown)}"
        if file_store:
            opener = f"MLFLOW_ALLOW_FILE_STORE=true {opener}"
        opener += f" ({MLFLOW_UI_VENV})"
    written = (
        f"mlflow: {_summary_counts(run, values)} logged to experiment '{experiment_name}' (id {experiment_id}) "
        f"at {shown}, one run per trial"
    )
    if replaced:
        written += f"; {counted(replaced, 'run')} of an earlier export deleted"
    return f"{written}\nopen it: {opener}"


def _tracking_uri(run: runlog.RunLog, out: str | os.PathLike | None) -> tuple[str, bool]:
    """The tracking URI to log to, and whether it is a file store."""
    if out is None:
        if not run.path.is_local:
            raise ViewerError(
                f"export --to mlflow of a run at {redact(str(run.path))} needs --out, a tracking URI "
                "(http://host:5000, sqlite:///path/mlflow.db, file:/path/mlruns)"
            )
        return f"sqlite:///{Path(run.path.path) / DEFAULT_OUT['mlflow']}", False
    text = os.fspath(out)
    scheme = urlparse(text).scheme
    if not scheme:  # a folder, as MLflow reads a bare path: a file store
        return Path(text).expanduser().resolve().as_uri(), True
    return text, scheme == "file"


def _local_store(uri: str) -> Path | None:
    """The local file or folder a tracking URI writes to: a SQLite database or a file store; None for a server
    or an in-memory database."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(url2pathname(parsed.path)).expanduser().resolve()
    if parsed.scheme.partition("+")[0] == "sqlite":  # sqlite:///relative.db, sqlite:////absolute.db
        database = uri.partition(":///")[2].partition("?")[0]
        return Path(database).expanduser().resolve() if database and database != ":memory:" else None
    return None


def _ms(unix: float | None) -> int | None:
    return None if unix is None else int(unix * 1000)


def _experiment_id(client, name: str, description: str) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        return client.create_experiment(name, tags={"mlflow.note.content": description})
    if experiment.lifecycle_stage == "deleted":
        client.restore_experiment(experiment.experiment_id)
    client.set_experiment_tag(experiment.experiment_id, "mlflow.note.content", description)
    return experiment.experiment_id


def _runs_by_trial(client, experiment_id: str, identity: dict[str, str]) -> dict[str, list[str]]:
    """The active runs of the experiment that an export of this same run logged, by trial name."""
    found: dict[str, list[str]] = {}
    page_token = None
    while True:
        page = client.search_runs([experiment_id], max_results=1000, page_token=page_token)
        for mlflow_run in page:
            tags = mlflow_run.data.tags
            trial = tags.get(TRIAL_TAG)
            if trial and all(tags.get(key) == value for key, value in identity.items()):
                found.setdefault(trial, []).append(mlflow_run.info.run_id)
        page_token = page.token
        if not page_token:
            return found
