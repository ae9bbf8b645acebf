"""The README and docs/ show what the code does: the README's example sweep file is a real one, the commands name
real files, the table of config keys is the one TrainConfig renders, the committed reports are what the code
renders from their data, the README stays a front page and every relative link leads somewhere."""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path

import pytest

from cifar_ray.core.keys import key_rows, markdown_keys_table

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *DOCS]  # every hand-written Markdown page
README_MAX_LINES = 200
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def section(text: str, heading: str) -> str:
    """The text under `heading` (a whole heading line, e.g. "## Tests"), up to the next heading of that level."""
    level = heading.split(" ", 1)[0]
    return text.split(f"\n{heading}\n", 1)[1].split(f"\n{level} ", 1)[0]


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # a "# comment" in a code block is no heading
    return {anchor(line.lstrip("#")) for line in text.splitlines() if re.match(r"#{1,6} ", line)}


def test_the_example_sweep_file_is_the_file_in_sweeps():
    block = section(README, "## A sweep file").split("```yaml\n", 1)[1].split("```", 1)[0]
    assert block == (ROOT / "sweeps" / "optimizers.yaml").read_text()


def test_every_sweep_file_the_readme_or_docs_name_exists():
    named = {name for page in PAGES for name in re.findall(r"sweeps/[\w.-]+\.yaml", page.read_text())}
    assert named and not [name for name in named if not (ROOT / name).is_file()]


def test_the_config_key_table_is_what_trainconfig_renders():
    page = (ROOT / "docs" / "config-keys.md").read_text()
    table = "".join(line + "\n" for line in page.splitlines() if line.startswith("|"))
    rendered = markdown_keys_table(key_rows())
    diff = "".join(difflib.unified_diff(table.splitlines(True), rendered.splitlines(True), "config-keys.md", "code"))
    assert table == rendered, (
        "docs/config-keys.md's table differs from TrainConfig: replace it with the output of "
        f"`cifar-ray keys --markdown`\n{diff}"
    )


@pytest.mark.parametrize("fmt, file", [("md", "README.md"), ("html", "report.html")])
def test_the_committed_quickstart_report_is_what_the_code_renders_from_its_logs(tmp_path, fmt, file):
    """reports/quickstart/ keeps the demo's logs (reports/quickstart/logs: sweep.json, trial.json, metrics.jsonl, ...)
    beside its report, so a change to the report's text shows here until the committed report is regenerated."""
    from cifar_ray.report import write_report

    written = write_report(ROOT / "reports" / "quickstart" / "logs", out_dir=tmp_path, fmt=fmt)
    assert written.read_text() == (ROOT / "reports" / "quickstart" / file).read_text(), (
        f"reports/quickstart/{file} is stale: run `python tests/regenerate_golden.py` and review the diff"
    )


def test_the_committed_bench_report_is_what_the_code_renders_from_its_json():
    """docs/measurements.md sends readers to reports/bench/README.md for the benchmark's numbers: they must be the
    ones in bench.json beside it."""
    from cifar_ray.report.bench import render

    record = json.loads((ROOT / "reports" / "bench" / "bench.json").read_text())
    assert render(record) == (ROOT / "reports" / "bench" / "README.md").read_text(), (
        "reports/bench/README.md differs from what report.bench.render makes of reports/bench/bench.json: "
        "cifar-ray bench --render"
    )


def test_the_measurements_page_is_what_the_code_renders_from_its_record():
    """Every timing lives in docs/measurements.md, rendered from reports/measurements.json: an edit of one alone
    shows here."""
    from cifar_ray.report import measurements

    record = json.loads((ROOT / measurements.RECORD).read_text())
    assert measurements.render(record) == (ROOT / measurements.PAGE).read_text(), (
        f"{measurements.PAGE} differs from {measurements.RECORD}: cifar-ray bench --render"
    )


def test_the_readme_is_a_front_page():
    lines = README.count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines, at most {README_MAX_LINES}: move detail to docs/"


def test_the_readme_indexes_every_page_in_docs_and_nothing_else():
    index = section(README, "## Documentation")
    indexed = {ROOT / target for target in LINK.findall(index) if target.startswith("docs/")}
    assert indexed == set(DOCS)


def test_the_readme_runs_the_tests_as_ci_does():
    """The README's test command is the one .ci/run runs, and the fresh-machine command ends with it."""
    ci_command = next(line for line in (ROOT / ".ci" / "run").read_text().splitlines() if "pytest" in line)
    block = section(README, "## Tests").split("```bash\n", 1)[1].split("```", 1)[0]
    assert block == ci_command + "\n"
    fresh_machine = section(README, "## Fresh machine: two commands")
    assert f"&& {ci_command}\n```" in fresh_machine


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists() or (fragment and linked.suffix == ".md" and fragment not in anchors(linked)):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)} links to what does not exist: {broken}"
