import numpy as np
import pytest
import torch

from cifar_ray import data
from cifar_ray.config import TrainConfig
from conftest import write_cifar_fixture


def test_loader_reads_cifar_format_fixture(tmp_path):
    arrays = write_cifar_fixture(tmp_path, per_batch=30, n_test=20)
    train, test = data.load_splits(TrainConfig(dataset="cifar10", data_dir=str(tmp_path)))
    assert train.images.shape == (150, 3, 32, 32) and train.images.dtype == torch.uint8
    assert test.images.shape == (20, 3, 32, 32)
    first, labels = arrays["data_batch_1"]
    assert np.array_equal(train.images[:30].reshape(30, -1).numpy(), first)  # row-major CHW, like the original
    assert train.labels[:30].tolist() == labels
    assert np.array_equal(train.images[120:150].reshape(30, -1).numpy(), arrays["data_batch_5"][0])
    sub_train, sub_test = data.load_splits(TrainConfig(data_dir=str(tmp_path), train_subset=128, test_subset=10, batch_size=64))
    assert (len(sub_train), len(sub_test)) == (128, 10)


def test_missing_data_offline_says_where_to_put_it(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "CIFAR_URL", "http://127.0.0.1:9/cifar-10-python.tar.gz")  # refused at once
    with pytest.raises(data.DataError) as error:
        data.load_splits(TrainConfig(data_dir=str(tmp_path / "empty")))
    message = str(error.value)
    assert "cifar-10-batches-py" in message and "dataset=synthetic" in message and str(tmp_path / "empty") in message


def test_corrupt_batch_is_a_data_error(tmp_path):
    write_cifar_fixture(tmp_path, per_batch=10, n_test=10)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").write_bytes(b"not a pickle")
    with pytest.raises(data.DataError, match="data_batch_3"):
        data.load_splits(TrainConfig(data_dir=str(tmp_path)))


@pytest.mark.parametrize("world, accum", [(1, 1), (2, 1), (2, 3), (4, 2)])
def test_shards_are_disjoint_and_complete(world, accum):
    n = 1000
    cfg = TrainConfig(batch_size=8 * world, accum_steps=accum, seed=3)
    shards = [data.train_step_indices(n, cfg, epoch=2, rank=r, world=world) for r in range(world)]
    steps = n // cfg.effective_batch
    for shard in shards:
        assert shard.shape == (steps, accum, 8)
    flat = torch.cat([s.flatten() for s in shards])
    assert len(set(flat.tolist())) == len(flat) == steps * cfg.effective_batch  # disjoint
    used = data.epoch_permutation(n, cfg.seed, 2)[: steps * cfg.effective_batch]
    assert sorted(flat.tolist()) == sorted(used.tolist())  # complete: every trained sample once
    # global micro-batch j is the concatenation of the ranks' j-th micro-batches, in rank order
    first_global = torch.cat([s[0, 0] for s in shards])
    assert first_global.tolist() == used[: cfg.batch_size].tolist()


def test_epochs_and_seeds_reshuffle():
    a = data.epoch_permutation(100, seed=0, epoch=1)
    assert not torch.equal(a, data.epoch_permutation(100, seed=0, epoch=2))
    assert not torch.equal(a, data.epoch_permutation(100, seed=1, epoch=1))
    assert torch.equal(a, data.epoch_permutation(100, seed=0, epoch=1))


@pytest.mark.parametrize("world", [1, 2, 3])
def test_test_shards_cover_the_test_set(world):
    slices = [data.test_shard(101, r, world) for r in range(world)]
    covered = [i for s in slices for i in range(s.start, s.stop)]
    assert covered == list(range(101))


def test_batched_augmentation():
    images = data.normalise(torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8))
    assert torch.equal(data.augment(images, "none", torch.Generator().manual_seed(0)), images)
    for kind in ("flip", "flip_crop", "flip_crop_cutout"):
        out = data.augment(images, kind, torch.Generator().manual_seed(0))
        again = data.augment(images, kind, torch.Generator().manual_seed(0))
        assert out.shape == images.shape and torch.equal(out, again)
    flipped = data.augment(images, "flip", torch.Generator().manual_seed(0))
    same = (flipped == images).flatten(1).all(1)
    mirrored = (flipped == images.flip(3)).flatten(1).all(1)
    assert (same | mirrored).all() and 10 < mirrored.sum() < 54  # each image flipped or not, about half
    cut = data.augment(images, "flip_crop_cutout", torch.Generator().manual_seed(0))
    assert ((cut == 0).flatten(1).sum(1) >= (data.CUTOUT_SIZE // 2) ** 2 * 3).all()  # every image has a hole


def test_synthetic_is_deterministic_and_balanced():
    a, b = data.synthetic_cifar(500, split_seed=1), data.synthetic_cifar(500, split_seed=1)
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.images, data.synthetic_cifar(500, split_seed=2).images)
    counts = torch.bincount(a.labels, minlength=10)
    assert counts.min() > 25
