"""Provenance (core/provenance.py) on real git checkouts and injected packages and GPUs; the report header's line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import make_run, report_text

from cifar_ray.core import provenance
from cifar_ray.core.errors import RunFolderError
from cifar_ray.core.storage import StoragePath
from cifar_ray.report import build_report

SECRET_URI = "s3://alice:hunter2@bucket/runs"


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A checkout with one commit, then a changed file (holding a URI with credentials), a changed file in another
    encoding, and an untracked file in a subfolder."""
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "train.py").write_text("lr = 0.1\n")
    (repo / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    (repo / "train.py").write_text(f"lr = 0.2\nstorage = '{SECRET_URI}'\n")
    (repo / "latin1.txt").write_bytes("caf\xe9 cr\xe8me\n".encode("latin-1"))
    (repo / "pkg" / "new.py").write_text("x = 1\n")
    return repo


def test_git_state_names_the_commit_the_changes_and_the_untracked_files_from_any_subfolder(checkout):
    state, diff = provenance.git_state(checkout / "pkg")
    assert state == {
        "root": str(checkout),
        "commit": git(checkout, "rev-parse", "HEAD").strip(),
        "changed": ["latin1.txt", "train.py"],
        "untracked": ["pkg/new.py"],
    }
    assert "lr = 0.2" in diff and "hunter2" not in diff and "s3://bucket/runs" in diff


def test_the_written_diff_restores_the_changes_byte_for_byte_on_a_clean_clone(checkout, tmp_path):
    state, diff = provenance.git_state(checkout)
    run_dir = StoragePath.of(tmp_path / "run")
    provenance.write_session(run_dir, 1, state, diff, {}, {})
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(checkout), str(clone)], check=True)
    git(clone, "apply", str(tmp_path / "run" / provenance.session_file(1, "diff")))
    assert (clone / "latin1.txt").read_bytes() == (checkout / "latin1.txt").read_bytes()
    assert (clone / "train.py").read_text() == "lr = 0.2\nstorage = 's3://bucket/runs'\n"  # redacted, as written


def test_outside_a_checkout_or_without_git_the_record_says_why_and_holds_no_diff(tmp_path):
    assert provenance.git_state(tmp_path) == ({"why": "not a git checkout"}, "")

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    assert provenance.git_state(tmp_path, run=no_git) == ({"why": "git is not installed"}, "")


def test_a_checkout_without_a_commit_records_the_failing_command(tmp_path):
    git(tmp_path, "init", "-q")
    state, diff = provenance.git_state(tmp_path)
    assert state["root"] == str(tmp_path) and state["why"].startswith("git rev-parse --verify HEAD: ") and diff == ""


def test_installed_packages_are_sorted_and_the_first_of_a_name_wins():
    def dist(name: str, version: str):
        return SimpleNamespace(metadata={"Name": name}, version=version)

    found = provenance.installed_packages(lambda: [dist("torch", "2.14.1"), dist("Ray", "2.60.0"), dist("ray", "1.0")])
    assert found == {"Ray": "2.60.0", "torch": "2.14.1"}
    real = provenance.installed_packages()
    assert real["pytest"] == pytest.__version__


def test_installed_packages_are_read_again_only_when_a_folder_on_the_path_changed(tmp_path, monkeypatch):
    reads = []

    def counted_read():
        reads.append(1)
        return {"pkg": str(len(reads))}

    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.setattr(sys, "path", [str(site), *sys.path])
    monkeypatch.setattr(provenance, "installed_packages", counted_read)
    first, again = provenance.installed_packages_now(), provenance.installed_packages_now()
    assert first == again == {"pkg": "1"} and len(reads) == 1
    (site / "new-1.0.dist-info").mkdir()  # pip install adds its .dist-info folder
    os.utime(site, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))  # a coarse clock may not tick in between
    assert provenance.installed_packages_now() == {"pkg": "2"} and len(reads) == 2


def fake_torch(gpus: int, nccl=(2, 27, 3)) -> SimpleNamespace:
    """torch as the provenance reads it, on a machine with `gpus` GPUs; no device query that opens a CUDA context."""

    def nccl_version():
        if isinstance(nccl, Exception):
            raise nccl
        return nccl

    cuda = SimpleNamespace(is_available=lambda: gpus > 0, nccl=SimpleNamespace(version=nccl_version))
    cudnn = SimpleNamespace(version=lambda: 91002)
    return SimpleNamespace(cuda=cuda, version=SimpleNamespace(cuda="12.8"), backends=SimpleNamespace(cudnn=cudnn))


def smi(stdout: str, returncode: int = 0):
    return lambda *a, **k: subprocess.CompletedProcess(a, returncode, stdout=stdout, stderr="")


H100S = "NVIDIA H100 80GB HBM3, 570.86.15\nNVIDIA H100 80GB HBM3, 570.86.15\n"


