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
pass (:func:`redist_opt.graph.optimize.optimize_graph`): chains of collectives from
different places (two redistributions in a row, hand-written funcol next to
DTensor's) are raised into the IR, optimized together and lowered back. A graph
it cannot improve is left as it was; if the pass fails, the graph as traced is
compiled and a warning is given once (``graph_pass=False`` turns it off).

With Inductor, the graphs this backend compiles are cached by Inductor's FX graph
cache, keyed on each graph after the rewrite, and stay out of AOTAutograd's cache,
which keys on the graph Dynamo captured, before it
(:class:`~redist_opt.graph.inductor_pass.BackendCacheKey`).

``REDIST_OPT_DUMP_DIR`` also receives each forward / backward graph this backend
produced: ``NNNN.compile[.rankR].{forward,backward}.txt``, the collectives with
their group names and the mesh dims each group stands for, then the graph.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.fx as fx

from redist_opt.api import enabled, recording_meshes, warn_once
from redist_opt.debug.dump import dump_dir_from_env
from redist_opt.debug.graph_dump import write_compile_dump
from redist_opt.graph import optimize
from redist_opt.graph.agreement import SliceAgreement
from redist_opt.graph.cache_key import meshes_keyed_by_meaning
from redist_opt.graph.inductor_pass import BackendCacheKey
from redist_opt.graph.optimize import GraphRewrites
from redist_opt.graph.results import GraphPassResult
from redist_opt.ir import layout as L
from redist_opt.ir.options import PlanOptions
from redist_opt.ir.placements import RedistributeError
from redist_opt.runtime.mesh_facts import live_meshes
from redist_opt.torch_api import functorch, inductor
from redist_opt.torch_api import mesh as tm
from redist_opt.torch_api.c10d import FUNCTIONAL_NAMESPACES
from redist_opt.torch_api.tracing import op_name
from redist_opt.torch_api.version import TorchAPIError

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
            # BackendCacheKey). Inductor's FX graph cache keys on each graph after them.
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
        """Inductor config patch for this backend's compiles: :class:`BackendCacheKey`
        after the post-grad custom passes the user set (which keep running)."""
        key = BackendCacheKey(self.options, self.graph_pass)
        return {"post_grad_custom_post_pass": inductor.post_grad_passes_with(key)}

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
) -> GraphPassResult | None:
    """The compiled-graph pass on ``gm`` under ``options``, in place; its result, or
    None if it failed.
    If it fails with one of the errors the planner and the pass raise themselves,
    ``gm`` gets back the graph as traced and a warning is given
    once per distinct failure: a compile that works never fails because of the pass.
    Any other error propagates: a ``TorchAPIError`` (a private torch name that moved)
    above all, which no compile may turn into a warning."""
    snapshot = fx.Graph()
    snapshot.output(snapshot.graph_copy(gm.graph, {}))
    try:
        return optimize.optimize_graph(
            gm, meshes=meshes, options=options, agreement=agreement, rewrites=rewrites
        )
    # What the planner and the pass raise themselves: RedistributeError and IRParseError
    # are ValueErrors, IRVerificationError an AssertionError, GroupUnavailable and
    # AgreementError RuntimeErrors, and the IR raises plain ValueError, RuntimeError and
    # TypeError (a symbolic size it cannot enumerate). Not TorchAPIError (an ImportError),
    # nor the AttributeError / KeyError / NameError of a bug.
    except (ValueError, RuntimeError, AssertionError, TypeError) as e:
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
        except TorchAPIError:  # a private torch name that moved: loud, as everywhere
            raise
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


def _dump_graph(gm: fx.GraphModule, kind: str) -> None:
    if dump_dir_from_env() is not None:  # the labels read every live mesh: only for a dump
        write_compile_dump(kind, describe_collectives(gm), gm.graph)
