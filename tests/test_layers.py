"""The packages' layers: core imports neither torch nor Ray, training no Ray, and each package imports only the
packages below it (core <- training <- cluster; core <- report; all of them <- api.py <- commands, the top). In
tests/, no test module imports another."""

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import cifar_ray

PACKAGE_ROOT = Path(cifar_ray.__file__).parent
# package -> the packages of cifar_ray it may import (itself always)
ALLOWED = {
    "core": set(),
    "training": {"core"},
    "cluster": {"core", "training"},
    "report": {"core"},
    "commands": {"core", "training", "cluster", "report", "viewers", "api"},
}
# top-level module -> the packages of cifar_ray it may import
TOP_LEVEL = {"api": {"core", "training", "cluster", "report"}}


def modules_of(package: str) -> list[str]:
    return [f"cifar_ray.{package}.{info.name}" for info in pkgutil.iter_modules([str(PACKAGE_ROOT / package)])]


def imported_after(modules: list[str]) -> list[str]:
    """Which of torch and ray a fresh Python holds in sys.modules after importing `modules`."""
    script = (
        "import importlib, json, sys\n"
        "for name in json.loads(sys.argv[1]):\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted({'torch', 'ray'} & set(sys.modules))))\n"
    )
    done = subprocess.run([sys.executable, "-c", script, json.dumps(modules)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_core_imports_neither_torch_nor_ray():
    modules = modules_of("core")
    assert "cifar_ray.core.config" in modules
    assert imported_after(modules) == []


def test_training_imports_torch_and_no_ray():
    modules = modules_of("training")
    assert "cifar_ray.training.loop" in modules
    assert imported_after(modules) == ["torch"]


def package_imports(path: Path, package: str | None) -> set[str]:
    """What of cifar_ray (core, training, ..., or a top-level module's name) `path`, a module of `package` (None: a
    top-level module), imports anywhere, function-local imports included."""
    found = set()
    here = ["cifar_ray", package] if package else ["cifar_ray"]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:  # level 1: the module's own package, level 2: the one above
                full = here[: len(here) + 1 - node.level] + (node.module.split(".") if node.module else [])
            else:
                full = (node.module or "").split(".")
            if full[0] == "cifar_ray":
                found |= {full[1]} if len(full) > 1 else {alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name.split(".")[1] for alias in node.names if alias.name.startswith("cifar_ray.")}
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_the_layers_below_it(package):
    wrong = {}
    for path in sorted((PACKAGE_ROOT / package).glob("*.py")):
        outside = package_imports(path, package) - ALLOWED[package] - {package}
        if outside:
            wrong[path.name] = sorted(outside)
    assert not wrong, f"{package} may import only {sorted(ALLOWED[package]) or 'itself'}: {wrong}"


@pytest.mark.parametrize("module", sorted(TOP_LEVEL))
def test_a_top_level_module_imports_only_the_layers_below_it(module):
    outside = package_imports(PACKAGE_ROOT / f"{module}.py", None) - TOP_LEVEL[module]
    assert not outside, f"{module}.py may import only {sorted(TOP_LEVEL[module])}: {sorted(outside)}"


def test_every_package_has_its_layer():
    assert {path.parent.name for path in PACKAGE_ROOT.glob("*/__init__.py")} == set(ALLOWED)


def imported_test_modules(path: Path) -> list[str]:
    """The test modules (test_*.py) that the module at `path` imports, by any form of import."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            parts = [part for alias in node.names for part in alias.name.split(".")]
        elif isinstance(node, ast.ImportFrom):
            parts = (node.module or "").split(".") + [alias.name for alias in node.names]
        else:
            continue
        found += [part for part in parts if part.startswith("test_")]
    return found


def test_no_test_module_imports_another():
    """Helpers shared by test modules live in tests/helpers.py (fault injection in tests/faults.py), never in a
    test module that others import: that ties the test files together and runs an imported module's code twice."""
    tests = Path(__file__).parent
    assert (tests / "helpers.py").is_file()
    wrong = {path.name: found for path in sorted(tests.glob("test_*.py")) if (found := imported_test_modules(path))}
    assert not wrong, f"import shared helpers from tests/helpers.py, not from test modules: {wrong}"
