"""Every shell command of README.md and docs/ runs as written: each fenced `bash`/`sh` block as one script (every
command must succeed), each `console` block command by command (`$ COMMAND`, then the lines it must print, in
order; `...` matches anything), in a scratch folder holding `sweeps/`, `docs/` and the demo's committed logs, with
this checkout's `cifar-ray` on PATH. A block is marked by an HTML comment on the line before its fence:
`<!-- docs-test: slow -->` (it trains: the slow tier), `<!-- docs-test: long -->` (it trains for minutes: run with
CIFAR_RAY_LONG_TESTS=1) or `<!-- docs-test: skip (REASON) -->` (it needs what a test machine lacks: a cluster, a GPU,
S3, the network; or it runs the whole suite), and is then reported as skipped with that reason. Nothing a block starts
may outlive it (docs/cluster.md starts two Ray nodes in the background and stops them): each block runs with a marker
in its environment and a TMPDIR of its own, and whatever carries either is waited for, then stopped and reported."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from helpers import PROGRESS_S

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = ("bash", "sh", "console")
MARK = re.compile(r"^<!-- docs-test: (slow|long|skip \((?P<reason>[^)]+)\)) -->$")
SKIP_REASONS = ("cluster", "GPU", "S3", "network", "runs the whole suite")  # what may keep a command from running
FAST_TIMEOUT_S = 120  # a block that trains gets PROGRESS_S: each bounds a hang only
MARKER = "CIFAR_RAY_DOCS_BLOCK"  # in the environment of every process a block starts, inherited
LEFTOVER_GRACE_S = 60  # bounds the wait for a block's processes to end (Ray's drain after SIGTERM: up to 30 s)


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    mark: str  # "", "slow", "long" or "skip"
    reason: str = ""

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT).as_posix()}:{self.line}"


def fenced_blocks(page: Path) -> list[Block]:
    """Every fenced block of a page with its language and the mark on the line before it."""
    lines, found, index = page.read_text(encoding="utf-8").splitlines(), [], 0
    while index < len(lines):
        if match := re.match(r"^```(\w*)$", lines[index]):
            end = lines.index("```", index + 1)
            mark = MARK.match(lines[index - 1]) if index else None
            kind = "" if mark is None else mark.group(1).split()[0]
            reason = (mark.group("reason") or "") if mark else ""
            text = "\n".join(lines[index + 1 : end]) + "\n"
            found.append(Block(page, index + 1, match.group(1), text, kind, reason))
            index = end
        index += 1
    return found


BLOCKS = [block for page in PAGES for block in fenced_blocks(page)]
COMMAND_BLOCKS = [block for block in BLOCKS if block.lang in SHELL]


def scratch(tmp_path: Path) -> Path:
    """A folder as a fresh clone has it, for what the docs' commands read: the sweep files, the recipes and the
    demo's committed logs (a copy: a command may write beside them)."""
    (tmp_path / "sweeps").symlink_to(ROOT / "sweeps")
    (tmp_path / "docs").symlink_to(ROOT / "docs")
    shutil.copytree(ROOT / "reports" / "quickstart" / "logs", tmp_path / "reports" / "quickstart" / "logs")
    return tmp_path


def environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ) | (extra or {})
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(ROOT)
    return env


