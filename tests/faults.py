"""Fault injection for tests: a pyarrow filesystem that makes a seeded share of the reads and writes of the run's
own files fail, mostly for a while, a few for good.

    handler = FaultyFiles(log_dir=tmp_path / "faults", seed=1, share=0.2, permanent=0.05)
    storage = faulty_storage(tmp_path / "runs", handler)    # a StoragePath, scheme "faulty" (not local)
    run_plan(plan, RunOptions(storage, ...))                # or runlog.append_epoch(storage / "t", ...)
    failures(tmp_path / "faults")                           # what was injected, by every process

Only files named in RUN_FILES fail (matched by basename, so Ray Tune's own files go through untouched); every
other call is LocalFileSystem's. A read fails at open; a write fails at open, before the file is touched, as an
object store's PUT fails (the older object stays). A failure is transient (the next `burst - 1` calls of the same
operation on the same file fail too, then the next one works: with `burst` < storage.TRIES a read or write always gets
through) or, with probability `permanent` of a failure, for good: that operation on that file fails from then on,
in every process (a marker file in `log_dir` says so).

The handler pickles (Ray workers receive it inside the StoragePath, with this module by value) and every
process appends one line per injected failure to `log_dir/failures.log`. Its random draws are seeded by (seed,
operation, file, call number in this process), so a single-process test sees the same failures every run.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import sys
from pathlib import Path

import pyarrow.fs as pafs
from ray import cloudpickle

from cifar_ray.core import runlog
from cifar_ray.core.checkpoints import CHECKPOINT_FILE
from cifar_ray.core.storage import StoragePath

# Ray pickles with cloudpickle: by value, this module travels with the handler and Ray workers need not find
# tests/ on their path.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
RUN_FILES = (runlog.SWEEP_FILE, runlog.TRIAL_FILE, runlog.EPOCHS_FILE, CHECKPOINT_FILE)
FAILURE_LOG = "failures.log"


class FaultyFiles(pafs.FileSystemHandler):
    def __init__(
        self,
        log_dir: str | os.PathLike,
        seed: int = 0,
        share: float = 0.1,
        permanent: float = 0.0,
        burst: int = 2,
        ops: tuple[str, ...] = ("read", "write"),
    ):
        """`share` of the calls of each of `ops` fail; `permanent` of those for good; a transient failure fails
        `burst` calls in a row."""
        self.log_dir = str(log_dir)
        self.seed, self.share, self.permanent, self.burst, self.ops = seed, share, permanent, burst, tuple(ops)
        self._local = pafs.LocalFileSystem()
        self._calls: dict[tuple[str, str], int] = {}  # this process's calls per (operation, file)
        self._failing: dict[tuple[str, str], int] = {}  # calls left to fail in a transient burst
        Path(self.log_dir).mkdir(parents=True, exist_ok=True)

    def __reduce__(self):
        return type(self), (self.log_dir, self.seed, self.share, self.permanent, self.burst, self.ops)

    # ---------------------------------------------------------------------- the faults

    def _draw(self, op: str, path: str, n: int) -> float:
        digest = hashlib.sha256(f"{self.seed}/{op}/{path}/{n}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64

    def _marker(self, op: str, path: str) -> Path:
        return Path(self.log_dir) / f"permanent-{op}-{hashlib.sha256(path.encode()).hexdigest()[:16]}"

    def _log(self, op: str, path: str, kind: str) -> None:
        with open(Path(self.log_dir) / FAILURE_LOG, "a") as out:  # one short O_APPEND write per line
            out.write(f"{op} {kind} {os.getpid()} {path}\n")

    def fail_for_good(self, op: str, path: str) -> None:
        """Make `op` ("read" or "write") of `path` fail from now on, in every process."""
        self._marker(op, str(path)).touch()

    def _maybe_fail(self, op: str, path: str) -> None:
        if posixpath.basename(path) not in RUN_FILES:
            return
        key = (op, path)
        if self._marker(op, path).exists():
            self._log(op, path, "permanent")
            raise OSError(f"injected permanent {op} failure: {path}")
        left = self._failing.pop(key, None)
        if left:
            self._failing[key] = left - 1 if left > 1 else 0  # 0: the call after the burst works
            self._log(op, path, "transient")
            raise OSError(f"injected transient {op} failure: {path}")
        if left == 0:
            return
        n = self._calls[key] = self._calls.get(key, 0) + 1
        draw = self._draw(op, path, n)
        if op not in self.ops or draw >= self.share:
            return
        if draw < self.share * self.permanent:
            self.fail_for_good(op, path)
            self._log(op, path, "permanent")
            raise OSError(f"injected permanent {op} failure: {path}")
        self._failing[key] = self.burst - 1
        self._log(op, path, "transient")
        raise OSError(f"injected transient {op} failure: {path}")

    # ------------------------------------------------------- pyarrow's FileSystemHandler

    def get_type_name(self) -> str:
        return "faulty"

    def normalize_path(self, path):
        return self._local.normalize_path(path)

    def get_file_info(self, paths):
        return self._local.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self._local.get_file_info(selector)

    def create_dir(self, path, recursive):
        self._local.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self._local.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self._local.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        raise OSError("FaultyFiles refuses to delete the root folder's contents")

    def delete_file(self, path):
        self._local.delete_file(path)

    def move(self, src, dest):
        self._local.move(src, dest)

    def copy_file(self, src, dest):
        self._local.copy_file(src, dest)

    def open_input_stream(self, path):
        self._maybe_fail("read", path)
        return self._local.open_input_stream(path)

    def open_input_file(self, path):
        self._maybe_fail("read", path)
        return self._local.open_input_file(path)

    def open_output_stream(self, path, metadata):
        self._maybe_fail("write", path)
        self._local.create_dir(posixpath.dirname(path), recursive=True)  # as in an object store: no folders to make
        return self._local.open_output_stream(path, metadata=metadata)

    def open_append_stream(self, path, metadata):
        self._maybe_fail("write", path)
        return self._local.open_append_stream(path, metadata=metadata)


def faulty_storage(folder: str | os.PathLike, handler: FaultyFiles) -> StoragePath:
    """A StoragePath of `folder` that reads and writes through `handler`."""
    return StoragePath(fs=pafs.PyFileSystem(handler), path=str(Path(folder).resolve()), scheme="faulty")


def failures(log_dir: str | os.PathLike) -> list[tuple[str, str, str]]:
    """Every injected failure so far, by every process: (operation, "transient" | "permanent", file)."""
    log = Path(log_dir) / FAILURE_LOG
    if not log.exists():
        return []
    return [(op, kind, path) for op, kind, _pid, path in (line.split(" ", 3) for line in log.read_text().splitlines())]
