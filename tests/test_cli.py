"""The command line's fast failures: what it refuses before Ray starts, and what it never imports."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_cifar_fixture
from helpers import fake_gpus

from cifar_ray.api import ensure_local_data
from cifar_ray.cli import build_parser, main
from cifar_ray.cluster import orchestrate
from cifar_ray.cluster import session as ray_session
from cifar_ray.commands import COMMANDS
from cifar_ray.commands.common import rerun_command
from cifar_ray.core import runlog
from cifar_ray.core import storage as run_storage
from cifar_ray.core.config import TrainConfig, parse_overrides
from cifar_ray.core.estimate import StepTime
from cifar_ray.core.keys import key_rows, markdown_keys_table
from cifar_ray.core.run import RunFolder
from cifar_ray.core.strict_yaml import parse_value
from cifar_ray.core.sweep import build_plan, load_sweep, single_run_plan
from cifar_ray.training import data, step_time

SWEEPS = Path(__file__).parent.parent / "sweeps"


class RayStarted(Exception):
    """Raised by the stand-in for ray_session.init_ray: the command got as far as starting Ray."""


@pytest.fixture
def ray_start(monkeypatch) -> None:
    """Starting Ray raises RayStarted (a session Ray may be running already, so ray.is_initialized()
    cannot tell whether this command started one)."""

    def init_ray(**options):
        raise RayStarted(options)

    monkeypatch.setattr(ray_session, "init_ray", init_ray)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


@pytest.fixture
def downloads(monkeypatch) -> list[str]:
    """CIFAR-10 downloads attempted; each fails at once, as offline."""
    import torchvision.datasets.utils as tv_utils

    attempted: list[str] = []

    def fail(url, *args, **kwargs):
        attempted.append(url)
        raise OSError("network is unreachable")

    monkeypatch.setattr(tv_utils, "download_and_extract_archive", fail)
    return attempted


def no_torch_nor_ray(*argvs: list[str]) -> list[tuple[int, str]]:
    """(exit code, stderr) of main(argv) for each argv, in a fresh Python that must import neither torch nor ray."""
    script = (
        "import contextlib, io, json, sys\n"
        "from cifar_ray.cli import main\n"
        "results = []\n"
        "for argv in json.loads(sys.argv[1]):\n"
        "    err = io.StringIO()\n"
        "    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):\n"
        "        try:\n"
        "            code = main(argv)\n"
        "        except SystemExit as stop:\n"
        "            code = stop.code\n"
        "    results.append((code, err.getvalue()))\n"
        "print(json.dumps(results))\n"
        "imported = {'torch', 'ray'} & set(sys.modules)\n"
        "assert not imported, imported\n"
    )
    done = subprocess.run([sys.executable, "-c", script, json.dumps(argvs)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return [tuple(result) for result in json.loads(done.stdout)]


def test_missing_cifar_is_one_line_before_ray_starts_on_the_embedded_ray_only(tmp_path, capsys, ray_start, downloads):
    empty, storage = tmp_path / "no-cifar", tmp_path / "runs"
    code = main(["train", "--storage", str(storage), "--set", f"data_dir={empty}"])
    err = capsys.readouterr().err
    assert code == 2 and downloads == [data.CIFAR_URL]
    assert err.startswith(f"cifar-ray: error: CIFAR-10 is not in {empty}") and err.count("\n") == 1, err
    assert "network is unreachable" in err and not storage.exists()  # no run folder

    staged = tmp_path / "staged"
    write_cifar_fixture(staged, per_batch=10, n_test=10)
    with pytest.raises(RayStarted):  # the check passed, without a download
        main(["train", "--storage", str(storage), "--set", f"data_dir={staged}", "batch_size=8"])
    with pytest.raises(RayStarted):  # on a cluster each node reads its own data_dir: no check here
        main(["train", "--address", "127.0.0.1:6379", "--storage", str(storage), "--set", f"data_dir={empty}"])
    assert len(downloads) == 1


def test_an_unusable_storage_is_one_line_before_ray_starts(tmp_path, capsys, ray_start):
    assert main(["train", "--storage", "foo://user:hunter2@bucket/runs", "--set", "dataset=synthetic"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cifar-ray: error: storage foo://bucket/runs: ") and err.count("\n") == 1, err


@pytest.mark.parametrize("storage", ["", " "])
def test_an_empty_storage_is_one_line_before_ray_starts(tmp_path, capsys, ray_start, monkeypatch, storage):
    """`--storage ''` ran the sweep into the current folder."""
    monkeypatch.chdir(tmp_path)
    for argv in (["train"], ["sweep", str(SWEEPS / "quickstart.yaml")]):
        assert main([*argv, "--storage", storage, "--set", "dataset=synthetic"]) == 2
        assert (
            capsys.readouterr().err
            == f"cifar-ray: error: storage {storage!r} names no folder; pass {run_storage.ALLOWED}\n"
        )
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_under_the_lease_is_one_line_before_ray_starts(tmp_path, capsys, ray_start, monkeypatch):
    """A disk with no byte free still makes empty files (the write check passes); the lease's write then failed
    with a traceback."""

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(run_storage.os, "fsync", full)
    assert main(["train", "--storage", str(tmp_path / "runs"), "--set", "dataset=synthetic"]) == 2
    err = capsys.readouterr().err
    line = rf"cifar-ray: error: cannot write {re.escape(str(tmp_path))}/runs/train-[0-9-]+/driver.lease: No space left "
    assert re.fullmatch(line + r"on device\n", err), err


def test_a_storage_that_cannot_be_written_is_one_line_before_ray_starts(tmp_path, capsys, ray_start):
    """Ray used to start, then a traceback came 19 s later. Tests run as root, whom a folder's mode does not stop:
    a folder under a file is one that nobody can make."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for storage in (blocker, blocker / "runs"):
        for argv in (["train"], ["sweep", str(SWEEPS / "quickstart.yaml")]):
            assert main([*argv, "--storage", str(storage), "--set", "dataset=synthetic"]) == 2
            assert capsys.readouterr().err == (
                f"cifar-ray: error: --storage {storage} cannot be written: {blocker} is a file, not a folder; "
                "allowed: a folder you can write\n"
            )
    assert sorted(tmp_path.iterdir()) == [blocker]  # the check leaves nothing behind