def test_gpu_stack_on_a_gpu_machine_and_on_a_cpu_one():
    stack = provenance.gpu_stack(2, lambda: fake_torch(2), smi=lambda: provenance.nvidia_smi(smi(H100S)))
    assert stack == {
        "cuda": "12.8",
        "cudnn": 91002,
        "nccl": "2.27.3",
        "gpus": ["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"],
        "driver": "570.86.15",
    }
    no_nccl = provenance.gpu_stack(1, lambda: fake_torch(1, nccl=RuntimeError("no NCCL")), smi=dict)
    assert no_nccl["nccl"] == "none (no NCCL)"
    no_gpu = {"gpus": [], "why": "no CUDA GPU visible to the sweep's driver process"}
    assert provenance.gpu_stack(1, lambda: fake_torch(0)) == no_gpu  # NVML sees one; CUDA does not work


def test_gpu_stack_does_not_import_torch_where_no_gpu_is_seen():
    def no_torch():
        raise AssertionError("torch imported on a node with no GPU")

    assert provenance.gpu_stack(0, no_torch, smi=no_torch) == {
        "gpus": [],
        "why": "no CUDA GPU visible to the sweep's driver process",
    }


def test_nvidia_smi_failures_are_recorded_as_such():
    assert provenance.nvidia_smi(smi("", 9)) == {"nvidia_smi": "exit status 9, no GPU listed"}

    def missing(*a, **k):
        raise FileNotFoundError(2, "No such file or directory", "nvidia-smi")

    assert provenance.nvidia_smi(missing)["nvidia_smi"].startswith("[Errno 2] No such file")


def record(tmp_path: Path, checkout: Path, session: int) -> dict:
    state, diff = provenance.git_state(checkout)
    provenance.write_session(StoragePath.of(tmp_path), session, state, diff, {"ray": "2.60.0"}, {"gpus": []})
    return json.loads((tmp_path / provenance.session_file(session, "json")).read_text())


def test_a_session_record_is_never_replaced(tmp_path, checkout):
    first = record(tmp_path, checkout, 1)
    (checkout / "train.py").write_text("lr = 0.3\n")
    with pytest.raises(RunFolderError, match="session 1 of this run already has its provenance"):
        record(tmp_path, checkout, 1)
    assert json.loads((tmp_path / provenance.session_file(1, "json")).read_text()) == first
    assert b"lr = 0.2" in (tmp_path / provenance.session_file(1, "diff")).read_bytes()
    assert record(tmp_path, checkout, 2)["git"]["diff_sha256"] != first["git"]["diff_sha256"]


def test_header_facts_count_the_files_and_name_the_diff_and_tell_sessions_apart(tmp_path, checkout):
    sweep = {"sessions": [{"start_unix": 1}, {"start_unix": 2}]}
    record(tmp_path, checkout, 1)
    record(tmp_path, checkout, 2)
    facts = provenance.header_facts(tmp_path, sweep)
    commit = git(checkout, "rev-parse", "HEAD")[:10]
    assert facts == {
        "uncommitted": "uncommitted changes: 3 files (2 changed, 1 untracked; diff in provenance/session-1.diff)",
        "revision": f"commit {commit} with provenance/session-1.diff applied (and 1 untracked file, not kept)",
    }
    (checkout / "pkg" / "new.py").unlink()
    record(tmp_path, checkout, 3)
    sweep["sessions"].append({"start_unix": 3})
    assert provenance.header_facts(tmp_path, sweep)["uncommitted"] == (
        "uncommitted changes: session 1: 3 files (2 changed, 1 untracked; diff in provenance/session-1.diff); "
        "session 2: 3 files (2 changed, 1 untracked; diff in provenance/session-2.diff); "
        "session 3: 2 files (2 changed, 0 untracked; diff in provenance/session-3.diff)"
    )
    assert provenance.header_facts(tmp_path / "old", {}) == {"uncommitted": None, "revision": None}
    (tmp_path / provenance.session_file(1, "json")).unlink()  # a session whose driver died before writing it
    assert provenance.header_facts(tmp_path, sweep)["uncommitted"].startswith(
        "uncommitted changes: session 1: not recorded (no provenance/session-1.json); session 2: 3 files"
    )


def test_the_report_header_says_the_uncommitted_changes_and_the_revision_to_re_run_on(tmp_path, checkout):
    run_dir = tmp_path / "runs" / "bs-workers"
    make_run(run_dir)
    sweep = json.loads((run_dir / "sweep.json").read_text())
    sweep["command"] = "cifar-ray sweep sweeps/x.yaml"
    (run_dir / "sweep.json").write_text(json.dumps(sweep))
    record(run_dir, checkout, 1)
    text = report_text(build_report(run_dir))
    commit = git(checkout, "rev-parse", "HEAD")[:10]
    assert (
        "| Git revision | `abc1234def`; uncommitted changes: 3 files (2 changed, 1 untracked; diff in "
        "provenance/session-1.diff) |"
    ) in text
    assert (
        f"| Re-run with | `cifar-ray sweep sweeps/x.yaml` on commit {commit} with provenance/session-1.diff applied "
        "(and 1 untracked file, not kept) |"
    ) in text
