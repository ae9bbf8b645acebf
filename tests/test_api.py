"""The Python API (cifar_ray/api.py): the command line's refusals raised as UserError with the same messages, a
loaded run's frames and notebook view, the report as the command writes it, the run folder the command leaves
(real Ray), and docs/api.md executed as written (real Ray)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml
from helpers import FAILED, PENDING, make_run, trial_name

import cifar_ray
from cifar_ray import api
from cifar_ray.cli import main
from cifar_ray.cluster import session as ray_session
from cifar_ray.core.errors import ConfigError, StorageError, UsageError, UserError
from cifar_ray.core.sweep import DICT_SOURCE, load_sweep

ROOT = Path(__file__).parent.parent
API_PAGE = ROOT / "docs" / "api.md"
TINY_SWEEP = {
    "name": "tiny",
    "description": "two trials of one epoch",
    "base": {
        "dataset": "synthetic",
        "train_subset": 128,
        "test_subset": 32,
        "train_eval_size": 32,
        "width": 4,
        "epochs": 1,
        "batch_size": 32,
    },
    "grid": {"optimizer": [{"optimizer": "momentum", "lr": 0.05}, {"optimizer": "adam", "lr": 0.002}]},
}


class RayStarted(Exception):
    """Raised by the stand-in for ray_session.init_ray: the call got as far as starting Ray."""


@pytest.fixture
def no_ray(monkeypatch) -> None:
    def init_ray(**options):
        raise RayStarted(options)

    monkeypatch.setattr(ray_session, "init_ray", init_ray)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def test_importing_cifar_ray_is_cheap_and_exports_the_api_lazily():
    script = (
        "import json, sys\n"
        "import cifar_ray\n"
        "heavy = {'torch', 'ray', 'pandas', 'pydantic'}\n"
        "before = sorted(heavy & set(sys.modules))\n"
        "exported = [getattr(cifar_ray, name) is getattr(cifar_ray.api, name) for name in cifar_ray.__all__]\n"
        "print(json.dumps([before, sorted(heavy & set(sys.modules)), exported]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    before, after_lookup, exported = json.loads(done.stdout)
    assert before == [] and after_lookup == []  # looking the functions up imports none of them either
    assert exported and all(exported)
    with pytest.raises(AttributeError):
        cifar_ray.no_such_function  # noqa: B018


def write_sweep_file(folder: Path, sweep: dict = TINY_SWEEP) -> Path:
    path = folder / f"{sweep['name']}.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


def test_a_sweep_dict_plans_what_its_file_plans(tmp_path):
    from_file = load_sweep(write_sweep_file(tmp_path), {"epochs": 2})
    from_dict = api.sweep_plan(TINY_SWEEP, ["epochs=2"])
    assert [(t.name, t.swept, t.config) for t in from_dict.trials] == [
        (t.name, t.swept, t.config) for t in from_file.trials
    ]
    assert from_dict.trials[0].config.epochs == 2 and from_dict.source == DICT_SOURCE


# (API call, the same request on the command line); {sweep}, {storage} filled in per test.
SAME_REFUSALS = [
    (lambda s, storage: api.sweep(s, {"bogus": 1}, storage=storage), ["sweep", "{sweep}", "--set", "bogus=1"]),
    (lambda s, storage: api.sweep(s, ["lr=inf"], storage=storage), ["sweep", "{sweep}", "--set", "lr=inf"]),
    (lambda s, storage: api.sweep(s, name="../x", storage=storage), ["sweep", "{sweep}", "--name", "../x"]),
    (
        lambda s, storage: api.sweep(s, max_concurrent=0, storage=storage),
        ["sweep", "{sweep}", "--max-concurrent", "0"],
    ),
    (
        lambda s, storage: api.sweep(s, storage="foo://user:hunter2@bucket/runs"),
        ["sweep", "{sweep}", "--storage", "foo://user:hunter2@bucket/runs"],
    ),
    (lambda s, storage: api.sweep(s, name="bs-workers", storage=storage), ["sweep", "{sweep}", "--name", "bs-workers"]),
    (
        lambda s, storage: api.train({"batch_size": 2000, "train_subset": 1000}, storage=storage),
        ["train", "--set", "batch_size=2000", "train_subset=1000"],
    ),
    (
        lambda s, storage: api.train({"dataset": "synthetic"}, name="bs-workers", storage=storage),
        ["train", "--set", "dataset=synthetic", "--name", "bs-workers"],
    ),
]


@pytest.mark.parametrize("call, argv", SAME_REFUSALS, ids=lambda x: " ".join(x) if isinstance(x, list) else "")
def test_a_refusal_is_the_command_lines_raised_before_ray_starts_and_writes_nothing(
    call, argv, tmp_path, capsys, no_ray
):
    storage = tmp_path / "runs"
    make_run(storage / "bs-workers")  # a finished run a new one must not overwrite
    sweep_file = write_sweep_file(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    words = [word.replace("{sweep}", str(sweep_file)) for word in argv]
    assert main(words if "--storage" in words else [*words, "--storage", str(storage)]) == 2
    cli_message = capsys.readouterr().err.removeprefix("cifar-ray: error: ").removesuffix("\n")
    with pytest.raises(UserError) as refused:
        call(sweep_file, storage)
    assert str(refused.value) == cli_message and "\n" not in cli_message
    assert "hunter2" not in cli_message
    assert sorted(tmp_path.rglob("*")) == before  # nothing written, no run folder


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda tmp: api.sweep(TINY_SWEEP, "epochs=1"), ConfigError, "overrides are a dict or a list of KEY=VALUE"),
        (lambda tmp: api.sweep_plan({"name": "x", "grid": {"lr": []}}), ConfigError, "<dict>: grid: "),
        (lambda tmp: api.sweep_plan(tmp / "missing.yaml"), ConfigError, "cannot read sweep file"),
        (lambda tmp: api.load(tmp / "nothing"), ConfigError, "no run folder at"),
        (lambda tmp: api.report(tmp / "run", fmt="pdf"), ConfigError, "unknown report format 'pdf'; allowed: md"),
        (lambda tmp: api.report(tmp / "run", baseline="adam"), UsageError, "--baseline expects KEY=VALUE"),
        (lambda tmp: api.load(tmp / "run").report(baseline={"lr": 1}), ConfigError, "'lr' is not a swept factor"),
    ],
)
def test_bad_input_raises_a_user_error_and_never_exits(call, error, message, tmp_path, no_ray):
    make_run(tmp_path / "run")
    with pytest.raises(error, match=re.escape(message)):
        call(tmp_path)


def test_a_storage_uri_refusal_is_a_storage_error(tmp_path, no_ray):
    with pytest.raises(StorageError, match="no bucket or folder in the URI"):
        api.train({"dataset": "synthetic"}, storage="s3://")


class TableRows(HTMLParser):
    """The text of each <td> of each body row of the HTML tables fed to it."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.headers: list[str] = []
        self._cell: list[str] | None = None
        self._in_body = False

    def handle_starttag(self, tag, attrs):
        if tag == "tbody":
            self._in_body = True
        elif tag == "tr" and self._in_body:
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            text = "".join(self._cell).strip()
            (self.rows[-1] if self._in_body and tag == "td" else self.headers).append(text)
            self._cell = None
        elif tag == "tbody":
            self._in_body = False

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def test_a_loaded_run_shows_its_trial_table_in_a_notebook(tmp_path):
    written = make_run(tmp_path / "bs")
    run = cifar_ray.load(tmp_path / "bs")
    assert list(run.trials["trial"]) == [trial_name(i) for i in range(len(written))]
    assert len(run.epochs) == sum(len(epochs) for epochs in written.values())
    html = run._repr_html_()
    assert "bs-workers: 8 trial(s) (5 finished, 1 failed, 1 diverged, 1 pending)" in html
    table = TableRows()
    table.feed(html)
    assert table.headers == list(run.trials.columns)
    assert [row[0] for row in table.rows] == [trial_name(i) for i in range(len(written))]
    status = table.headers.index("status")
    assert table.rows[FAILED][status] == "failed" and table.rows[PENDING][status] == "pending"
    assert table.rows[PENDING][table.headers.index("final_test_acc")] == "—"  # no epoch: no accuracy
    assert repr(run).startswith("<Run bs-workers: 8 trial(s)")