def test_ensure_local_data_checks_each_cifar_data_dir_once(tmp_path, monkeypatch):
    checked: list[str] = []
    monkeypatch.setattr(data, "ensure_cifar10", checked.append)
    ensure_local_data(load_sweep(SWEEPS / "batch_size.yaml", {"data_dir": str(tmp_path / "a")}))  # 10 trials
    ensure_local_data(single_run_plan({"dataset": "synthetic"}, "x"))
    dirs = [str(tmp_path / "b"), str(tmp_path / "c")]
    ensure_local_data(build_plan({"name": "d", "grid": {"data_dir": dirs, "dataset": ["cifar10", "synthetic"]}}))
    assert checked == [str(tmp_path / "a"), *dirs]


def write_run(storage: Path, name: str, statuses: list[str], **sweep) -> Path:
    run_dir = storage / name
    trials = [f"t{i:03d}-seed={i}" for i in range(len(statuses))]
    runlog.write_json(run_dir / runlog.SWEEP_FILE, {"name": name, "trials": trials, "slots": True} | sweep)
    for trial, status in zip(trials, statuses):
        runlog.write_json(run_dir / trial / runlog.TRIAL_FILE, {"name": trial, "status": status})
    return run_dir


@pytest.mark.parametrize(
    "statuses, sweep, finished",
    [
        (["finished", "running"], {}, False),
        (["finished", "pending"], {}, False),
        (["finished", "failed"], {}, True),
        (["finished", "running"], {"finished_at": "2026-01-01T00:00:00+0000"}, True),
    ],
)
def test_a_folder_holding_a_run_is_refused_before_ray_starts(tmp_path, capsys, ray_start, statuses, sweep, finished):
    sweep_file = tmp_path / "fake.yaml"
    sweep_file.write_text("name: fake\nbase: {dataset: synthetic}\ngrid: {seed: [0, 1]}\n")
    storage = tmp_path / "runs"
    run_dir = write_run(storage, "fake", statuses, **sweep)
    before = sorted(p.relative_to(storage) for p in storage.rglob("*"))
    assert main(["sweep", str(sweep_file), "--storage", str(storage)]) == 2
    err = capsys.readouterr().err
    if finished:
        assert err == (
            f"cifar-ray: error: {run_dir} already holds a finished run of 'fake' (2 trials): see it with "
            f"`cifar-ray report {run_dir}`; pass --name NEW to start another, or delete the folder\n"
        )
    else:
        assert err == (
            f"cifar-ray: error: {run_dir} already holds an unfinished run of 'fake': pass --resume to "
            "finish it, --name NEW to start another, or delete the folder\n"
        )
    assert sorted(p.relative_to(storage) for p in storage.rglob("*")) == before  # nothing written
    with pytest.raises(RayStarted):  # --resume goes on to Ray (which compares the resolved configs, then resumes)
        main(["sweep", str(sweep_file), "--storage", str(storage), "--resume"])
    [(code, subprocess_err)] = no_torch_nor_ray(["sweep", str(sweep_file), "--storage", str(storage)])
    assert (code, subprocess_err) == (2, err)


