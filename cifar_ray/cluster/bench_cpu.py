"""`cifar-ray bench`'s CPU seconds per kind of process: what a process of a sweep is, by its title, and a sampler of
this process and its descendants while a block runs.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from pathlib import Path


def process_kind(process, words: list[str] | None = None) -> str:
    """What a process of this sweep is, by its title (`words`: its command line as already read, else read here):
    Ray names its workers `ray::Actor.method` or `ray::task` (`ray::RayTrainWorker`, `ray::TrainController`, the thin
    trials' `ray::ImplicitFunc`), its daemons by their executables (raylet, gcs_server); an idle pooled worker is
    `ray::IDLE`. A named actor's name (the run's Dispatcher's) is dropped: the kind is its class."""
    if words is None:
        try:
            words = process.cmdline()
        except Exception:  # it ended between the listing and the read
            return "gone"
    first = words[0] if words else process.name()
    if first.startswith("ray::"):  # an actor's title: ray::[name:]Class.method; a task's: ray::function
        return "ray::" + first[5:].split(" ")[0].split(".")[0].split(":")[-1].lstrip("_")
    for word in words[:3]:  # python .../default_worker.py before it sets its title; a daemon's executable path
        name = Path(word).name
        if name in ("raylet", "gcs_server", "default_worker.py", "log_monitor.py"):
            return name
        for script, kind in RAY_SCRIPTS.items():
            if word.endswith(script):
                return kind
    return "driver" if process.pid == os.getpid() else Path(first).name


# Ray's Python daemons by their script (a head node's; ray.init starts them): the agents by the titles they set later
RAY_SCRIPTS = {
    "ray/dashboard/dashboard.py": "dashboard.py",  # the API server: started (minimal) even with include_dashboard=False
    "ray/autoscaler/_private/monitor.py": "monitor.py",  # the autoscaler's monitor
    "ray/dashboard/agent.py": "ray::DashboardAgent",
    "ray/_private/runtime_env/agent/main.py": "ray::RuntimeEnvAgent",
}


class ProcessCpu:
    """CPU seconds spent by this process and all its descendants (an embedded Ray's daemons and workers) while a
    `with` block runs, per kind of process (process_kind), from samples every `interval_s`, and when each kind
    was first seen. CPU time, unlike wall time, is not stretched by other programs on a loaded machine. A process
    is charged to the first kind it had other than `ray::IDLE` and `default_worker.py` (a pooled worker that
    becomes a trial's actor) and other than its parent's while it still shows its parent's command line (forked, not
    yet running its own program: the raylet's new workers); a process in `named` is its name from its first sample.
    What a process spends after the last sample before it ends is not seen."""

    FORKED = "forked"  # charged to its parent's kind if it never runs a program of its own
    IDLE = ("ray::IDLE", "default_worker.py", "bash", "sh", "gone", FORKED)  # a worker before its first task or actor

    def __init__(self, interval_s: float = 0.1, named: dict[int, str] | None = None):
        self.interval_s = interval_s
        self.named = named or {}  # pid -> its kind, for a process its title does not name (a command run here)
        self.start: dict[int, float] = {}  # pid -> its CPU seconds when the block began (0 for newer processes)
        self.last: dict[int, float] = {}
        self.kind: dict[int, str] = {}
        self.first_seen: dict[str, float] = {}  # kind -> time.time() it was first seen
        self.parent_kind: dict[int, str] = {}  # pid -> its parent's kind, for a process first seen forked
        self._stop = threading.Event()

    def _sample(self, initial: bool = False) -> None:
        import psutil

        me = psutil.Process()
        for process in [me, *me.children(recursive=True)]:
            try:
                times = process.cpu_times()
            except psutil.Error:
                continue
            used = times.user + times.system
            self.start.setdefault(process.pid, used if initial else 0.0)
            self.last[process.pid] = used
            if self.kind.get(process.pid, "ray::IDLE") in self.IDLE:
                try:
                    kind = self._kind_now(process)
                except psutil.Error:
                    continue
                if kind not in self.IDLE or process.pid not in self.kind:
                    self.kind[process.pid] = kind
                    if kind != self.FORKED:
                        self.first_seen.setdefault(kind, time.time())

    def _kind_now(self, process) -> str:
        """Its kind now: a named process's name, whatever it runs (a command started here is that command from its
        first sample, even while it still shows the command line of the process that forked it); else from one read
        of its command line, which both names it and tells a forked copy (a process that starts its own program
        between two reads was taken for its parent's program, for good)."""
        if process.pid in self.named:
            return self.named[process.pid]
        words = process.cmdline()
        if not words:  # ended (a zombie): it keeps the kind it had
            return "gone"
        kind = process_kind(process, words)
        parent = process.parent()
        if kind not in self.IDLE and parent is not None and parent.cmdline() == words:
            self.parent_kind.setdefault(process.pid, self.named.get(parent.pid) or process_kind(parent))
            return self.FORKED
        return kind

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> ProcessCpu:
        self._sample(initial=True)
        self.first_seen.clear()  # kinds present before the block did not start in it
        self._thread = threading.Thread(target=self._run, name="cifar-ray-bench-cpu", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def seconds(self) -> dict[str, float]:
        """CPU seconds per kind spent in the block, largest first."""
        totals: dict[str, float] = collections.Counter()
        for pid, used in self.last.items():
            kind = self.kind.get(pid, "gone")
            totals[self.parent_kind[pid] if kind == self.FORKED else kind] += used - self.start[pid]
        return dict(sorted(((k, v) for k, v in totals.items() if v > 0.005), key=lambda kv: -kv[1]))
