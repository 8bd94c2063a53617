"""The package's structural rules, read off the source (ast), so they stay true.

Layers and cycles are import-linter's job (``lint-imports``, contracts in
pyproject.toml); these are the rules it cannot express: module and function
sizes, imports of our own modules inside functions, which modules read
torch's private DTensor / DeviceMesh / c10d internals, what ``import redist_opt``
loads, and that no shipped module stubs ``sys.modules``.

The walk follows symlinks: ``redist_opt/passes`` is a symlink to the top-level
``passes/`` folder, which ``Path.rglob`` (and ``grep -r``) do not enter.
Each rule is a function of the modules it reads, so the tests at the end can
check that a pass file breaking a rule fails it.
"""

from __future__ import annotations

import ast
import os
import pathlib
import re
import subprocess
import sys

import pytest

import redist_opt
import redist_opt.passes


def package_modules(root: pathlib.Path) -> list[pathlib.Path]:
    """Every ``.py`` file under ``root``, symlinked folders included (paths stay
    under ``root``: ``redist_opt/passes/...``, not ``passes/...``)."""
    return sorted(
        pathlib.Path(folder, name)
        for folder, dirs, names in os.walk(root, followlinks=True)
        if "__pycache__" not in pathlib.Path(folder).parts
        for name in names
        if name.endswith(".py")
    )


PACKAGE = pathlib.Path(redist_opt.__file__).resolve().parent
MODULES = package_modules(PACKAGE)

# Sizes are counted in statements (lines where a statement starts), not lines: the
# formatter owns layout, so wrapping a call over five lines must not change a module's size.
MAX_MODULE_STATEMENTS = 300
MAX_FUNCTION_STATEMENTS = 60
# Imports of our own modules inside functions: only for heavy optional
# dependencies, and few of them.
MAX_FUNCTION_LEVEL_IMPORTS = 6
# torch internals a torch upgrade may move: read only in these two modules.
TORCH_INTERNALS = re.compile(
    r"\._get_root_mesh\b|\._layout\b|\._flatten_mapping\b|\._local_ints\b|_get_default_store\b"
    r"|_gen_transform_infos\b|\bDTensorSpec\b|\b_MeshLayout\b|_resolve_process_group\b"
)
INTERNALS_MODULES = {"ir/layout.py", "torch_api/dtensor.py"}
# The one module that decides a round over a c10d store (``compare_set``): every
# agreement across ranks goes through it.
STORE_ROUND_MODULE = "runtime/store_round.py"


def _rel(path: pathlib.Path, root: pathlib.Path = PACKAGE) -> str:
    return path.relative_to(root).as_posix()


def _functions(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def statements(node: ast.AST) -> int:
    """How many lines of ``node`` start a statement (docstrings and wrapped arguments count once)."""
    return len({n.lineno for n in ast.walk(node) if isinstance(n, ast.stmt)})


def oversized(path: pathlib.Path, limit: int = MAX_MODULE_STATEMENTS) -> int | None:
    """The module's statement count if it is over ``limit``."""
    n = statements(ast.parse(path.read_text()))
    return n if n > limit else None


def long_functions(path: pathlib.Path, limit: int = MAX_FUNCTION_STATEMENTS) -> list[str]:
    return [
        f"{f.name} ({statements(f)} statements, line {f.lineno})"
        for f in _functions(ast.parse(path.read_text()))
        if statements(f) > limit
    ]


def own_imports_in_functions(path: pathlib.Path, root: pathlib.Path = PACKAGE):
    tree = ast.parse(path.read_text())
    for f in _functions(tree):
        for node in ast.walk(f):
            if isinstance(node, ast.ImportFrom) and (
                node.level > 0 or (node.module or "").startswith("redist_opt")
            ):
                yield f"{_rel(path, root)}:{node.lineno} ({f.name})"
            elif isinstance(node, ast.Import) and any(a.name.startswith("redist_opt") for a in node.names):
                yield f"{_rel(path, root)}:{node.lineno} ({f.name})"


def torch_internal_readers(paths, root: pathlib.Path = PACKAGE) -> dict[str, list[str]]:
    """{module: the torch internals it reads}, outside ``INTERNALS_MODULES``."""
    readers = {}
    for path in paths:
        code = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
        hits = sorted(set(TORCH_INTERNALS.findall(code)))
        if hits and _rel(path, root) not in INTERNALS_MODULES:
            readers[_rel(path, root)] = hits
    return readers


def store_round_deciders(paths, root: pathlib.Path = PACKAGE) -> list[str]:
    """The modules that call a store's ``compare_set``."""
    return sorted(
        {
            _rel(path, root)
            for path in paths
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "compare_set"
        }
    )


def test_the_package_has_modules_to_check():
    assert len(MODULES) > 40, MODULES  # the rules below would pass vacuously otherwise


def test_every_pass_file_is_checked():
    passes = pathlib.Path(redist_opt.passes.__file__).resolve().parent  # the top-level passes/ folder
    files = {p.name for p in passes.glob("*.py")}
    assert len(files) >= 13, files
    assert {p.name for p in MODULES if _rel(p).startswith("passes/")} == files


@pytest.mark.parametrize("path", MODULES, ids=_rel)
def test_module_size(path):
    n = oversized(path)
    assert n is None, f"{_rel(path)} has {n} statements (at most {MAX_MODULE_STATEMENTS}): split it by job"


@pytest.mark.parametrize("path", MODULES, ids=_rel)
def test_function_size(path):
    long = long_functions(path)
    assert not long, f"{_rel(path)}: functions over {MAX_FUNCTION_STATEMENTS} statements: {long}"


def test_few_function_level_imports_of_our_own_modules():
    found = sorted({imp for path in MODULES for imp in own_imports_in_functions(path)})
    assert len(found) <= MAX_FUNCTION_LEVEL_IMPORTS, found


def test_torch_internals_are_read_in_two_modules_only():
    readers = torch_internal_readers(MODULES)
    assert not readers, readers


def test_one_module_decides_rounds_over_the_store(tmp_path):
    assert store_round_deciders(MODULES) == [STORE_ROUND_MODULE]
    own_round = tmp_path / "own_round.py"  # a second protocol is found
    own_round.write_text("def decide(store):\n    return store.compare_set('k', '', 'commit')\n")
    assert store_round_deciders([own_round], tmp_path) == ["own_round.py"]


# -- the rules see a pass file that breaks them, through the symlink ----------------------------


@pytest.fixture
def package_with_a_bad_pass(tmp_path):
    """A package laid out like ours (``pkg/passes`` a symlink to a top-level
    ``passes/``) whose one pass file breaks every rule above."""
    (tmp_path / "passes").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_STATEMENTS))
    filler = "".join(f"y{i} = {i}\n" for i in range(MAX_MODULE_STATEMENTS))
    (tmp_path / "passes" / "bad_pass.py").write_text(
        "from torch.distributed.tensor._dtensor_spec import DTensorSpec\n\n\n"
        + "def run():\n    from redist_opt.ir import steps\n"
        + body
        + "\n"
        + filler
    )
    pkg = tmp_path / "pkg"
    (pkg / "ir").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "ir" / "plan.py").write_text("X = 1\n")
    (pkg / "passes").symlink_to("../passes", target_is_directory=True)
    return pkg


