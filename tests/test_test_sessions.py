"""The suite's own guard (tests/conftest.py): each pytest-xdist worker (`-n 2`) is a test session of its own, so the
processes one worker leaves alive are found at its end, and never those of another worker still running."""

import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).parent

# A worker as pytest-xdist starts it: conftest's configure hook, then a child; on a line from stdin, what its
# end-of-session check finds.
WORKER = f"""
import json, os, subprocess, sys
sys.path.insert(0, {str(TESTS)!r})
import conftest
conftest.pytest_configure(None)
child = subprocess.Popen(["sleep", "60"])
print(json.dumps([os.getpid(), child.pid]), flush=True)
sys.stdin.readline()
print(json.dumps(sorted(p.pid for p in conftest.session_processes())), flush=True)
child.kill()
child.wait()
"""


def test_each_xdist_worker_finds_only_the_processes_it_started():
    env = os.environ | {"CIFAR_RAY_TEST_SESSION": "controller-1"}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER],
            env=env | {"PYTEST_XDIST_WORKER": name},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in ("gw0", "gw1")
    ]
    try:
        started = [json.loads(worker.stdout.readline()) for worker in workers]
        found = []
        for worker in workers:
            worker.stdin.write("\n")
            worker.stdin.flush()
            found.append(json.loads(worker.stdout.readline()))
        assert found == [[child] for _, child in started], (started, found)
    finally:
        for worker in workers:
            worker.stdin.close()
            if worker.wait(timeout=30) != 0:
                worker.kill()
