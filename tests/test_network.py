"""The network stated: a trial records the model it builds (layers, output shapes, parameters), and the report lists
each distinct model once with the trials that used it, reading only those records."""

from __future__ import annotations

import pytest
import torch
from helpers import make_run, trial_name

from cifar_ray.core import runlog, storage
from cifar_ray.core.config import TrainConfig
from cifar_ray.core.errors import StorageError
from cifar_ray.core.storage import StoragePath
from cifar_ray.report.build import build_report
from cifar_ray.report.document import Paragraph, Table, to_markdown
from cifar_ray.report.network import network_blocks, run_networks
from cifar_ray.training import loop
from cifar_ray.training.distributed import Worker
from cifar_ray.training.models import build_model, count_parameters, describe_network

TINY = TrainConfig(
    dataset="synthetic", train_subset=256, test_subset=64, train_eval_size=0, width=4, depth=2, epochs=1, batch_size=32
)


def described(cfg: TrainConfig) -> dict:
    return describe_network(build_model(cfg), cfg, torch.contiguous_format)


def test_the_description_lists_every_layer_as_built_and_changes_nothing():
    torch.manual_seed(0)
    model = build_model(TINY)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    network = describe_network(model, TINY, torch.contiguous_format)
    assert (network["model"], network["width"], network["depth"], network["norm"]) == ("simple_cnn", 4, 2, "batch")
    assert network["total_params"] == count_parameters(model) == sum(layer["params"] for layer in network["layers"])
    first, last = network["layers"][0], network["layers"][-1]
    assert first == {"name": "features.0.0", "type": "Conv2d", "output": [4, 32, 32], "params": 3 * 4 * 9}
    assert last == {"name": "head.5", "type": "Linear", "output": [10], "params": 256 * 10 + 10}
    pools = [layer["output"] for layer in network["layers"] if layer["type"] == "MaxPool2d"]
    assert pools == [[4, 16, 16], [8, 8, 8]]
    # eval mode, no gradients: batch-norm statistics, weights and the random stream as they were; train mode back
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert torch.equal(torch.get_rng_state(), rng) and model.training
    resnet = described(TrainConfig(model="resnet9", width=8, norm="group"))
    assert resnet["depth"] is None and resnet["layers"][1]["type"] == "GroupNorm"
    assert resnet["total_params"] == count_parameters(build_model(TrainConfig(model="resnet9", width=8, norm="group")))


def test_a_trial_records_the_network_it_builds_in_its_folder(tmp_path):
    torch.set_num_threads(1)
    worker = Worker(rank=0, world=1, devices=[torch.device("cpu")])
    loop.run_trial(TINY, StoragePath.of(tmp_path / "trial"), worker, lambda metrics, _: None)
    assert runlog.read_json(tmp_path / "trial" / runlog.NETWORK_FILE) == described(TINY)


WIDE = TINY.model_copy(update={"width": 8})


def run_with_networks(run_dir):
    """The report's bs-workers run, its trials 0-3 built at width 4, 4-6 at width 8, 7 never started (no record)."""
    make_run(run_dir)
    for index in range(7):
        network = described(TINY if index < 4 else WIDE)
        runlog.write_json(run_dir / trial_name(index) / runlog.NETWORK_FILE, network)


def test_the_report_lists_each_distinct_network_once_with_the_trials_that_used_it(tmp_path):
    run_with_networks(tmp_path / "run")
    report = build_report(tmp_path / "run")
    networks = run_networks([(source.label, source.log) for source in report.sources])
    assert [n.trials for n in networks] == [
        tuple(trial_name(i) for i in range(4)),
        tuple(trial_name(i) for i in range(4, 7)),
    ]
    assert [n.total_params for n in networks] == [count_parameters(build_model(c)) for c in (TINY, WIDE)]
    blocks = network_blocks(report)
    tables = [block for block in blocks if isinstance(block, Table)]
    assert [len(table.rows) for table in tables] == [len(described(TINY)["layers"])] * 2
    assert tables[0].rows[0] == ("features.0.0", "Conv2d", "4 × 32 × 32", "108")
    text = to_markdown(blocks)
    assert text.count("parameters**") == 2 and text.count(trial_name(0)) == 1 and trial_name(7) not in text
    first = next(block for block in blocks if isinstance(block, Paragraph))
    assert first.text.startswith(f"`simple_cnn`, width 4, depth 2, norm batch: **{networks[0].total_params:,} param")


def test_a_run_from_before_networks_were_recorded_has_no_section_and_a_bad_record_is_an_error(tmp_path, monkeypatch):
    make_run(tmp_path / "old")
    assert network_blocks(build_report(tmp_path / "old")) == []
    run_with_networks(tmp_path / "run")
    (tmp_path / "run" / trial_name(2) / runlog.NETWORK_FILE).write_text('{"model": "simple_cnn", "lay')
    monkeypatch.setattr(storage, "RETRY_S", 0.0)
    with pytest.raises(StorageError, match=rf"cannot read .*{trial_name(2)}/{runlog.NETWORK_FILE}"):
        network_blocks(build_report(tmp_path / "run"))
