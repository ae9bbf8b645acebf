"""Write every golden file anew from the code as it is: `python tests/regenerate_golden.py`, then review the diff.

The goldens: reports/quickstart/README.md and report.html (the demo's committed report, from its committed logs) and
tests/golden/*.md (helpers.golden_texts). tests/test_golden.py and tests/test_readme.py fail while any is stale."""

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from helpers import GOLDEN_DIR, golden_texts  # noqa: E402

from cifar_ray.report import write_report  # noqa: E402

ROOT = Path(__file__).parent.parent

if __name__ == "__main__":
    for fmt in ("md", "html"):
        print(write_report(ROOT / "reports" / "quickstart" / "logs", ROOT / "reports" / "quickstart", fmt=fmt))
    with tempfile.TemporaryDirectory() as scratch:
        for name, text in golden_texts(Path(scratch)).items():
            (GOLDEN_DIR / name).write_text(text, encoding="utf-8")
            print(GOLDEN_DIR / name)
