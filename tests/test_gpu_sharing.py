"""Fractional and shared GPUs: what trial.json records (physical GPUs by UUID, the share per rank) and the
report's note on time comparisons that include trials which shared a GPU."""

from __future__ import annotations

import json
import types

import pytest
import torch
from helpers import fake_gpus, make_factorial, report_text, trial_name

from cifar_ray.core import sysinfo
from cifar_ray.core.runlog import TrialLog
from cifar_ray.report import build_report
from cifar_ray.report.findings import shared_note
from cifar_ray.report.sharing import shared_trials
from cifar_ray.training.distributed import Worker, worker_system

HERE = {"node_id": None, "hostname": "here"}  # where the rank runs: cluster.placement.worker_placement outside Ray


@pytest.mark.parametrize(
    "uuids_per_rank, gpus_per_rank, num_gpus, share",
    [
        ([["GPU-a"], ["GPU-a"]], 0.5, 1, 0.5),  # 2 gloo ranks sharing one GPU: 1 GPU, not 2
        ([["GPU-a", "GPU-b"]], 2.0, 2, 1.0),  # dp: one process drives 2 whole GPUs
        ([["GPU-a"], ["GPU-b"]], 1.0, 2, 1.0),  # ddp, a GPU per rank
        ([["GPU-a"]], 0.25, 1, 0.25),  # a 0.25 trial: 1 GPU, a quarter of it
    ],
)
def test_gpu_record_counts_physical_gpus_and_the_share(uuids_per_rank, gpus_per_rank, num_gpus, share):
    record = sysinfo.gpu_record(uuids_per_rank, gpus_per_rank)
    assert record == {"num_gpus": num_gpus, "gpu_uuids": uuids_per_rank, "gpu_share": share}


def test_worker_system_records_the_uuid_of_the_workers_own_gpu(monkeypatch):
    fake_gpus(monkeypatch, ("GPU zero", (9, 0)), ("GPU one", (9, 0)))
    uuids = ["uuid-zero", "uuid-one"]
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(uuid=uuids[device.index])
    )
    system = worker_system(Worker(0, 1, [torch.device("cuda:1")]), 0.25, HERE)
    assert (system["num_gpus"], system["gpu_uuids"], system["gpu_share"]) == (1, [["uuid-one"]], 0.25)
    assert system["device_name"] == "GPU one" and system["world_size"] == 1


def test_worker_system_on_cpu_keeps_its_keys():
    """CPU trials' trial.json stays as it was (the committed quickstart logs render byte-identically)."""
    system = worker_system(Worker(0, 1, [torch.device("cpu")]), 0.0, HERE)
    keys = ["device_type", "device_name", "devices_per_worker", "nodes", "hostnames", "world_size", "num_gpus"]
    assert list(system) == [*keys, "versions"] and system["num_gpus"] == 0


def gpu_trial(name: str, uuid: str, share: float, start: float, end: float) -> TrialLog:
    system = {"device_type": "cuda", "gpu_uuids": [[uuid]], "gpu_share": share}
    return TrialLog.of(name, {"system": system, "started_unix": start, "finished_unix": end})


def test_shared_trials_by_share_and_by_overlap_on_one_uuid():
    trials = [
        gpu_trial("t0", "GPU-a", 0.5, 0, 10),
        gpu_trial("t1", "GPU-b", 1.0, 5, 15),  # overlaps t2 on GPU-b
        gpu_trial("t2", "GPU-b", 1.0, 12, 20),
        gpu_trial("t3", "GPU-b", 1.0, 20, 30),  # starts as t2 finishes: no overlap
        gpu_trial("t4", "GPU-c", 1.0, 0, 30),  # alone on its GPU
        TrialLog.of("t5", {"system": {"device_type": "cpu", "num_gpus": 0}, "started_unix": 0, "finished_unix": 30}),
    ]
    assert shared_trials(trials) == {
        "t0": "gpu_share 0.5",
        "t1": "beside t2 on one GPU",
        "t2": "beside t1 on one GPU",
    }


def share_gpus(run_dir, shares: dict[int, float]) -> None:
    """Make the given trials of a hand-made run CUDA trials holding that share of their own GPU."""
    for index, share in shares.items():
        path = run_dir / trial_name(index) / "trial.json"
        meta = json.loads(path.read_text())
        uuid = f"GPU-{index}"
        meta["system"] |= {"device_type": "cuda", "num_gpus": 1, "gpu_uuids": [[uuid]], "gpu_share": share}
        path.write_text(json.dumps(meta))


def test_report_notes_time_comparisons_of_trials_that_shared_a_gpu(tmp_path):
    run_dir = tmp_path / "factorial"
    make_factorial(run_dir)
    share_gpus(run_dir, {0: 0.5, 3: 0.5, 5: 0.25, 7: 1.0})
    note = (
        "Time/epoch of trials that shared a device includes their neighbours' contention: "
        f"{trial_name(0)}, {trial_name(3)} (gpu_share 0.5); {trial_name(5)} (gpu_share 0.25)."
    )
    report = build_report(run_dir)
    assert shared_note(report) == note
    text = report_text(report)
    findings = text.split("## Findings")[1].split("\n## ")[0].splitlines()
    fastest = next(i for i, line in enumerate(findings) if line.startswith("- **Fastest**"))
    assert findings[fastest + 1] == f"- {note}"
    assert text.count(note) == 1  # said once, in the findings


def test_report_says_nothing_of_sharing_for_whole_gpus_or_cpus(tmp_path):
    run_dir = tmp_path / "factorial"
    make_factorial(run_dir)
    share_gpus(run_dir, {0: 1.0})
    report = build_report(run_dir)
    assert shared_note(report) == ""
    assert "trials that shared a device includes" not in report_text(report)
