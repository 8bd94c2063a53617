"""torch.compile backend: DTensor redistributions traced through redist_opt.

Under ``torch.compile``, Dynamo records calls of ``DTensor.redistribute`` (and
DTensor ops) into a graph; AOTAutograd then runs DTensor's Python code on fake
tensors to trace the forward and backward graphs, and the functional collectives
``redistribute_local_tensor`` issues become the graphs' collectives
(``_c10d_functional.all_reduce`` ... ``wait_tensor``, groups named by string).
:func:`backend` runs that AOTAutograd trace inside :func:`redist_opt.enabled`,
so the graphs hold our optimized plans, forward and backward, then hands them to
the inner compiler. Dynamo itself never sees our planner (the routed function
defers to torch's while Dynamo traces), so a program that compiles with torch's
default backend compiles with this one.

Then, before the inner compiler, each graph goes through the compiled-graph
pass (:func:`redist_opt.graph.graph_pass.optimize_graph`): chains of collectives from
different places (two redistributions in a row, hand-written funcol next to
DTensor's) are raised into the IR, optimized together and lowered back. A graph
it cannot improve is left as it was; if the pass fails, the graph as traced is
compiled and a warning is given once (``graph_pass=False`` turns it off).

With Inductor, the graphs this backend compiles are cached by Inductor's FX graph
cache, keyed on each graph after the rewrite, and stay out of AOTAutograd's cache,
which keys on the graph Dynamo captured, before it (:class:`CompiledByRedistOpt`).

``REDIST_OPT_DUMP_DIR`` also receives each forward / backward graph this backend
produced: ``NNNN.compile[.rankR].{forward,backward}.txt``, the collectives with
their group names and the mesh dims each group stands for, then the graph.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

import torch.fx as fx

from redist_opt.api import enabled, live_meshes, recording_meshes, warn_once
from redist_opt.debug.dump import dump_dir_from_env, rank_suffix
from redist_opt.graph import graph_pass
from redist_opt.graph.agreement import SliceAgreement
from redist_opt.graph.cache_key import meshes_keyed_by_meaning, rewritten_graph_key
from redist_opt.graph.graph_pass import GraphRewrites
from redist_opt.ir import layout as L
from redist_opt.ir.options import PlanOptions
from redist_opt.ir.placements import RedistributeError
from redist_opt.torch_api import functorch, inductor
from redist_opt.torch_api import mesh as tm
from redist_opt.torch_api.c10d import FUNCTIONAL_NAMESPACES
from redist_opt.torch_api.tracing import op_name

__all__ = [
    "backend",
    "collectives",
    "describe_collectives",
    "check_inner",
    "graph_compiler",
    "run_graph_pass",
]

INNER_COMPILERS = ("inductor", "aot_eager")


def backend(
    inner: str | Callable = "inductor",
    *,
    graph_pass: bool = True,
    rewrites: GraphRewrites = GraphRewrites(),
    options: PlanOptions | None = None,
    **fields,
):
    """A ``torch.compile`` backend that traces DTensor redistributions through redist_opt.

    ``inner``: ``"inductor"``, ``"aot_eager"``, or a callable with the contract of
    aot_autograd's ``fw_compiler`` (``(gm, example_inputs) -> callable``), called on
    each forward and backward graph. ``options=PlanOptions(...)`` or its fields as
    keywords: :func:`redist_opt.enabled`'s options, which both the trace and the
    compiled-graph pass honour whole. Under ``groups="create"`` (or an allow-list)
    merged collectives may create flattened process groups while tracing; every rank
    traces the same program, so they are created in the same order everywhere.
    ``graph_pass``: run the compiled-graph pass on each traced graph; ``rewrites``: which
    of its graph-only rewrites run (:class:`~redist_opt.graph_pass.GraphRewrites`, by
    default all: reassociation and combining; turning one off measures what it buys).

    Usage: ``torch.compile(model, backend=redist_opt.backend())``.
    """
    options = PlanOptions.of(options, **fields)
    check_inner(inner)
    if not isinstance(graph_pass, bool):
        raise RedistributeError(f"graph_pass={graph_pass!r}: expected True or False")
    if not isinstance(rewrites, GraphRewrites):
        raise RedistributeError(f"rewrites={rewrites!r}: expected a redist_opt.graph_pass.GraphRewrites")
    return _RedistOptBackend(inner, options, graph_pass=graph_pass, rewrites=rewrites)


class _RedistOptBackend:
    def __init__(self, inner, options: PlanOptions, *, graph_pass: bool, rewrites: GraphRewrites):
        self.inner = inner
        self.options = options
        self.graph_pass = graph_pass
        self.rewrites = rewrites
        # The meshes redist_opt planned on while tracing the current program: the
        # graph pass resolves group names against these roots (a backward graph may
        # be compiled lazily, after the trace, so they are kept here).
        self._trace_meshes: dict = {}
        # Cross-rank agreement on slice dims: one round per graph, counted per compiler.
        self.agreement = SliceAgreement()

    def __repr__(self) -> str:
        inner = self.inner if isinstance(self.inner, str) else getattr(self.inner, "__name__", "callable")
        return f"redist_opt.backend(inner={inner!r}, groups={self.options.groups!r})"

    def __call__(self, gm: fx.GraphModule, example_inputs):
        # The routing must be active while AOTAutograd traces (inside this call);
        # the inner compilers may run later (a lazily compiled backward), on
        # graphs already traced.
        if _compiled_for_any_rank():
            # Under compile_on_one_rank (torch.compiler.config from 2.15) the graph must run on
            # every rank: torch's trace reads mesh coordinates at run time, while our
            # planner specialises to this rank's. So torch traces, and the graph pass
            # finds no group names or constant slices to raise: the graph stays as is.
            warn_once(
                ("compile_on_one_rank",),
                "redist_opt.backend: compile_on_one_rank is on, so DTensor "
                "redistributions are traced by torch (rank-independent) and left as traced",
            )
            self._trace_meshes = {}
            return self._compile(gm, example_inputs)
        with enabled(options=self.options), recording_meshes() as used:
            self._trace_meshes = used
            return self._compile(gm, example_inputs)

    def _compile(self, gm, example_inputs):
        if self.inner == "inductor":

            def inner_compile(g, inputs, *args, **kwargs):
                self._optimize(g)
                _dump_graph(g, "backward" if kwargs.get("is_backward") else "forward")
                with meshes_keyed_by_meaning():
                    return inductor.compile_fx_inner(g, inputs, *args, **kwargs)

            # AOTAutograd's cache is looked up before the trace: a hit would skip the
            # routing, the graph pass and its rounds with the other ranks (see
            # CompiledByRedistOpt). Inductor's FX graph cache keys on each graph after them.
            with functorch.autograd_cache_off():
                return inductor.compile_fx(
                    gm, example_inputs, inner_compile=inner_compile, config_patches=self._cache_config()
                )

        compile_one = graph_compiler(self.inner)

        def fw_compiler(g, inputs):
            self._optimize(g)
            _dump_graph(g, "forward")
            return compile_one(g, inputs)

        def bw_compiler(g, inputs):
            self._optimize(g)
            _dump_graph(g, "backward")
            return compile_one(g, inputs)

        # torch's own "aot_eager" backend partitions with min-cut rematerialization and
        # keeps inference input mutations; so does ours with that inner compiler, so the
        # two differ only by the pass (the default partitioner leaves dead recomputed
        # matmuls in the backward: 12 mm per TransformerBlock backward instead of 10).
        partition = (
            dict(
                partition_fn=functorch.min_cut_partitioner(),
                keep_inference_input_mutations=True,
            )
            if self.inner == "aot_eager"
            else {}
        )
        return functorch.aot_autograd(fw_compiler=fw_compiler, bw_compiler=bw_compiler, **partition)(
            gm, example_inputs
        )

    def _cache_config(self) -> dict:
        """Inductor config patch for this backend's compiles: :class:`CompiledByRedistOpt`
        after the post-grad custom passes the user set (which keep running)."""
        mark = CompiledByRedistOpt(self.options, self.graph_pass)
        return {"post_grad_custom_post_pass": inductor.post_grad_passes_with(mark)}

    def _optimize(self, gm: fx.GraphModule) -> None:
        """The compiled-graph pass, in place; on failure the graph as traced, and one warning."""
        if not self.graph_pass:
            return
        # The meshes planned on while tracing this program (their roots hold the
        # groups its chains name); none: every live mesh.
        run_graph_pass(
            gm,
            meshes=list(self._trace_meshes.values()) or None,
            options=self.options,
            agreement=self.agreement,
            rewrites=self.rewrites,
        )


def _compiled_for_any_rank() -> bool:
    """``compile_on_one_rank``: one rank's trace runs on all."""
    return inductor.compile_on_one_rank()


