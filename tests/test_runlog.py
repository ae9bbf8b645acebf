"""The run log fails safe: a read tells "absent" from "failed", a failure is retried then raised, nothing is
rewritten from a failed read, and a folder that may hold a run is never taken for an empty one. Driven by
hand-made failures and by tests/faults.py's filesystem."""

from __future__ import annotations

import json

import pytest
from faults import FaultyFiles, failures, faulty_storage

from cifar_ray.cli import main
from cifar_ray.cluster import session as ray_session
from cifar_ray.core import runlog, storage
from cifar_ray.core.checkpoints import CHECKPOINTS
from cifar_ray.core.errors import StorageError
from cifar_ray.core.run import RunFolder
from cifar_ray.core.storage import StoragePath


@pytest.fixture(autouse=True)
def no_retry_pause(monkeypatch):
    monkeypatch.setattr(storage, "RETRY_S", 0.0)


def flaky_reads(monkeypatch, errors: list[Exception]) -> list[str]:
    """StoragePath.read_bytes raises `errors` first, one a call, then reads; returns the paths read."""
    real_read = StoragePath.read_bytes
    pending = iter(errors)
    reads: list[str] = []

    def read_bytes(self: StoragePath) -> bytes:
        reads.append(self.path)
        error = next(pending, None)
        if error:
            raise error
        return real_read(self)

    monkeypatch.setattr(StoragePath, "read_bytes", read_bytes)
    return reads


def test_a_missing_file_is_empty_a_transient_failure_is_read_again(tmp_path, monkeypatch):
    assert runlog.read_json(tmp_path / "none.json") == {} and runlog.read_epochs(tmp_path / "none") == []
    runlog.write_json(tmp_path / runlog.TRIAL_FILE, {"status": "running"})
    reads = flaky_reads(monkeypatch, [TimeoutError("timed out"), OSError("AWS Error NETWORK_CONNECTION")])
    assert runlog.read_json(tmp_path / runlog.TRIAL_FILE) == {"status": "running"}
    assert len(reads) == 3


@pytest.mark.parametrize("content", ["{not json", '{"status": "runn', "[1, 2]", "\xff"])
def test_a_file_that_never_parses_raises_one_line_naming_it(tmp_path, content):
    trial_file = tmp_path / runlog.TRIAL_FILE
    trial_file.write_bytes(content.encode("latin-1"))
    with pytest.raises(StorageError) as error:
        runlog.read_json(trial_file)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"cannot read {trial_file} ({storage.TRIES} tries): ")


def test_a_permission_error_raises_after_the_tries_naming_the_file(tmp_path, monkeypatch):
    runlog.write_json(tmp_path / runlog.SWEEP_FILE, {"name": "x"})
    denied = PermissionError(13, "Permission denied", str(tmp_path / runlog.SWEEP_FILE))
    reads = flaky_reads(monkeypatch, [denied] * storage.TRIES)
    with pytest.raises(StorageError, match=f"cannot read {tmp_path / runlog.SWEEP_FILE} .*Permission denied"):
        runlog.read_json(tmp_path / runlog.SWEEP_FILE)
    assert len(reads) == storage.TRIES


def test_metrics_jsonl_skips_a_torn_last_line_and_refuses_a_corrupt_one_in_the_middle(tmp_path):
    epochs = tmp_path / runlog.EPOCHS_FILE
    epochs.write_text('{"epoch": 1, "a": 1}\n{"epoch": 2, "a": 2}\n{"epoch": 1, "a": 3}\n{"epoch": 3, "a"')
    assert runlog.read_epochs(tmp_path) == [{"epoch": 1, "a": 3}, {"epoch": 2, "a": 2}]  # a repeat keeps its last
    runlog.append_epoch(tmp_path, {"epoch": 3, "a": 4})  # epoch 3's torn line was never logged: logged now once
    assert [row["a"] for row in runlog.read_epochs(tmp_path)] == [3, 2, 4]
    for corrupt in ('{"epoch": 1}\n{"epo\n{"epoch": 3}\n', '{"epoch": 1}\n{"loss": 2}\n', '{"epoch": 1}\n{"ep\n'):
        epochs.write_text(corrupt)  # the last one: a torn line that ends with its newline is not a torn write
        with pytest.raises(StorageError, match=f"cannot read {epochs} .*line 2 is not"):
            runlog.read_epochs(tmp_path)
        for rewrite in (
            lambda: runlog.append_epoch(tmp_path, {"epoch": 4}),
            lambda: runlog.truncate_epochs(tmp_path, 1),
        ):
            with pytest.raises(StorageError):
                rewrite()
            assert epochs.read_text() == corrupt  # nothing rewritten from a failed read