@pytest.mark.parametrize(
    "sweep, refusal",
    [
        (None, "nothing to resume in {run_dir}: no interrupted run of 'fake' there; run without --resume"),
        ({"trials": ["t000-lr=0.1"]}, "{run_dir} holds a different sweep (its trials differ from this file's)"),
        ({"slots": None, "warm": None}, "{run_dir} was started with --isolate by an older cifar-ray"),
    ],
    ids=["no run", "another sweep", "an old --isolate run"],
)
def test_a_resume_of_no_run_or_of_another_is_refused_before_ray_starts(tmp_path, capsys, ray_start, sweep, refusal):
    sweep_file = tmp_path / "fake.yaml"
    sweep_file.write_text("name: fake\nbase: {dataset: synthetic}\ngrid: {seed: [0, 1]}\n")
    storage = tmp_path / "runs"
    run_dir = storage / "fake"
    if sweep is not None:
        write_run(storage, "fake", ["finished", "running"], **sweep)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert main(["sweep", str(sweep_file), "--storage", str(storage), "--resume"]) == 2  # RayStarted not raised
    assert capsys.readouterr().err.startswith(f"cifar-ray: error: {refusal.format(run_dir=run_dir)}")
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing written


def test_new_run_refusal_is_none_without_a_run(tmp_path):
    assert RunFolder(tmp_path / "nothing").new_run_refusal("x") is None
    (tmp_path / "empty").mkdir()
    assert RunFolder(tmp_path / "empty").new_run_refusal("x") is None
    run_dir = write_run(tmp_path, "one", ["oom"])
    assert f"finished run of 'x' (1 trial): see it with `cifar-ray report {run_dir}`" in RunFolder(
        run_dir
    ).new_run_refusal("x")


def test_bare_command_prints_the_usage_and_errors_name_the_subcommand_once(capsys):
    assert main([]) == 2
    out, err = capsys.readouterr()
    assert not out and err == build_parser().format_help()
    assert main(["sweep", str(SWEEPS / "quickstart.yaml"), "--max-concurrent", "x"]) == 2
    assert capsys.readouterr().err == "cifar-ray sweep: error: argument --max-concurrent: invalid int value: 'x'\n"
    assert main(["bogus"]) == 2
    assert capsys.readouterr().err.startswith("cifar-ray: error: unknown command 'bogus'; allowed: train, ")


def test_help_version_usage_errors_and_dry_run_import_neither_torch_nor_ray():
    quickstart = str(SWEEPS / "quickstart.yaml")
    results = no_torch_nor_ray(
        ["--help"],
        ["--version"],
        [],
        ["train", "--bogus"],
        ["sweep", quickstart, "--dry-run"],
        ["sweep", quickstart, "--dry-run", "--set", "batch_size=0"],
        ["sweep", str(SWEEPS / "batch_size.yaml"), "--dry-run", "--json"],
        ["sweep", "--set", "epochs=1", quickstart, "--dry-run"],
        ["sweep", "--help"],
        ["keys"],
    )
    assert [code for code, _ in results] == [0, 0, 2, 2, 0, 2, 0, 0, 0, 0]
    assert results[5][1].startswith("cifar-ray: error: --set: batch_size=0: should be greater than or equal to 1")


