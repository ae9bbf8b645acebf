"""The on-disk record of a run: what training writes and what the report reads, without Ray.

    RUN_DIR/                    one sweep (or one `cifar-ray train`), = <storage>/<name>,
                                a local folder or a URI (storage.StoragePath)
      sweep.json                the sweep: name, description, grid, base, host, versions, git, times
      driver.lease              while a driver runs the sweep: its host, pid and heartbeat (lease.py)
      provenance/session-N.*    what session N ran with: git changes, packages, GPU stack (provenance.py)
      <trial>/trial.json        one trial: swept values, full config, status, error, system info
      <trial>/metrics.jsonl     one JSON object per finished epoch, appended by rank 0
      <trial>/network.json      the model as built: its layers and parameter count (rank 0, as the trial starts)
      <trial>/test_correct.json which test images the final evaluation got right, packed bits (rank 0; CorrectImages)
      <trial>/error.txt         the traceback of a failed trial
      <trial>/profile_trace.json  with --profile: a Chrome trace of a few steps of one epoch, written by rank 0
      <trial>/profile.json      with --profile: the top operators by self time in that trace (training/profile.py)
      <trial>/checkpoints/      the trial's checkpoints (layout: checkpoints.py)

Ray Tune writes its own files (result.json, progress.csv, ...) into the same trial folders; they are
not read back: they hold what each session's Tune experiment was told, and lag behind after a killed
driver, while metrics.jsonl is written by the training itself as each epoch ends.

Reads tell "absent" from "failed" (storage.read_retrying): a missing file is empty ({} or no epochs); a file
that cannot be read or does not parse is read again, then raises StorageError naming it, so status and report
say which file they cannot read instead of showing its trial as pending, and no file is rewritten from a failed
read (update_json, append_epoch, truncate_epochs). In metrics.jsonl a last line cut short (no newline, not JSON:
its writer was killed mid-write on a store without atomic writes) is an epoch never logged and is skipped; any
other line that is not an epoch's JSON is corruption and raises. A finished trial that lost an epoch's line so
is incomplete (`incomplete`): `--resume` trains it again.

Epoch keys: EPOCH_METRICS below, each with what it measures (training.loop.epoch_record writes exactly these).
Trial status: pending | running | interrupted (its sweep was stopped: --resume continues it) | finished | failed |
diverged | oom.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import shlex
import time
from dataclasses import dataclass, field
from typing import Any

from .checkpoints import CHECKPOINTS
from .errors import RunFolderError, StorageError
from .record import TrialRecord
from .storage import StoragePath, read_retrying

Where = str | os.PathLike | StoragePath
logger = logging.getLogger(__name__)

SWEEP_FILE = "sweep.json"
TRIAL_FILE = "trial.json"
EPOCHS_FILE = "metrics.jsonl"
ERROR_FILE = "error.txt"
PROFILE_TRACE_FILE = "profile_trace.json"
PROFILE_FILE = "profile.json"
NETWORK_FILE = "network.json"
TEST_CORRECT_FILE = "test_correct.json"
# Step-time breakdown of an epoch in seconds, mean over ranks (training.timing.PhaseTimer measures it).
ALLREDUCE_KEY = "time_allreduce_s"
BREAKDOWN_KEYS = ("time_data_s", "time_compute_s", ALLREDUCE_KEY, "time_optimizer_s", "time_eval_s")
# Where the all-reduce wait cannot be measured (DDP on CUDA), its estimate takes ALLREDUCE_KEY's place under this key.
ALLREDUCE_ESTIMATE_KEY = "time_allreduce_estimate_s"
# One line of metrics.jsonl: every key training writes, in its order, and what it measures. This is the one place
# an epoch metric is named; the report, the CLI summary and the sweep's objective import from here, and
# tests/test_warm_process.py binds it to what training.loop.epoch_record writes. Accuracies are fractions 0-1.
EPOCH_METRICS = {
    "epoch": "the epoch, 1-based",
    "train_loss": "training loss, running mean over the epoch's steps (augmentation on, weights changing)",
    "train_acc": "training accuracy, running mean over the epoch's steps (augmentation on, weights changing)",
    "test_loss": "test-set loss after the epoch",
    "test_acc": "test-set accuracy after the epoch",
    "train_eval_loss": "loss on the first train_eval_size training images, evaluated like the test set "
    "(absent when train_eval_size=0)",
    "train_eval_acc": "accuracy on the first train_eval_size training images, evaluated like the test set "
    "(absent when train_eval_size=0)",
    "epoch_time_s": "wall time of the epoch: training and evaluation (s)",
    "train_time_s": "wall time of the epoch's training steps (s)",
    "time_data_s": "step-time breakdown: loading and augmenting batches (s, mean over ranks)",
    "time_compute_s": "step-time breakdown: forward and backward, less the all-reduce wait (s, mean over ranks)",
    ALLREDUCE_KEY: "step-time breakdown: gradient communication backward did not overlap with computing gradients, "
    "measured in the epoch (time in DDP's comm hook plus the wait for its last all-reduce; 0 without DDP) (s, mean "
    "over ranks); absent where only estimated (DDP on CUDA)",
    ALLREDUCE_ESTIMATE_KEY: "DDP on CUDA, in place of time_allreduce_s: an estimate of it, DDP's own timing of the "
    "epoch's last sampled step (two sampled per epoch) times the epoch's steps (s, mean over ranks)",
    "time_optimizer_s": "step-time breakdown: the optimizer step (s, mean over ranks)",
    "time_eval_s": "step-time breakdown: the test set and the train_eval pass (s, mean over ranks)",
    "train_samples": "images trained in the epoch over all workers: steps x effective batch",
    "samples_per_s": "training throughput over all workers: train_samples / train_time_s",
    "flops_per_s": "model FLOP/s of training over all workers: the model's forward + backward FLOPs per image "
    "(torch.utils.flop_counter, counted once per trial) x train_samples / train_time_s",
    "mfu": "model FLOPs utilisation, 0-1: flops_per_s / peak_flops_per_s",
    "peak_flops_per_s": "the trial's devices' peak FLOP/s at its dtype, summed over workers, each GPU once "
    "(peak_source says how it was found)",
    "peak_source": "how one device's peak was found: the faster of a GEMM and a convolution probe on each worker "
    "(which, shape, dtype, threads), once per worker process",
    "peak_mem_mb": "the largest peak memory of one worker process (RSS), or on GPUs of one GPU (torch's "
    "allocations, without the CUDA context) (MB)",
    "peak_mem_total_mb": "peak memory summed over every worker (and every GPU of a dp worker) (MB)",
    "peak_mem_reserved_mb": "on GPUs, the largest peak of memory torch's caching allocator reserved on one GPU "
    "(allocations and cached blocks, without the CUDA context: nvidia-smi shows more) (MB); null on CPU",
    "peak_mem_above_start_mb": "the largest rise of one worker's peak memory (as peak_mem_mb measures it) over its "
    "resident level with the trial's data loaded, after freed memory went back to the system: what the model, "
    "optimizer, activations and evaluation needed, the same in a warm slot's first trial and its later ones (MB)",
    "lr_last": "the learning rate of the epoch's last optimizer step",
    "lr_max": "the highest learning rate of the epoch's optimizer steps (above lr_last while warm-up or onecycle's "
    "rise lifts it)",
    "peak_lr": "the learning rate after lr_scaling, before the schedule",
    "amp_skipped_steps": "optimizer steps the fp16 grad scaler skipped (inf/NaN gradients)",
    "allreduce_bytes_per_step": "bytes each worker sends to the gradient all-reduce per optimizer step",
    "end_unix": "when the epoch ended (Unix time)",
    "diverged": "the weights or a trained step's loss were not finite (with fp16: every step skipped on a "
    "non-finite loss; one the grad scaler skipped is not a divergence): the trial stops",
}
assert set(BREAKDOWN_KEYS) <= set(EPOCH_METRICS)
# Epoch keys of older logs, read under the name that says what they held: `lr` was the epoch's first step's rate.
RENAMED_EPOCH_KEYS = {"lr": "lr_first"}
OLD_EPOCH_METRICS = {"lr_first": "logs written before lr_last: the learning rate of the epoch's first optimizer step"}
assert set(RENAMED_EPOCH_KEYS.values()) == set(OLD_EPOCH_METRICS)
# Epoch metrics a sweep file may name as its `metric` (the one Tune ranks trials by).
OBJECTIVES = ("test_acc", "train_acc", "test_loss", "train_loss", "epoch_time_s", "samples_per_s", "peak_mem_mb")
assert set(OBJECTIVES) <= set(EPOCH_METRICS)
MODES = ("max", "min")

# Time per epoch, the one statistic the report (trial table, effects, leaders) and the CLI's summary show: what a
# trial's epochs cost once warm. A trial's first epoch pays the warm-up (a slot's first trial: first-touch
# allocations, oneDNN/cuDNN plans; DDP's bucket rebuild; with compile=true the compile, which later trials of a slot
# find cached), so its place in a slot would move a mean.
TIME_PER_EPOCH_RULE = (
    "the median over a trial's epochs after its first, which pays the warm-up (a one-epoch trial: that epoch)"
)


def warm_slice(epochs: int) -> slice:
    """Which of a trial's `epochs` epochs (in epoch order) TIME_PER_EPOCH_RULE reads: all after the first; the one
    epoch of a one-epoch trial."""
    return slice(1, None) if epochs > 1 else slice(0, None)


def time_per_epoch(epoch_times: list[float | None]) -> float:
    """TIME_PER_EPOCH_RULE over a trial's epoch times (in epoch order; a missing time is skipped); NaN without any."""
    warm = sorted(t for t in epoch_times[warm_slice(len(epoch_times))] if t is not None and math.isfinite(t))
    if not warm:
        return math.nan
    mid = len(warm) // 2
    return warm[mid] if len(warm) % 2 else (warm[mid - 1] + warm[mid]) / 2


