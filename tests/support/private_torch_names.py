"""Which private torch names a module touches, read off its AST.

A name is private to torch when its dotted path has a component that starts
with one underscore (``torch._C``, ``torch.ops._c10d_functional``,
``torch.utils._pytree.tree_leaves``, ``torch.distributed.tensor._dtensor_spec``),
or when it is a private attribute of one of torch's distributed objects (a
DeviceMesh's ``_layout``, a DTensor's ``_spec``, a SymNode's ``_local_ints``):
those names are collected by building the objects (:func:`torch_private_attributes`).

:func:`private_uses` finds, in one module's source:

- ``import torch.x._y`` and ``from torch.x._y import z`` / ``from torch.x import _z``;
- attribute chains rooted at a name bound to torch (``torch._C._foo``,
  ``dist.distributed_c10d._get_default_store``, ``C10D = torch.ops._c10d_functional``);
- an attribute (or a ``getattr``/``hasattr``/``setattr`` string) that is one of
  the private attributes of torch objects, on any object;
- a string constant that is a private torch module path
  (``importlib.import_module("torch.distributed.tensor._api")``).

Each use is reported as ``(line, name)``. The package's own private names
(``self._spec`` on a redist_opt class) are not torch's: :func:`own_private_names`
collects them, and callers leave them out of the attribute set.
"""

from __future__ import annotations

import ast
import re

__all__ = [
    "private_uses",
    "own_private_names",
    "torch_private_attributes",
    "torch_private_attributes_by_type",
    "is_private_path",
]

_DOTTED = re.compile(r"torch(\.[A-Za-z_][A-Za-z0-9_]*)+")
_ATTR_FUNCS = {"getattr", "hasattr", "setattr", "delattr"}


def _private_part(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def is_private_path(path: str) -> bool:
    """Whether a dotted torch path has a private component. Under ``torch.ops`` only
    the namespace counts (``torch.ops._c10d_functional`` is private; ``torch.ops.aten.
    _to_copy`` is a core ATen operator, whose schema names start with ``_`` by ATen's
    own convention)."""
    parts = path.split(".")
    if parts[:2] == ["torch", "ops"]:
        return len(parts) > 2 and _private_part(parts[2])
    return parts[0] == "torch" and any(_private_part(p) for p in parts[1:])


def _torch_bindings(tree: ast.AST) -> dict[str, str]:
    """{local name: dotted torch path} for every import of torch in the module, and
    every name a boundary module binds to ``private(module, name)``."""
    constants = _module_constants(tree)
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "torch":
                    continue
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    bound[alias.name.split(".")[0]] = "torch"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "torch":
                for alias in node.names:
                    bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif (
            isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
        ):
            path = _private_call_path(node.value, constants)
            if path is not None:
                bound[node.targets[0].id] = path
    return bound


def _module_constants(tree: ast.AST) -> dict[str, str]:
    """{NAME: "string"} of the module's top-level string constants (``_LT = "torch..."``)."""
    return {
        node.targets[0].id: node.value.value
        for node in getattr(tree, "body", [])
        if isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    }


def _private_call_path(node, constants: dict[str, str]) -> str | None:
    """The dotted path a boundary's ``private(module, name)`` call reaches, or None."""
    if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("private", "has_private")):
        return None
    parts = []
    for arg in node.args[:2]:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            parts.append(arg.value)
        elif isinstance(arg, ast.Name) and arg.id in constants:
            parts.append(constants[arg.id])
        else:
            return None
    return ".".join(parts) if parts and parts[0].startswith("torch") else None


def _own_module_bindings(tree: ast.AST) -> set[str]:
    """Local names bound by imports that are not of torch (the package's own modules)."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound |= {a.asname or a.name.split(".")[0] for a in node.names if not a.name.startswith("torch")}
        elif isinstance(node, ast.ImportFrom) and (
            node.level > 0 or not (node.module or "").startswith("torch")
        ):
            bound |= {a.asname or a.name for a in node.names}
    return bound


def _chain(node: ast.Attribute) -> tuple[str, list[str]] | None:
    """``a.b.c`` as (``a``, [``b``, ``c``]); None when the root is not a plain name."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return node.id, attrs[::-1]


def _import_uses(node) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if is_private_path(a.name)]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "torch":
        return [
            f"{node.module}.{a.name}"
            for a in node.names
            if is_private_path(node.module) or _private_part(a.name)
        ]
    return []


def _outermost_attributes(tree: ast.AST):
    """Attribute nodes that are not the ``.value`` of another attribute (whole chains)."""
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    return [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and id(n) not in inner]


