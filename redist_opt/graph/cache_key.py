"""The cache keys of the compiled-graph pass: everything that decides a rewrite.

Inductor's FX graph cache keys a compile on the graph it is given, its inputs and
Inductor's config, where a custom pass counts by its ``uuid()``
(``torch/_inductor/codecache.py``, ``FxGraphHashDetails``). When the pass runs inside
Inductor (:class:`~redist_opt.graph.inductor_pass.RedistGraphPass`, a post-grad pass),
the graph in the key is the graph *before* the rewrite, so the uuid must cover
whatever else decides the graph after it:

* the code: every module of the package (``passes/`` included, which is a folder
  symlinked into it), not only the graph pass's own: the pipeline that re-plans a
  chain, the IR, the cost model and the passes decide the new collectives;
* the options, the cost profile after ``$REDIST_OPT_COST_PROFILE`` or the group's
  backend has been read (its whole content: a recalibrated file is another key),
  and the pass classes of a ``passes=`` list with their source;
* the meshes the graph's group names resolve against (sizes, names, which flattened
  groups exist, backend), this rank's coordinate in each and the rank map: a
  rewritten graph holds this rank's constants (its block of a slice), and the ranks
  of one host share one cache directory.

``redist_opt.backend`` rewrites before Inductor takes its key, so its key
(:func:`rewritten_graph_key`) needs only the code and the options; while Inductor takes
it, :func:`meshes_keyed_by_meaning` makes a DeviceMesh input count by what it is, so a
restarted job finds the entries of the last one.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import os
import threading
from pathlib import Path

import torch.distributed as dist

from redist_opt.graph.mesh_groups import mesh_contexts
from redist_opt.ir import layout as L
from redist_opt.ir.cost import resolve as resolve_cost
from redist_opt.ir.options import PlanOptions
from redist_opt.torch_api import inductor
from redist_opt.torch_api import mesh as tm
from redist_opt.torch_api.tracing import unset_fake_temporarily

__all__ = [
    "graph_pass_key",
    "rewritten_graph_key",
    "meshes_keyed_by_meaning",
    "source_digest",
    "PACKAGE_DIR",
]

# The package's folder (this module is redist_opt/graph/cache_key.py).
PACKAGE_DIR = Path(__file__).parent.parent


@functools.cache
def source_digest(package_dir: Path = PACKAGE_DIR) -> str:
    """sha256 of every ``.py`` file under the package, by relative path and content.
    Symlinked folders are followed (``passes/``). Read once per process: the modules
    that run were imported from these files."""
    h = hashlib.sha256()
    for root, dirs, files in os.walk(package_dir, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(f for f in files if f.endswith(".py")):
            path = Path(root, name)
            h.update(path.relative_to(package_dir).as_posix().encode() + b"\0")
            h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def graph_pass_key(options: PlanOptions, meshes=None, *extra) -> str:
    """The key of what the graph pass does to a graph with ``options`` on ``meshes``
    (as :func:`~redist_opt.graph.optimize.optimize_graph` takes them) in this
    process and rank; ``extra``: what the caller adds (its own kind, its inner
    compiler), as JSON-able values."""
    with unset_fake_temporarily():  # Inductor asks while tracing; mesh rank maps are real
        contexts = mesh_contexts(meshes)
        meshes_key = [_context_key(c) for c in contexts]
        profiles = (
            [options.cost]
            if options.cost is not None
            else [resolve_cost(c.spec)[0] for c in contexts] or [resolve_cost(None)[0]]
        )
    key = {
        "source": source_digest(),
        "options": _options_key(options),
        "profiles": [p.to_dict() for p in profiles],
        "meshes": meshes_key,
        "extra": list(extra),
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=repr).encode()).hexdigest()


def rewritten_graph_key(options: PlanOptions, *extra) -> str:
    """The key of a compile whose graph was rewritten before the cache saw it
    (``redist_opt.backend``): the graph in Inductor's key holds every decision, so
    this names the code and options alone (no profile, meshes or rank: the same
    rewritten graph compiles the same way on any rank)."""
    key = {"source": source_digest(), "options": _options_key(options), "extra": list(extra)}
    if options.cost is not None:
        key["cost"] = options.cost.to_dict()
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=repr).encode()).hexdigest()


def _options_key(options: PlanOptions) -> dict:
    # the cost model is keyed as resolved (profiles); pass classes by name and source
    return {
        "groups": options.groups,
        "prefer": options.prefer,
        "max_collectives": options.max_collectives,
        "without": list(options.without),
        "passes": None if options.passes is None else [_class_key(c) for c in options.passes],
    }


def _class_key(cls) -> list:
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):  # defined where no source can be read: its name only
        source = ""
    return [getattr(cls, "__module__", ""), getattr(cls, "__qualname__", repr(cls)), source]


def _context_key(ctx) -> dict:
    return {
        "spec": dict(ctx.spec.canonical()),
        "coord": list(ctx.coord),
        "ranks": ctx.rank_map,
        "scope": list(ctx.scope_dims),
        "group_names": _group_names(ctx.device_mesh),
    }


def _group_names(device_mesh) -> list:
    """[layout, process-group name] of every communicator a rewrite on ``device_mesh``
    may name in the graph (its dims' groups, its root's flattened meshes, the world).

    The spec keys the mesh by layouts, but the rewritten graph holds group *names*, which
    c10d hands out in creation order: a job that creates its flattened meshes in another
    order has the same layouts under other names, and must not load a graph naming a
    group it does not have (or another group under that name)."""
    names = [[f"dim {d}", L.group_name(device_mesh, d)] for d in range(device_mesh.ndim)]
    for layout, (mesh, dim) in L.known_communicators(tm.internals(device_mesh)).items():
        name = dist.group.WORLD.group_name if mesh == "world" else L.group_name(mesh, dim)
        names.append([L.format_layout(layout), name])
    return sorted(names)


# -- DeviceMesh inputs in Inductor's FX graph cache key -------------------------------------

_keying_lock = threading.Lock()
_keying_depth = 0
_pickler_init = None


@contextlib.contextmanager
def meshes_keyed_by_meaning():
    """Inside the block, Inductor's FX graph cache key counts a DeviceMesh by
    :func:`redist_opt.ir.layout.mesh_meaning` instead of by its pickled state.

    Dynamo passes a DTensor program's mesh to its graphs as an opaque input, and torch
    2.13's key pickler (``FxGraphCachePickler``, ``torch/_inductor/codecache.py``) writes
    the mesh's whole state, which holds ``_hash`` and ``_thread_id``: both differ in
    every process, so a restarted job missed every entry of a DTensor program. The mesh
    is handed to the compiled code at run time, and what the graph does with it is in the
    graph, so its meaning is all the key needs. Only the key's pickler changes (entries
    are saved by another pickler), and only while ``redist_opt.backend`` compiles one of
    its rewritten graphs (``compile_fx_inner``); the patch is on the class, so a compile
    another thread keys meanwhile gets the same stable key, which is as safe."""
    global _keying_depth, _pickler_init
    FxGraphCachePickler = inductor.fx_graph_key_pickler()

    with _keying_lock:
        if _keying_depth == 0:
            _pickler_init = FxGraphCachePickler.__init__
            FxGraphCachePickler.__init__ = _init_with_mesh_meaning(_pickler_init)
        _keying_depth += 1
    try:
        yield
    finally:
        with _keying_lock:
            _keying_depth -= 1
            if _keying_depth == 0:
                FxGraphCachePickler.__init__ = _pickler_init


def _init_with_mesh_meaning(init):
    from torch.distributed.device_mesh import DeviceMesh

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.dispatch_table[DeviceMesh] = lambda mesh: (_mesh_key, ("DeviceMesh", L.mesh_meaning(mesh)))
        # torch 2.11 to 2.15 key an opaque input (a DeviceMesh Dynamo passes to the graph)
        # through this entry: the boundary raises if a torch no longer does
        FakeScriptObject, opaque = inductor.opaque_input_reducer(self)

        def reduce_opaque(obj):
            if isinstance(obj.real_obj, DeviceMesh):
                return _mesh_key, (obj.script_class_name, L.mesh_meaning(obj.real_obj))
            return opaque(obj)

        self.dispatch_table[FakeScriptObject] = reduce_opaque

    return __init__


def _mesh_key(*meaning):
    """What a DeviceMesh stands for in a key (a key's pickle is hashed, never loaded)."""
    return meaning
