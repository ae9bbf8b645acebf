"""The docs say each thing once and name only what exists: at most WORD_LIMIT words of prose in README, CONTRIBUTING
and docs/*.md (the generated pages left out, each tested for being current); CONTRIBUTING's module map names every
module of cifar_ray/ and no other; every name in backticks (in the pages, and in cifar_ray's docstrings and comments)
is a module, file, symbol, config key, option or command. The shell blocks of README and docs/ run as written:
tests/test_docs_commands.py."""

from __future__ import annotations

import ast
import importlib
import io
import keyword
import re
import tokenize
from functools import cache
from pathlib import Path

import pytest

from cifar_ray.cli import build_parser
from cifar_ray.commands import COMMANDS
from cifar_ray.core.config import TrainConfig

ROOT = Path(__file__).parent.parent
PACKAGE = ROOT / "cifar_ray"
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
# The word limit counts what people write, not the generated pages: each page's test in tests/test_readme.py that
# fails when it is stale, and the command that writes it.
GENERATED = {
    "docs/config-keys.md": ("test_the_config_key_table_is_what_trainconfig_renders", "cifar-ray keys --markdown"),
    "docs/measurements.md": (
        "test_the_measurements_page_is_what_the_code_renders_from_its_record",
        "cifar-ray bench --render",
    ),
}
PROSE = [page for page in PAGES if page.relative_to(ROOT).as_posix() not in GENERATED]
WORD_LIMIT = 10_000
MODULE_SECTION = "## Layout"  # CONTRIBUTING.md's module map: its tables' first column names modules

# Names in backticks that are no symbol of this project, and need not be: other tools' options and words, and the
# placeholders of run folders. Everything else in backticks must resolve (see `problem`).
NOT_SYMBOLS = {
    # other tools' options (ray start, pytest, git, pip)
    "--head", "--address", "--ray-client-server-port", "--dashboard-host", "--node-ip-address", "--binary",
    "--strict-markers",
    # shell and environment words
    "RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
    "AWS_ENDPOINT_URL", "GOOGLE_APPLICATION_CREDENTIALS", "MLFLOW_ALLOW_FILE_STORE", "CIFAR_RAY_LONG_TESTS",
    "CIFAR_RAY_SCREENSHOT", "XDG_CACHE_HOME", "pip", "console", "sbatch", "srun", "scontrol", "kubectl", "sudo",
    # KubeRay's and Ray Tune's names (their manifests and files, not our code)
    "apiVersion", "authOptions", "entrypoint", "headGroupSpec", "workerGroupSpecs", "rayClusterSpec",
    "session-N.json", "session-N.diff", "allow_tf32", "cublasCreate(handle)", "result.json", "progress.csv",
    "events.out.tfevents.*", "cifar-10-batches-py", "mlruns",
    # the report's words and values shown in backticks
    "ProfilerStep#N", "user:secret@", "off", "on", "yes", "no",
}  # fmt: skip
OTHER_PACKAGES = {"torch", "numpy", "ray", "importlib", "nn", "pytorch", "tensorboardX"}  # dotted names outside ours
MODULE_FILE = re.compile(r"^(?:cifar_ray/)?((?:core|training|cluster|report|commands)/)?(\w+)\.py$")
IDENTIFIER = re.compile(r"^[A-Za-z_]\w*$")
DOTTED = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+$")
FILE_NAME = re.compile(r"^[\w.-]+\.(?:json|jsonl|pt|csv|png|html|md|txt|diff|lease|db|yaml|toml|sh|sbatch)$")
REPO_PATH = re.compile(r"^(?:\.ci|cifar_ray|tests|docs|sweeps|reports)/[\w./-]*$")
OPTION = re.compile(r"^--[a-z][a-z-]*$")
HASH = re.compile(r"^[0-9a-f]{7,40}$")


def words(page: Path) -> int:
    return len(page.read_text(encoding="utf-8").split())


def test_the_docs_say_each_thing_once_in_at_most_the_word_limit():
    counts = {page.relative_to(ROOT).as_posix(): words(page) for page in PROSE}
    assert sum(counts.values()) <= WORD_LIMIT, f"{sum(counts.values())} words, at most {WORD_LIMIT}: {counts}"


