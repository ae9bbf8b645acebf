import io
import os
import pathlib
import pickle
import struct

import numpy as np
import pytest
import torch
from conftest import write_cifar_fixture
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cifar_ray.core.config import TrainConfig
from cifar_ray.training import data


def test_loader_reads_cifar_format_fixture(tmp_path):
    arrays = write_cifar_fixture(tmp_path, per_batch=30, n_test=20)
    train, test = data.load_splits(TrainConfig(dataset="cifar10", data_dir=str(tmp_path)))
    assert train.images.shape == (150, 3, 32, 32) and train.images.dtype == torch.uint8
    assert test.images.shape == (20, 3, 32, 32)
    first, labels = arrays["data_batch_1"]
    assert np.array_equal(train.images[:30].reshape(30, -1).numpy(), first)  # row-major CHW, like the original
    assert train.labels[:30].tolist() == labels
    assert np.array_equal(train.images[120:150].reshape(30, -1).numpy(), arrays["data_batch_5"][0])
    sub_train, sub_test = data.load_splits(
        TrainConfig(data_dir=str(tmp_path), train_subset=128, test_subset=10, batch_size=64)
    )
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


def read_batch(folder, content: bytes) -> data.Split:
    """`content` as the one batch file data_batch_1 in `folder`, read back by the loader."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data_batch_1").write_bytes(content)
    return data.read_cifar_batches(folder, ("data_batch_1",))


def batch_error(folder, content: bytes) -> str:
    """The loader's DataError for `content`, checked to be one line that names the file."""
    with pytest.raises(data.DataError) as error:
        read_batch(folder, content)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"cannot read CIFAR-10 batch {folder / 'data_batch_1'}: ")
    return message


class Python2Pickler(pickle._Pickler):
    """Pickles as Python 2 did for the official archive: protocol 2, str and bytes as Python 2 str
    (SHORT_BINSTRING/BINSTRING, read back as bytes under encoding="bytes"), numpy under numpy.core."""

    dispatch = dict(pickle._Pickler.dispatch)

    def save_python2_str(self, obj):
        raw = obj.encode("latin-1") if isinstance(obj, str) else obj
        if len(raw) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(raw)]) + raw)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(raw)) + raw)
        self.memoize(obj)

    dispatch[str] = dispatch[bytes] = save_python2_str


def python2_pickle(obj) -> bytes:
    out = io.BytesIO()
    Python2Pickler(out, protocol=2).dump(obj)
    return out.getvalue().replace(b"cnumpy._core.", b"cnumpy.core.")


def random_batch(n: int, seed: int = 0) -> tuple[np.ndarray, list[int]]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 3072), dtype=np.uint8), rng.integers(0, 10, n).tolist()


@pytest.mark.parametrize("keys", ["bytes", "str"])
def test_loader_reads_bytes_and_str_keys(tmp_path, keys):
    arrays = write_cifar_fixture(tmp_path, per_batch=20, n_test=10, keys=keys)
    train, test = data.load_splits(TrainConfig(dataset="cifar10", data_dir=str(tmp_path)))
    train_images = np.concatenate([arrays[n][0] for n in data.TRAIN_FILES])
    assert np.array_equal(train.images.reshape(100, -1).numpy(), train_images)
    assert train.labels.tolist() == [label for n in data.TRAIN_FILES for label in arrays[n][1]]
    assert np.array_equal(test.images.reshape(10, -1).numpy(), arrays["test_batch"][0])


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize("keys", ["bytes", "str"])
def test_every_pickle_protocol_loads_bitwise(tmp_path, keys, protocol):
    images, labels = random_batch(6, seed=protocol)
    key = (lambda k: k.encode()) if keys == "bytes" else str
    stored = [
        (images, labels),
        (images.reshape(6, 3, 32, 32), np.array(labels)),  # also N x 3 x 32 x 32, array labels
        (np.asfortranarray(images), list(np.array(labels))),
    ]  # Fortran order, numpy int scalars
    for stored_images, stored_labels in stored:
        batch = {key("batch_label"): key("b"), key("data"): stored_images, key("labels"): stored_labels}
        split = read_batch(tmp_path, pickle.dumps(batch, protocol))
        assert np.array_equal(split.images.reshape(6, -1).numpy(), images) and split.labels.tolist() == labels