def test_version_is_the_installed_package_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    [declared] = re.findall(r'^version = "(.+)"$', (SWEEPS.parent / "pyproject.toml").read_text(), re.MULTILINE)
    assert (
        capsys.readouterr().out == f"cifar-ray {importlib.metadata.version('cifar-ray')}\n" == f"cifar-ray {declared}\n"
    )


def test_keys_lists_every_config_key_with_its_default_and_meaning(capsys):
    assert main(["keys"]) == 0
    listed = capsys.readouterr().out
    for key, field in TrainConfig.model_fields.items():
        assert re.search(rf"^{key} ", listed, re.MULTILINE), key
        assert field.description.split()[0] in listed, key
    assert main(["keys", "--markdown"]) == 0
    assert capsys.readouterr().out == markdown_keys_table(key_rows())


def test_every_subcommand_is_a_command_module_with_its_examples():
    parser = build_parser()
    [subcommands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]  # argparse's own table
    assert list(subcommands.choices) == list(COMMANDS)
    for name, module in COMMANDS.items():
        assert module.__name__ == f"cifar_ray.commands.{name}" and callable(module.run) and module.EXAMPLES, name


QUICKSTART = str(SWEEPS / "quickstart.yaml")


@pytest.mark.parametrize(
    "argv",
    [
        ["sweep", QUICKSTART, "--set", "epochs=1", "lr=0.1"],
        ["sweep", "--set", "epochs=1", "lr=0.1", QUICKSTART],
        ["sweep", "--set", "epochs=1", QUICKSTART, "--set", "lr=0.1"],
        ["sweep", "--set", "epochs=1", "--dry-run", "--set", "lr=0.1", QUICKSTART],
        ["sweep", "--set=epochs=1", "lr=0.1", QUICKSTART],
        ["sweep", "--set", "epochs=1", "lr=0.1", "--", QUICKSTART],
    ],
)
def test_set_takes_its_key_values_before_or_after_the_sweep_file(argv, capsys):
    args = build_parser().parse_args(argv)
    assert (args.file, args.set) == (QUICKSTART, ["epochs=1", "lr=0.1"])
    assert main(["sweep", "--dry-run", "--json", *argv[1:]]) == 0  # before any "--"
    trials = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert {(t["config"]["epochs"], t["config"]["lr"]) for t in trials} == {(1, 0.1)}


def test_train_takes_several_set_flags():
    args = build_parser().parse_args(["train", "--set", "epochs=1", "lr=0.1", "--name", "x", "--set", "seed=3"])
    assert (args.set, args.name) == (["epochs=1", "lr=0.1", "seed=3"], "x")


ALLOWED = "; allowed: the options of `cifar-ray {} --help`"


@pytest.mark.parametrize(
    "argv, error",
    [
        (
            ["sweep", "--set", "epochs=1", QUICKSTART, "lr=0.1"],
            "cifar-ray: error: unrecognized arguments: lr=0.1" + ALLOWED.format("sweep"),
        ),
        (["sweep", "--set", "epochs=1"], "cifar-ray sweep: error: the following arguments are required: file"),
        (["train", "--set", "epochs"], "cifar-ray: error: --set expects KEY=VALUE, got 'epochs'"),
        (["train", "--set"], "cifar-ray train: error: argument --set: expected at least one argument"),
        (
            ["train", "--set", "epochs=1", "bogus"],
            "cifar-ray: error: unrecognized arguments: bogus" + ALLOWED.format("train"),
        ),
        # no abbreviations: --resume and --set are what rerun_command and the --set rewriting look for
        (
            ["sweep", QUICKSTART, "--res"],
            "cifar-ray: error: unrecognized arguments: --res (did you mean --resume?)" + ALLOWED.format("sweep"),
        ),
        (
            ["sweep", QUICKSTART, "--se", "epochs=1"],
            "cifar-ray: error: unrecognized arguments: --se epochs=1 (did you mean --set?)" + ALLOWED.format("sweep"),
        ),
    ],
)
def test_set_errors_stay_one_line(argv, error, capsys, ray_start):
    assert main(argv) == 2
    assert capsys.readouterr().err == error + "\n"