def test_a_pass_file_breaking_the_rules_is_found(package_with_a_bad_pass):
    pkg = package_with_a_bad_pass
    assert sorted(pkg.rglob("*.py")) == [pkg / "__init__.py", pkg / "ir" / "plan.py"]  # rglob misses passes/
    modules = package_modules(pkg)
    bad = pkg / "passes" / "bad_pass.py"
    assert bad in modules
    assert oversized(bad) == MAX_MODULE_STATEMENTS + MAX_FUNCTION_STATEMENTS + 3
    assert long_functions(bad) == [f"run ({MAX_FUNCTION_STATEMENTS + 2} statements, line 4)"]
    assert list(own_imports_in_functions(bad, pkg)) == ["passes/bad_pass.py:5 (run)"]
    assert torch_internal_readers(modules, pkg) == {"passes/bad_pass.py": ["DTensorSpec"]}


def test_import_loads_no_renderer_cli_or_benchmark():
    """``import redist_opt`` (in a fresh interpreter) leaves the SVG/DOT renderers, the
    command line and the benchmarks unloaded: they load when something draws or runs."""
    code = "import sys, redist_opt; print('\\n'.join(sorted(sys.modules)))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert "redist_opt.api.planning" in loaded  # the check sees the package's modules
    renderers = {"redist_opt.debug.svg", "redist_opt.debug.dot", "redist_opt.debug.mesh_diagram"}
    unwanted = [
        m
        for m in loaded
        if m in renderers or m.split(".")[:2] == ["redist_opt", "tools"] or m.split(".")[0] == "benchmarks"
    ]
    assert not unwanted, unwanted


def test_the_command_line_imports_a_command_when_it_runs():
    """Building ``redist-opt``'s parser loads no command's module (they load when run)."""
    code = (
        "import sys; from redist_opt.tools import cli; cli.build_parser(); "
        "print('\\n'.join(sorted(sys.modules)))"
    )
    loaded = set(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.split()
    )
    assert "redist_opt.tools.cli" in loaded
    commands = {"bench", "calibrate", "quality", "quality_report", "demo", "timing"}
    assert not {f"redist_opt.tools.{m}" for m in commands} & loaded


def _stubs_sys_modules(tree) -> list[int]:
    """Lines that assign, delete or update an entry of ``sys.modules``."""

    def is_sys_modules(node):
        return (
            isinstance(node, ast.Attribute)
            and node.attr == "modules"
            and getattr(node.value, "id", "") == "sys"
        )

    lines = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else []
        if any(isinstance(t, ast.Subscript) and is_sys_modules(t.value) for t in targets):
            lines.append(node.lineno)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and is_sys_modules(node.func.value)
        ):
            if node.func.attr in ("update", "setdefault", "pop", "__setitem__"):
                lines.append(node.lineno)
    return lines


def test_no_shipped_module_stubs_sys_modules():
    stubbing = {
        _rel(p): lines for p in MODULES for lines in [_stubs_sys_modules(ast.parse(p.read_text()))] if lines
    }
    assert not stubbing, stubbing
    # the check finds a stub where there is one
    assert _stubs_sys_modules(
        ast.parse("import sys\nsys.modules['triton'] = object()\ndel sys.modules['x']")
    ) == [2, 3]
