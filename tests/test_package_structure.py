"""The package's structural rules, read off the source (ast), so they stay true.

Layers and cycles are import-linter's job (``lint-imports``, contracts in
pyproject.toml); these are the rules it cannot express: module and function
sizes, imports of our own modules inside functions, that torch's private names
are reached only inside ``redist_opt/torch_api/`` (each boundary module declaring
the names it reaches and the releases that have them), what ``import redist_opt``
loads, and that no shipped module stubs ``sys.modules``.

The walk follows symlinks: ``redist_opt/passes`` is a symlink to the top-level
``passes/`` folder, which ``Path.rglob`` (and ``grep -r``) do not enter.
Each rule is a function of the modules it reads, so the tests at the end can
check that a pass file breaking a rule fails it.
"""

from __future__ import annotations

import ast
import functools
import importlib
import os
import pathlib
import pkgutil
import subprocess
import sys
import warnings

import pytest
from support.private_torch_names import (
    own_private_names,
    private_uses,
    torch_private_attributes_by_type,
)

import redist_opt
import redist_opt.passes
import redist_opt.torch_api
from redist_opt.torch_api.version import has_private


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
# torch's private names (a torch upgrade may move them): reached only in these modules.
BOUNDARY = "torch_api/"
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


@functools.cache
def torch_attributes_by_type() -> dict[str, frozenset[str]]:
    """{type: private attribute names} of torch's DeviceMesh, DTensor, DTensorSpec,
    LocalTensor, SymNode, ... as built under the fake backend by this Python's torch."""
    return torch_private_attributes_by_type(sys.executable)


def torch_private_attributes(paths, root: pathlib.Path = PACKAGE) -> frozenset[str]:
    """Private attributes of torch's objects, less the names the package's modules
    outside the boundary define themselves (their own classes' ``_hash``)."""
    own = own_private_names(p.read_text() for p in paths if not _rel(p, root).startswith(BOUNDARY))
    return frozenset().union(*torch_attributes_by_type().values()) - own


def private_torch_readers(paths, root: pathlib.Path = PACKAGE) -> dict[str, list[str]]:
    """{module: ["line: private torch name", ...]} outside ``redist_opt/torch_api/``."""
    attributes = torch_private_attributes(paths, root)
    readers = {}
    for path in paths:
        if _rel(path, root).startswith(BOUNDARY):
            continue
        uses = private_uses(path.read_text(), attributes)
        if uses:
            readers[_rel(path, root)] = [f"{line}: {name}" for line, name in uses]
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


def test_private_torch_names_are_reached_only_in_torch_api():
    """Every private torch name (a ``_`` component of a torch path, or a private
    attribute of torch's distributed objects) outside ``redist_opt/torch_api/``."""
    readers = private_torch_readers(MODULES)
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
    assert private_torch_readers(modules, pkg) == {
        "passes/bad_pass.py": ["1: torch.distributed.tensor._dtensor_spec.DTensorSpec"]
    }


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


# -- the private-name check finds each kind of use ------------------------------------------

VIOLATIONS = """\
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.tensor._redistribute import redistribute_local_tensor
from torch.distributed.tensor.placement_types import Shard, _StridedShard
from torch._inductor import config
from redist_opt.ir import layout

C10D = torch.ops._c10d_functional
cast = torch.ops.aten._to_copy.default
node = torch._C._current_autograd_node()
store = dist.distributed_c10d._get_default_store()


class Mine:
    def __init__(self):
        self._hash = 1


def f(mesh, dt, c, spec_like):
    import importlib

    importlib.import_module("torch.distributed.tensor._api")
    mesh._flatten("x")
    getattr(c.node, "_local_ints", None)
    hasattr(dt, "_spec")
    layout._layout(mesh)
    spec_like._hash
    return dt.to_local(), Shard(0)
"""


def test_the_private_name_check_reports_each_violation(tmp_path):
    source = tmp_path / "violations.py"
    source.write_text(VIOLATIONS)
    found = private_torch_readers([source], tmp_path)["violations.py"]
    assert found == [
        "3: torch.distributed._functional_collectives",
        "4: torch.distributed.tensor._redistribute.redistribute_local_tensor",
        "5: torch.distributed.tensor.placement_types._StridedShard",
        "6: torch._inductor.config",
        "9: torch.ops._c10d_functional",
        "11: torch._C._current_autograd_node",
        "12: torch.distributed.distributed_c10d._get_default_store",
        "23: torch.distributed.tensor._api",
        "24: <torch object>._flatten",
        "25: <torch object>._local_ints",
        "26: <torch object>._spec",
    ]
    # not reported: public names, a core ATen op (line 10), a private module-level name of
    # one of our own modules (layout._layout), an attribute our own class defines (_hash)


