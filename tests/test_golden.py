"""The rendered report's wording lives in golden files (tests/golden/, reports/quickstart/), not in asserts: a change
of wording is one reviewed diff, made by `python tests/regenerate_golden.py`."""

from helpers import GOLDEN_DIR, golden_texts


def test_every_golden_file_is_what_the_code_renders(tmp_path):
    for name, text in golden_texts(tmp_path).items():
        assert (GOLDEN_DIR / name).read_text(encoding="utf-8") == text, (
            f"tests/golden/{name} is stale: run `python tests/regenerate_golden.py` and review the diff"
        )