def test_python2_pickle_as_in_the_official_archive_loads_bitwise(tmp_path):
    images, labels = random_batch(12)
    raw = python2_pickle(
        {
            b"data": images,
            b"labels": labels,
            b"batch_label": b"training batch 1 of 5",
            b"filenames": [b"x_%d.png" % i for i in range(12)],
        }
    )
    assert raw.startswith(b"\x80\x02}") and b"U\x04data" in raw and b"cnumpy.core.multiarray\n_reconstruct\n" in raw
    split = read_batch(tmp_path, raw)
    assert np.array_equal(split.images.reshape(12, -1).numpy(), images) and split.labels.tolist() == labels


GOOD = np.zeros((10, 3072), np.uint8)


@pytest.mark.parametrize(
    "batch, says",
    [
        (
            {b"data": np.zeros((10, 100), np.uint8), b"labels": [0] * 10},
            "'data' has shape (10, 100) and dtype uint8; expected N x 3072 uint8 (N images of 3 x 32 x 32",
        ),
        (
            {"data": np.zeros((10, 32, 32, 3), np.uint8), "labels": [0] * 10},
            "'data' has shape (10, 32, 32, 3) and dtype",
        ),
        (
            {b"data": np.zeros((10, 3072), np.float32), b"labels": [0] * 10},
            "'data' has shape (10, 3072) and dtype float32",
        ),
        ({"data": [[0] * 3072] * 10, "labels": [0] * 10}, "'data' is a list; expected N x 3072 uint8"),
        (
            {b"data": GOOD, b"batch_label": b"x"},
            "has no 'labels' key (found keys: 'data', 'batch_label'); expected 'data' and 'labels' (bytes or str keys)",
        ),
        ({"labels": [0] * 10}, "has no 'data' key (found keys: 'labels')"),
        (
            {b"data": GOOD, b"labels": [0] * 9},
            "'labels' has 9 entries for 10 images; expected a list or 1-D integer array",
        ),
        ({"data": GOOD, "labels": [0] * 9 + [10]}, "label 10 at index 9 is not an int in 0..9"),
        ({b"data": GOOD, b"labels": [-1] + [0] * 9}, "label -1 at index 0 is not an int in 0..9"),
        ({b"data": GOOD, b"labels": [0] * 9 + [1.5]}, "label 1.5 at index 9 is not an int in 0..9"),
        ({b"data": GOOD, b"labels": np.zeros((10, 1), np.int64)}, "'labels' has shape (10, 1) and dtype int64;"),
        ({b"data": GOOD, b"labels": np.zeros(10)}, "'labels' has shape (10,) and dtype float64;"),
        ([GOOD, [0] * 10], "it holds a list; expected a dict with 'data' and 'labels'"),
        ({b"data": GOOD, b"labels": np.zeros(10, object)}, "refused to load a numpy array of dtype 'O8'"),
    ],
    ids=[
        "short-rows",
        "channels-last",
        "float32",
        "data-list",
        "no-labels",
        "no-data",
        "label-count",
        "label-10",
        "label-negative",
        "label-float",
        "labels-2d",
        "labels-float",
        "not-a-dict",
        "object-array",
    ],
)
def test_bad_batches_are_one_line_data_errors(tmp_path, batch, says):
    assert says in batch_error(tmp_path, pickle.dumps(batch))


def test_missing_batch_file_says_what_to_do(tmp_path):
    with pytest.raises(data.DataError) as error:
        data.read_cifar_batches(tmp_path, ("data_batch_1", "data_batch_2"))
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"cannot read CIFAR-10 batch {tmp_path / 'data_batch_1'}: ")
    assert "no such file;" in message
    assert data.CIFAR_URL in message and "data_dir=" in message


class TouchOnLoad:
    """Unpickling this runs `call(marker)`: what a crafted batch file could do."""

    def __init__(self, call, marker):
        self.call, self.marker = call, marker

    def __reduce__(self):
        if self.call == "os.system":
            return os.system, (f"touch {self.marker}",)
        return pathlib.Path.touch, (self.marker,)


