"""Shared fixtures: one real Ray for the whole session, and a generated CIFAR-format dataset; no process the session
started outlives it."""

from __future__ import annotations

import os
import pickle
import time
import warnings
from pathlib import Path

import numpy as np
import psutil
import pytest

SESSION_MARKER = "CIFAR_RAY_TEST_SESSION"  # in the environment of every process this test session starts

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


def pytest_configure(config) -> None:
    marker = os.environ.setdefault(SESSION_MARKER, f"{os.getpid()}-{time.time_ns()}")
    # A pytest-xdist worker (`-n 2`) inherits the marker of the process that started it: it is a session of its own,
    # with a marker of its own, so no worker's end stops what another worker still runs (nor the worker itself).
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and not marker.endswith(f"-{worker}"):
        os.environ[SESSION_MARKER] = f"{marker}-{worker}"


def pytest_collection_modifyitems(config, items) -> None:
    """A test on the session's real Ray (the `ray_cluster` fixture) is in the slow tier, marked or not: the fast
    tier (`-m "not slow"`) never starts Ray in this process."""
    for item in items:
        if "ray_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


def session_processes() -> list[psutil.Process]:
    """The live processes this session started (its marker in their environment), this one and its parents aside,
    and multiprocessing's resource tracker and forkserver (tests/helpers.py's FRESH): both end with this process.
    A process forked from the forkserver is not spared: its cmdline is the server's, its parent the server."""
    mine, spared = os.environ[SESSION_MARKER], {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid not in spared and proc.status() != psutil.STATUS_ZOMBIE:
                command = " ".join(proc.cmdline())
                tracker = "multiprocessing.resource_tracker" in command
                server = "multiprocessing.forkserver" in command and proc.ppid() == os.getpid()
                if proc.environ().get(SESSION_MARKER) == mine and not (tracker or server):
                    found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


@pytest.fixture(scope="session", autouse=True)
def no_process_outlives_the_session():
    """Set up first, so torn down last (after ray_cluster's ray.shutdown): what the session started and is still
    alive 10 s later is stopped, and named in the warnings summary. A Ray worker normally exits with its raylet; a
    TrainController once stayed, orphaned, for hours."""
    yield
    deadline = time.monotonic() + 10
    while (left := session_processes()) and time.monotonic() < deadline:
        time.sleep(0.5)
    for proc in left:
        try:
            command = " ".join(proc.cmdline())[:200]
            warnings.warn(f"stopped {proc.pid} ({command}): the test session left it alive", stacklevel=1)
            proc.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass


@pytest.fixture(scope="session")
def ray_cluster():
    """Ray started once per test session with 2 CPUs (like this machine), shut down at the end."""
    import ray

    from cifar_ray.cluster.session import init_ray

    init_ray(num_cpus=2, num_gpus=0)
    yield
    ray.shutdown()


@pytest.fixture(autouse=True)
def no_placement_group_outlives_its_test(request):
    """A test on the session's Ray leaves no placement group reserved: one left holds its cores until the session
    ends, and a later test's worker group waits for them forever (a CI run hung so, ten tests after the one that
    left it). What a test left is removed, so the tests after it run, and the test errs at its teardown, naming it."""
    if "ray_cluster" not in request.fixturenames:
        yield
        return
    import ray
    from helpers import reserved_placement_groups
    from ray.util.placement_group import PlacementGroup, placement_group_table, remove_placement_group

    before = reserved_placement_groups()
    yield
    deadline = time.monotonic() + 60  # a removal sent just before the test's end may not have landed yet
    while (left := reserved_placement_groups() - before) and time.monotonic() < deadline:
        time.sleep(0.5)
    if left:
        table = placement_group_table()
        for key in left:
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(key))))
        pytest.fail(f"the test left {len(left)} placement group(s) reserved: {[table[key]['bundles'] for key in left]}")
