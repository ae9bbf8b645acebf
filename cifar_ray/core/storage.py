"""Where runs live: a local folder, or any URI that pyarrow opens (s3://, gs://, abfs://, hdfs://,
file://). `StoragePath` is the one small path type that the run log, the orchestrator, the training
loop and the report share, so the same code writes `metrics.jsonl` to a disk or to a bucket; Ray
Tune and Ray Train get the same filesystem (`storage_filesystem`) for their checkpoints and state.

Object stores have no rename and no append: a write is one whole-object PUT, which readers see
entirely or not at all; on local disk a write goes to a temp file and is renamed over the target. New files
and folders get the modes a plain open() and mkdir() give (0o666 and 0o777 less the umask), so a run folder
shared by a group is readable by the group.

A read tells "absent" from "failed" (`read_retrying`): a missing file is the caller's empty value; any other
error, or content that does not parse (a torn or corrupt file), is read again TRIES times with a doubling
pause, then raised as a StorageError naming the file and the reason. Nothing is ever taken for empty because a
read failed: a file rewritten from such a read would lose what it held.
Credentials and endpoints come from each node's environment (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL,
GOOGLE_APPLICATION_CREDENTIALS, ...) or from the URI itself (`s3://bucket/runs?region=eu-west-1&
endpoint_override=host:9000&scheme=http`); a StoragePath pickles with them, so Ray workers on any
node open the same store.

pyarrow is imported inside the methods that touch a filesystem: at module level it cost 0.4 s of
every `cifar-ray --help` and usage error (python -X importtime). A local folder is read with os, without
pyarrow (0.2 s of every `cifar-ray status`); only its writes and deletes go through pyarrow. For the same reason
this module imports no pydantic (config.py): the CLI imports it before it knows the command.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import stat
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from .errors import StorageError
from .text import first_line

if TYPE_CHECKING:
    import pyarrow.fs as pafs

URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
CREDENTIALS = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)[^/@?\s]*@")
TRIES = 5  # a failed read or write is tried again after RETRY_S, then twice as long each time (1.5 s in all)
RETRY_S = 0.1
# What a read that finds nothing raises: no file, or a path under a file (a file given where a folder belongs).
ABSENT = (FileNotFoundError, NotADirectoryError)
Parsed = TypeVar("Parsed")
ALLOWED = (
    "a folder, or a URI pyarrow opens: s3://bucket/path, gs://bucket/path, abfs://..., hdfs://host/path, file:///path"
)


def redact(text: str) -> str:
    """`text` with every URI's user:secret@ removed (safe to print and log)."""
    return CREDENTIALS.sub(r"\1", text)


