"""Provenance: what a sweep session ran with, beyond sweep.json's revision and versions. The driver writes one record
per session (the first and each --resume) as the session starts (while its slots start), into the run folder:

    provenance/session-N.json   the git checkout (commit, changed and untracked files), the installed packages with
                                versions (importlib.metadata), and the driver machine's GPU stack (CUDA, cuDNN,
                                NCCL, the NVIDIA driver, the GPU models; "why" where it has none)
    provenance/session-N.diff   `git diff HEAD --binary` of that checkout: `git apply` restores the tracked changes;
                                untracked files are named in the JSON, their contents are not kept

One record per session, never rewritten: a --resume may run other code than the session before it, and each
session's record says what that session ran. N is the session's place in sweep.json's `sessions`.
URI credentials (user:secret@) are removed from the diff and the file names (storage.redact) before they are
written. Everything here is pure or takes what it reads as an argument (git's runner, the distributions, torch),
so tests inject them; cluster/session.py gathers the real ones.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from . import runlog
from .errors import RunFolderError
from .storage import StoragePath, redact
from .text import counted

PROVENANCE_DIR = "provenance"
GIT_TIMEOUT_S = 30
Runner = Callable[..., subprocess.CompletedProcess]
# git's output as text that keeps every byte: a diff of a file in another encoding is written back byte for byte.
GIT_TEXT = {"encoding": "utf-8", "errors": "surrogateescape"}


def session_file(session: int, suffix: str) -> str:
    """The path, inside the run folder, of session `session`'s record (suffix "json") or diff ("diff")."""
    return f"{PROVENANCE_DIR}/session-{session}.{suffix}"


class GitFailed(Exception):
    """A git command failed; its message is the reason in one line."""


def _git(args: list[str], cwd: Path | str, run: Runner) -> str:
    try:
        done = run(["git", *args], cwd=cwd, capture_output=True, timeout=GIT_TIMEOUT_S, **GIT_TEXT)
    except FileNotFoundError:
        raise GitFailed("git is not installed") from None
    except (OSError, subprocess.SubprocessError) as error:
        raise GitFailed(f"git {args[0]}: {error}") from None
    if done.returncode != 0:
        first = next((line for line in done.stderr.splitlines() if line.strip()), f"exit status {done.returncode}")
        raise GitFailed(f"git {' '.join(args)}: {first.strip()[:200]}")
    return done.stdout


def tracked_refusal(folder: Path | str, run: Runner = subprocess.run) -> str | None:
    """Why a command's default output may not go into `folder`: git tracks files in it, which the output would
    replace (a committed report), in one line naming --out and --force; None when git tracks none there (no such
    folder, no checkout, no git)."""
    if not Path(folder).is_dir():
        return None
    try:
        tracked = [name for name in _git(["ls-files", "-z", "--", "."], folder, run).split("\0") if name]
    except GitFailed:
        return None
    if not tracked:
        return None
    example = tracked[0] + (", ..." if len(tracked) > 1 else "")
    return (
        f"the default output folder {folder} holds {counted(len(tracked), 'file')} tracked by git ({example}), "
        "which this would replace; pass --out FOLDER to write elsewhere, or --force to replace them"
    )


def git_state(checkout: Path | str, run: Runner = subprocess.run) -> tuple[dict, str]:
    """The checkout holding `checkout` (a folder): ({"root", "commit", "changed", "untracked"}, its diff against
    HEAD); ({"why": ...}, "") when it is not a git checkout or git cannot say (the reason, never an empty diff
    that looks like a clean checkout)."""
    try:
        root = _git(["rev-parse", "--show-toplevel"], checkout, run).strip()
    except GitFailed as error:
        why = str(error)
        return {"why": "not a git checkout" if "not a git repository" in why else why}, ""
    try:
        commit = _git(["rev-parse", "--verify", "HEAD"], root, run).strip()
        diff = _git(["diff", "HEAD", "--binary"], root, run)
        changed = _git(["diff", "HEAD", "--name-only", "-z"], root, run).split("\0")
        untracked = _git(["ls-files", "--others", "--exclude-standard", "-z"], root, run).split("\0")
    except GitFailed as error:
        return {"root": root, "why": str(error)}, ""
    state = {
        "root": root,
        "commit": commit,
        "changed": [redact(name) for name in changed if name],
        "untracked": [redact(name) for name in untracked if name],
    }
    return state, redact(diff)


def installed_packages(distributions: Callable[[], Iterable[Any]] = importlib.metadata.distributions) -> dict:
    """{name: version} of every installed distribution, sorted by name; the first of a name on sys.path wins, as
    for an import."""
    found: dict[str, str] = {}
    for dist in distributions():
        name = dist.metadata["Name"]
        if name and name.lower() not in {n.lower() for n in found}:
            found[name] = dist.version
    return dict(sorted(found.items(), key=lambda item: item[0].lower()))


_read: list = [None, {}]  # [the state of sys.path's folders, installed_packages() as read then]