class CompiledByRedistOpt(inductor.CustomGraphPass):
    """Inductor's post-grad custom pass while ``redist_opt.backend`` compiles with
    Inductor: it changes nothing (the rewrite happened before Inductor's passes) and
    gives the compile a cache key of its own.

    Inductor's FX graph cache keys a compile on the graph it is given, its inputs and
    Inductor's config, custom passes by their ``uuid()``. That graph is the one this
    backend traced with its plans and rewrote with the compiled-graph pass, on this
    rank, in this process: every decision (plans, the pass, created groups' names,
    the compile-time agreement with the other ranks, this rank's constants) is in it,
    so an entry is served only for the same rewritten graph. The uuid adds the
    package's source, the options and whether the pass runs
    (:func:`~redist_opt.graph.cache_key.rewritten_graph_key`), which also keeps
    torch's compile of the same graph and ours on entries of their own.

    AOTAutograd's cache is off for these compiles (``_compile``): it keys on the graph
    Dynamo captured, before the trace, and a hit would skip what decides the graphs:

    * the compile-time agreement (:mod:`redist_opt.graph.agreement`): a rank that
      loads a cached graph never answers; the ranks that compile wait, give up and
      keep a chain that the loading rank runs rewritten (ranks of one job may find
      different cache states);
    * ``groups="create"``: groups created while tracing would not exist in a process
      that loads the graph;
    * facts outside that key: which flattened groups exist, the cost profile.

    So a warm start still traces and runs the graph pass (with its rounds), and loads
    what Inductor compiled (code generation, C++/Triton compiles, autotuning).
    """

    def __init__(self, options: PlanOptions, graph_pass_on: bool) -> None:
        self.options, self.graph_pass_on = options, graph_pass_on

    def __call__(self, graph) -> None:
        return None

    def uuid(self):
        return rewritten_graph_key(self.options, "redist_opt.backend", "inductor", self.graph_pass_on)