@dataclass(frozen=True)
class StoragePath:
    fs: pafs.FileSystem | None  # None for local disk: read with os, written through `filesystem`
    path: str  # inside fs: an absolute path on local disk, bucket/key... in an object store
    scheme: str = ""  # "" for local disk
    query: str = ""  # the URI's options (endpoint, region), kept for display

    @classmethod
    def of(cls, where: str | os.PathLike | StoragePath) -> StoragePath:
        """A folder path, a file:// URI or another pyarrow URI; StorageError naming what is allowed."""
        if isinstance(where, StoragePath):
            return where
        text = os.fspath(where)
        if not text.strip():  # Path("") is the current folder: --storage '' ran a sweep into it
            raise StorageError(f"storage {text!r} names no folder; pass {ALLOWED}")
        match = URI.match(text)
        if not match or match.group(1).lower() == "file":
            local = text[len(match.group(0)) :] if match else text
            return cls(None, str(Path(local).expanduser().resolve()))
        import pyarrow
        import pyarrow.fs as pafs

        try:
            fs, path = pafs.FileSystem.from_uri(text)
        except (pyarrow.ArrowException, OSError, ValueError) as error:
            reason = first_line(error)
            raise StorageError(f"storage {redact(text)}: {redact(reason)[:200]}; pass {ALLOWED}") from None
        path = path.rstrip("/")
        if not path:
            raise StorageError(f"storage {redact(text)}: no bucket or folder in the URI; pass {ALLOWED}")
        return cls(fs, path, match.group(1).lower(), text.partition("?")[2])

    @property
    def is_local(self) -> bool:
        return not self.scheme

    @property
    def filesystem(self) -> pafs.FileSystem:
        """pyarrow's filesystem of this path (for a local folder made when a write or delete needs it)."""
        import pyarrow.fs as pafs

        return self.fs or pafs.LocalFileSystem()

    def __str__(self) -> str:
        if self.is_local:
            return self.path
        return f"{self.scheme}://{self.path}" + (f"?{self.query}" if self.query else "")

    def __truediv__(self, name: str) -> StoragePath:
        return replace(self, path=posixpath.join(self.path, name))

    @property
    def name(self) -> str:
        return posixpath.basename(self.path)

    @property
    def parent(self) -> StoragePath:
        return replace(self, path=posixpath.dirname(self.path))

    @property
    def ray_filesystem(self) -> pafs.FileSystem | None:
        """Ray's `storage_filesystem`: None (Ray's own local handling) for a folder."""
        return None if self.is_local else self.fs

    def ray_storage(self) -> dict:
        """storage_path and storage_filesystem for ray.train.RunConfig and tune.RunConfig."""
        return {"storage_path": self.path, "storage_filesystem": self.ray_filesystem}

    def _local_stat(self) -> os.stat_result | None:
        """The local file's stat; None when there is none. Any other failure (a folder of another user, mode
        0700) raises StorageError: os.path.exists would take it for absent and a trial would silently vanish."""
        try:
            return os.stat(self.path)
        except ABSENT:
            return None
        except OSError as error:
            raise StorageError(f"cannot tell whether {self.path} exists: {error.strerror or error}") from error

    def exists(self) -> bool:
        if self.is_local:
            return self._local_stat() is not None
        import pyarrow.fs as pafs

        return self.fs.get_file_info(self.path).type != pafs.FileType.NotFound

    def is_dir(self) -> bool:
        if self.is_local:
            found = self._local_stat()
            return found is not None and stat.S_ISDIR(found.st_mode)
        import pyarrow.fs as pafs

        return self.fs.get_file_info(self.path).type == pafs.FileType.Directory

    def subfolders(self) -> list[str]:
        """Names of the folders directly inside (none when this folder does not exist)."""
        if self.is_local:
            return sorted(entry.name for entry in os.scandir(self.path) if entry.is_dir()) if self.is_dir() else []
        import pyarrow.fs as pafs

        infos = self.fs.get_file_info(pafs.FileSelector(self.path, allow_not_found=True))
        return sorted(posixpath.basename(info.path) for info in infos if info.type == pafs.FileType.Directory)

    def mkdir(self) -> None:
        self.filesystem.create_dir(self.path, recursive=True)

    def read_bytes(self) -> bytes:
        """The whole file; FileNotFoundError when there is none (pyarrow raises it for disks and S3 alike)."""
        if self.is_local:
            return Path(self.path).read_bytes()
        with self.fs.open_input_stream(self.path) as stream:
            return stream.read()

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def write_bytes(self, data: bytes) -> None:
        """All or nothing: a killed writer never leaves half a file. A write that fails (a storage timeout) is
        tried again, TRIES times in all, then StorageError names the file: a whole-file write can be repeated."""
        _retrying(lambda: self._write_once(data), f"cannot write {self}", (OSError,))

    def _write_once(self, data: bytes) -> None:
        if not self.is_local:
            with self.fs.open_output_stream(self.path) as stream:
                stream.write(data)
            return
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=posixpath.dirname(self.path), prefix=self.name, suffix=".tmp")
        try:
            os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp's 0600 would hide the file from the group
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)  # a failed write leaves no temp file behind
            raise

    def write_text(self, text: str) -> None:
        self.write_bytes(text.encode())

    def create_bytes(self, data: bytes) -> bool:
        """On local disk: the file, written whole, only where none is (os.link of a complete temp file fails when
        the target exists: atomic, unlike a look then a write); False when one is there. Object stores in pyarrow
        have no such conditional write: core/lease.py reads back instead."""
        if not self.is_local:
            raise NotImplementedError("create_bytes needs a local folder")
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=posixpath.dirname(self.path), prefix=self.name, suffix=".tmp")
        try:
            os.fchmod(fd, 0o666 & ~current_umask())
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            return False
        except OSError as error:  # a full disk: one line, as write_bytes says it
            raise StorageError(f"cannot write {self}: {error.strerror or error}") from error
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def delete_dir(self) -> None:
        """This folder and everything in it; nothing when it does not exist."""
        try:
            self.filesystem.delete_dir(self.path)
        except FileNotFoundError:
            pass

    def unlink(self) -> None:
        try:
            if self.is_local:
                os.unlink(self.path)  # without pyarrow: a refused command deletes its lease (core/lease.py)
            else:
                self.fs.delete_file(self.path)
        except FileNotFoundError:
            pass


def local_write_refusal(folder: str | os.PathLike) -> str | None:
    """Why files cannot be written into the local `folder` (made when missing), in a few words; None when they
    can. Tried, not asked (os.access): root passes every permission check, but not a read-only mount or a path
    through a file. The try creates and removes a file in the folder, or in its nearest existing parent, so that
    nothing is left behind when it is refused."""
    path = Path(folder).expanduser().absolute()
    existing = next(p for p in (path, *path.parents) if os.path.lexists(p))
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".cifar-ray-write-check-")
        os.close(fd)
        os.unlink(probe)
    except OSError as error:
        return f"no file can be made in {existing} ({error.strerror or error})"
    return None


def current_umask() -> int:
    """The process's umask, read without changing it (os.umask sets it: a race with other threads)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)  # no /proc (macOS): set and restore
    os.umask(mask)
    return mask


def read_retrying(path: StoragePath, parse: Callable[[bytes], Parsed], absent: Parsed) -> Parsed:
    """`parse` of the file's content; `absent` when there is no file. A file that cannot be read or parsed right
    now (a storage timeout, a file being replaced on a store without atomic writes) is read again, TRIES times in
    all, then StorageError names it and the reason. `parse` raises ValueError for content it refuses."""
    try:
        return _retrying(lambda: parse(path.read_bytes()), f"cannot read {path}", (OSError, ValueError))
    except ABSENT:
        return absent


def _retrying(action: Callable[[], Parsed], what: str, failures: tuple[type[Exception], ...]) -> Parsed:
    """`action()`, tried again after each of `failures` (ABSENT passes through: absent, not failed),
    TRIES times in all with a doubling pause; then StorageError: `what`, the tries and the reason."""
    attempt = 1
    while True:
        try:
            return action()
        except ABSENT:
            raise
        except failures as error:
            if attempt == TRIES:
                reason = (str(error).splitlines() or [""])[0].strip() or type(error).__name__
                raise StorageError(f"{what} ({TRIES} tries): {redact(reason)[:300]}") from error
            time.sleep(RETRY_S * 2 ** (attempt - 1))
            attempt += 1
