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
    "export": {"core"},
    "commands": {"core", "training", "cluster", "report", "export", "api", "settling"},
}
# top-level module -> the packages of cifar_ray it may import
TOP_LEVEL = {"api": {"core", "training", "cluster", "report", "settling"}, "settling": {"core", "cluster", "report"}}


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


def third_party_imports(path: Path) -> set[str]:
    """The top-level names of the packages outside cifar_ray that `path` imports anywhere (function-local too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and not node.level:
            found.add((node.module or "").split(".")[0])
        elif isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
    return found - {"cifar_ray"}


@pytest.mark.parametrize("package", ["core", "report"])
def test_core_and_report_hold_no_torch_or_ray_function(package):
    """Not even inside a function: what needs torch or Ray lives in training/ or cluster/ (core/sysinfo.py's device,
    version and placement probes once did)."""
    wrong = {
        path.name: sorted(used)
        for path in sorted((PACKAGE_ROOT / package).glob("*.py"))
        if (used := third_party_imports(path) & {"torch", "ray"})
    }
    assert not wrong, f"{package} reaches torch or Ray: {wrong}"


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


def module_graph() -> dict[str, set[str]]:
    """Each module of cifar_ray -> the modules of cifar_ray it imports anywhere (function-local and TYPE_CHECKING
    imports included), a package's name standing for its __init__.py."""
    modules = {}
    for path in PACKAGE_ROOT.rglob("*.py"):
        parts = ["cifar_ray", *path.relative_to(PACKAGE_ROOT).with_suffix("").parts]
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def known(name: str) -> str:
        while name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package[: len(package) + 1 - node.level] if node.level else []
                full = ".".join(base + (node.module.split(".") if node.module else []))
                found |= {known(f"{full}.{alias.name}") for alias in node.names if full.startswith("cifar_ray")}
            elif isinstance(node, ast.Import):
                found |= {known(alias.name) for alias in node.names if alias.name.startswith("cifar_ray.")}
        graph[name] = found - {name}
    return graph


def test_no_import_circle():
    """No module imports, through any chain, one that imports it (loop.py and state.py once did): each module can
    be read knowing only the ones below it."""
    graph = module_graph()
    assert "cifar_ray.training.state" in graph["cifar_ray.training.loop"]

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()] - seen:
                if nxt == goal:
                    return True
                seen.add(nxt)
                todo.append(nxt)
        return False

    circles = sorted(name for name in graph if reaches(name, name))
    assert not circles, f"modules in an import circle: {circles}"


MAX_PARAMETERS = 6  # beyond this a function takes an options object (core/run.py: RunOptions; training/loop.py: ...)


def public_api_functions() -> set[str]:
    """api.py's public functions: they keep their keyword-only options, as pandas' do (docs/api.md)."""
    tree = ast.parse((PACKAGE_ROOT / "api.py").read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")}


def test_no_internal_function_takes_more_than_six_parameters():
    """Options travel as one object (RunOptions from api.execute_plan to run_plan; TrialOptions into run_trial; a
    Worker instead of its rank, world and devices): a function with a long list of parameters is one whose callers
    pass them one by one, through every layer."""
    exempt = {("api.py", name) for name in public_api_functions()}
    assert ("api.py", "execute_plan") in exempt
    long = []
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        module = str(path.relative_to(PACKAGE_ROOT))
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or (module, node.name) in exempt:
                continue
            args = node.args
            named = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
            count = sum(1 for arg in named if arg is not None and arg.arg not in ("self", "cls"))
            if count > MAX_PARAMETERS:
                long.append(f"{module}:{node.lineno} {node.name} ({count})")
    assert not long, f"functions with more than {MAX_PARAMETERS} parameters: {long}"


MAX_LINES = 500  # a module past this is split by what its parts do (CONTRIBUTING.md, Layout)


def test_no_module_is_longer_than_500_lines():
    """cluster/bench.py grew to 767 lines unnoticed: every module under cifar_ray/ is held to MAX_LINES."""
    lines = {str(p.relative_to(PACKAGE_ROOT)): len(p.read_text().splitlines()) for p in PACKAGE_ROOT.rglob("*.py")}
    assert "api.py" in lines
    long = [f"{module} ({count})" for module, count in sorted(lines.items()) if count > MAX_LINES]
    assert long == [], f"modules over {MAX_LINES} lines: {long}"