def check_inner(inner, *, allow_none: bool = False) -> None:
    """Refuse an inner compiler other than "inductor", "aot_eager" or a callable
    (or None, where ``allow_none``)."""
    if inner is None and allow_none:
        return
    names = "'inductor', 'aot_eager'" + (", None" if allow_none else "")
    if isinstance(inner, str) and inner not in INNER_COMPILERS:
        raise ValueError(f"inner={inner!r}: expected {names} or a callable (gm, example_inputs)")
    if not isinstance(inner, str) and not callable(inner):
        raise TypeError(f"inner must be {names} or a callable, got {type(inner).__name__}")


def graph_compiler(inner) -> Callable:
    """The compiler of one forward or backward graph that ``inner`` names, with the
    contract of aot_autograd's ``fw_compiler``: ``(gm, example_inputs) -> callable``.

    "inductor": Inductor's per-graph compiler (``compile_fx_inner``); "aot_eager":
    the graph run as is (``boxed_nop``); a callable: itself.
    """
    if inner == "inductor":
        return inductor.compile_fx_inner
    if inner == "aot_eager":
        return functorch.boxed_nop()
    return inner


def run_graph_pass(
    gm: fx.GraphModule,
    *,
    meshes=None,
    options: PlanOptions,
    agreement=None,
    rewrites: GraphRewrites = GraphRewrites(),
) -> graph_pass.GraphPassResult | None:
    """The compiled-graph pass on ``gm`` under ``options``, in place; its result, or
    None if it failed.
    If it fails, ``gm`` gets back the graph as traced and a warning is given once per
    distinct failure: a compile that works never fails because of the pass."""
    snapshot = fx.Graph()
    snapshot.output(snapshot.graph_copy(gm.graph, {}))
    try:
        return graph_pass.optimize_graph(
            gm, meshes=meshes, options=options, agreement=agreement, rewrites=rewrites
        )
    except Exception as e:  # never turn a compile that works into one that fails
        gm.graph = snapshot
        gm.recompile()
        warn_once(
            ("graph-pass", type(e).__name__, str(e)),
            f"redist_opt: the compiled-graph pass failed ({type(e).__name__}: {e}); "
            "compiling the graph as traced",
        )
        return None


