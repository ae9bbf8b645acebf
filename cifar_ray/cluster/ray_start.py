"""Ray's start, stopped cleanly: a Ctrl-C, a SIGTERM or a failure in the middle of `ray.init` leaves no Ray process
behind (cluster/session.init_ray starts Ray inside ray_starting)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

from ..core.text import first_line

# Whether this process cut a Ray start short: Ray's half-built core worker may then crash the interpreter's exit
# (SIGSEGV in its C++ teardown, seen with a SIGTERM as the first idle worker started), so cli.main skips that teardown.
cut_short = False


@contextlib.contextmanager
def ray_starting() -> Iterator[None]:
    """Around `ray.init`: a stop that cuts Ray's start short leaves no Ray process behind, and the command's own SIGTERM
    handler is in place again once Ray is up.

    Ray's start spawns the GCS, a monitor, a log monitor and the raylet, and the raylet its agents
    (`ray::DashboardAgent`, `ray::RuntimeEnvAgent`) and idle workers, before `ray.init` returns. A KeyboardInterrupt
    (Ctrl-C; SIGTERM as a command handles it) or the SystemExit of the SIGTERM handler Ray's init sets left them
    running: the node is not Ray's `_global_node` yet, so neither `ray.shutdown()` nor Ray's exit hook stops it, and
    the agents, which look for their raylet only once they are up, outlived it (over 40 s measured). Here the
    half-started node (found among the interrupted frames' locals) and every Ray process this process started since,
    each with all its descendants, are stopped, then `ray.shutdown()`. A KeyboardInterrupt then goes on as the
    command's stop; Ray's SIGTERM exit is handed to the SIGTERM handler that was in place before Ray's start (a
    command's turns it into the same stop), else it goes on. A start that fails (Ray's node timed out on a busy
    machine) is cleared the same way before its error goes on."""
    import ray._private.ray_constants as ray_constants

    main = threading.current_thread() is threading.main_thread()
    ours = signal.getsignal(signal.SIGTERM) if main else None
    before = _own_children()
    no_dump = ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER
    if callable(ours):
        # The driver's core worker, made inside ray.init, installs Abseil's failure-signal handler, SIGTERM among its
        # signals: a SIGTERM between then and init's end dumped "*** SIGTERM received ***" and aborted (exit -6,
        # measured at the first idle worker's start). Without it (in this process only; the driver's own C++ crashes
        # then go undumped) that SIGTERM too reaches Ray's Python handler, and so the command's.
        ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
    try:
        yield
    except (KeyboardInterrupt, Exception) as stop:  # a stop, or a start that failed (its node timed out)
        _stop_half_started(stop.__traceback__, before)
        raise
    except SystemExit as stop:
        if not _rays_sigterm_exit(stop):
            raise
        _stop_half_started(stop.__traceback__, before)
        if callable(ours):
            signal.signal(signal.SIGTERM, ours)
            ours(signal.SIGTERM, None)  # the command's: raises its stop (commands/common.py: _stop_as_ctrl_c)
        raise
    finally:
        ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = no_dump
        if main and ours is not None:
            signal.signal(signal.SIGTERM, ours)


def _rays_sigterm_exit(stop: SystemExit) -> bool:
    """Whether `stop` is the `sys.exit(SIGTERM)` of the SIGTERM handler `ray.init` sets: its innermost frame is a
    `sigterm_handler` of Ray's."""
    tb = stop.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None or stop.code != signal.SIGTERM:
        return False
    frame = tb.tb_frame
    return frame.f_code.co_name == "sigterm_handler" and str(frame.f_globals.get("__name__", "")).startswith("ray.")


def _own_children() -> set[tuple[int, float]]:
    """This process's children now, as (pid, start time): what Ray's start did not start."""
    import psutil

    found = set()
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            found.add((child.pid, child.create_time()))
    return found


def _stop_half_started(tb: Any, before: set[tuple[int, float]]) -> None:
    """Stop what an interrupted `ray.init` started (ray_starting): the processes of the node in the traceback's frames
    (or Ray's `_global_node`), and this process's children started since `before` that run Ray's programs (one whose
    start was interrupted is in no node's list yet), each with its descendants; then `ray.shutdown()`. Never raises:
    the stop it serves goes on."""
    global cut_short
    cut_short = True
    try:
        import psutil
        import ray
        import ray._private.node
        import ray._private.worker

        nodes = []
        while tb is not None:
            nodes += [v for v in tb.tb_frame.f_locals.values() if isinstance(v, ray._private.node.Node)]
            tb = tb.tb_next
        if ray._private.worker._global_node is not None:
            nodes.append(ray._private.worker._global_node)
        nodes = list({id(node): node for node in nodes}.values())
        roots = {info.process.pid for node in nodes for infos in node.all_processes.values() for info in infos}
        ray_dir = os.path.dirname(ray.__file__)
        for child in psutil.Process().children():
            with contextlib.suppress(psutil.Error):
                if (child.pid, child.create_time()) not in before and ray_dir in " ".join(child.cmdline()):
                    roots.add(child.pid)
        _kill_process_trees(roots)
        for node in nodes:  # its processes are gone: Ray reaps them and forgets them
            node.kill_all_processes(check_alive=False, allow_graceful=False)
        ray.shutdown()
    except Exception as error:
        # the stop goes on; what could not be stopped ends with this process (Ray's fate sharing)
        logging.getLogger(__name__).warning(f"stopping the Ray processes of an interrupted start: {first_line(error)}")


def _kill_process_trees(pids: set[int]) -> None:
    """SIGKILL the processes `pids` and all their descendants. Each is suspended first, until a look finds no process
    of the trees left running, so none starts a new one in between, and a child killed before its own children leaves
    no orphan to miss."""
    import psutil

    tree: dict[int, psutil.Process] = {}
    todo = [pid for pid in pids]
    while todo:
        for pid in todo:
            with contextlib.suppress(psutil.Error):
                proc = tree[pid] if pid in tree else psutil.Process(pid)
                proc.suspend()
                tree[pid] = proc
        todo = []
        for proc in list(tree.values()):
            with contextlib.suppress(psutil.Error):
                todo += [child.pid for child in proc.children() if child.pid not in tree]
    for proc in tree.values():
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(list(tree.values()), timeout=5)