def test_a_page_left_out_of_the_word_count_is_generated_and_tested_for_being_current():
    """A generated page grows with the code (a config key, a timing), not with prose: it is left out of the count,
    and only a page that a test re-renders and compares may be."""
    readme_tests = {
        node.name
        for node in ast.parse((ROOT / "tests" / "test_readme.py").read_text()).body
        if isinstance(node, ast.FunctionDef)
    }
    for page, (test, command) in GENERATED.items():
        assert (ROOT / page).is_file() and test in readme_tests, (page, test)
        text = " ".join((ROOT / page).read_text().split())  # a command may wrap
        assert command in text, f"{page} does not say it is written by `{command}`"
    assert len(PROSE) == len(PAGES) - len(GENERATED)


# --- the module map ---------------------------------------------------------------------------------------------


def modules_in_the_map(text: str) -> set[str]:
    """The modules CONTRIBUTING.md's tables name in their first column, as paths under cifar_ray/."""
    layout = text.split(f"\n{MODULE_SECTION}\n", 1)[1].split("\n## ", 1)[0]
    named = set()
    for line in layout.splitlines():
        if line.startswith("| `"):
            first = line.split("|")[1]
            named |= set(re.findall(r"`([\w/]+\.py)`", first))
    return named


def test_the_module_map_names_every_module_and_only_modules_that_exist():
    named = modules_in_the_map((ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8"))
    present = {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")}
    assert not present - named, f"CONTRIBUTING.md's module map lacks {sorted(present - named)}"
    assert not named - present, (
        f"CONTRIBUTING.md's module map names modules that do not exist: {sorted(named - present)}"
    )


def test_the_module_map_check_sees_a_missing_and_a_made_up_module():
    text = "x\n## Layout\n| `core/config.py` | what |\n| `core/made_up.py` | what |\n## Next\n| `api.py` | no |\n"
    assert modules_in_the_map(text) == {"core/config.py", "core/made_up.py"}


# --- names in backticks -------------------------------------------------------------------------------------------


def source_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


@cache
def known_names() -> frozenset[str]:
    """Every name the code and its tests use or define (identifiers, attributes, arguments, imported names) and
    every string constant they write (file names, JSON keys, statuses, config values), and the config keys."""
    names: set[str] = set(TrainConfig.model_fields) | set(keyword.kwlist)
    tests = [path for path in sorted((ROOT / "tests").glob("*.py")) if not path.name.startswith("test_docs")]
    for path in [*source_files(), *tests]:  # not these tests: their made-up names would count as known
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.keyword) and node.arg:
                names.add(node.arg)
            elif isinstance(node, ast.alias):
                names |= {*node.name.split("."), node.asname or ""}
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 80:
                names.add(node.value)
    return frozenset(names)


@cache
def options() -> dict[str, set[str]]:
    """Each subcommand's options (and the top level's, under "")."""
    parser = build_parser()
    found = {"": {flag for action in parser._actions for flag in action.option_strings}}
    subparsers = next(action for action in parser._actions if action.choices and set(action.choices) == set(COMMANDS))
    for name, subparser in subparsers.choices.items():
        found[name] = {flag for action in subparser._actions for flag in action.option_strings}
    return found


def module_path(parts: list[str]) -> tuple[str, list[str]] | None:
    """The longest leading part of a dotted name that is a module of cifar_ray (written from the package or from
    one of its packages, `runlog.X` included), and the rest."""
    if parts[0] == "cifar_ray":
        parts = parts[1:]
    for cut in range(len(parts), 0, -1):
        head = "/".join(parts[:cut])
        candidates = [PACKAGE / f"{head}.py", PACKAGE / head / "__init__.py"]
        candidates += [path for path in PACKAGE.glob(f"*/{head}.py")]
        for candidate in candidates:
            if candidate.is_file():
                module = candidate.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
                return module.removesuffix(".__init__"), parts[cut:]
    return None if parts else ("cifar_ray", [])


def resolves(module: str, rest: list[str]) -> bool:
    try:
        target = importlib.import_module(module)
        for attr in rest:
            target = getattr(target, attr)
    except (ImportError, AttributeError):
        # a class attribute that is a dataclass field or an annotation only, e.g. `Report.findings`
        return bool(rest) and rest[-1] in known_names()
    return True


def problem(span: str) -> str | None:
    """Why a backticked span names nothing that exists, or None. Prose in backticks (anything with a space, or
    punctuation other than a path's or a dotted name's) is not a name and is checked only where it is a
    `cifar-ray` command line: its subcommand and options."""
    if span != span.strip() or HASH.match(span) or len(span) == 1:
        return None  # backticks paired across prose, a commit, a formula's letter
    if span in NOT_SYMBOLS or span in known_names():
        return None
    if span.startswith("cifar-ray"):
        tokens = span.split()
        command = tokens[1] if len(tokens) > 1 and re.match(r"^[a-z]+$", tokens[1]) else ""
        if command and command not in options():
            return f"no subcommand {command!r}"
        unknown = [t for t in tokens if OPTION.match(t.split("=")[0]) and t.split("=")[0] not in options()[command]]
        return f"{command or 'cifar-ray'} has no option {unknown}" if unknown else None
    if " " in span:  # prose, or an option with its argument: `--repeats N`
        first = span.split()[0]
        return problem(first) if OPTION.match(first) else None
    name = re.sub(r"\(.*\)$", "", span)  # `f(x)` and `f()` name f
    if OPTION.match(name):
        return None if any(name in found for found in options().values()) else f"no command has the option {name}"
    if "=" in name:  # KEY=VALUE: the key must be a config key or a grid factor
        key = name.split("=", 1)[0]
        return None if not IDENTIFIER.match(key) or key.isupper() or key in known_names() else f"no config key {key!r}"
    if match := MODULE_FILE.match(name):
        found = list(PACKAGE.glob(f"{match.group(1) or ''}{match.group(2)}.py")) + list(
            PACKAGE.glob(f"*/{match.group(2)}.py") if not match.group(1) else []
        )
        return None if found else f"no module {name}"
    if REPO_PATH.match(name):
        return None if (ROOT / name.rstrip("/")).exists() else f"no file {name}"
    if FILE_NAME.match(name):
        return None if (ROOT / name).exists() or name in known_names() else f"no file named {name} is written or kept"
    if DOTTED.match(name):
        parts = name.split(".")
        if parts[0] in OTHER_PACKAGES:
            return None if parts[-1] in known_names() else f"{name}: the code uses no {parts[-1]!r}"
        located = module_path(parts)
        if located is None:
            return None if parts[-1] in known_names() else f"{name} resolves to nothing"
        return None if resolves(*located) else f"{name} resolves to nothing"
    if IDENTIFIER.match(name):
        return (
            None
            if name in known_names() or list(PACKAGE.rglob(f"{name}.py"))
            else f"no symbol, config key or value {name!r} in cifar_ray"
        )
    return None


def prose(text: str) -> str:
    """Markdown without its fenced blocks (commands and outputs: tests/test_docs_commands.py runs those)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_name_in_backticks_on_a_page_exists(page):
    wrong = {span: why for span in spans(prose(page.read_text(encoding="utf-8"))) if (why := problem(span))}
    assert not wrong, f"{page.relative_to(ROOT)} names what does not exist: {wrong}"


def code_text(path: Path) -> str:
    """A module's docstrings and comments."""
    source = path.read_text(encoding="utf-8")
    parts = [
        ast.get_docstring(node) or ""
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    ]
    parts += [
        tok.string for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT
    ]
    return "\n".join(parts)


@pytest.mark.parametrize("path", source_files(), ids=lambda path: path.relative_to(ROOT).as_posix())
def test_every_name_in_backticks_in_a_docstring_or_comment_exists(path):
    wrong = {span: why for span in spans(code_text(path)) if (why := problem(span))}
    assert not wrong, f"{path.relative_to(ROOT)} names what does not exist: {wrong}"


@pytest.mark.parametrize(
    "span",
    ["run_plann", "core/runlogs.py", "runlog.EPOCH_METRIC", "report.build.Reports", "cifar-ray sweep --resum",
     "cifar-ray sweeps", "--estimat", "--max-concurent N", "sweeps/nothing.yaml", "epochz=3", "torch.made_up"],
)  # fmt: skip
def test_a_made_up_name_is_caught(span):
    assert problem(span)


@pytest.mark.parametrize(
    "span",
    ["run_plan", "core/runlog.py", "runlog.EPOCH_METRICS", "report.build.Report", "cifar-ray sweep FILE --resume",
     "sweeps/quickstart.yaml", "epochs=3", "trial.json", "--estimate", "TrainConfig", "torch.load(weights_only=True)"],
)  # fmt: skip
def test_a_real_name_passes(span):
    assert problem(span) is None
