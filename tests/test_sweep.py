import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cifar_ray.cli import main
from cifar_ray.core.config import ConfigError, TrainConfig
from cifar_ray.core.sweep import (
    NAME_MAX,
    NAME_PATTERN,
    SWEEP_FILE_ALLOWED,
    SweepFile,
    build_plan,
    load_sweep,
    trial_name,
)
from cifar_ray.core.text import SHOWN_MAX
from cifar_ray.core.work import TrialWork, trial_work, work_summary

ROOT = Path(__file__).parent.parent
SWEEPS = sorted((ROOT / "sweeps").glob("*.yaml"))
BIG_GRID_KEYS = ("lr", "momentum", "weight_decay", "dropout", "label_smoothing", "warmup_epochs")


def test_there_are_sweep_files():
    assert any(p.name == "quickstart.yaml" for p in SWEEPS)


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_every_shipped_sweep_dry_runs(path, capsys):
    assert main(["sweep", str(path), "--dry-run", "--json"]) == 0
    out = capsys.readouterr().out.splitlines()
    trials = json.loads(out[-1])
    plan = load_sweep(path)
    assert len(trials) == len(plan.trials) > 0
    assert plan.description, f"{path.name} has no description (the question it answers)"
    assert out[-3] == work_summary(plan)
    assert out[-2].startswith("on this machine's ") and ": wall time " in out[-2]  # rough, or unknown with GPUs
    # and offline, as docs/sweep-files.md suggests for trying any sweep on a laptop
    assert main(["sweep", str(path), "--dry-run", "--set", "dataset=synthetic", "epochs=1"]) == 0


def test_grid_is_a_cartesian_product_with_repeats():
    plan = build_plan(
        {
            "name": "g",
            "base": {"epochs": 2, "seed": 10},
            "grid": {"batch_size": [32, 64], "optimizer": ["sgd", "adam"]},
            "repeats": 2,
        }
    )
    assert len(plan.trials) == 8
    assert [t.swept for t in plan.trials[:3]] == [
        {"batch_size": 32, "optimizer": "sgd", "seed": 10},
        {"batch_size": 32, "optimizer": "sgd", "seed": 11},
        {"batch_size": 32, "optimizer": "adam", "seed": 10},
    ]
    assert plan.trials[2].config.optimizer == "adam" and plan.trials[2].config.epochs == 2
    assert len({t.name for t in plan.trials}) == 8
    assert plan.trials[0].name == "t000-batch_size=32-optimizer=sgd-seed=10"


def test_bundled_grid_values_set_keys_together():
    plan = build_plan(
        {
            "name": "o",
            "grid": {"optimizer": [{"optimizer": "momentum", "lr": 0.05}, {"optimizer": "adam", "lr": 0.001}]},
        }
    )
    assert [(t.config.optimizer, t.config.lr) for t in plan.trials] == [("momentum", 0.05), ("adam", 0.001)]
    assert [t.swept["optimizer"] for t in plan.trials] == ["momentum (lr=0.05)", "adam (lr=0.001)"]
    assert plan.grid == {"optimizer": ["momentum (lr=0.05)", "adam (lr=0.001)"]}


def test_set_overrides_base_and_collapses_the_grid():
    plan = build_plan(
        {"name": "o", "base": {"epochs": 5}, "grid": {"batch_size": [32, 64], "lr": [0.1, 0.2]}},
        {"epochs": 1, "lr": 0.3},
    )
    assert len(plan.trials) == 2
    assert all(t.config.epochs == 1 and t.config.lr == 0.3 for t in plan.trials)