def shell(
    command: str, cwd: Path, timeout_s: int, strict: bool, extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Its output goes to a file, not a pipe: a process it left running in the background (holding the pipe) would
    keep the command from ending; stop_leftovers finds it."""
    flags = ["-euo", "pipefail"] if strict else []
    with tempfile.TemporaryFile("w+") as out:
        done = subprocess.run(
            ["bash", *flags, "-c", command],
            cwd=cwd,
            env=environment(extra),
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout_s,
        )
        out.seek(0)
        done.stdout = out.read()
    return done


def console_steps(text: str) -> list[tuple[str, list[str]]]:
    """A console block as (command, the lines it must print)."""
    steps: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps and line.strip():
            steps[-1][1].append(line)
        elif line.strip():
            raise ValueError(f"output before any command: {line!r}")
    return steps


def missing_lines(expected: list[str], printed: str) -> list[str]:
    """The expected lines not found, in order, among the printed ones (`...` in a line matches anything)."""
    printed_lines, at, missing = [line.rstrip() for line in printed.splitlines()], 0, []
    for line in expected:
        if line.strip() == "...":
            continue
        pattern = re.compile(".*".join(re.escape(part) for part in line.rstrip().split("...")))
        hit = next((i for i in range(at, len(printed_lines)) if pattern.fullmatch(printed_lines[i])), None)
        if hit is None:
            missing.append(line)
        else:
            at = hit + 1
    return missing


def run_block(block: Block, cwd: Path, timeout_s: int, extra: dict[str, str] | None = None) -> str | None:
    """Why the block does not run as written, or None. `extra`: environment variables for its commands."""
    if block.lang != "console":
        done = shell(block.text, cwd, timeout_s, strict=True, extra=extra)
        return None if done.returncode == 0 else f"exit status {done.returncode}:\n{done.stdout[-3000:]}"
    for command, expected in console_steps(block.text):
        printed = shell(command, cwd, timeout_s, strict=False, extra=extra).stdout
        printed = printed.replace(f"{cwd.resolve()}/", "").replace(str(cwd.resolve()), ".")
        if missing := missing_lines(expected, printed):
            return f"$ {command}\nprinted:\n{printed[-3000:]}\nnot printed: {missing}"
    return None


def params(mark: str) -> list:
    chosen = [block for block in COMMAND_BLOCKS if block.mark in (mark, "skip")]
    return [pytest.param(block, id=block.id) for block in chosen]


def written_outside_runs(cwd: Path, before: set[Path]) -> list[str]:
    """What a block wrote outside runs/ (which a clone ignores) and the run folders it was given: an example that
    wrote compared/ or reports/api-demo left untracked folders in the reader's checkout."""
    after = set(cwd.rglob("*"))  # not into the links to sweeps/ and docs/
    given = cwd / "reports" / "quickstart" / "logs"  # a run folder: an export may write into it
    return sorted(
        str(path.relative_to(cwd))
        for path in after - before
        if not path.is_relative_to(cwd / "runs") and not path.is_relative_to(given)
    )


def started_by(marker: str, folder: str) -> list[psutil.Process]:
    """The live processes a block started: `marker` in their environment, or `folder` (its TMPDIR) on their command
    line or among their open files (a Ray node's agents rename themselves over their environment, which then reads
    empty)."""
    spared, found = {os.getpid(), *(p.pid for p in psutil.Process().parents())}, []
    for proc in psutil.process_iter():
        try:
            if proc.pid in spared or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if (
                proc.environ().get(MARKER) == marker
                or any(folder in part for part in proc.cmdline())
                or any(f.path.startswith(folder + os.sep) for f in proc.open_files())
            ):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def stop_leftovers(marker: str, folder: str) -> list[str]:
    """What the block left running once LEFTOVER_GRACE_S have passed (waited for, not timed): each one's pid and
    command, after it is killed."""
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while (left := started_by(marker, folder)) and time.monotonic() < deadline:
        time.sleep(0.5)
    named = []
    for proc in left:
        try:
            named.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
            proc.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return named


def check(block: Block, tmp_path: Path, timeout_s: int) -> None:
    if block.mark == "skip":
        pytest.skip(f"{block.id} skipped: {block.reason}")
    cwd = scratch(tmp_path)
    before = set(cwd.rglob("*"))
    marker, folder = f"{os.getpid()}-{time.time_ns()}", tempfile.mkdtemp(prefix="cr-", dir="/tmp")  # short: Ray's
    try:  # socket paths under it fit 107 characters
        problem = run_block(block, cwd, timeout_s, {MARKER: marker, "TMPDIR": folder})
    finally:
        left = stop_leftovers(marker, folder)
        if not left:
            shutil.rmtree(folder, ignore_errors=True)
    assert problem is None, f"{block.id} does not run as written: {problem}"
    assert not left, f"{block.id} left processes running after it ended (now killed): {left}"
    stray = written_outside_runs(cwd, before)
    assert not stray, f"{block.id} writes outside runs/: {stray[:5]}"


@pytest.mark.parametrize("block", params(""))
def test_a_documented_command_runs_as_written(block, tmp_path):
    check(block, tmp_path, FAST_TIMEOUT_S)


@pytest.mark.slow
@pytest.mark.parametrize("block", [p for p in params("slow") if p.values[0].mark == "slow"])
def test_a_documented_command_that_trains_runs_as_written(block, tmp_path):
    check(block, tmp_path, PROGRESS_S)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("CIFAR_RAY_LONG_TESTS"), reason="trains for minutes; set CIFAR_RAY_LONG_TESTS=1")