# -- each boundary module declares the private names it reaches, and they resolve -----------

BOUNDARY_MODULES = sorted(
    m.name for m in pkgutil.iter_modules(redist_opt.torch_api.__path__) if m.name != "version"
)


def _covered(use: str, declared) -> bool:
    """Whether a use the AST check found is one of ``declared`` (a PrivateName tuple): the
    name itself, a module whose names are declared, a member of a declared object, or a
    private attribute some declared ``Class._attr`` names."""
    if use.startswith("<torch object>."):
        attr = use.split(".", 1)[1]
        return any(d.name is not None and d.name.split(".")[-1] == attr for d in declared)
    return any(
        use == d.path or d.path.startswith(use + ".") or (d.name is not None and use.startswith(d.path + "."))
        for d in declared
    )


def test_there_are_boundary_modules():
    assert {"dtensor", "mesh", "c10d", "tracing", "inductor", "functorch", "local_tensor"} <= set(
        BOUNDARY_MODULES
    )


@pytest.mark.parametrize("name", BOUNDARY_MODULES)
def test_a_boundary_module_declares_the_private_names_it_reaches(name):
    module = importlib.import_module(f"redist_opt.torch_api.{name}")
    declared = getattr(module, "PRIVATE_NAMES", None)
    assert declared, f"redist_opt.torch_api.{name} declares no PRIVATE_NAMES"
    attributes = torch_private_attributes(MODULES)
    uses = private_uses(pathlib.Path(module.__file__).read_text(), attributes)
    undeclared = sorted({use for _, use in uses if not _covered(use, declared)})
    assert not undeclared, f"redist_opt.torch_api.{name} reaches undeclared private names: {undeclared}"


@pytest.mark.parametrize("name", BOUNDARY_MODULES)
def test_each_declared_private_name_resolves_on_this_torch(name):
    """A name this release should have resolves (an instance attribute: on a real
    object of its class); one it should not have is absent, so the table stays true."""
    module = importlib.import_module(f"redist_opt.torch_api.{name}")
    by_type = torch_attributes_by_type()
    wrong = []
    for decl in getattr(module, "PRIVATE_NAMES", ()):
        owner, _, attr = (decl.name or "").rpartition(".")
        with warnings.catch_warnings():  # 2.15's deprecated config aliases warn when read
            warnings.simplefilter("ignore")
            if decl.instance:
                owner_type = owner.rsplit(".", 1)[-1]
                assert owner_type in by_type, f"{decl.path}: no {owner_type} object is built to check it"
                present = has_private(decl.module, owner) and attr in by_type[owner_type]
            else:
                present = has_private(decl.module, decl.name) if decl.name else _importable(decl.module)
        if present != decl.expected:
            wrong.append(f"{decl.path} ({decl.releases()}): {'present' if present else 'missing'}")
    assert not wrong, f"torch {torch_version()}: {wrong}"


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def torch_version() -> str:
    import torch

    return torch.__version__


def test_a_name_is_covered_only_by_its_own_declaration():
    from redist_opt.torch_api.version import PrivateName

    declared = (
        PrivateName("torch.x._y"),
        PrivateName("torch.x._y", "Klass"),
        PrivateName("torch.a", "B._c", instance=True),
    )
    assert _covered("torch.x._y", declared)
    assert _covered("torch.x._y.Klass.method", declared)  # a member of a declared object
    assert not _covered("torch.x._y._other", declared)  # a declared module does not cover its names
    assert _covered("<torch object>._c", declared)
    assert not _covered("<torch object>._d", declared)


def test_the_wheel_lists_every_package():
    """setuptools ships only the packages pyproject.toml lists: a package folder missing from the
    list installs from a checkout (editable) and is absent from ``pip install .``'s wheel."""
    import tomllib

    listed = set(
        tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    folders = {
        ".".join(path.parent.relative_to(PACKAGE.parent).parts)
        for path in MODULES
        if path.name == "__init__.py"
    }
    assert folders == listed, (
        f"in the tree, not listed: {sorted(folders - listed)}; listed, absent: {sorted(listed - folders)}"
    )
