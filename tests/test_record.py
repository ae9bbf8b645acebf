"""The typed trial record (core/record.py) and the run folder's owner (core/run.py) on the current format: a run
folder as cifar-ray wrote it (tests/fixtures/quickstart-run, the committed quickstart's logs of 2026-11-26) loads
into records that give back every trial.json as it was, and the report, status and summary read it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cifar_ray.core import runlog, status
from cifar_ray.core.record import TrialRecord
from cifar_ray.core.run import RunFolder
from cifar_ray.core.storage import StoragePath

FIXTURE = Path(__file__).parent / "fixtures" / "quickstart-run"
TRIALS = sorted(p.name for p in FIXTURE.iterdir() if (p / runlog.TRIAL_FILE).is_file())


def test_the_fixture_is_a_whole_run_folder():
    sweep = json.loads((FIXTURE / runlog.SWEEP_FILE).read_text())
    assert sweep["trials"] == TRIALS and len(TRIALS) == 4
    assert (FIXTURE / "provenance" / "session-1.json").is_file()


@pytest.mark.parametrize("name", TRIALS)
def test_every_trial_json_of_the_current_format_round_trips(name):
    data = json.loads((FIXTURE / name / runlog.TRIAL_FILE).read_text())
    record = TrialRecord.from_json(name, data)
    assert record.to_json() == data and list(record.to_json()) == list(data)  # same keys, same order
    assert record.extra == {}, "a key of today's trial.json without its field"
    assert (record.name, record.status, record.error) == (name, "finished", None)
    assert record.system["world_size"] == record.config["workers"] and record.timeline["ready_unix"] > 0


def test_unknown_keys_and_nulls_are_kept_and_absent_keys_stay_absent():
    data = {
        "index": 3,
        "name": "t003",
        "swept": {"lr": 0.1},
        "config": {"epochs": 2},
        "status": "interrupted",
        "error": None,
        "notes": ["checkpoint epoch-0002 passed over: truncated"],
        "system": None,  # null where a dict is expected: written back as null
        "interrupted_at": "2026-11-26T21:41:05+0000",
        "from_a_later_version": {"x": [1, 2]},
    }
    record = TrialRecord.from_json("t003", data)
    assert record.to_json() == data and list(record.to_json()) == list(data)
    assert record.extra == {"from_a_later_version": {"x": [1, 2]}} and record.get("from_a_later_version") == {
        "x": [1, 2]
    }
    assert record.notes == data["notes"] and record.system is None
    pending = TrialRecord.from_json("t004", {"index": 4, "name": "t004", "status": "pending"})
    assert pending.to_json() == {"index": 4, "name": "t004", "status": "pending"}  # no error, no system added
    assert pending.get("error", "absent") == "absent" and pending.started_unix is None
    assert TrialRecord.from_json("t005", {}).to_json() == {} and TrialRecord.from_json("t005", {}).status == "pending"


def test_the_run_folder_owner_reads_the_fixture_as_typed_records():
    run = RunFolder(FIXTURE)
    assert run.sweep()["name"] == "quickstart" and run.holds_run()
    records = run.trials(TRIALS)
    assert [r.name for r in records] == TRIALS and run.all_final(TRIALS)
    assert run.new_run_refusal("quickstart").startswith(f"{FIXTURE} already holds a finished run of 'quickstart'")


def test_the_run_folder_owner_writes_keep_the_format(tmp_path):
    """An update through the owner changes the named keys only: the rest of trial.json, its order included, stays."""
    shutil.copytree(FIXTURE, tmp_path / "run")
    run = RunFolder(tmp_path / "run")
    name = TRIALS[0]
    before = json.loads((tmp_path / "run" / name / runlog.TRIAL_FILE).read_text())
    run.add_note(name, "a line")
    run.mark_interrupted(TRIALS)  # finished trials are not running: untouched
    after = json.loads((tmp_path / "run" / name / runlog.TRIAL_FILE).read_text())
    assert after == before | {"notes": ["a line"]} and list(after) == [*before, "notes"]
    assert run.trial(name).notes == ["a line"]


def test_status_and_the_report_load_the_fixture():
    from cifar_ray.report import build_report

    state = status.load_state(StoragePath.of(FIXTURE), now=1795729400.0)
    assert state.counts["finished"] == 4 and not state.stopped
    built = build_report(FIXTURE)
    assert list(built.trials["trial"]) == TRIALS and set(built.trials["status"]) == {"finished"}
    assert len(built.epochs) == 4 * 3  # three epochs each (the base's epochs)


def test_the_run_folder_owner_is_the_only_writer_of_sweep_and_trial_json():
    """No module but core/run.py updates a run's JSON records or writes sweep.json, trial.json or a session's
    provenance (core/runlog.py defines the writes; others write their own files: network.json, profile.json)."""
    import ast

    import cifar_ray

    root = Path(cifar_ray.__file__).parent
    owners = {"core/runlog.py", "core/run.py"}
    wrong = []
    for path in sorted(root.rglob("*.py")):
        module = str(path.relative_to(root))
        if module in owners:
            continue
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name not in ("update_json", "write_session", "write_json"):
                continue  # before the call's source text: getting that for every call took seconds
            text = (ast.get_source_segment(source, node) or "").lower()
            records = "sweep_file" in text or "trial_file" in text  # the names, or a path to one
            if (
                name == "update_json"
                or name == "write_session"
                and module != "core/provenance.py"
                or (name == "write_json" and records)
            ):
                wrong.append(f"{module}:{node.lineno} {name}")
    assert not wrong, f"write the run folder's records through core.run.RunFolder: {wrong}"