@pytest.mark.parametrize(
    "argv, error",
    [
        (["swep", QUICKSTART], "cifar-ray: error: unknown command 'swep' (did you mean 'sweep'?); allowed: train, "),
        (
            ["sweep", "sweeps/quickstat.yaml", "--dry-run"],
            "cifar-ray: error: cannot read sweep file sweeps/quickstat.yaml: No such file or directory (did you mean "
            "sweeps/quickstart.yaml?)",
        ),
        (["train", "--set", "lr=-0.1"], "lr=-0.1: should be greater than 0; allowed: a number greater than 0"),
        (["train", "--set", "lr=abc"], "lr='abc': should be a valid number; allowed: a number greater than 0"),
        (
            ["train", "--set", "epochs=0"],
            "epochs=0: should be greater than or equal to 1; allowed: an integer at least 1",
        ),
    ],
)
def test_a_misspelt_command_or_file_is_matched_and_an_allowed_value_names_its_bounds(argv, error, capsys, ray_start):
    """Issue 51's messages: the nearest command and sweep file are suggested; `allowed` says the bounds."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert error in err and len(err.strip().splitlines()) == 1


def test_a_number_in_quotes_in_a_sweep_file_is_text_not_a_number(tmp_path, capsys, ray_start):
    """Strict YAML everywhere else reads "64" as text; the sweep file's values no longer become numbers quietly."""
    sweep = tmp_path / "q.yaml"
    sweep.write_text('name: q\ngrid: {batch_size: ["64"]}\n')
    assert main(["sweep", str(sweep), "--dry-run"]) == 2
    assert "batch_size='64': a number in quotes is text: write it without quotes" in capsys.readouterr().err


def help_examples(command: str, capsys) -> list[list[str]]:
    """The example commands at the end of `cifar-ray COMMAND --help`, as shell words."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    epilog = capsys.readouterr().out.partition("\nexamples:\n")[2]
    return [shlex.split(line) for line in epilog.splitlines() if line.startswith("  cifar-ray ")]


def test_every_help_example_parses_and_names_real_sweeps_and_runs(capsys, monkeypatch):
    monkeypatch.chdir(SWEEPS.parent)  # the examples use paths relative to the repository, as README does
    timed = []  # `--estimate`'s step timing, the quickstart's full-size steps ~8 s here: test_estimate.py times steps
    monkeypatch.setattr(step_time, "time_step", lambda cfg: timed.append(cfg) or StepTime(0.01, 1e-4, 0.5))
    sweeps = {plan.name: plan for plan in map(load_sweep, sorted(SWEEPS.glob("*.yaml")))}
    for command in COMMANDS:
        examples = help_examples(command, capsys)
        assert 2 <= len(examples) <= 4, (command, examples)
        for words in examples:
            args = build_parser().parse_args(words[1:])
            assert words[0] == "cifar-ray" and args.command == command, words
            if command == "train":
                single_run_plan(parse_overrides(args.set), "example")
            if command == "sweep":  # the file exists and the --set values fit it
                assert main([*words[1:], "--dry-run"]) == 0, capsys.readouterr().err
                capsys.readouterr()
            if command == "report":  # <...>runs/<name of a sweep in sweeps/>, its baseline a value of that sweep's grid
                for run_dir in args.run_dir:
                    folder, name = run_dir.split("/")
                    assert folder.endswith("runs") and name in sweeps, run_dir
                if args.baseline:
                    key, _, value = args.baseline.partition("=")
                    assert parse_value(value) in sweeps[name].grid[key], args.baseline
    assert timed  # an example estimates, up to its timing


def test_the_recorded_command_reruns_the_sweep_as_typed(tmp_path, monkeypatch):
    """sweep.json's "command" is what a user types to run the sweep again: no venv path, no --resume, no secret."""
    assert rerun_command(["sweep", "sweeps/x.yaml", "--resume", "--set", "description=a b"]) == (
        "cifar-ray sweep sweeps/x.yaml --set 'description=a b'"
    )
    assert rerun_command(["sweep", "--resume", "x.yaml", "--storage", "s3://key:hunter2@bucket/runs?region=x"]) == (
        "cifar-ray sweep x.yaml --storage 's3://bucket/runs?region=x'"
    )

    recorded = []

    def run_plan(plan, options, run=None):
        recorded.append(options.command)
        raise RayStarted

    monkeypatch.setattr(ray_session, "init_ray", lambda **options: False)  # Ray "already up", not ours to stop
    monkeypatch.setattr(orchestrate, "run_plan", run_plan)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    argv = ["sweep", "--set", "dataset=synthetic", "epochs=1", QUICKSTART, "--storage", str(tmp_path), "--isolate"]
    with pytest.raises(RayStarted):
        main(argv)
    assert recorded == [shlex.join(["cifar-ray", *argv])]


