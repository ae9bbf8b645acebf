"""--storage as a folder or a pyarrow URI: unit tests of StoragePath and the run log, and a real
sweep whose logs and checkpoints go to an S3 bucket (moto's S3 server on loopback)."""

from __future__ import annotations

import json
import logging
import os
import pickle
import shlex
import stat

import pyarrow.fs as pafs
import pytest
from faults import FaultyFiles, faulty_storage

from cifar_ray.cli import main
from cifar_ray.core import runlog, storage
from cifar_ray.core.checkpoints import CHECKPOINTS
from cifar_ray.core.errors import RunInUseError, StorageError
from cifar_ray.core.storage import StoragePath
from cifar_ray.report import write_report


@pytest.fixture(scope="module")
def s3_root():
    """An S3 URI prefix served by moto on 127.0.0.1, with an empty bucket per test via bucket()."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a log line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield lambda bucket: (
        f"s3://test-key:test-secret@{bucket}",
        f"?endpoint_override={host}:{port}&scheme=http&region=us-east-1",
    )
    server.stop()


def make_bucket(s3_root, bucket: str) -> tuple[str, str]:
    prefix, options = s3_root(bucket)
    fs, _ = pafs.FileSystem.from_uri(f"{prefix}{options}&allow_bucket_creation=true")
    fs.create_dir(bucket)
    return prefix, options


def test_local_paths_and_file_uris_are_folders(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert StoragePath.of("runs").path == str(tmp_path / "runs") and StoragePath.of("runs").is_local
    assert StoragePath.of(f"file://{tmp_path}/x").path == str(tmp_path / "x")
    assert StoragePath.of(tmp_path / "y") / "a" / "b.json" == StoragePath.of(tmp_path / "y" / "a" / "b.json")
    assert str(StoragePath.of("runs") / "q") == str(tmp_path / "runs" / "q")


def test_bad_uris_fail_in_one_line_naming_what_is_allowed():
    for uri in ("foo://bucket/runs", "hdfs://namenode:8020/runs", "s3://"):
        with pytest.raises(StorageError) as error:
            StoragePath.of(uri)
        message = str(error.value)
        assert "\n" not in message and uri.split(":")[0] in message and "s3://bucket/path" in message, message


def test_credentials_never_appear_in_names_or_errors(s3_root):
    prefix, options = s3_root("secret-bucket")
    where = StoragePath.of(f"{prefix}/runs{options}")
    assert "test-secret" not in str(where) and str(where).startswith("s3://secret-bucket/runs?endpoint_override=")
    with pytest.raises(StorageError) as error:
        StoragePath.of("foo://user:hunter2@host/x")
    assert "hunter2" not in str(error.value)


def test_resume_hint_leaves_credentials_out():
    import argparse

    from cifar_ray.commands.common import resume_command

    args = argparse.Namespace(
        file="s.yaml", storage="s3://key:hunter2@bucket/runs?region=x", name=None, address=None, set=[], repeats=None
    )
    assert resume_command(args) == "cifar-ray sweep s.yaml --resume --storage 's3://bucket/runs?region=x'"


def test_run_log_round_trip_in_a_bucket(s3_root):
    prefix, options = make_bucket(s3_root, "roundtrip")
    run_dir = StoragePath.of(f"{prefix}/runs/r1{options}")
    assert not run_dir.exists() and runlog.read_json(run_dir / runlog.SWEEP_FILE) == {}
    runlog.write_json(run_dir / runlog.SWEEP_FILE, {"name": "r1", "trials": ["b", "a"]})
    for name in ("a", "b"):
        runlog.write_json(run_dir / name / runlog.TRIAL_FILE, {"status": "running", "loss": float("nan")})
        for epoch in (1, 2, 3):
            runlog.append_epoch(run_dir / name, {"epoch": epoch, "test_acc": 0.1 * epoch})
    runlog.truncate_epochs(run_dir / "a", 2)
    runlog.update_json(run_dir / "a" / runlog.TRIAL_FILE, status="finished")

    run = runlog.load_run(pickle.loads(pickle.dumps(run_dir)))  # as a Ray worker receives it
    assert [t.name for t in run.trials] == ["b", "a"]  # sweep order
    assert [t.status for t in run.trials] == ["running", "finished"] and run.trials[0].meta["loss"] is None
    assert [len(t.epochs) for t in run.trials] == [3, 2]
    with pytest.raises(FileNotFoundError):
        runlog.load_run(StoragePath.of(f"{prefix}/runs/missing{options}"))


def test_a_driver_lease_in_a_bucket_is_written_read_back_refused_and_released(s3_root):
    """S3 has no conditional write in pyarrow: the lease is written, read back after lease.SETTLE_S, and held."""
    from cifar_ray.core import lease, status

    prefix, options = make_bucket(s3_root, "lease")
    run_dir = StoragePath.of(f"{prefix}/runs/r1{options}")
    runlog.write_json(run_dir / runlog.SWEEP_FILE, {"name": "r1", "trials": ["a"]})
    runlog.write_json(run_dir / "a" / runlog.TRIAL_FILE, {"status": "running", "config": {"epochs": 2}})
    with lease.hold(run_dir) as held:
        assert lease.read_lease(run_dir).token == held.token
        refusal = lease.live_driver_refusal(run_dir)
        assert f"pid {os.getpid()}" in refusal and "test-secret" not in refusal
        with pytest.raises(RunInUseError):
            lease.DriverLease(run_dir, pid=os.getpid() + 1).acquire()
        assert status.load_state(run_dir).trials[0].state == "running"
    assert lease.read_lease(run_dir) is None
    assert status.load_state(run_dir).trials[0].state == "stalled"


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.slow
def test_sweep_logs_and_checkpoints_land_in_a_bucket_and_report_reads_them(s3_root, tmp_path, capsys):
    prefix, options = make_bucket(s3_root, "sweeps")
    storage = f"{prefix}/runs{options}"
    sweep = tmp_path / "s3.yaml"
    sweep.write_text(
        "name: s3sweep\n"
        "max_concurrent: 1\n"  # one slot: its start, not the trials, is what costs here
        "base: {dataset: synthetic, train_subset: 512, test_subset: 128, "
        "width: 8, epochs: 2, batch_size: 64, augment: none, workers: 1}\n"
        "grid:\n  seed: [0, 1]\n"
    )
    code = main(["sweep", str(sweep), "--storage", storage, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    results = json.loads(out.strip().splitlines()[-1])
    assert [r["status"] for r in results] == ["finished", "finished"]
    assert "test-secret" not in out + err  # the printed log location hides the credentials

    run_dir = StoragePath.of(storage) / "s3sweep"
    run = runlog.load_run(run_dir)
    assert run.sweep["finished_at"] and [len(t.epochs) for t in run.trials] == [2, 2]
    typed_without_secret = ["sweep", str(sweep), "--storage", storage.replace("test-key:test-secret@", ""), "--json"]
    assert run.sweep["command"] == shlex.join(["cifar-ray", *typed_without_secret])  # as typed, minus the secret
    for trial in run.trials:
        assert trial.meta["system"]["world_size"] == 1  # written by the Ray Train worker, into the bucket
        checkpoints = (run_dir / trial.name / CHECKPOINTS).subfolders()  # a warm slot's trial keeps its own
        assert checkpoints, f"no checkpoint of {trial.name} in the bucket"

    # a second run of the same sweep into the same bucket is refused, --resume of a finished one is a no-op
    assert main(["sweep", str(sweep), "--storage", storage]) == 2
    assert "already holds a finished run" in capsys.readouterr().err
    assert main(["sweep", str(sweep), "--storage", storage, "--resume", "--json"]) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["test_acc"] for r in again] == [r["test_acc"] for r in results]
    assert [len(t.epochs) for t in runlog.load_run(run_dir).trials] == [2, 2]

    readme = write_report(f"{prefix}/runs/s3sweep{options}", out_dir=tmp_path / "report")
    assert "2 finished" in readme.read_text()


def test_update_json_never_takes_an_unreadable_file_for_an_empty_one(tmp_path, monkeypatch):
    trial_file = StoragePath.of(str(tmp_path / runlog.TRIAL_FILE))
    runlog.write_json(trial_file, {"config": {"seed": 1}, "system": {"world_size": 2}})
    real_read = StoragePath.read_bytes
    failures = iter([OSError("AWS Error NETWORK_CONNECTION: timeout")])

    def flaky_read(self: StoragePath) -> bytes:
        error = next(failures, None)
        if error:
            raise error
        return real_read(self)

    monkeypatch.setattr(StoragePath, "read_bytes", flaky_read)
    monkeypatch.setattr(storage, "RETRY_S", 0.0)
    runlog.update_json(trial_file, status="finished")
    assert runlog.read_json(trial_file) == {"config": {"seed": 1}, "system": {"world_size": 2}, "status": "finished"}

    trial_file.write_text("{not json")  # never readable: an error, not a file rewritten with `status` alone
    with pytest.raises(StorageError, match=f"cannot read {trial_file} "):
        runlog.update_json(trial_file, status="failed")
    assert trial_file.read_text() == "{not json"
    runlog.update_json(StoragePath.of(str(tmp_path / "new.json")), status="pending")  # absent: created
    assert runlog.read_json(tmp_path / "new.json") == {"status": "pending"}


def test_a_read_under_a_file_is_absent_at_once_not_an_outage(tmp_path, monkeypatch, capsys):
    """`status FILE` read FILE/sweep.json: NotADirectoryError was retried TRIES times as an outage, then printed
    `[Errno 20]`. A path under a file holds nothing, as a missing one."""
    file = tmp_path / "notes.txt"
    file.write_text("not a run folder")
    reads = []
    real_read = StoragePath.read_bytes

    def counted_read(self: StoragePath) -> bytes:
        reads.append(self.path)
        return real_read(self)

    monkeypatch.setattr(StoragePath, "read_bytes", counted_read)
    assert runlog.read_json(StoragePath.of(str(file)) / runlog.SWEEP_FILE) == {} and len(reads) == 1
    assert not (StoragePath.of(str(file)) / runlog.SWEEP_FILE).exists()
    assert main(["status", str(file)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Errno" not in err, err


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_new_files_and_folders_get_the_modes_open_and_mkdir_give(tmp_path, umask):
    old = os.umask(umask)
    try:
        trial_file = StoragePath.of(tmp_path / "runs" / "t000" / runlog.TRIAL_FILE)
        runlog.write_json(trial_file, {"status": "pending"})  # makes its folders too
        (StoragePath.of(tmp_path) / "made").mkdir()
        plain = tmp_path / "plain"
        plain.write_text("")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(trial_file.path).st_mode) == stat.S_IMODE(plain.stat().st_mode) == 0o666 & ~umask
    for folder in (tmp_path / "runs", tmp_path / "runs" / "t000", tmp_path / "made"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o777 & ~umask, folder


def test_a_pyarrow_filesystem_that_is_not_local_works_as_a_folder_does(tmp_path):
    where = faulty_storage(tmp_path / "runs", FaultyFiles(tmp_path / "faults", share=0.0))
    assert not where.is_local and not where.exists() and where.subfolders() == []
    assert runlog.read_json(where / "r" / runlog.SWEEP_FILE) == {} and runlog.read_epochs(where / "r" / "a") == []
    runlog.write_json(where / "r" / runlog.SWEEP_FILE, {"name": "r", "trials": ["a"]})
    runlog.write_json(where / "r" / "a" / runlog.TRIAL_FILE, {"status": "running"})
    runlog.append_epoch(where / "r" / "a", {"epoch": 1})
    (where / "r" / "made").mkdir()
    assert where.is_dir() and (where / "r").subfolders() == ["a", "made"]
    run = runlog.load_run(pickle.loads(pickle.dumps(where / "r")))
    assert [(t.name, t.status, len(t.epochs)) for t in run.trials] == [("a", "running", 1)]
    (where / "r" / "a" / runlog.TRIAL_FILE).unlink()
    (where / "r" / "made").delete_dir()
    assert (where / "r").subfolders() == ["a"] and not (tmp_path / "runs" / "r" / "a" / runlog.TRIAL_FILE).exists()
    assert where.ray_storage() == {"storage_path": str(tmp_path / "runs"), "storage_filesystem": where.fs}
