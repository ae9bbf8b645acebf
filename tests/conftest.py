"""Shared fixtures: one real Ray for the whole session, and a generated CIFAR-format dataset."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

PER_TRAIN_BATCH = 120  # 5 files x 120 = 600 training images, 200 test images: seconds per epoch


def write_cifar_fixture(
    root: Path, per_batch: int = PER_TRAIN_BATCH, n_test: int = 200, keys: str = "bytes"
) -> dict[str, np.ndarray]:
    """`root/cifar-10-batches-py` in the original pickle format, with seeded random images. keys="bytes":
    bytes keys, as in the official (Python 2) archive; keys="str": str keys, as Python 3 tools write them."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    arrays = {}
    for name, n in [*((f"data_batch_{i}", per_batch) for i in range(1, 6)), ("test_batch", n_test)]:
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n).tolist()
        batch = {"batch_label": name, "labels": labels, "data": data, "filenames": ["x.png"] * n}
        if keys == "bytes":
            batch = {b"batch_label": name.encode(), b"labels": labels, b"data": data, b"filenames": [b"x.png"] * n}
        with open(folder / name, "wb") as out:
            pickle.dump(batch, out)
        arrays[name] = (data, labels)
    (folder / "batches.meta").write_bytes(pickle.dumps({b"label_names": [b"c%d" % i for i in range(10)]}))
    return arrays


@pytest.fixture(scope="session")
def cifar_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cifar")
    write_cifar_fixture(root)
    return root


@pytest.fixture(scope="session")
def ray_cluster():
    """Ray started once per test session with 2 CPUs (like this machine), shut down at the end."""
    import ray

    from cifar_ray.cluster.session import init_ray

    init_ray(num_cpus=2, num_gpus=0)
    yield
    ray.shutdown()