def test_the_api_report_is_the_command_lines(tmp_path, capsys):
    make_run(tmp_path / "bs")
    argv = ["report", str(tmp_path / "bs"), "--out", str(tmp_path / "cli"), "--format", "json"]
    assert main([*argv, "--baseline", "batch_size=128"]) == 0
    assert capsys.readouterr().out == f"{tmp_path / 'cli' / 'report.json'}\n"
    from_text = api.report(tmp_path / "bs", tmp_path / "text", "batch_size=128", "json")
    from_run = cifar_ray.load(tmp_path / "bs").report(tmp_path / "run", {"batch_size": 128}, "json")
    expected = (tmp_path / "cli" / "report.json").read_bytes()
    assert from_text.read_bytes() == expected and from_run.read_bytes() == expected
    assert json.loads(expected)["factors"]["batch_size"]["baseline"] == 128


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.S | re.M)


def test_the_api_page_has_code_that_compiles():
    blocks = python_blocks(API_PAGE)
    assert len(blocks) >= 5
    for block in blocks:
        compile(block, str(API_PAGE), "exec")


def folder_shape(run_dir: Path) -> dict[str, object]:
    """What a run folder holds, less what differs between any two runs: the files by relative path (numbers and
    Ray's hashes made N), and the keys of sweep.json, of each trial.json and of each metrics.jsonl row."""
    shape: dict[str, object] = {}
    for path in sorted(run_dir.rglob("*")):
        relative = re.sub(r"[0-9a-f]{8}|\d+", "N", str(path.relative_to(run_dir)))
        if path.name in ("sweep.json", "trial.json"):
            shape[relative] = sorted(json.loads(path.read_text()))
        elif path.name == "metrics.jsonl":
            shape[relative] = [sorted(json.loads(line)) for line in path.read_text().splitlines()]
        else:
            shape[relative] = path.is_dir()
    return shape