# -- reading collectives back out of a traced graph ------------------------------------

_COLLECTIVE_OPS = (
    "all_reduce",
    "all_reduce_coalesced",
    "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced",
    "all_gather_into_tensor",
    "all_gather_into_tensor_coalesced",
    "all_to_all_single",
    "broadcast",
)


def collectives(gm: fx.GraphModule) -> list[tuple[str, str]]:
    """(op name, group name) of every functional collective in ``gm``, in graph order.

    ``wait_tensor`` is not counted: it completes a collective, it is not one.
    """
    out = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        target = node.target
        op = op_name(target)
        if op is None or target.namespace not in FUNCTIONAL_NAMESPACES:
            continue
        if op not in _COLLECTIVE_OPS:
            continue
        group = (
            node.args[-1]
            if isinstance(node.args[-1], str)
            else next(
                (
                    a
                    for a in node.args
                    if isinstance(a, str) and a not in ("sum", "avg", "max", "min", "product")
                ),
                "?",
            )
        )
        out.append((op, group))
    return out


def _group_labels() -> dict[str, str]:
    """Process-group name -> "mesh dims <names> of mesh <shape>" for every live mesh
    (their dims and flattened meshes)."""
    labels: dict[str, str] = {}
    for mesh in live_meshes():
        try:
            root = tm.root_mesh(mesh)
            names = root.mesh_dim_names or tuple(f"dim{d}" for d in range(root.ndim))
            shape = "x".join(str(s) for s in root.shape)
            for d in range(root.ndim):
                labels.setdefault(L.group_name(root, d), f"mesh dim {names[d]} of mesh {shape}")
            for flat_name, flat, covered in L.flattened_dims(tm.internals(root)):
                what = "+".join(names[d] for d in covered) if covered else flat_name
                labels.setdefault(
                    L.group_name(flat), f"mesh dims {what} of mesh {shape} (flattened {flat_name})"
                )
        except Exception:  # noqa: BLE001 - a label is a courtesy; never fail a compile for it
            continue
    return labels


def describe_collectives(gm: fx.GraphModule) -> list[str]:
    """One line per collective: op, group name, and the mesh dims the group stands for."""
    labels = _group_labels()
    return [
        f"{op}  group={group}  ({labels.get(group, 'group not from a known mesh')})"
        for op, group in collectives(gm)
    ]


_dump_seq = itertools.count()
_dump_lock = threading.Lock()


def _dump_graph(gm: fx.GraphModule, kind: str) -> None:
    directory = dump_dir_from_env()
    if directory is None:
        return
    with _dump_lock:
        seq = next(_dump_seq)
    rank = rank_suffix()
    lines = describe_collectives(gm)
    text = [f"# {kind} graph traced by redist_opt.backend", f"# {len(lines)} collective(s)"]
    text += [f"#   {line}" for line in lines] or ["#   (none)"]
    text += ["", str(gm.graph)]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{seq:04d}.compile{rank}.{kind}.txt").write_text("\n".join(text) + "\n")