def test_an_unfinished_train_folder_is_not_offered_resume(tmp_path, capsys, ray_start):
    """`cifar-ray train` has no --resume: its refusal offers only --name and deleting the folder."""
    run_dir = write_run(tmp_path, "mine", ["running"])
    assert main(["train", "--storage", str(tmp_path), "--name", "mine", "--set", "dataset=synthetic"]) == 2
    assert capsys.readouterr().err == (
        f"cifar-ray: error: {run_dir} already holds an unfinished run of 'mine': "
        "pass --name NEW to start another, or delete the folder\n"
    )


# Values that used to fail only inside a worker after Ray started, and names that would leave the storage: each is
# one line and exit 2 from `sweep`, `sweep --dry-run` and `train`, before Ray starts and before anything is written.
LATE_FAILURES = [
    (["--name", "../x"], "--name '../x' is not a name; allowed: up to 80 letters, digits and . _ = + -"),
    (["--name", "/tmp/abs"], "--name '/tmp/abs' is not a name; allowed: "),
    (["--name", "a/b"], "--name 'a/b' is not a name; allowed: "),
    (["--set", "lr=inf"], "--set: lr='inf': should be a finite number; allowed: a number"),
    (["--set", "warmup_epochs=nan"], "warmup_epochs='nan': should be a finite number; allowed: a number"),
    (["--set", "seed=4294967296"], "seed=4294967296: should be less than or equal to 4294967295"),
    (["--set", "norm=group", "width=17"], "norm=group cannot split 17 channels into 2 groups of about 8"),
    (["--set", "batch_size=2000"], "the effective batch 2000 (batch_size x accum_steps) is larger than the 1000"),
    (["--set", "epochs=010"], "--set: epochs: 010 is an integer written with a leading zero"),
    (["--set", "epochs=true"], "epochs=True: true or false is not a number; allowed: an integer"),
    (["--set", "epochs=2", "lr=0.1", "epochs=3"], "--set: epochs is given twice; allowed: each key once"),
]


@pytest.mark.parametrize("words, message", LATE_FAILURES, ids=lambda x: " ".join(x) if isinstance(x, list) else "")
def test_values_that_fail_late_are_one_line_before_ray_starts(words, message, tmp_path, capsys, ray_start):
    sweep_file = tmp_path / "tiny.yaml"
    sweep_file.write_text("name: tiny\nbase: {dataset: synthetic, train_subset: 1000, batch_size: 64}\n")
    storage = tmp_path / "store" / "runs"
    common = ["--storage", str(storage), *words, "--set", "dataset=synthetic", "train_subset=1000"]
    argvs = [["sweep", str(sweep_file), *common, "--dry-run"], ["sweep", str(sweep_file), *common], ["train", *common]]
    for argv in argvs:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("cifar-ray: error: ") and message in err and err.count("\n") == 1, (argv, err)
    assert sorted(tmp_path.rglob("*")) == [sweep_file]  # no run folder, inside the storage or out of it
    [(code, err)] = no_torch_nor_ray(argvs[0])
    assert code == 2 and message in err