@pytest.mark.slow
def test_the_api_page_runs_as_written_and_the_command_line_leaves_the_same_run_folder(
    ray_cluster, tmp_path, monkeypatch, capsys
):
    """docs/api.md's Python blocks, in order, in one namespace, in a scratch folder that holds only a link to
    sweeps/: its runs and reports land in runs/ there. Then `cifar-ray sweep` runs the page's sweep as a file with
    the same overrides: the same run folder, the same trial table, the same progress lines."""
    (tmp_path / "sweeps").symlink_to(ROOT / "sweeps")
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    for block in python_blocks(API_PAGE):
        exec(compile(block, str(API_PAGE), "exec"), namespace)
    printed = capsys.readouterr().out
    assert "already holds a finished run of 'api-demo'" in printed
    run = cifar_ray.load("runs/api-demo")
    assert run.status_counts() == {"finished": 2} and len(run.epochs) == 2
    assert cifar_ray.load("runs/api-one").status_counts() == {"finished": 1}
    assert (tmp_path / "runs" / "api-demo-report" / "README.md").is_file()
    assert (tmp_path / "runs" / "api-demo-json" / "report.json").is_file()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["runs", "sweeps"]  # nothing beside runs/

    sweep_file = write_sweep_file(tmp_path, namespace["sweep"])
    assert main(["sweep", str(sweep_file), "--set", "epochs=1", "batch_size=32", "--storage", "cli"]) == 0
    cli_shape, api_shape = folder_shape(tmp_path / "cli" / "api-demo"), folder_shape(tmp_path / "runs" / "api-demo")
    assert cli_shape == api_shape
    assert "api-demo/sweep.json" not in cli_shape and "sweep.json" in cli_shape
    assert sum("trial.json" in path for path in api_shape) == 2
    from_cli = cifar_ray.load(tmp_path / "cli" / "api-demo")
    assert list(from_cli.trials.columns) == list(run.trials.columns)
    assert list(from_cli.trials["trial"]) == list(run.trials["trial"])
    api_progress = [line for line in printed.splitlines() if " epoch 1/1 " in line and "optimizer" in line]
    cli_progress = [line for line in capsys.readouterr().out.splitlines() if " epoch 1/1 " in line]
    assert len(api_progress) == 2 == len(cli_progress)  # the same progress, printed