def test_update_json_and_append_epoch_never_rewrite_from_a_failed_read(tmp_path, monkeypatch):
    runlog.write_json(tmp_path / runlog.TRIAL_FILE, {"config": {"seed": 1}})
    for epoch in (1, 2, 3):
        runlog.append_epoch(tmp_path, {"epoch": epoch})
    before = {name: (tmp_path / name).read_text() for name in (runlog.TRIAL_FILE, runlog.EPOCHS_FILE)}
    flaky_reads(monkeypatch, [OSError("AWS Error NETWORK_CONNECTION: timeout")] * 4 * storage.TRIES)
    for write in (
        lambda: runlog.update_json(tmp_path / runlog.TRIAL_FILE, status="failed"),
        lambda: runlog.append_epoch(tmp_path, {"epoch": 4}),
        lambda: runlog.truncate_epochs(tmp_path, 2),
    ):
        with pytest.raises(StorageError, match="NETWORK_CONNECTION"):
            write()
    assert {name: (tmp_path / name).read_text() for name in before} == before


# ------------------------------------------------------------------------------------ fault injection


def test_every_epoch_is_logged_once_under_transient_read_failures(tmp_path):
    handler = FaultyFiles(tmp_path / "faults", seed=3, share=0.3, burst=2, ops=("read",))
    trial_dir = faulty_storage(tmp_path / "runs", handler) / "t000"
    assert not trial_dir.is_local and str(trial_dir).startswith("faulty://")
    for epoch in range(1, 41):
        runlog.append_epoch(trial_dir, {"epoch": epoch, "test_acc": epoch / 100})
    runlog.truncate_epochs(trial_dir, 30)
    for epoch in range(31, 36):  # a resumed trial redoes epochs 31-35
        runlog.append_epoch(trial_dir, {"epoch": epoch, "test_acc": 1 - epoch / 100})
    logged = (tmp_path / "runs" / "t000" / runlog.EPOCHS_FILE).read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in logged] == list(range(1, 36))  # each once, in order
    assert [json.loads(line)["test_acc"] for line in logged][30:] == [1 - e / 100 for e in range(31, 36)]
    injected = failures(tmp_path / "faults")
    assert len(injected) > 10 and {(op, kind) for op, kind, _ in injected} == {("read", "transient")}


def test_a_permanent_read_failure_raises_and_leaves_the_file_as_it_was(tmp_path):
    handler = FaultyFiles(tmp_path / "faults", share=0.0)
    trial_dir = faulty_storage(tmp_path / "runs", handler) / "t000"
    for epoch in (1, 2):
        runlog.append_epoch(trial_dir, {"epoch": epoch})
    runlog.write_json(trial_dir / runlog.TRIAL_FILE, {"status": "running", "config": {"epochs": 2}})
    local = tmp_path / "runs" / "t000"
    before = {name: (local / name).read_text() for name in (runlog.EPOCHS_FILE, runlog.TRIAL_FILE)}
    for name in before:
        handler.fail_for_good("read", str(local / name))
    with pytest.raises(StorageError, match="injected permanent read failure"):
        runlog.append_epoch(trial_dir, {"epoch": 3})
    with pytest.raises(StorageError, match="injected permanent read failure"):
        runlog.update_json(trial_dir / runlog.TRIAL_FILE, status="finished")
    with pytest.raises(StorageError, match=f"cannot read faulty://{local / runlog.TRIAL_FILE}"):
        runlog.load_run(trial_dir.parent)
    assert {name: (local / name).read_text() for name in before} == before
    assert len(failures(tmp_path / "faults")) == 3 * storage.TRIES