def test_a_bad_set_value_is_blamed_on_set_and_a_bad_file_base_on_the_file(tmp_path):
    batch_size = SWEEPS[0].parent / "batch_size.yaml"
    with pytest.raises(ConfigError) as error:
        load_sweep(batch_size, {"batch_size": 0})
    assert str(error.value).startswith("--set: batch_size=0: should be greater than or equal to 1")
    path = tmp_path / "s.yaml"
    path.write_text("name: s\nbase: {batch_size: 96}\n")
    assert load_sweep(path, {"workers": 3}).trials[0].config.workers == 3  # valid only with the file's batch_size
    with pytest.raises(ConfigError, match=r"^--set: batch_size=96 must be divisible by workers=5"):
        load_sweep(path, {"workers": 5})
    path.write_text("name: s\nbase: {lr: -1}\n")
    with pytest.raises(ConfigError, match=f"^{path}: base: lr=-1: should be greater than 0"):
        load_sweep(path, {"batch_size": 0})  # both are bad: the file's base is named first
    assert load_sweep(path, {"lr": 0.1}).trials[0].config.lr == 0.1  # --set may fix the file's base


def test_trial_work_counts_the_images_trained():
    quick = TrainConfig(dataset="synthetic", train_subset=5000, test_subset=1000, batch_size=64, epochs=3)
    assert trial_work(quick) == TrialWork("synthetic", 5000, 1000, 3, 3 * 78 * 64)  # 78 steps of 64, 8 left over
    assert trial_work(TrainConfig()) == TrialWork("cifar10", 50_000, 10_000, 10, 10 * 390 * 128)
    accumulated = TrainConfig(batch_size=64, accum_steps=4, train_subset=1000, epochs=1)
    assert trial_work(accumulated).images_trained == 3 * 256  # whole optimizer steps of the effective batch
    capped = trial_work(TrainConfig(train_subset=80_000, test_subset=20_000, batch_size=100))  # subsets beyond the data
    assert (capped.train_images, capped.test_images, capped.images_trained) == (50_000, 10_000, 10 * 50_000)


def test_work_summary_totals_the_sweep():
    quickstart = load_sweep(SWEEPS[0].parent / "quickstart.yaml")
    assert work_summary(quickstart) == (
        "4 trials · dataset synthetic · 5,000 train / 1,000 test images per trial · "
        "3 epochs · 59,904 images trained in all (14,976 per trial)"
    )
    mixed = build_plan(
        {
            "name": "m",
            "base": {"train_subset": 1000, "batch_size": 100},
            "grid": {"epochs": [1, 2], "dataset": ["cifar10", "synthetic"]},
        }
    )
    assert work_summary(mixed) == (
        "4 trials · dataset cifar10/synthetic · 1,000 train / 10,000 test images per "
        "trial · 1-2 epochs · 6,000 images trained in all (1,000-2,000 per trial)"
    )
    one = build_plan({"name": "o", "base": {"dataset": "synthetic", "epochs": 1, "test_subset": 500}})
    assert work_summary(one) == (
        "1 trial · dataset synthetic · 50,000 train / 500 test images per trial · "
        "1 epoch · 49,920 images trained in all (49,920 per trial)"
    )


def test_trial_names_are_folder_safe():
    assert (
        trial_name(7, {"optimizer": "adam (lr=0.001)", "data_dir": "/a/b"})
        == "t007-optimizer=adam-lr-0.001-data_dir=a-b"
    )
    assert trial_name(0, {"data_dir": "../.."}) == "t000-data_dir=..-..", "one path component, never .."


def test_every_shipped_and_recorded_name_matches_the_name_pattern():
    """The name pattern keeps what exists valid: the bundled sweeps' run and trial names, and the recorded run."""
    names = []
    for path in SWEEPS:
        plan = load_sweep(path)
        names += [plan.name, *(t.name for t in plan.trials), *plan.grid]
    recorded = ROOT / "reports" / "quickstart" / "logs"
    names += [folder.name for folder in recorded.iterdir() if folder.is_dir()]
    assert len(names) > 100 and all(re.fullmatch(NAME_PATTERN, name) for name in names), names