DEFAULT_OBJECTIVE = ("test_acc", "max")  # (metric, mode) of a sweep file that names neither
STATUSES = ("pending", "running", "interrupted", "finished", "failed", "diverged", "oom")
FINAL_STATUSES = ("finished", "failed", "diverged", "oom")
TRAINED_STATUSES = ("finished", "diverged")  # its training ran to its end: never trained again, unless incomplete


def incomplete(status: str, epochs_logged: int, planned: Any) -> bool:
    """A trial marked finished with fewer epochs in metrics.jsonl than planned: an epoch's line was lost (a last
    line cut short is skipped on reading). The report leaves it out, status says so, --resume trains it again from
    its last checkpoint at or before its last logged epoch (training.state.resume_newest)."""
    return status == "finished" and isinstance(planned, int) and epochs_logged < planned


def now_iso(unix: float | None = None) -> str:
    """Now (or Unix time `unix`) as sweep.json and trial.json write times, in local time with its offset."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(unix))


def _jsonable(value: Any) -> Any:
    # json has no NaN/inf: a diverged loss is written as null rather than invalid JSON.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def write_json(path: Where, data: dict) -> None:
    StoragePath.of(path).write_text(json.dumps(_jsonable(data), indent=2, sort_keys=False) + "\n")


def _json_object(data: bytes) -> dict:
    value = json.loads(data)
    if not isinstance(value, dict):
        raise ValueError(f"it holds a JSON {type(value).__name__}, not an object")
    return value


def read_json(path: Where) -> dict:
    """The JSON object in the file; {} when there is none; StorageError when it cannot be read or parsed."""
    return read_retrying(StoragePath.of(path), _json_object, {})


def update_json(path: Where, **fields: Any) -> dict:
    """Set `fields` in a JSON file, keeping its other keys. A file that exists but cannot be read raises (after
    read_json's tries): taking it for {} would write `fields` alone and drop every other key (a trial.json lost
    its config and system this way with S3 at load average 30)."""
    path = StoragePath.of(path)
    data = read_json(path) | fields
    write_json(path, data)
    return data


def _epoch_rows(data: bytes) -> list[dict]:
    """metrics.jsonl's epochs, a repeated epoch's last copy, older keys renamed (RENAMED_EPOCH_KEYS); ValueError
    for a line that is not an epoch's JSON, except a last line cut short (see the module's docstring)."""
    lines = data.decode().split("\n")  # the last item is "" when the file ends with its newline
    by_epoch: dict[int, dict] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                continue
            raise ValueError(f"line {number} is not JSON") from None
        if not (isinstance(row, dict) and isinstance(row.get("epoch"), int)):
            raise ValueError(f"line {number} is not an epoch's metrics (a JSON object with an integer epoch)")
        by_epoch[row["epoch"]] = {RENAMED_EPOCH_KEYS.get(key, key): value for key, value in row.items()}
    return [by_epoch[e] for e in sorted(by_epoch)]


def read_epochs(trial_dir: Where) -> list[dict]:
    """Per-epoch metrics in epoch order; none when there is no metrics.jsonl; StorageError when it cannot be read
    or holds a corrupt line."""
    return read_retrying(StoragePath.of(trial_dir) / EPOCHS_FILE, _epoch_rows, [])


def _write_epochs(trial_dir: Where, rows: list[dict]) -> None:
    (StoragePath.of(trial_dir) / EPOCHS_FILE).write_text("".join(json.dumps(_jsonable(row)) + "\n" for row in rows))


def append_epoch(trial_dir: Where, metrics: dict) -> bool:
    """Rewrites the whole (small) file: object stores cannot append, and a rewrite is all or nothing. An epoch at
    or before the last one logged is skipped with a warning, and False returned: a second writer of the trial (two
    drivers, a replayed report) never logs an epoch twice; a resumed trial truncates its log first
    (truncate_epochs), so its redone epochs come after the last one kept."""
    rows = read_epochs(trial_dir)
    if rows and metrics["epoch"] <= rows[-1]["epoch"]:
        logger.warning(
            "%s: epoch %s not logged: %s already ends at epoch %s (a second writer of this trial?)",
            trial_dir,
            metrics["epoch"],
            EPOCHS_FILE,
            rows[-1]["epoch"],
        )
        return False
    _write_epochs(trial_dir, rows + [metrics])
    return True


def truncate_epochs(trial_dir: Where, last_kept_epoch: int) -> None:
    """Drop epochs after `last_kept_epoch` (a resumed trial redoes them)."""
    _write_epochs(trial_dir, [row for row in read_epochs(trial_dir) if row["epoch"] <= last_kept_epoch])


def sweep_objective(sweep: dict) -> tuple[str, str]:
    """What "best" means for a run, from its sweep.json: the sweep's (metric, mode), the defaults where it names
    none. The end-of-run summary names the best trial by it, the report the best configuration (seeds averaged)."""
    return sweep.get("metric", DEFAULT_OBJECTIVE[0]), sweep.get("mode", DEFAULT_OBJECTIVE[1])


@dataclass(frozen=True)
class CorrectImages:
    """Which test images a trial's final evaluation got right (TEST_CORRECT_FILE): one bit per image of the test
    set in dataset order (the first test_subset images), the same order for every trial and any number of workers,
    as numpy.packbits packs them (first image in the first byte's highest bit); `images` says where the last
    byte's padding starts. A JSON object (`epoch`, `images`, `bits` in base64) rather than a bare .bin: the count
    and the epoch travel with the bits in one file written whole, and it reads like every other file here (10,000
    images: 1,250 bytes, 1.7 kB as base64)."""

    epoch: int  # the evaluation's epoch: the trial's last
    images: int
    bits: bytes


def write_correct_images(trial_dir: Where, record: CorrectImages) -> None:
    write_json(
        StoragePath.of(trial_dir) / TEST_CORRECT_FILE,
        {"epoch": record.epoch, "images": record.images, "bits": base64.b64encode(record.bits).decode("ascii")},
    )


def _correct_images(data: bytes) -> CorrectImages:
    value = _json_object(data)
    epoch, images, text = value.get("epoch"), value.get("images"), value.get("bits")
    bits = base64.b64decode(text, validate=True) if isinstance(text, str) else b""  # binascii.Error: a ValueError
    if not (isinstance(epoch, int) and isinstance(images, int) and images > 0 and len(bits) == -(-images // 8)):
        raise ValueError(f"it holds no packed bits of an epoch's test images ({len(bits)} bytes for {images} images)")
    return CorrectImages(epoch, images, bits)


def read_correct_images(trial_dir: Where) -> CorrectImages | None:
    """The trial's CorrectImages; None when it logged none (older versions, or no final evaluation yet);
    StorageError when the file cannot be read or is not such a record."""
    return read_retrying(StoragePath.of(trial_dir) / TEST_CORRECT_FILE, _correct_images, None)


@dataclass
class TrialLog:
    """A trial as its folder holds it: its trial.json as a typed record (core/record.py), its epochs in epoch order
    and, for the report, which test images its final evaluation got right. Status, the report's loader, export and
    the end-of-run summary all read this one record."""

    name: str
    record: TrialRecord
    epochs: list[dict] = field(default_factory=list)
    correct: CorrectImages | None = None  # read only for the report (load_run's per_image)

    @classmethod
    def of(cls, name: str, meta: dict, epochs: list[dict] | None = None) -> TrialLog:
        """A trial from its trial.json's object `meta` (hand-made logs: tests, a compared run's relabelled trial)."""
        return cls(name, TrialRecord.from_json(name, meta), epochs or [])

    @property
    def meta(self) -> dict:
        """trial.json's object, as read (the keys it holds, nothing added)."""
        return self.record.to_json()

    @property
    def status(self) -> str:
        return self.record.status

    @property
    def swept(self) -> dict:
        return self.record.swept

    @property
    def config(self) -> dict:
        return self.record.config

    @property
    def incomplete(self) -> bool:
        return incomplete(self.status, len(self.epochs), self.config.get("epochs"))