@pytest.mark.parametrize("block", [p for p in params("long") if p.values[0].mark == "long"])
def test_a_documented_command_that_trains_for_minutes_runs_as_written(block, tmp_path):
    check(block, tmp_path, PROGRESS_S)


def test_every_skip_says_why_in_one_of_the_allowed_reasons():
    skipped = [block for block in COMMAND_BLOCKS if block.mark == "skip"]
    assert skipped and all(any(reason in block.reason for reason in SKIP_REASONS) for block in skipped)
    assert [block for block in COMMAND_BLOCKS if block.mark == "slow"]


def test_no_shell_session_hides_in_a_block_that_is_not_run():
    """A block whose lines start with `$ ` is a console session: marked otherwise, it would never be run."""
    hidden = [block.id for block in BLOCKS if block.lang not in SHELL and re.search(r"^\$ ", block.text, re.M)]
    assert not hidden, f"shell sessions in blocks that are not run (mark them console): {hidden}"


def test_a_broken_command_and_a_wrong_output_are_caught(tmp_path):
    scratch(tmp_path)
    page = ROOT / "docs" / "usage.md"
    misspelt = Block(page, 1, "bash", "cifar-ray sweep sweeps/quickstart.yaml --dry-run --estimat\n", "")
    assert "exit status 2" in run_block(misspelt, tmp_path, FAST_TIMEOUT_S)
    wrong = Block(page, 1, "console", "$ cifar-ray sweep sweeps/quickstart.yaml --res\ncifar-ray: error: --rez\n", "")
    assert "not printed" in run_block(wrong, tmp_path, FAST_TIMEOUT_S)
    right = Block(page, 1, "console", "$ cifar-ray sweep sweeps/quickstart.yaml --res\ncifar-ray: error: ...\n", "")
    assert run_block(right, tmp_path, FAST_TIMEOUT_S) is None


def test_a_block_writing_outside_runs_is_caught(tmp_path):
    cwd = scratch(tmp_path)
    before = set(cwd.rglob("*"))
    page = ROOT / "docs" / "usage.md"
    command = "cifar-ray report reports/quickstart/logs --out compared\n"
    command += "cifar-ray report reports/quickstart/logs --out runs/report\n"
    assert run_block(Block(page, 1, "bash", command, ""), cwd, FAST_TIMEOUT_S) is None
    assert written_outside_runs(cwd, before)[0] == "compared"
    assert all(path.startswith("compared") for path in written_outside_runs(cwd, before))


def test_an_unmarked_block_runs_and_a_mark_is_read(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- docs-test: skip (a GPU) -->\n```bash\nnvidia-smi\n```\n\n```console\n$ true\n```\n")
    first, second = fenced_blocks(page)
    assert (first.mark, first.reason, first.line) == ("skip", "a GPU", 2)
    assert (second.mark, second.lang, second.text) == ("", "console", "$ true\n")