def installed_packages_now() -> dict:
    """installed_packages(), read again only when a folder on sys.path changed since this process last read it
    (installing, upgrading or removing a distribution adds or removes its .dist-info folder there): each sweep
    of a session (a notebook, a warm pool) records them, and a read opens every distribution's metadata file."""
    state = []
    for folder in sys.path:
        try:
            state.append((folder, os.stat(folder or ".").st_mtime_ns))
        except OSError:
            state.append((folder, None))
    if _read[0] != state:
        _read[:] = [state, installed_packages()]
    return dict(_read[1])


def nvidia_smi(run: Runner = subprocess.run) -> dict:
    """{"gpus": [model per GPU], "driver": version} from nvidia-smi, or {"nvidia_smi": why not}. Asked of
    nvidia-smi, not torch: torch's device queries would open a CUDA context in the driver, on a GPU trials use."""
    try:
        done = run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError) as error:
        return {"nvidia_smi": str(error)}
    rows = [line.rsplit(",", 1) for line in done.stdout.splitlines() if "," in line]
    if done.returncode != 0 or not rows:
        return {"nvidia_smi": f"exit status {done.returncode}, no GPU listed"}
    return {"gpus": [name.strip() for name, _ in rows], "driver": rows[0][1].strip()}


def gpu_stack(
    visible_gpus: int,
    load_torch: Callable[[], Any] = lambda: importlib.import_module("torch"),
    smi: Callable[[], dict] = nvidia_smi,
) -> dict:
    """The CUDA stack the driver process sees: CUDA, cuDNN and NCCL versions from torch (`load_torch` gives the
    module, or a stand-in with the same attributes) and the GPU models and NVIDIA driver from `smi`; {"gpus": [],
    "why": ...} without a GPU. `visible_gpus`: the GPUs the driver's node shows (NVML); with none, torch is not
    imported (~2 s of CPU beside a sweep's start)."""
    if not visible_gpus or not (torch := load_torch()).cuda.is_available():
        return {"gpus": [], "why": "no CUDA GPU visible to the sweep's driver process"}
    try:
        nccl = torch.cuda.nccl.version()
        nccl = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    except (AttributeError, RuntimeError) as error:  # a torch built without NCCL
        nccl = f"none ({error})"
    return {"cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(), "nccl": nccl, **smi()}


def write_session(run_dir: StoragePath, session: int, git: dict, diff: str, packages: dict, gpu: dict) -> None:
    """Session `session`'s record and diff into `run_dir`; a record already there is refused, never replaced."""
    record_path = run_dir / session_file(session, "json")
    if record_path.exists():
        raise RunFolderError(
            f"{record_path} exists: session {session} of this run already has its provenance, which is never "
            "replaced; sweep.json's sessions do not match the provenance folder (edited by hand?)"
        )
    if "commit" in git:
        data = diff.encode(**GIT_TEXT)
        git = git | {"diff": session_file(session, "diff"), "diff_sha256": hashlib.sha256(data).hexdigest()}
        (run_dir / session_file(session, "diff")).write_bytes(data)
    runlog.write_json(record_path, {"session": session, "git": git, "packages": packages, "gpu": gpu})


def read_sessions(run_dir: runlog.Where, sweep: dict) -> list[dict]:
    """Every session's record in session order ({} for a session without one: a run from before provenance, or a
    driver killed before it wrote it)."""
    run_dir = StoragePath.of(run_dir)
    sessions = len(sweep.get("sessions") or []) or 1
    return [runlog.read_json(run_dir / session_file(n, "json")) for n in range(1, sessions + 1)]


def _changes_text(record: dict, session: int) -> str:
    git = record.get("git")
    if git is None:
        return f"not recorded (no {session_file(session, 'json')})"
    if "why" in git:
        return f"unknown ({git['why']})"
    changed, untracked = len(git["changed"]), len(git["untracked"])
    n = changed + untracked
    files = f"{n} file{'s' * (n != 1)}"
    if not n:
        return files
    return f"{files} ({changed} changed, {untracked} untracked; diff in {git['diff']})"


def _same_code(records: list[dict]) -> bool:
    def code(record: dict) -> tuple:
        git = record.get("git") or {}
        return git.get("commit"), git.get("diff_sha256"), tuple(git.get("untracked") or ()), git.get("why")

    return len({code(record) for record in records}) == 1


def header_facts(run_dir: runlog.Where, sweep: dict) -> dict:
    """The report header's provenance: "uncommitted" ("uncommitted changes: N files (...)", per session when the
    sessions ran different code) and "revision" (the first session's commit and diff, what `Re-run with` needs); None
    where it is unknown, both None for a run from before provenance (no record at all)."""
    records = read_sessions(run_dir, sweep)
    if not any(records):
        return {"uncommitted": None, "revision": None}
    if _same_code(records):
        uncommitted = _changes_text(records[0], 1)
    else:
        uncommitted = "; ".join(f"session {n}: {_changes_text(r, n)}" for n, r in enumerate(records, 1))
    git = records[0].get("git") or {}
    revision = None
    if "commit" in git:
        untracked = len(git["untracked"])
        revision = f"commit {git['commit'][:10]}" + (f" with {git['diff']} applied" if git["changed"] else "")
        revision += f" (and {untracked} untracked file{'s' * (untracked != 1)}, not kept)" if untracked else ""
    return {"uncommitted": f"uncommitted changes: {uncommitted}", "revision": revision}