def test_a_failed_write_raises_and_keeps_the_older_file(tmp_path):
    handler = FaultyFiles(tmp_path / "faults", share=0.0)
    trial_dir = faulty_storage(tmp_path / "runs", handler) / "t000"
    runlog.append_epoch(trial_dir, {"epoch": 1})
    handler.fail_for_good("write", str(tmp_path / "runs" / "t000" / runlog.EPOCHS_FILE))
    with pytest.raises(StorageError, match=rf"cannot write .*{runlog.EPOCHS_FILE} \(5 tries\): injected permanent"):
        runlog.append_epoch(trial_dir, {"epoch": 2})
    assert runlog.read_epochs(trial_dir) == [{"epoch": 1}]


def test_a_write_that_fails_for_a_while_is_written_again_and_leaves_no_temp_file(tmp_path, monkeypatch):
    """A whole-file write can be repeated: a storage timeout must not fail the trial's attempt."""
    from pathlib import Path

    real_write, calls = storage.StoragePath._write_once, []

    def flaky_write(self, data):
        calls.append(self.path)
        if len(calls) <= 2:
            real_write(self, data[:3])  # a first try that is cut short, then fails
            raise OSError("AWS Error NETWORK_CONNECTION: timeout")
        real_write(self, data)

    monkeypatch.setattr(storage.StoragePath, "_write_once", flaky_write)
    runlog.write_json(tmp_path / runlog.TRIAL_FILE, {"status": "running"})
    assert len(calls) == 3 and runlog.read_json(tmp_path / runlog.TRIAL_FILE) == {"status": "running"}
    assert sorted(p.name for p in Path(tmp_path).iterdir()) == [runlog.TRIAL_FILE]


def test_the_faulty_filesystem_pickles_and_counts_the_failures_of_every_copy(tmp_path):
    import pickle

    handler = FaultyFiles(tmp_path / "faults", seed=1, share=1.0, burst=1, permanent=0.0)
    where = faulty_storage(tmp_path / "runs", handler)
    copy = pickle.loads(pickle.dumps(where))  # as a Ray worker receives it
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "result.json").write_text("{}")  # Ray Tune's files are never failed
    assert (copy / "result.json").read_bytes() == b"{}" and copy.subfolders() == []
    for path in (where, copy):  # each fails once, then its retry writes it
        (path / runlog.SWEEP_FILE).write_text("{}")
    assert [op for op, _, _ in failures(tmp_path / "faults")] == ["write", "write"]
    assert (tmp_path / "runs" / runlog.SWEEP_FILE).read_text() == "{}"


# ------------------------------------------------------------------------------- a run folder is not empty


def test_an_unreadable_sweep_json_or_trial_folders_without_one_refuse_a_new_run(tmp_path):
    run_dir = tmp_path / "x"
    (run_dir / "t000").mkdir(parents=True)
    (run_dir / "notes").mkdir()  # a folder holding no trial's file is no trial
    assert RunFolder(run_dir).new_run_refusal("x") is None
    for held in (runlog.EPOCHS_FILE, runlog.TRIAL_FILE, f"{CHECKPOINTS}/epoch-0001/x.tmp"):
        (run_dir / "t000" / held).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / "t000" / held).write_text("")
        assert RunFolder(run_dir).new_run_refusal("x") == (
            f"{run_dir} holds trial folders (t000) but no {runlog.SWEEP_FILE}: pass --name NEW to start another run, "
            "or move the folder away"
        )
        (run_dir / "t000" / held).unlink()
    (run_dir / runlog.SWEEP_FILE).write_text('{"name": "x", "tria')
    refusal = RunFolder(run_dir).new_run_refusal("x")
    assert refusal.startswith(f"cannot read {run_dir / runlog.SWEEP_FILE} ") and refusal.endswith(
        f"{run_dir} may hold a run: pass --resume to finish it, --name NEW to start another, or move the folder away"
    )