NAME_REFUSAL = (
    "is not a name; allowed: up to 80 letters, digits and . _ = + -, starting with a letter or digit "
    f"({NAME_PATTERN}), as it names a folder or file"
)


@pytest.mark.parametrize(
    "name", ["../x", "/abs", "a/b", "..", ".hidden", "", "has space", "trailing\n", "x" * (NAME_MAX + 1), "y" * 300]
)
def test_a_name_that_is_no_single_folder_name_is_refused(name, tmp_path):
    """--name, the file's name and a bundle factor's name become folder, CSV and PNG names. A long one is echoed
    cut to its first SHOWN_MAX characters."""
    shown_name = (
        repr(name) if len(repr(name)) <= SHOWN_MAX else f"{repr(name)[: SHOWN_MAX - 1]}… ({len(repr(name))} characters)"
    )
    with pytest.raises(ConfigError) as error:
        build_plan({"name": "ok"}, name=name)
    assert str(error.value) == f"--name {shown_name} {NAME_REFUSAL}"
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps({"name": name}))
    with pytest.raises(ConfigError) as error:
        load_sweep(path)
    assert str(error.value) == f"{path}: name: {shown_name} {NAME_REFUSAL}"
    path.write_text(json.dumps({"name": "ok", "grid": {name: [{"lr": 0.1}, {"lr": 0.2}]}}))
    with pytest.raises(ConfigError) as error:
        load_sweep(path)
    assert str(error.value) == f"{path}: grid: factor {shown_name} {NAME_REFUSAL}"


def test_names_with_the_characters_trial_names_use_are_accepted():
    plan = build_plan({"name": "a.b_c=d+e-f", "grid": {"my.factor=1": [{"lr": 0.1}]}}, name="Run-2.v=1+x")
    assert plan.name == "Run-2.v=1+x" and plan.trials[0].name == "t000-my.factor=1=lr-0.1"