class ForgedPointers:
    """numpy.ndarray called from a pickle: an object array whose pointers are the file's bytes."""

    def __reduce__(self):
        return np.ndarray, ((2,), np.dtype(object), bytes(16))


@pytest.mark.parametrize("protocol", [2, pickle.DEFAULT_PROTOCOL])
@pytest.mark.parametrize(
    "call, refused",
    [
        ("os.system", ["'posix.system'"]),  # protocol 2 names Path.touch by getattr
        ("Path.touch", ["'pathlib.Path.touch'", "'__builtin__.getattr'"]),
    ],
)
def test_loading_a_batch_runs_no_code(tmp_path, call, refused, protocol):
    marker = tmp_path / "marker"
    batch = {b"data": TouchOnLoad(call, marker), b"labels": [0]}
    message = batch_error(tmp_path / "batches", pickle.dumps(batch, protocol))
    assert any(f": refused to load {name} (a CIFAR batch holds only " in message for name in refused)
    assert not marker.exists()
    message = batch_error(tmp_path / "batches", pickle.dumps({b"data": ForgedPointers(), b"labels": [0, 0]}, protocol))
    assert "refused to load a numpy array of dtype 'O8'" in message


def read_or_fail_in_one_line(folder, content: bytes) -> None:
    """`content` is read, or fails as a one-line DataError naming the file: never another exception."""
    try:
        read_batch(folder, content)
    except data.DataError as error:
        message = str(error)
        assert "\n" not in message and message.startswith(f"cannot read CIFAR-10 batch {folder / 'data_batch_1'}: ")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300))
def test_random_batch_files_fail_in_one_line(tmp_path, content):
    read_or_fail_in_one_line(tmp_path, content)


SMALL_IMAGES = np.arange(2 * 3072, dtype=np.uint8).reshape(2, 3072)
SMALL_PICKLES = [python2_pickle({b"data": SMALL_IMAGES, b"labels": [3, 7]})] + [
    pickle.dumps({key("data"): SMALL_IMAGES, key("labels"): [3, 7]}, protocol)
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1)
    for key in (str, str.encode)
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.sampled_from(SMALL_PICKLES),
    st.integers(0, 10**5),
    st.lists(st.tuples(st.integers(0, 10**5), st.integers(0, 255)), max_size=4),
)
def test_damaged_batch_files_load_or_fail_in_one_line(tmp_path, content, cut, changes):
    damaged = bytearray(content[:cut])  # cut short (unless cut is past its end) ...
    for position, value in changes:  # ... and a few bytes overwritten
        if damaged:
            damaged[position % len(damaged)] = value
    read_or_fail_in_one_line(tmp_path, bytes(damaged))


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


def test_pad_crop_takes_each_image_at_its_drawn_offset():
    images, p = torch.randn(16, 3, 32, 32), data.CROP_PADDING
    out = data.augment(images, "flip_crop", torch.Generator().manual_seed(5))
    draws = torch.Generator().manual_seed(5)
    flip = torch.randint(0, 2, (16,), generator=draws).bool()  # the flip's draw comes first
    dy, dx = (torch.randint(0, 2 * p + 1, (16,), generator=draws) for _ in range(2))
    padded = torch.nn.functional.pad(
        torch.where(flip[:, None, None, None], images.flip(3), images), (p,) * 4, "reflect"
    )
    assert (dy != dx).any()  # rows and columns told apart
    for i in range(16):
        assert torch.equal(out[i], padded[i, :, dy[i] : dy[i] + 32, dx[i] : dx[i] + 32])


def test_flip_and_crop_in_one_gather_equal_flip_then_crop():
    images = torch.randn(32, 3, 32, 32)
    fused = data.augment(images, "flip_crop", torch.Generator().manual_seed(2))
    generator = torch.Generator().manual_seed(2)
    assert torch.equal(fused, data._pad_crop(data._flip(images, generator), generator))


def test_synthetic_is_deterministic_and_balanced():
    a, b = data.synthetic_cifar(500, split_seed=1), data.synthetic_cifar(500, split_seed=1)
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.images, data.synthetic_cifar(500, split_seed=2).images)
    counts = torch.bincount(a.labels, minlength=10)
    assert counts.min() > 25