@dataclass
class RunLog:
    path: StoragePath
    sweep: dict
    trials: list[TrialLog]
    # trial folder -> why none of its trial is here (load_run's `damaged`): its trial.json unparseable, or absent
    damaged: dict[str, str] = field(default_factory=dict)


def load_run(run_dir: Where, per_image: bool = False, damaged: bool = False) -> RunLog:
    """Everything under RUN_DIR, in sweep order (trial folders not listed in sweep.json come last); with
    `per_image`, each trial's CorrectImages too (one more read per trial, which only the report needs). A file that
    cannot be read raises StorageError naming it: status and report say so in one line rather than show a
    table with its trial as pending (another user's files of mode 0600 in a shared folder, a storage outage). With
    `damaged` (the report), a trial whose trial.json holds no JSON after every try, or whose folder holds other
    files but no trial.json, is left out and named in RunLog.damaged instead: the rest of the run is still read."""
    run_dir = StoragePath.of(run_dir)
    if not run_dir.is_dir():
        raise RunFolderError(f"no run folder at {run_dir}: pass the folder holding {SWEEP_FILE} (<storage>/<name>)")
    sweep = read_json(run_dir / SWEEP_FILE)
    listed = list(sweep.get("trials", []))
    found = [name for name in run_dir.subfolders() if (run_dir / name / TRIAL_FILE).exists()]
    names = [n for n in listed if n in found] + [n for n in found if n not in listed]
    trials, why = [], {}
    for name in names:
        try:
            record = TrialRecord.from_json(name, read_json(run_dir / name / TRIAL_FILE))
        except StorageError as error:
            if not damaged or not isinstance(error.__cause__, ValueError):  # an outage or a refusal: not damage
                raise
            why[name] = f"its {TRIAL_FILE} is damaged: {str(error.__cause__).splitlines()[0]}"
            continue
        epochs = read_epochs(run_dir / name)
        trials.append(TrialLog(name, record, epochs, read_correct_images(run_dir / name) if per_image else None))
    if damaged:
        why |= {name: f"its folder has no {TRIAL_FILE}" for name in trial_folders(run_dir) if name not in found}
    return RunLog(run_dir, sweep, trials, why)


def trial_folders(run_dir: Where) -> list[str]:
    """The folders in `run_dir` that hold a trial's files (trial.json, metrics.jsonl or checkpoints)."""
    run_dir = StoragePath.of(run_dir)
    return [
        name
        for name in run_dir.subfolders()
        if any((run_dir / name / held).exists() for held in (TRIAL_FILE, EPOCHS_FILE, CHECKPOINTS))
    ]


# Options of a run's first command that a resume refuses (--estimate times a whole sweep before it starts) or replaces.
_NOT_RESUMED = ("--estimate", "--dry-run", "--resume")


def more_seeds_command(command: str | None, repeats: int) -> str:
    """The command that adds seeds to the run that `command` (sweep.json's, as typed) started: its words less the
    options a resume refuses or replaces, then --resume --repeats `repeats`."""
    words, kept = shlex.split(command) if command else ["cifar-ray", "sweep", "FILE"], []
    skip = False
    for word in words:
        if skip or word in _NOT_RESUMED or word.startswith("--repeats="):
            skip = False
            continue
        skip = word == "--repeats"  # and its value
        if not skip:
            kept.append(word)
    return shlex.join([*kept, "--resume", "--repeats", str(repeats)])
