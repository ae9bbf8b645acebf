"""What one real 2-worker training logs beside the running train metrics: the fixed training subset evaluated like
the test set (train_eval_*), and peak memory per worker and in total (real Ray Train workers, gloo, tiny data)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cifar_ray.cli import main
from cifar_ray.core import runlog
from cifar_ray.core.checkpoints import CHECKPOINT_FILE
from cifar_ray.core.config import TrainConfig
from cifar_ray.report.testset import unpack
from cifar_ray.training import loop as train
from cifar_ray.training.data import load_splits, normalise
from cifar_ray.training.distributed import Worker
from cifar_ray.training.memory import peak_memory_mb, reset_peak_memory
from cifar_ray.training.models import build_model

pytestmark = pytest.mark.usefixtures("ray_cluster")

TRAIN_EVAL_SIZE = 101  # fewer than the 256 training images, and split unevenly over the 2 ranks (51 + 50)


@pytest.fixture(scope="module")
def trial(tmp_path_factory) -> tuple[Path, runlog.TrialLog]:
    """The trial's folder and log."""
    storage = tmp_path_factory.mktemp("runs")
    code = main(
        [
            "train",
            "--storage",
            str(storage),
            "--name",
            "train-eval",
            "--set",
            "dataset=synthetic",
            "train_subset=256",
            "test_subset=65",  # split unevenly over the 2 ranks (33 + 32)
            "width=4",
            "depth=2",
            "workers=2",
            "epochs=2",
            "batch_size=32",
            "augment=flip_crop",
            "dropout=0.2",
            f"train_eval_size={TRAIN_EVAL_SIZE}",
        ]
    )
    assert code == 0
    run = runlog.load_run(storage / "train-eval")
    return storage / "train-eval" / run.trials[0].name, run.trials[0]


def checkpointed_model(trial_dir: Path, epoch: int, cfg: TrainConfig) -> torch.nn.Module:
    """The model as rank 0 saved it after `epoch` (the same weights and batch-norm statistics it evaluated)."""
    for path in trial_dir.rglob(CHECKPOINT_FILE):
        state = torch.load(path, weights_only=True)
        if state["epoch"] == epoch:
            model = build_model(cfg)
            model.load_state_dict(state["model"])
            return model
    raise AssertionError(f"no checkpoint of epoch {epoch} under {trial_dir}")


@pytest.mark.slow  # the module's real 2-worker training
def test_train_eval_is_the_first_training_images_evaluated_like_the_test_set(trial):
    trial_dir, trial = trial
    cfg = TrainConfig(**trial.config)
    first = load_splits(cfg)[0].head(TRAIN_EVAL_SIZE)
    assert len(trial.epochs) == 2
    for row in trial.epochs:
        model = checkpointed_model(trial_dir, row["epoch"], cfg)
        loss_sum, correct, samples = train.evaluate(model, first, cfg, Worker.single(torch.device("cpu"))).tolist()
        assert samples == TRAIN_EVAL_SIZE
        assert row["train_eval_acc"] == correct / samples  # both ranks' shards, all-reduced: every image once
        assert row["train_eval_loss"] == pytest.approx(loss_sum / samples, rel=1e-5)
        assert row["train_eval_acc"] != row["train_acc"]  # not the running mean under augmentation and dropout


@pytest.mark.slow  # the module's real 2-worker training
def test_the_final_evaluation_logs_which_test_images_it_got_right(trial):
    """`cifar-ray train` with 2 workers: the bits rank 0 wrote are the final model's per-image correctness on the
    whole test set, in dataset order (recomputed here in one batch, no shards)."""
    trial_dir, trial = trial
    cfg = TrainConfig(**trial.config)
    model = checkpointed_model(trial_dir, cfg.epochs, cfg).eval()
    test = load_splits(cfg)[1]
    with torch.no_grad():
        right = model(normalise(test.images).contiguous(memory_format=train.MEMORY_FORMAT)).argmax(1) == test.labels
    record = runlog.read_correct_images(trial_dir)
    assert (record.epoch, record.images) == (cfg.epochs, len(test))
    assert torch.equal(torch.from_numpy(unpack(record)), right)


@pytest.mark.slow  # the module's real 2-worker training
def test_peak_memory_per_worker_and_total_over_both_workers(trial):
    for row in trial[1].epochs:
        # Two worker processes, each a whole Python + torch process: the total sums both peaks.
        assert row["peak_mem_mb"] < row["peak_mem_total_mb"] <= 2 * row["peak_mem_mb"]


def test_cpu_peak_memory_is_reset_per_epoch():
    """The CPU peak is the epoch's (VmHWM after /proc/self/clear_refs), not the process's lifetime peak: an
    earlier 256 MiB allocation must not show in the next epoch's number."""
    cpu = [torch.device("cpu")]
    reset_peak_memory(cpu)
    before = peak_memory_mb(cpu)
    block = bytearray(256 * 2**20)
    block[::4096] = b"x" * len(block[::4096])  # touch every page, so it is resident
    assert peak_memory_mb(cpu) > before + 200
    del block
    reset_peak_memory(cpu)
    assert peak_memory_mb(cpu) < before + 50