def test_bf16_on_a_local_gpu_older_than_ampere_is_one_line_before_ray_starts(tmp_path, capsys, ray_start, monkeypatch):
    fake_gpus(monkeypatch, ("NVIDIA A100", (8, 0)), ("Tesla V100-SXM2-16GB", (7, 0)))
    storage = tmp_path / "runs"
    for use_gpu in ("auto", "true"):
        assert (
            main(["train", "--storage", str(storage), "--set", "dataset=synthetic", "amp=bf16", f"use_gpu={use_gpu}"])
            == 2
        )
        err = capsys.readouterr().err
        assert err == (
            "cifar-ray: error: amp=bf16 needs a GPU of compute capability 8.0 (Ampere) or newer, but Tesla "
            "V100-SXM2-16GB is 7.0: bf16 runs emulated or fails in cuDNN there; use amp=fp16 or amp=off\n"
        )
    assert not storage.exists()
    for words in (["amp=bf16", "use_gpu=false"], ["amp=fp16"]):  # on CPU, or not bf16: Ray starts
        with pytest.raises(RayStarted):
            main(["train", "--storage", str(storage), "--set", "dataset=synthetic", *words])
    fake_gpus(monkeypatch, ("NVIDIA H100", (9, 0)))
    with pytest.raises(RayStarted):
        main(["train", "--storage", str(storage), "--set", "dataset=synthetic", "amp=bf16"])


def test_yaml_1_1_words_are_amps_strings_in_set(capsys):
    assert main(["sweep", str(SWEEPS / "amp.yaml"), "--dry-run", "--json", "--set", "amp=off", "compile=no"]) == 0
    trials = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert {(t["config"]["amp"], t["config"]["compile"]) for t in trials} == {("off", False)}


def test_bench_writes_nothing_git_tracks_unless_told_and_refuses_an_out_it_cannot_write(tmp_path, monkeypatch, capsys):
    """`cifar-ray bench` wrote into the committed reports/bench/; --render re-renders that page, as it says."""
    from cifar_ray.commands import bench

    written = []
    monkeypatch.setattr(bench, "run_bench", lambda quick, out_dir, say: written.append(out_dir) or Path(out_dir))
    monkeypatch.setattr(bench, "render_pages", lambda out_dir: written.append(out_dir) or [])
    assert main(["bench"]) == 0 and main(["bench", "--render"]) == 0
    assert written == ["runs/bench", "reports/bench"]
    root = SWEEPS.parent
    tracked = subprocess.run(["git", "ls-files", "--", "runs/bench"], cwd=root, capture_output=True, text=True)
    ignored = subprocess.run(["git", "check-ignore", "-q", "runs/bench/bench.json"], cwd=root)
    assert tracked.returncode == 0 and tracked.stdout == "" and ignored.returncode == 0

    monkeypatch.undo()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["bench", "--quick", "--out", str(blocker / "bench")]) == 2  # before the minutes of measuring
    assert capsys.readouterr().err == (
        f"cifar-ray: error: --out {blocker / 'bench'}: cannot write there: {blocker} is a file, not a folder; "
        "allowed: a folder you can write\n"
    )


def test_a_ray_that_does_not_start_is_one_line_not_a_traceback(tmp_path):
    """On a machine at load 30, Ray's local node timed out during its start: the sweep ended in a 20-line traceback.
    In a child process (its Ray, if any, is its own), ray.init fails as Ray's Node does."""
    script = (
        "import ray\n"
        "def timed_out(*args, **kwargs):\n"
        "    raise Exception('The current node timed out during startup. This could happen because some of the raylet "
        "failed to startup or the GCS has become overloaded.')\n"
        "ray.init = timed_out\n"
        "import sys\nfrom cifar_ray.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    sweep = tmp_path / "tiny.yaml"
    sweep.write_text("name: tiny\nbase: {dataset: synthetic, epochs: 1}\n")
    command = [sys.executable, "-c", script, "sweep", str(sweep), "--storage", str(tmp_path / "runs")]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(
        "cifar-ray: error: Ray did not start on this machine: The current node timed out during startup. "
    )
    assert done.stderr.rstrip().endswith("nothing of the run was trained: run the same command again")
