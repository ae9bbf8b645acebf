"""One live driver per run folder: the driver of a sweep (or of `cifar-ray train`) holds a lease on its run folder,

    RUN_DIR/driver.lease        {"host", "pid", "started_unix", "heartbeat_unix", "token"}, JSON

renewed by a background thread every INTERVAL_S seconds and deleted when the driver ends. A second driver on the
same folder reads it and is refused in one line naming the live driver (RunInUseError), before Ray starts. A lease
is stale, and taken over with a line saying so, when its heartbeat is older than STALE_INTERVALS x INTERVAL_S, or
when it names a process of this host that is gone (a driver killed with SIGKILL leaves its lease behind).

The lease is written through core/storage.py, so it works on a disk and at a URI. A new lease on a disk is created
with os.link, which fails when the file exists: of two drivers starting at once exactly one gets it. pyarrow's
object stores offer no conditional write (no If-None-Match), so there, and for every takeover of a stale lease,
the driver writes its record with a token of its own, waits SETTLE_S, reads the lease back and holds it only if
its token is there: of two drivers writing at once the later write wins and the earlier driver is refused.
The race left: a driver whose read of "no lease" and write of its own are SETTLE_S or more apart (a storage stall
that long) while another driver writes, settles and reads back in between: both then hold the lease. Each
heartbeat reads the lease first: a driver that finds another's token there has lost it and says so in one line.

Staleness is judged with the reader's clock against the holder's heartbeat: clocks of different hosts that
differ by more than STALE_INTERVALS x INTERVAL_S (30 s) make a live lease look stale, or a dead one live longer.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

from .errors import RunInUseError, StorageError
from .storage import StoragePath, read_retrying
from .text import rough_duration

LEASE_FILE = "driver.lease"
INTERVAL_S = 5.0  # between heartbeats
STALE_INTERVALS = 6  # heartbeats missed before a lease is stale: 30 s
SETTLE_S = 0.5  # between writing a lease without os.link and reading it back


@dataclass(frozen=True)
class LeaseRecord:
    """What driver.lease holds: who holds the run folder, since when, and when it last said it was alive."""

    host: str
    pid: int
    started_unix: float
    heartbeat_unix: float
    token: str

    @property
    def since(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started_unix))

    def describe(self, now: float) -> str:
        beat = max(now - self.heartbeat_unix, 0.0)
        return f"host {self.host}, pid {self.pid}, since {self.since}, last heartbeat {rough_duration(beat)} ago"


def _record(data: bytes) -> LeaseRecord:
    value = json.loads(data)
    try:
        return LeaseRecord(
            str(value["host"]),
            int(value["pid"]),
            float(value["started_unix"]),
            float(value["heartbeat_unix"]),
            str(value["token"]),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"not a driver lease ({error})") from None


def read_lease(run_dir: StoragePath) -> LeaseRecord | None:
    """The run folder's lease; None when it has none; StorageError when it cannot be read or parsed."""
    return read_retrying(run_dir / LEASE_FILE, _record, None)