def test_yaml_1_1_booleans_are_the_strings_amp_takes_and_bool_keys_still_read_them(tmp_path):
    path = tmp_path / "amp.yaml"
    path.write_text("name: amp\nbase: {amp: off, compile: no, dataset: synthetic}\ngrid: {amp: [off, bf16]}\n")
    plan = load_sweep(path)
    assert [(t.config.amp, t.config.compile) for t in plan.trials] == [("off", False), ("bf16", False)]
    assert plan.trials[0].name == "t000-amp=off"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("name: x\ngrid: {batch_size: []}\n", "grid.batch_size is an empty list"),
        (
            "name: x\ngrid: {bach_size: [1]}\n",
            "grid.bach_size: unknown config key 'bach_size' (did you mean 'batch_size'?)",
        ),
        ("name: x\nbase: {optimiser: adam}\n", "base: unknown config key 'optimiser' (did you mean 'optimizer'?)"),
        ("name: x\ngrids: {}\n", "unknown top-level key 'grids' (did you mean 'grid'?); allowed: name,"),
        ("name: x\nrepeat: 2\n", "unknown top-level key 'repeat' (did you mean 'repeats'?)"),
        ("name: x\nbase: {epochs: true}\n", "base: epochs=True: true or false is not a number; allowed: an integer"),
        ("name: x\ngrid: {lr: [0.1, false]}\n", "lr=False: true or false is not a number; allowed: a number"),
        # 10^5 levels: a RecursionError in PyYAML's composer without the cap
        ("name: x\nbase: " + "[" * 100_000 + "]" * 100_000 + "\n", "line 2: nested deeper than 32 levels"),
        ("name: x\nbase: {a: " + "{b: " * 40 + "1" + "}" * 41 + "\n", "line 2: nested deeper than 32 levels"),
        (  # 10^6 trials from 410 bytes: listing them hung for minutes
            "name: x\ngrid:\n"
            + "".join(f"  {key}: [{', '.join(str(n / 100) for n in range(1, 11))}]\n" for key in BIG_GRID_KEYS),
            "the grid makes 1,000,000 trials (10 lr x 10 momentum x 10 weight_decay x 10 dropout x 10 "
            "label_smoothing x 10 warmup_epochs x 1 repeat); allowed: at most 10,000 per sweep",
        ),
        (
            "name: x\ngrid: {width: [" + ", ".join(map(str, range(8, 209))) + "]}\nrepeats: 50\n",
            "the grid makes 10,050 trials (201 width x 50 repeats); allowed: at most 10,000 per sweep",
        ),
        (
            "name: x\ngrid: {optimizer: [sgd, lamb]}\n",
            "trial (optimizer=lamb): optimizer='lamb': not allowed; allowed: one of sgd",
        ),
        ("name: x\nbase: {lr: -1}\n", "base: lr=-1: should be greater than 0"),
        (
            "name: x\ngrid: {workers: [1, 3]}\nbase: {batch_size: 64}\n",
            "trial (workers=3): batch_size=64 must be divisible by workers=3",
        ),
        ("name: x\ngrid: {seed: [1, 2]}\nrepeats: 2\n", "grid.seed and repeats=2 both vary the seed"),
        ("name: x\ngrid: {lr: [0.1, {lr: 0.2}]}\n", "grid.lr mixes mappings and plain values"),
        ("description: no name\n", "name is missing; allowed: a name of up to 80 letters"),
        ("name: has space\n", "name: 'has space' is not a name; allowed: up to 80 letters"),
        ("- just\n- a list\n", "a sweep file is a YAML mapping"),
        ("name: x\nbase: {lr: 0.1\n", "invalid YAML at line"),
        ("name: !!python/object/apply:os.system ['echo pwned']\n", "refused YAML tag"),
        ("name: x\nmetric: accuracy\n", "metric='accuracy': not allowed; allowed: test_acc, train_acc"),
        ("name: x\nbase: {epochs: 010}\n", "line 2: 010 is an integer written with a leading zero"),
        (
            "name: x\ngrid: {lr: [0.1]}\nrepeats: 2\ngrid: {lr: [0.2]}\n",
            "line 4: duplicate key 'grid' (first at line 2); allowed: each key once",
        ),
        ("name: x\nbase:\n  lr: 0.1\n  lr: 0.2\n", "line 4: duplicate key 'lr' (first at line 3)"),
        ("name: x\nbase: {lr: .inf}\n", "base: lr=inf: should be a finite number; allowed: a number"),
        ("name: x\ngrid: {weight_decay: [0.1, .nan]}\n", "weight_decay=nan: should be a finite number"),
        ("name: x\nbase: {seed: 4294967296}\n", "seed=4294967296: should be less than or equal to 4294967295"),
        ("name: x\ngrid: {width: [16, 25]}\nbase: {norm: group}\n", "trial (width=25): norm=group cannot split 25"),
        ("name: x\nbase: {batch_size: 40000, accum_steps: 2}\n", "the effective batch 80000 (batch_size x accum"),
        (  # 5 MB: PyYAML parsed it for 14 s to reach "too many trials"
            "name: x\ngrid: {lr: [" + ", ".join(f"{n / 10**6:.6f}" for n in range(1, 600_000)) + "]}\n",
            "larger than 1,000,000 bytes; allowed: a sweep file up to 1 MB",
        ),
        (
            "name: x\ngrid: {lr: [" + ", ".join(str(n) for n in range(1, 10_002)) + "]}\n",
            "grid.lr has 10,001 values, a trial each; allowed: at most 10,000 trials per sweep",
        ),
    ],
)
def test_invalid_sweep_files_fail_with_one_line(tmp_path, capsys, text, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load_sweep(path)
    assert expected in str(error.value) and str(path) in str(error.value)
    assert main(["sweep", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("cifar-ray: error: ") and "\n" not in err and "Traceback" not in err


# "Billion laughs": 10 lists of 10 aliases of the list before, 10^9 values from 583 bytes; one value per factor, so
# no factor repeats a value. Read whole, repr and pydantic took 3 GB in 34 s.
LAUGHS = "name: lol\ngrid:\n  lr: [&a0 [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]]\n" + "".join(
    f"  f{i}: [&a{i} [{', '.join([f'*a{i - 1}'] * 10)}]]\n" for i in range(1, 9)
)


def test_aliases_expanding_past_the_node_budget_are_one_line_in_bounded_memory(tmp_path):
    """In a child limited to 1 GB of address space, so that a regression dies of MemoryError instead of taking
    the machine: with and without --dry-run (the plan is read before Ray starts), refused at the alias that
    crosses 20,000 values; the child's peak resident memory (VmHWM: ru_maxrss counts the forking pytest too) comes
    back."""
    path = tmp_path / "laughs.yaml"
    path.write_text(LAUGHS)
    script = (
        "import contextlib, io, json, resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30))\n"
        "from cifar_ray.cli import main\n"
        "results = []\n"
        "for argv in json.loads(sys.argv[1]):\n"
        "    err = io.StringIO()\n"
        "    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):\n"
        "        results.append((main(argv), err.getvalue()))\n"
        "peak = [line for line in open('/proc/self/status') if line.startswith('VmHWM:')][0]\n"
        "print(json.dumps([results, int(peak.split()[1])]))\n"
    )
    argvs = [["sweep", str(path), "--dry-run"], ["sweep", str(path), "--storage", str(tmp_path / "runs")]]
    done = subprocess.run([sys.executable, "-c", script, json.dumps(argvs)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    results, peak_kb = json.loads(done.stdout)
    refusal = (
        f"cifar-ray: error: {path}: line 7: more than 20,000 values with its aliases expanded; allowed: up to "
        "20,000 (a sweep file needs a few hundred)\n"
    )
    assert results == [[2, refusal], [2, refusal]] and len(LAUGHS) < 600
    assert peak_kb < 200 * 1024  # about 40 MB: the interpreter and pydantic
    assert not (tmp_path / "runs").exists()


def test_a_sweep_file_with_a_few_aliases_and_a_merge_key_is_read_as_written(tmp_path):
    path = tmp_path / "aliased.yaml"
    path.write_text(
        "name: aliased\nbase: {lr: &lr 0.1, epochs: 1}\n"
        "grid:\n  opt:\n    - &sgd {optimizer: sgd, lr: *lr}\n    - {<<: *sgd, momentum: 0.5}\n"
    )
    plan = load_sweep(path)
    assert [(t.config.optimizer, t.config.lr, t.config.momentum) for t in plan.trials] == [
        ("sgd", 0.1, TrainConfig().momentum),
        ("sgd", 0.1, 0.5),
    ]


def test_a_sweep_file_that_is_not_utf8_is_one_line_naming_the_line(tmp_path, capsys):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: x\ndescription: caf\u00e9\n".encode("latin-1"))
    assert main(["sweep", str(path), "--dry-run"]) == 2
    assert capsys.readouterr().err == (
        f"cifar-ray: error: {path}: line 2: byte 0xe9 is not UTF-8; allowed: a UTF-8 text file\n"
    )
    path.write_bytes("name: x\ndescription: caf\u00e9\n".encode())  # the same text in UTF-8 is read
    assert load_sweep(path).description == "caf\u00e9"


def test_missing_file_and_bad_flags(capsys):
    assert main(["sweep", "no/such.yaml", "--dry-run"]) == 2
    assert "cannot read sweep file no/such.yaml" in capsys.readouterr().err
    assert main(["sweep", str(SWEEPS[0]), "--set", "lr"]) == 2
    assert main(["sweep"]) == 2
    assert main(["train", "--bogus"]) == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_summary_names_the_best_trial_by_the_sweeps_metric_and_mode():
    from cifar_ray.commands.common import best_trial_line

    rows = [
        {"trial": "a", "status": "finished", "test_acc": 0.9, "test_loss": 0.5},
        {"trial": "b", "status": "finished", "test_acc": 0.8, "test_loss": 0.3},
        {"trial": "c", "status": "failed", "test_acc": 0.95, "test_loss": 0.1},
    ]  # not finished: never best
    # "best trial": the report's "best" is a configuration, seeds averaged; the two are named apart
    assert (
        best_trial_line(rows, "test_acc", "max")
        == "best trial by the sweep's metric (test_acc, max, final epoch): a at 90.0%"
    )
    assert best_trial_line(rows, "test_loss", "min").endswith(": b at 0.3")
    assert best_trial_line(rows[2:], "test_loss", "min") is None


def test_summary_and_report_read_best_from_one_place():
    """sweep.json's metric and mode, or the sweep file's defaults where it names none: the same for the end-of-run
    summary's best trial and the report's best configuration (both call runlog.sweep_objective)."""
    import pandas as pd

    from cifar_ray.core.runlog import sweep_objective
    from cifar_ray.core.sweep import SweepFile
    from cifar_ray.report.metrics import resolve_objective

    defaults = SweepFile(name="x")
    assert sweep_objective({}) == (defaults.metric, defaults.mode)
    assert sweep_objective({"metric": "test_loss", "mode": "min"}) == ("test_loss", "min")
    trials = pd.DataFrame({"status": ["finished"], "outcome": ["finished"], "final_test_loss": [0.5]})
    metric, note = resolve_objective({"metric": "test_loss", "mode": "min"}, trials)
    assert (metric.column, metric.better, note) == ("final_test_loss", "min", "")


OPTIMIZER_BUNDLES = {"optimizer": [{"optimizer": "momentum", "lr": 0.05}, {"optimizer": "adam", "lr": 0.001}]}


def test_set_of_a_key_a_bundle_sets_relabels_the_trials_from_what_ran():
    plan = build_plan({"name": "o", "grid": OPTIMIZER_BUNDLES}, {"lr": 0.5})
    assert [(t.config.optimizer, t.config.lr) for t in plan.trials] == [("momentum", 0.5), ("adam", 0.5)]
    assert [t.swept["optimizer"] for t in plan.trials] == ["momentum (lr=0.5)", "adam (lr=0.5)"]
    assert plan.grid == {"optimizer": ["momentum (lr=0.5)", "adam (lr=0.5)"]}
    assert [t.name for t in plan.trials] == ["t000-optimizer=momentum-lr-0.5", "t001-optimizer=adam-lr-0.5"]


def test_bundles_made_one_config_by_set_are_one_value_and_a_bundle_set_whole_leaves_the_grid():
    bundles = {"optimizer": [{"optimizer": "adam", "lr": 0.01}, {"optimizer": "adam", "lr": 0.001}]}
    plan = build_plan({"name": "o", "grid": bundles | {"width": [8, 16]}}, {"lr": 0.5})
    assert [t.swept for t in plan.trials] == [
        {"optimizer": "adam (lr=0.5)", "width": 8},
        {"optimizer": "adam (lr=0.5)", "width": 16},
    ]
    whole = build_plan({"name": "o", "grid": OPTIMIZER_BUNDLES | {"width": [8, 16]}}, {"lr": 0.5, "optimizer": "sgd"})
    assert [t.swept for t in whole.trials] == [{"width": 8}, {"width": 16}] and whole.grid == {"width": [8, 16]}
    assert all((t.config.optimizer, t.config.lr) == ("sgd", 0.5) for t in whole.trials)


@pytest.mark.parametrize(
    "grid, refusal",
    [
        (OPTIMIZER_BUNDLES | {"lr": [0.1, 0.2]}, "grid.optimizer and grid.lr both set lr"),
        ({"lr": [0.1, 0.2], **OPTIMIZER_BUNDLES}, "grid.lr and grid.optimizer both set lr"),
        (OPTIMIZER_BUNDLES | {"schedule": [{"lr": 0.1, "scheduler": "step"}]}, "grid.optimizer and grid.schedule both"),
    ],
)
def test_two_factors_that_set_one_key_are_refused_in_one_line_before_ray(tmp_path, capsys, grid, refusal):
    path = tmp_path / "shared.yaml"
    path.write_text(json.dumps({"name": "shared", "grid": grid}))
    with pytest.raises(ConfigError) as error:
        load_sweep(path)
    assert str(error.value).startswith(f"{path}: {refusal}") and "allowed: each key set by one grid factor" in str(
        error.value
    )
    assert main(["sweep", str(path), "--storage", str(tmp_path / "runs")]) == 2  # refused before Ray starts
    err = capsys.readouterr().err.strip()
    assert err.startswith("cifar-ray: error: ") and "\n" not in err
    assert not (tmp_path / "runs").exists()


def test_every_sweep_file_key_says_what_it_allows():
    """SWEEP_FILE_ALLOWED names what each key of SweepFile takes: pydantic's own words ("Input should be a valid
    integer") said nothing of it."""
    assert set(SWEEP_FILE_ALLOWED) == set(SweepFile.model_fields)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("name: x\nrepeats: 0\n", "repeats=0: should be greater than or equal to 1; allowed: an integer from 1 to"),
        ("name: x\nrepeats: many\n", "repeats='many': should be a valid integer; allowed: an integer from 1 to"),
        ("name: x\nbase: [1]\n", "base=[1]: should be a valid dictionary; allowed: a mapping of config keys"),
        ("name: x\ngrid: {lr: 0.1}\n", "grid.lr=0.1: should be a valid list; allowed: a mapping of factor names"),
        ("name: x\nmode: up\n", "mode='up': not allowed; allowed: max, min"),
        ("name: x\nmax_concurrent: 0\n", "max_concurrent=0: should be greater than or equal to 1; allowed: an"),
    ],
)
def test_a_bad_value_of_a_sweep_file_key_says_what_is_allowed(tmp_path, text, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load_sweep(path)
    assert str(error.value).startswith(f"{path}: {expected}"), str(error.value)


def test_a_refused_value_is_echoed_cut_to_a_line(tmp_path):
    """A 1,000-value list given where a mapping belongs, and a grid repeating a 300-character value: each echoed
    in at most SHOWN_MAX characters and its size, not whole."""
    path = tmp_path / "bad.yaml"
    path.write_text(json.dumps({"name": "x", "base": list(range(1000))}))
    with pytest.raises(ConfigError) as error:
        load_sweep(path)
    assert str(error.value) == (
        f"{path}: base=[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, … (1,000 values): should be a "
        "valid dictionary; allowed: a mapping of config keys to values (cifar-ray keys lists them)"
    )
    path.write_text(json.dumps({"name": "x", "grid": {"note": ["n" * 300, "n" * 300]}}))
    with pytest.raises(ConfigError) as error:
        load_sweep(path)
    assert (
        str(error.value)
        == f"{path}: grid: grid.note repeats a value: '{'n' * 58}… (302 characters); allowed: each value once"
    )


@pytest.mark.parametrize("written, value", [("1e-3", 0.001), ("5E-4", 0.0005), ("1.5e+2", 150.0), ("2e0", 2.0)])
def test_a_number_in_e_notation_is_a_float_in_a_sweep_file_and_in_set(tmp_path, written, value):
    """YAML 1.1 reads 1e-3 as text (its floats want a dot), which the config then refused as a number in quotes."""
    from cifar_ray.core.config import parse_overrides

    path = tmp_path / "e.yaml"
    path.write_text(f"name: e\nbase: {{lr: {written}}}\n")
    assert load_sweep(path).trials[0].config.lr == value
    assert parse_overrides([f"lr={written}"]) == {"lr": value}
