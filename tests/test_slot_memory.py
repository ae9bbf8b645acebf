"""A trial's memory figures do not depend on its place in a warm slot (issue 35): identical trials, one after
another in one worker process, log a like rise over their start (within a factor of 2), the first (which loads the
data and runs the FLOP probes) as the later ones (which find what earlier trials freed)."""

from __future__ import annotations

import pytest

from cifar_ray.cli import main
from cifar_ray.core import runlog

pytestmark = pytest.mark.usefixtures("ray_cluster")

# Measured with this test on loaded 2-core CPU machines: rises of 118, 107, 101 MB; 131, 149, 130 MB; 130, 118, 88 MB
# (a CI run: the allocator keeps what it frees as it likes, so a later trial moves by up to a third). Before the
# baseline was taken after release_trial, the data and the probes: 233, 66, 72 MB (the first counted the data it
# loaded and the probes' leftovers, the later ones were measured over what earlier trials had freed but kept
# resident): a factor of 3.5, which a factor of 2 catches.
FACTOR = 2.0


@pytest.mark.slow
def test_identical_trials_in_one_warm_slot_log_a_like_memory_rise(tmp_path, capsys):
    (tmp_path / "s.yaml").write_text(
        "name: slot-memory\n"
        "base: {dataset: synthetic, train_subset: 8192, test_subset: 512, train_eval_size: 0, width: 8, epochs: 1,"
        " workers: 1}\n"
        "grid:\n  seed: [0, 1, 2]\n"
    )
    code = main(["sweep", str(tmp_path / "s.yaml"), "--storage", str(tmp_path / "runs"), "--max-concurrent", "1"])
    assert code == 0, capsys.readouterr().err
    run = runlog.load_run(tmp_path / "runs" / "slot-memory")
    assert len({t.meta["slot"] for t in run.trials}) == 1  # one worker process ran all three, in plan order
    trials = sorted(run.trials, key=lambda t: t.meta["started_unix"])
    rises = [max(e["peak_mem_above_start_mb"] for e in t.epochs) for t in trials]
    peaks = [max(e["peak_mem_mb"] for e in t.epochs) for t in trials]
    print(f"rise over start by place in the slot: {rises} MB; peak RSS: {peaks} MB")
    assert all(rise > 0 for rise in rises)
    for later in rises[1:]:
        assert rises[0] / FACTOR <= later <= rises[0] * FACTOR, rises
