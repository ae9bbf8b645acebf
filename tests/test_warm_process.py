"""A trial trained in a process that trained other trials before gives bitwise the metrics of the same trial
trained in a fresh process (on CPU): what lets warm worker processes run trial after trial."""

from __future__ import annotations

import torch
from helpers import COMPUTED, in_a_fresh_process

from cifar_ray.core import runlog
from cifar_ray.core.config import TrainConfig
from cifar_ray.core.storage import StoragePath
from cifar_ray.training import loop as train
from cifar_ray.training.distributed import Worker

TINY = {
    "dataset": "synthetic",
    "train_subset": 256,
    "test_subset": 64,
    "train_eval_size": 64,
    "width": 4,
    "depth": 2,
    "epochs": 2,
    "batch_size": 32,
}
TRIAL = TINY | {"seed": 3, "dropout": 0.3, "augment": "flip_crop_cutout", "optimizer": "momentum", "lr": 0.05}
OTHERS = [
    TINY | {"seed": 1, "dropout": 0.5, "optimizer": "adam", "lr": 0.003},
    TINY | {"seed": 2, "norm": "group", "accum_steps": 2, "label_smoothing": 0.1},
]


def trained_epochs(values: dict, folder: str) -> list[dict]:
    """The trial's epochs as training reports them, trained here by the worker code (one worker, no Ray)."""
    torch.set_num_threads(1)
    epochs: list[dict] = []
    worker = Worker(rank=0, world=1, devices=[torch.device("cpu")])
    train.run_trial(TrainConfig(**values), StoragePath.of(folder), worker, lambda metrics, _: epochs.append(metrics))
    return epochs


def trial_metrics(values: dict, folder: str) -> list[dict]:
    return [{key: row[key] for key in COMPUTED} for row in trained_epochs(values, folder)]


def test_training_writes_exactly_the_epoch_metrics_the_run_log_names(tmp_path):
    epochs = trained_epochs(TINY | {"epochs": 1}, str(tmp_path / "trial"))
    logged = runlog.read_epochs(str(tmp_path / "trial"))
    on_cpu = [key for key in runlog.EPOCH_METRICS if key != runlog.ALLREDUCE_ESTIMATE_KEY]  # measured on CPU
    assert list(epochs[0]) == on_cpu and list(logged[0]) == on_cpu


def test_a_trial_after_others_in_one_process_equals_it_in_a_fresh_process(tmp_path):
    for i, values in enumerate(OTHERS):
        trial_metrics(values, str(tmp_path / f"other{i}"))
    warm = trial_metrics(TRIAL, str(tmp_path / "warm"))

    assert warm == in_a_fresh_process(trial_metrics, TRIAL, str(tmp_path / "fresh"))
    assert len(warm) == 2 and warm[0]["train_loss"] != warm[1]["train_loss"]


class _Cycle:
    def __init__(self):
        self.me = self


def test_a_warm_slot_collects_only_what_its_trials_made():
    """The collection after each trial (release_trial) walked every object of torch, Ray and ours: 0.7-2 s per
    trial, the whole hand-off in a warm slot. Frozen at the slot's set-up, those are skipped, and a trial's
    cycles are still collected."""
    import gc
    import weakref

    from cifar_ray.cluster.slots import keep_out_of_collections
    from cifar_ray.training.memory import release_trial

    before = len(gc.get_objects())
    try:
        keep_out_of_collections()
        assert gc.get_freeze_count() >= before > 10_000 and len(gc.get_objects()) < before / 10
        left = weakref.ref(_Cycle())  # what a trial leaves in a reference cycle, made after the set-up
        release_trial([torch.device("cpu")])
        assert left() is None
    finally:
        gc.unfreeze()


def test_what_a_trial_leaves_alive_is_not_walked_by_the_next_trials_collections():
    """A slot's first trial imports modules lazily and fills caches: objects that outlive it. After each trial
    (slots.after_trial) they are frozen with the rest, so the next collection walks only what the next trial makes;
    a trial's cycles are still collected."""
    import gc
    import weakref

    from cifar_ray.cluster.slots import after_trial, keep_out_of_collections

    try:
        keep_out_of_collections()
        kept_by_the_first_trial = [[i] for i in range(50_000)]  # as a lazily imported module's objects
        left = weakref.ref(_Cycle())
        after_trial([torch.device("cpu")])
        assert left() is None
        assert len(gc.get_objects()) < 10_000 and kept_by_the_first_trial
    finally:
        gc.unfreeze()
