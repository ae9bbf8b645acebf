"""Which test images a trial's final evaluation got right (test_correct.json), as training writes it: run_trial in
this process (one rank) and on two gloo ranks (DDP, an odd test set split 34 + 33), each against a recomputation
from its final checkpoint's model in dataset order; and one model evaluated on two ranks gives the one-rank bits."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from helpers import two_gloo_ranks

from cifar_ray.core import runlog
from cifar_ray.core.checkpoints import CHECKPOINT_FILE
from cifar_ray.report.testset import unpack
from cifar_ray.training import loop as train
from cifar_ray.training.check_runs import make_config
from cifar_ray.training.data import load_splits, normalise
from cifar_ray.training.distributed import Worker, all_reduce
from cifar_ray.training.models import build_model

CPU = torch.device("cpu")
TEST_IMAGES = 67


def config(world: int):
    return make_config(
        test_subset=TEST_IMAGES, train_subset=128, norm="batch", epochs=2, workers=world, batch_size=16 * world
    )


def _train(rank: int, world: int, folder: str) -> dict:
    """run_trial on this rank; rank 0 keeps its last checkpoint. Returns, per epoch, whether the per-image record
    existed when that epoch was reported, and the bits the same (seeded) model gives when evaluated on these ranks."""
    cfg, folder = config(world), Path(folder)
    trial_dir = folder / "trial"
    seen = []

    def report(metrics: dict, checkpoint: Path | None) -> None:
        seen.append([metrics["epoch"], (trial_dir / runlog.TEST_CORRECT_FILE).exists()])
        if checkpoint is not None and metrics["epoch"] == cfg.epochs:
            shutil.copy(checkpoint / CHECKPOINT_FILE, folder / "final.pt")

    train.run_trial(cfg, trial_dir, Worker(rank, world, [CPU]), report)
    return {"seen": seen, "seeded": seeded_bits(rank, world)}


def seeded_bits(rank: int, world: int) -> list[int]:
    torch.manual_seed(3)
    model, cfg = build_model(config(1)).to(memory_format=train.MEMORY_FORMAT), config(1)
    test = load_splits(cfg)[1]
    correct = torch.zeros(len(test), dtype=torch.uint8)
    train.evaluate(model, test, cfg, Worker(rank, world, [CPU]), correct)
    return all_reduce(correct).tolist()


def recomputed(folder: Path) -> torch.Tensor:
    """Which test images the final checkpoint's model gets right, the whole test set as one batch, in dataset
    order: no shards, nothing gathered."""
    cfg = config(1)
    model = build_model(cfg)
    model.load_state_dict(torch.load(folder / "final.pt", weights_only=True)["model"])
    model.eval()
    test = load_splits(cfg)[1]
    with torch.no_grad():
        return model(normalise(test.images).contiguous(memory_format=train.MEMORY_FORMAT)).argmax(1) == test.labels


def logged(folder: Path) -> torch.Tensor:
    record = runlog.read_correct_images(folder / "trial")
    assert (record.epoch, record.images) == (2, TEST_IMAGES)
    return torch.from_numpy(unpack(record))


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> tuple[Path, list[dict]]:
    folder = tmp_path_factory.mktemp("two-ranks")
    return folder, two_gloo_ranks(_train, folder)


def test_one_rank_logs_the_final_evaluation_in_dataset_order(tmp_path):
    findings = _train(0, 1, str(tmp_path))
    assert findings["seen"] == [[1, False], [2, True]]  # written at the final evaluation only, before it is reported
    bits = logged(tmp_path)
    assert torch.equal(bits, recomputed(tmp_path))
    assert runlog.read_epochs(tmp_path / "trial")[-1]["test_acc"] == bits.double().mean().item()


def test_two_ranks_gather_their_shards_back_into_dataset_order(two_ranks):
    folder, findings = two_ranks
    assert findings[0]["seen"] == [[1, False], [2, True]]
    bits = logged(folder)
    assert torch.equal(bits, recomputed(folder))
    assert runlog.read_epochs(folder / "trial")[-1]["test_acc"] == bits.double().mean().item()


def test_one_model_gives_the_same_bits_on_two_ranks_as_on_one(two_ranks):
    one = seeded_bits(0, 1)
    assert 0 < sum(one) < TEST_IMAGES  # some right, some wrong: an order to get wrong
    assert two_ranks[1][0]["seeded"] == two_ranks[1][1]["seeded"] == one
