"""The HTML report's renderer, block by block (no browser: tests/test_report_browser.py opens the page)."""

from __future__ import annotations

import base64
import re
import subprocess
import sys

import pytest
from helpers import make_run

from cifar_ray.cli import main
from cifar_ray.core.errors import StorageError
from cifar_ray.report import build_report
from cifar_ray.report.document import Bullets, Figure, Heading, Paragraph, Table
from cifar_ray.report.html import SORT_SCRIPT, inline_html, to_html

# The smallest valid PNG: one transparent pixel.
PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)


def test_text_is_escaped_before_the_inline_subset_becomes_tags():
    text = 'a <script>alert("x")</script> & `<b>` **bold <i>** *it* [l&nk](https://x.org/?a=1&b=2)'
    assert inline_html(text) == (
        "a &lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; <code>&lt;b&gt;</code> "
        "<strong>bold &lt;i&gt;</strong> <em>it</em> "
        '<a href="https://x.org/?a=1&amp;b=2">l&amp;nk</a>'
    )


def test_code_spans_keep_their_stars_and_only_safe_links_become_links():
    assert inline_html("`a*b*c` and **x**") == "<code>a*b*c</code> and <strong>x</strong>"
    assert inline_html("[see](#trials)") == '<a href="#trials">see</a>'
    assert inline_html("[x](javascript:alert(1))") == "[x](javascript:alert(1))"
    assert inline_html("[x](javascript:go)") == "[x](javascript:go)"
    # A lone star, a product and underscores in key names stay text.
    assert inline_html("batch_size × accum_steps, 2 * 3") == "batch_size × accum_steps, 2 * 3"


def test_figures_are_embedded_as_data_uris(tmp_path):
    (tmp_path / "plot.png").write_bytes(PIXEL)
    page = to_html([Figure("plot.png", 'A "plot" <1>')], tmp_path, "t")
    uri = "data:image/png;base64," + base64.b64encode(PIXEL).decode()
    assert f'<img src="{uri}" alt="A &quot;plot&quot; &lt;1&gt;">' in page
    assert "plot.png" not in page


def test_a_missing_or_broken_figure_is_an_error_not_a_broken_image(tmp_path, monkeypatch):
    monkeypatch.setattr("cifar_ray.core.storage.RETRY_S", 0)
    with pytest.raises(StorageError, match=r"cannot embed figure .*missing\.png: no such file"):
        to_html([Paragraph("x"), Figure("missing.png", "gone")], tmp_path, "t")
    (tmp_path / "half.png").write_bytes(b"GIF89a")
    with pytest.raises(StorageError, match=r"cannot read .*half\.png \(5 tries\): not a PNG file"):
        to_html([Figure("half.png", "not a png")], tmp_path, "t")


def test_page_is_self_contained_and_every_table_is_sortable_by_one_script(tmp_path):
    doc = [
        Heading("Sweep <x>", 1),
        Bullets(("one", "**two**")),
        Table(("trial", "acc (%)"), (("`t0`", "1,234"), ("`t1`", "—")), "lr", name="trials"),
        Table(("a",), (("1",),), name="effects-optimizer"),
        Table(("", ""), (("Date", "today"),)),
    ]
    page = to_html(doc, tmp_path, "Sweep <x> & co")
    assert page.startswith("<!DOCTYPE html>") and "<title>Sweep &lt;x&gt; &amp; co</title>" in page
    assert "<h1>Sweep &lt;x&gt;</h1>" in page and "<li><strong>two</strong></li>" in page
    assert page.count("<script>") == 1 and page.count(SORT_SCRIPT) == 1
    assert page.count('<table class="sortable"') == 3
    assert '<table class="sortable" id="trials">' in page and 'id="effects-optimizer"' in page
    assert '<td class="right">1,234</td>' in page and '<th class="left">trial</th>' in page
    assert "<thead>" not in page.split('<table class="sortable">')[1]  # no empty header row
    # Nothing is fetched: no URL to load anything from, and the policy allows only what is inline.
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page) and "@import" not in page
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1)
    assert (
        policy.startswith("default-src 'none'; img-src data:;") and "'unsafe-inline'" not in policy.split("script")[1]
    )


def test_two_tables_with_one_name_and_unknown_blocks_are_refused(tmp_path):
    with pytest.raises(ValueError, match="table names must be unique"):
        to_html([Table(("a",), (), name="t"), Table(("b",), (), name="t")], tmp_path, "t")
    with pytest.raises(TypeError, match="not a report block"):
        to_html(["plain"], tmp_path, "t")


def test_cli_writes_the_html_report_and_refuses_an_unknown_format(tmp_path, capsys):
    run_dir = tmp_path / "bs-workers"
    make_run(run_dir)
    assert main(["report", str(run_dir), "--out", str(tmp_path / "out"), "--format", "html"]) == 0
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert capsys.readouterr().out.strip() == str(tmp_path / "out" / "report.html")
    trial_rows = re.search(r'<table class="sortable" id="trials">.*?<tbody>(.*?)</tbody>', page, re.S).group(1)
    assert trial_rows.count("<tr>") == len(build_report(run_dir).trials) == 8
    assert page.count('<img src="data:image/png;base64,') > 0  # every plot inside the page ...
    assert not list((tmp_path / "out").glob("*.png"))  # ... and no PNG beside it
    assert main(["report", str(run_dir), "--out", str(tmp_path / "pdf"), "--format", "pdf"]) == 2
    assert capsys.readouterr().err.strip() == (
        "cifar-ray: error: unknown report format 'pdf'; allowed: md, csv, json, html"
    )
    assert not (tmp_path / "pdf").exists()  # refused before anything is written


def test_header_cells_wrap_and_a_wide_table_scrolls_in_its_own_box():
    """The trial table was wider than a 1280-px window: its headers (class right) kept to one line. Without Chromium
    this reads the stylesheet; tests/test_report_browser.py measures the page in a 1280-px window."""
    from cifar_ray.report.html import STYLE

    rules = {selector.strip(): body for selector, body in re.findall(r"([^{}]+)\{([^}]*)\}", STYLE)}
    nowrap = [selector for selector, body in rules.items() if "nowrap" in body]
    assert nowrap and all(part.strip().startswith("td") for s in nowrap for part in s.split(",")), nowrap
    assert "overflow-x: auto" in rules[".table"] and "max-width: 100%" in rules[".table"]
    assert "overflow-wrap: anywhere" in rules["p code, li code"]  # a long path in prose cannot widen the page


@pytest.mark.parametrize("options", [["--format", "pdf"], ["--target", "85"]])
def test_a_bad_report_option_is_refused_before_the_reports_imports(tmp_path, options):
    """The report's options were checked after it imported pandas and matplotlib (2 to 7 s, 200 MB): now first."""
    script = (
        "import sys\nfrom cifar_ray.cli import main\n"
        f"code = main(['report', {str(tmp_path)!r}, *{options!r}])\n"
        "print(code, 'pandas' in sys.modules, 'matplotlib' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.stdout.split() == ["2", "False", "False"], done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("cifar-ray: error: ")