def private_uses(source: str, private_attributes: frozenset[str] = frozenset()) -> list[tuple[int, str]]:
    """Every ``(line, private torch name)`` the module ``source`` touches."""
    tree = ast.parse(source)
    bound = _torch_bindings(tree)
    constants = _module_constants(tree)
    own_modules = _own_module_bindings(tree)
    uses = set()
    for node in ast.walk(tree):
        for name in _import_uses(node):
            uses.add((node.lineno, name))
        if isinstance(node, ast.Attribute) and node.attr in private_attributes:
            if isinstance(node.value, ast.Name) and node.value.id in own_modules:
                continue  # a module-level name of one of the package's own modules
            uses.add((node.lineno, f"<torch object>.{node.attr}"))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in _ATTR_FUNCS:
            if len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
                attr = node.args[1].value
                if attr in private_attributes:
                    uses.add((node.lineno, f"<torch object>.{attr}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _DOTTED.fullmatch(node.value) and is_private_path(node.value):
                uses.add((node.lineno, node.value))
        path = _private_call_path(node, constants)
        if path is not None and is_private_path(path):
            uses.add((node.lineno, path))
    for node in _outermost_attributes(tree):
        chain = _chain(node)
        if chain is None or chain[0] not in bound:
            continue
        path = ".".join([bound[chain[0]], *chain[1]])
        if is_private_path(path):
            uses.add((node.lineno, path))
    return sorted(uses)


def own_private_names(sources) -> set[str]:
    """The private attribute names a package defines itself: methods and class
    fields of its classes, attributes it assigns (``self._x = ...``), ``__slots__``
    entries and names given to ``setattr``. (Module-level functions are not
    attributes: ``module._f`` of one of the package's modules is skipped by
    :func:`private_uses` through its binding instead.)"""
    names = set()
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        names.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        names.add(item.target.id)
                    elif isinstance(item, ast.Assign):
                        names |= {t.id for t in item.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                if getattr(node.value, "id", None) in ("self", "cls"):
                    names.add(node.attr)
            elif isinstance(node, ast.Assign) and any(
                getattr(t, "id", "") == "__slots__" for t in node.targets
            ):
                names |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "__setattr__":
                names |= {c.value for c in node.args[1:2] if isinstance(c, ast.Constant)}
    return {n for n in names if isinstance(n, str) and _private_part(n)}


# The torch objects whose private attributes count: built under the fake backend
# and LocalTensorMode (in a subprocess: it initialises a process group). Printed as
# {type name: its private attribute names}; a class counts with its own name.
INTROSPECT = r"""
import json, torch, torch.distributed as dist, torch.fx
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed import _local_tensor as lt
from torch.distributed.tensor import placement_types as pt
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor._ops._math_ops import _NormPartial
from torch.distributed.tensor._redistribute import _TransformInfo
from torch.fx.experimental.sym_node import SymNode
import torch.distributed._functional_collectives as funcol

dist.init_process_group("fake", rank=0, world_size=8)
mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("a", "b", "c"))
flat = mesh["a", "c"]._flatten("ac")
objects = [mesh, flat, DeviceMesh, DTensorSpec, lt.LocalTensorMode, lt.LocalIntNode, SymNode,
           dist.group.WORLD, dist.ProcessGroup,
           Shard(0), Replicate(), Partial(), pt._StridedShard(0, split_factor=2), pt._MaskPartial(),
           _NormPartial(2), torch.fx.Node, torch.fx.Graph, torch.fx.GraphModule, _TransformInfo,
           torch.ops.aten.add.Tensor, torch.ops.aten.add, torch.ops._c10d_functional.all_reduce.default]
tensor_names = set(dir(torch.Tensor))
with lt.LocalTensorMode(8) as mode:
    d = distribute_tensor(torch.arange(24.0).reshape(4, 6), mesh, [Shard(0), Replicate(), Replicate()])
    objects += [d._spec, mode, mesh.get_coordinate()[0].node]
    tensors = [d, d._local_tensor, DTensor, lt.LocalTensor, funcol.AsyncCollectiveTensor]
found = {}
def add(obj, names):
    name = obj.__name__ if isinstance(obj, type) else type(obj).__name__
    names = {n for n in names if n.startswith("_") and not n.endswith("__")}
    found.setdefault(name, set()).update(names)
for obj in objects:
    add(obj, set(dir(obj)) | set(getattr(obj, "__dict__", {})))
for obj in tensors:  # a tensor subclass's own names, not torch.Tensor's
    add(obj, (set(dir(obj)) | set(getattr(obj, "__dict__", {}))) - tensor_names)
print(json.dumps({k: sorted(v) for k, v in found.items()}))
"""


def torch_private_attributes_by_type(python: str) -> dict[str, frozenset[str]]:
    """{type name: private attribute names} of torch's distributed objects, in
    ``python``'s torch."""
    import json
    import subprocess

    out = subprocess.run([python, "-c", INTROSPECT], capture_output=True, text=True, check=True).stdout
    return {k: frozenset(v) for k, v in json.loads(out.strip().splitlines()[-1]).items()}


def torch_private_attributes(python: str) -> frozenset[str]:
    """The private attributes of torch's distributed objects, in ``python``'s torch."""
    return frozenset().union(*torch_private_attributes_by_type(python).values())