def pid_alive(pid: int) -> bool:
    """Whether a process of this host runs with the id `pid` (one of another user counts; a zombie, killed but not
    yet waited for by its parent, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"  # the state follows the command's name
    except (OSError, IndexError):
        return True  # no /proc (macOS): os.kill's answer


def this_host() -> str:
    return socket.gethostname()


def stale_reason(
    record: LeaseRecord, now: float, host: str | None = None, alive: Callable[[int], bool] = pid_alive
) -> str | None:
    """Why the lease no longer holds (its driver is gone), in words; None while it holds."""
    late = now - record.heartbeat_unix
    if late > STALE_INTERVALS * INTERVAL_S:
        return f"no heartbeat for {rough_duration(late)}"
    if record.host == (host or this_host()) and not alive(record.pid):
        return f"process {record.pid} of {record.host} is gone"
    return None


def driver_gone(run_dir: StoragePath, now: float) -> str | None:
    """Why the run has no live driver (`cifar-ray status`): no lease, or a stale one; None while one holds it."""
    record = read_lease(run_dir)
    if record is None:
        return f"no driver holds {LEASE_FILE}"
    reason = stale_reason(record, now)
    return None if reason is None else f"its driver ({record.host}, pid {record.pid}) is gone: {reason}"


def live_driver_refusal(run_dir: StoragePath) -> str | None:
    """The one-line refusal of a second driver while a live one holds the run folder; None when none does."""
    now = time.time()
    record = read_lease(run_dir)
    if record is None or stale_reason(record, now) is not None:
        return None
    return _refusal(run_dir, record, now)


def _refusal(run_dir: StoragePath, record: LeaseRecord, now: float) -> str:
    return (
        f"{run_dir} is in use by a live driver ({record.describe(now)}): a second one would train the same trials; "
        f"wait for it to end (`cifar-ray status {shlex.quote(str(run_dir))}` shows where it stands), stop it, or pass "
        "--name NEW"
    )


class DriverLease:
    """This driver's lease on `run_dir`. `clock`, `host`, `pid`, `alive` and `sleep` are the real ones unless a
    test gives its own."""

    def __init__(
        self,
        run_dir: StoragePath,
        clock: Callable[[], float] = time.time,
        host: str | None = None,
        pid: int | None = None,
        alive: Callable[[int], bool] = pid_alive,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.run_dir, self.file = run_dir, run_dir / LEASE_FILE
        self.clock, self.alive, self.sleep = clock, alive, sleep
        self.host, self.pid = host or this_host(), os.getpid() if pid is None else pid
        self.token = uuid.uuid4().hex
        self.started = clock()
        self.beaten, self.outage_said = self.started, False  # the last heartbeat written; its outage said
        self.lost: LeaseRecord | None = None  # another driver's lease found where ours was
        self.made: list[str] = []  # the folders the lease's file made, deepest first (local disk)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _ours(self, heartbeat: float) -> bytes:
        record = LeaseRecord(self.host, self.pid, self.started, heartbeat, self.token)
        return json.dumps(asdict(record)).encode()

    def acquire(self, print_line: Callable[[str], None] = print) -> None:
        """Hold the lease, taking over a stale one (and saying so in one line); RunInUseError naming the live
        driver otherwise."""
        now = self.clock()
        if self.run_dir.is_local:
            self.made = _missing_folders(self.run_dir.path)
        if self.run_dir.is_local and self.file.create_bytes(self._ours(now)):
            return  # created whole where no lease was: nobody else can have it
        record = read_lease(self.run_dir)
        if record is not None:
            reason = stale_reason(record, now, self.host, self.alive)
            if reason is None:
                raise RunInUseError(_refusal(self.run_dir, record, now))
            print_line(
                f"{self.run_dir}: taking over from a driver that is gone (host {record.host}, pid {record.pid}, "
                f"since {record.since}: {reason})"
            )
        self.file.write_bytes(self._ours(now))
        self.sleep(SETTLE_S)  # another driver writing at the same time: the later write wins
        held = read_lease(self.run_dir)
        if held is None or held.token != self.token:
            if held is None:
                raise RunInUseError(f"{self.run_dir}: the driver lease vanished while this driver took it; try again")
            raise RunInUseError(_refusal(self.run_dir, held, self.clock()))

    def renew(self) -> bool:
        """One heartbeat; False (and `lost` set) when another driver's lease is there instead."""
        held = read_lease(self.run_dir)
        if held is not None and held.token != self.token:
            self.lost = held
            return False
        now = self.clock()
        self.file.write_bytes(self._ours(now))
        self.beaten, self.outage_said = now, False
        return True

    def heartbeat(self, print_line: Callable[[str], None]) -> bool:
        """One beat of the heartbeat thread; False once the lease is lost to another driver (said in one line). A
        beat that cannot write (a storage outage, a full disk) is tried again at the next one, and said once, only
        when the lease has gone long enough without one to be taken over: a driver that stops sooner on the same
        fault (cannot write sweep.json) prints only its own one line."""
        try:
            if not self.renew():
                print_line(
                    f"{self.run_dir}: this driver lost its lease to another ({self.lost.describe(self.clock())}); "
                    "two drivers may now train the same trials: stop one"
                )
                return False
        except StorageError as error:
            late = self.clock() - self.beaten
            if late >= STALE_INTERVALS * INTERVAL_S and not self.outage_said:
                self.outage_said = True
                print_line(
                    f"{self.run_dir}: no heartbeat of this driver's lease for {rough_duration(late)} ({error}); "
                    "another driver may now take the run over"
                )
        return True

    def _beat(self, print_line: Callable[[str], None]) -> None:
        while not self._stop.wait(INTERVAL_S) and self.heartbeat(print_line):
            pass

    def start_heartbeat(self, print_line: Callable[[str], None] = print) -> None:
        self._thread = threading.Thread(target=self._beat, args=(print_line,), name="cifar-ray-lease", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stop the heartbeat and delete the lease if it is still ours (and the folder it made, left empty)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with contextlib.suppress(StorageError):
            held = read_lease(self.run_dir)
            if held is not None and held.token == self.token:
                self.file.unlink()
        for folder in self.made:  # those left empty: a refused or failed start leaves nothing behind
            try:
                os.rmdir(folder)
            except OSError:
                break


def _missing_folders(path: str) -> list[str]:
    """`path` and its parents that do not exist, deepest first."""
    missing = []
    while not os.path.exists(path) and os.path.dirname(path) != path:
        missing.append(path)
        path = os.path.dirname(path)
    return missing


_held: dict[str, list] = {}  # run folder -> [its DriverLease, how many `hold`s of this process are inside]
_held_lock = threading.Lock()


@contextlib.contextmanager
def hold(run_dir: StoragePath, print_line: Callable[[str], None] = print) -> Iterator[DriverLease]:
    """The lease on `run_dir` while inside, heartbeat renewed; re-entrant in one process (api.execute_plan takes it
    before Ray starts, orchestrate.run_plan inside it again, for callers that start there)."""
    key = str(run_dir)
    with _held_lock:
        entry = _held.get(key)
        if entry is not None:
            entry[1] += 1
    if entry is None:
        lease = DriverLease(run_dir)
        lease.acquire(print_line)
        lease.start_heartbeat(print_line)
        entry = _held[key] = [lease, 1]
    try:
        yield entry[0]
    finally:
        with _held_lock:
            entry[1] -= 1
            last = entry[1] == 0
            if last:
                del _held[key]
        if last:
            entry[0].release()