def test_a_sweep_into_a_folder_with_a_corrupt_sweep_json_is_refused_before_ray_starts(tmp_path, capsys, monkeypatch):
    def init_ray(**options):
        raise AssertionError("Ray started")

    monkeypatch.setattr(ray_session, "init_ray", init_ray)
    (tmp_path / "s.yaml").write_text("name: old\nbase: {dataset: synthetic}\ngrid: {seed: [0, 1]}\n")
    run_dir = tmp_path / "runs" / "old"
    runlog.write_json(run_dir / "t000-seed=0" / runlog.TRIAL_FILE, {"status": "finished"})
    (run_dir / runlog.SWEEP_FILE).write_text('{"name": "old", "trials": ["t000-se')  # torn
    before = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    assert main(["sweep", str(tmp_path / "s.yaml"), "--storage", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"cifar-ray: error: cannot read {run_dir / runlog.SWEEP_FILE}")
    assert {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()} == before


def test_an_older_logs_lr_is_read_as_the_first_steps_rate_and_train_json_calls_nothing_final_lr(tmp_path):
    """Logs written before lr_last held `lr`, the epoch's first step's rate: read as lr_first, never as the
    config's lr (the peak) nor as a final rate; the report's epochs keep it."""
    from cifar_ray.commands.common import trial_result
    from cifar_ray.report.load import epochs_frame

    trial_dir = tmp_path / "run" / "t000"
    trial_dir.mkdir(parents=True)
    runlog.write_json(trial_dir / runlog.TRIAL_FILE, {"config": {"lr": 0.05}, "status": "finished"})
    (trial_dir / runlog.EPOCHS_FILE).write_text(json.dumps({"epoch": 1, "test_acc": 0.5, "lr": 0.0125}) + "\n")
    assert runlog.read_epochs(trial_dir) == [{"epoch": 1, "test_acc": 0.5, "lr_first": 0.0125}]
    run = runlog.load_run(tmp_path / "run")
    result = trial_result(run.trials[0])
    assert result["lr"] == 0.05 and result["lr_first"] == 0.0125 and "final_lr" not in result
    assert epochs_frame(run)["lr_first"].tolist() == [0.0125]


def test_the_more_seeds_command_drops_what_a_resume_refuses_or_replaces():
    from cifar_ray.core.runlog import more_seeds_command

    assert more_seeds_command("cifar-ray sweep s.yaml --estimate --storage /tmp/r", 11) == (
        "cifar-ray sweep s.yaml --storage /tmp/r --resume --repeats 11"
    )
    assert more_seeds_command("cifar-ray sweep s.yaml --repeats 3 --set lr=0.1 --dry-run", 5) == (
        "cifar-ray sweep s.yaml --set lr=0.1 --resume --repeats 5"
    )
    assert more_seeds_command(None, 4) == "cifar-ray sweep FILE --resume --repeats 4"


def test_append_epoch_never_logs_an_epoch_twice_whoever_calls_it(tmp_path, caplog):
    """Two writers of one trial (two drivers): the second copy of an epoch, or an earlier epoch, is skipped with a
    warning; a resumed trial truncates first and then logs its redone epochs."""
    for epoch in (1, 2):
        assert runlog.append_epoch(tmp_path, {"epoch": epoch, "test_acc": 0.1 * epoch})
    with caplog.at_level("WARNING", logger=runlog.__name__):
        assert not runlog.append_epoch(tmp_path, {"epoch": 2, "test_acc": 0.9})
        assert not runlog.append_epoch(tmp_path, {"epoch": 1, "test_acc": 0.9})
    assert "epoch 2 not logged: metrics.jsonl already ends at epoch 2" in caplog.text
    lines = (tmp_path / runlog.EPOCHS_FILE).read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"epoch": 1, "test_acc": 0.1}, {"epoch": 2, "test_acc": 0.2}]
    runlog.truncate_epochs(tmp_path, 1)
    assert runlog.append_epoch(tmp_path, {"epoch": 2, "test_acc": 0.3})
    assert [row["test_acc"] for row in runlog.read_epochs(tmp_path)] == [0.1, 0.3]
