"""The live view: TensorBoard event files in the run folder as epochs arrive (`tensorboard --logdir runs/NAME`).

Tune's own TBXLoggerCallback writes into a staging folder on the driver, which Tune copies to the run folder at its
experiment checkpoints (every 10 s or more), through tensorboardX's writer thread that writes its file every 30 s
(Tune's flush_secs; SummaryWriter.flush() does not wait for that thread): the run folder lags up to 40 s behind, and
a driver killed in between loses what was not copied yet; a --resume continues from the copy and never reports
those epochs again. RunFolderTensorBoard, a TBXLoggerCallback (so Tune adds none of its own), writes into each
trial's folder itself, within LIVE_FLUSH_S of the result, each epoch at step = epoch (thin_trials.thin_trial reports
it as timesteps_total). Before an epoch, and as the trial ends, it writes from metrics.jsonl, the training's own
record, every earlier epoch that the trial's event files lack: those a killed driver never passed on; an epoch its
files hold already (retrained after a checkpoint fallback) is not written again. A resumed sweep first fills in the
trials it will not train (fill_in_ended): those that ended while a driver was dying. Each writer
gets a file of its own (tensorboardX names a file by the second and the host only: a second writer in the same
second emptied the first one's file). A run folder at a URI keeps Tune's logger and its lag: tensorboardX writes
local files.
"""

from __future__ import annotations

import struct
import sys
import uuid
from pathlib import Path

from ..core import runlog
from ..core.storage import StoragePath

TUNE_TAG = "ray/tune/{}"  # TBXLoggerCallback's name for a result's key
EVENT_FILES = "events.out.tfevents.*"
LIVE_FLUSH_S = 1  # tensorboardX's writer thread writes its file this often; 0 would make it spin


def logged_steps(trial_dir: str | Path) -> list[int]:
    """The epochs that the event files in `trial_dir` hold whole, in their files' order, once per copy written (a
    fault campaign counts the copies). A result's scalars are written in its order, its epoch metrics before its
    timesteps_total (thin_trials.thin_trial, and this module's fill-ins), so an epoch counts once its timesteps_total
    is there. A file is a run of TFRecords (length: 8 bytes, its CRC: 4, the Event, its CRC: 4); a record cut short
    by a killed writer ends its file."""
    from ray.tune.result import TIMESTEPS_TOTAL
    from tensorboardX.proto.event_pb2 import Event

    last_tag, steps = TUNE_TAG.format(TIMESTEPS_TOTAL), []
    for path in sorted(Path(trial_dir).glob(EVENT_FILES)):
        data, at = path.read_bytes(), 0
        while at + 12 <= len(data):
            (length,) = struct.unpack_from("<Q", data, at)
            end = at + 12 + length + 4
            if end > len(data):
                break
            event = Event.FromString(data[at + 12 : at + 12 + length])
            steps += [event.step for value in event.summary.value if value.tag == last_tag]
            at = end
    return steps


def logged_epochs(trial_dir: str | Path) -> set[int]:
    """The epochs that the event files in `trial_dir` hold whole (logged_steps, each once)."""
    return set(logged_steps(trial_dir))


def import_tensorboardx_without_torch() -> None:
    """Import tensorboardX as if torch were not installed, unless either is imported already: its writer module
    imports torch (~2 CPU-s in the driver, beside a sweep's start) only to name torch.Tensor in type hints, and the
    live view writes floats. A `None` in sys.modules makes `import torch` raise ImportError (Python's documented
    import protocol) for that moment only."""
    if "tensorboardX" in sys.modules or "torch" in sys.modules:
        return
    sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        import tensorboardX  # noqa: F401
    finally:
        del sys.modules["torch"]


def missing_rows(trial_dir: str | Path) -> list[dict]:
    """The epochs of a trial's metrics.jsonl (the last copy of each) that its event files do not hold whole."""
    logged = logged_epochs(trial_dir)
    return [row for row in runlog.read_epochs(trial_dir) if row["epoch"] not in logged]


def fill_in_ended(run_dir: StoragePath, names: list[str]) -> int:
    """Bring the event files of the trials `names`, which this session will not train (they ended under an earlier
    driver, maybe as it was killed), up to their metrics.jsonl: each missing epoch once, tagged as the live view tags
    a result (TUNE_TAG, its timesteps_total last, at step = epoch). Returns the epochs written."""
    if not run_dir.is_local:
        return 0
    from ray.tune.result import TIMESTEPS_TOTAL

    written = 0
    for name in names:
        folder = Path(run_dir.path) / name
        rows = missing_rows(folder) if folder.is_dir() else []
        if not rows:
            continue
        import_tensorboardx_without_torch()
        from tensorboardX import SummaryWriter

        with SummaryWriter(str(folder), filename_suffix=f".{uuid.uuid4().hex[:8]}") as writer:
            for row in rows:
                for key, value in (row | {TIMESTEPS_TOTAL: row["epoch"]}).items():
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                        writer.add_scalar(TUNE_TAG.format(key), value, global_step=row["epoch"])
                written += 1
    return written


def live_tensorboard(run_dir: StoragePath) -> list:
    """The Tune callbacks of the live view: [RunFolderTensorBoard] for a local run folder, [] (Tune's own) for a URI."""
    if not run_dir.is_local:
        return []
    from ray.tune.logger import TBXLoggerCallback
    from ray.tune.result import TIMESTEPS_TOTAL

    class RunFolderTensorBoard(TBXLoggerCallback):
        def __init__(self):
            import_tensorboardx_without_torch()
            super().__init__()
            self._logged: dict = {}  # trial -> the epochs its event files hold, read at its first epoch here

        def log_trial_start(self, trial):
            if trial in self._trial_writer:
                self._trial_writer[trial].close()
            self._trial_writer[trial] = self._summary_writer_cls(
                trial.path, flush_secs=LIVE_FLUSH_S, filename_suffix=f".{uuid.uuid4().hex[:8]}"
            )
            self._trial_result[trial] = {}

        def _fill_in(self, iteration, trial, before: int | None) -> None:
            """Write the epochs of metrics.jsonl (those before `before`; all for None) that the event files lack."""
            if trial not in self._logged:
                self._logged[trial] = logged_epochs(trial.path)
            logged = self._logged[trial]
            for row in runlog.read_epochs(trial.path):
                if (before is None or row["epoch"] < before) and row["epoch"] not in logged:
                    super().log_trial_result(iteration, trial, row | {TIMESTEPS_TOTAL: row["epoch"]})
                    logged.add(row["epoch"])

        def log_trial_result(self, iteration, trial, result):
            epoch = result.get("epoch")
            if isinstance(epoch, int):
                self._fill_in(iteration, trial, epoch)
                if epoch in self._logged[trial]:  # retrained after a checkpoint fallback: in its files already
                    return
                self._logged[trial].add(epoch)
            super().log_trial_result(iteration, trial, result)

        def log_trial_end(self, trial, failed=False):
            # Epochs no result brought: trained while no driver listened (a killed driver's slot went on), so the
            # resumed trial reports none of them.
            self._fill_in(0, trial, None)
            super().log_trial_end(trial, failed)

    return [RunFolderTensorBoard()]
