"""The README shows what the code does: its example sweep file is a real one, its commands name real files, its
table of config keys is the one TrainConfig renders."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from cifar_ray.core.config import key_rows, markdown_keys_table

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()


def test_the_example_sweep_file_is_the_file_in_sweeps():
    section = README.split("## Sweep files", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert block == (ROOT / "sweeps" / "optimizers.yaml").read_text()


def test_every_sweep_file_the_readme_names_exists():
    named = set(re.findall(r"sweeps/[\w.-]+\.yaml", README))
    assert named and not [name for name in named if not (ROOT / name).is_file()]


def test_the_config_key_table_is_what_trainconfig_renders():
    section = README.split("\n## Config keys\n", 1)[1].split("\n## ", 1)[0]
    table = "".join(line + "\n" for line in section.splitlines() if line.startswith("|"))
    rendered = markdown_keys_table(key_rows())
    diff = "".join(difflib.unified_diff(table.splitlines(True), rendered.splitlines(True), "README.md", "rendered"))
    assert table == rendered, (
        "README.md's Config keys table differs from TrainConfig: replace it with the output of "
        f"`cifar-ray keys --markdown`\n{diff}"
    )


def test_the_committed_quickstart_report_is_what_the_code_renders_from_its_logs(tmp_path):
    """reports/quickstart/ keeps the demo's logs (reports/quickstart/logs: sweep.json, trial.json, metrics.jsonl)
    beside its report, so a change to the report's text shows here until the committed report is regenerated."""
    from cifar_ray.report import write_report

    readme = write_report(ROOT / "reports" / "quickstart" / "logs", out_dir=tmp_path)
    assert readme.read_text() == (ROOT / "reports" / "quickstart" / "README.md").read_text(), (
        "reports/quickstart/README.md is stale: cifar-ray report reports/quickstart/logs --out reports/quickstart"
    )
