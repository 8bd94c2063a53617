"""``compiler_fn``: the compiled-graph pass as a graph compiler, for any tracer.

Systems that trace their own forward and backward graphs (autoparallel's
``aot_compile_joint_with_descriptors``, aot_autograd's ``fw_compiler`` /
``bw_compiler``) never go through ``redist_opt.backend``; they hand each graph
to a compiler with the contract ``(gm, example_inputs) -> callable``.
:func:`compiler_fn` returns such a compiler: it runs the compiled-graph pass
(:func:`redist_opt.graph.optimize.optimize_graph`) on the graph, in place,
then the inner compiler. If the pass fails, the graph as traced is compiled
and a warning is given once (the same code path as ``redist_opt.backend``).

The graphs were traced before this compiler sees them, so nothing is routed
here: only the collectives already in the graph are raised, optimized and
lowered back.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.fx as fx

from redist_opt.graph.agreement import SliceAgreement
from redist_opt.graph.backend import check_inner, graph_compiler, run_graph_pass
from redist_opt.graph.mesh_groups import GivenMeshes, mesh_contexts
from redist_opt.graph.optimize import check_allow_list
from redist_opt.ir.options import PlanOptions

__all__ = ["compiler_fn", "GraphPassCompiler"]


def compiler_fn(
    meshes=None, *, inner=None, options: PlanOptions | None = None, **fields
) -> GraphPassCompiler:
    """A graph compiler ``(gm, example_inputs, **kwargs) -> callable`` that runs the
    compiled-graph pass on ``gm``, then ``inner``.

    ``meshes``: the program's DeviceMeshes (or one), whose root meshes the
    graph's group names are resolved against (None: every live mesh this rank
    belongs to; see :func:`~redist_opt.graph.optimize.optimize_graph`).
    ``options=PlanOptions(...)`` or its fields as keywords, as for
    :func:`redist_opt.optimize` and honoured as
    :func:`~redist_opt.graph.optimize.optimize_graph` honours them (groups other
    than "existing" are created at compile time, in graph order: every rank must
    compile the same graphs).
    ``inner``: None (run the graph as it is: ``gm.forward``), "aot_eager",
    "inductor", or a callable with the same contract; keyword arguments the
    caller passes (autoparallel's ``tag_forward=True``) go to a callable inner.

    Usage: ``aot_autograd(fw_compiler=compiler_fn(meshes=mesh), bw_compiler=...)``,
    or autoparallel's ``autop.compiler_fn = compiler_fn(meshes=mesh, inner=autop.compiler_fn)``
    (an attribute of ``AutoParallel``, set before ``apply_placement``; keep
    autoparallel's own compiler as ``inner``: it tags the forward's saved values).
    """
    options = PlanOptions.of(options, **fields)
    check_inner(inner, allow_none=True)
    if meshes is not None:
        # Their contexts are built here, once, and handed to the pass of every graph; an
        # allow-list is refused here, not at the first graph.
        meshes = GivenMeshes(meshes)
        check_allow_list(options, [c.spec for c in mesh_contexts(meshes)])
    return GraphPassCompiler(meshes, inner, options)


class GraphPassCompiler:
    """What :func:`compiler_fn` returns; ``graphs`` counts the graphs it compiled and
    ``results`` holds the pass's :class:`~redist_opt.graph.results.GraphPassResult`
    of each, in order (None for a graph whose pass failed and was compiled as traced):
    what was rewritten, and why the rest was kept."""

    def __init__(self, meshes: GivenMeshes | None, inner, options: PlanOptions) -> None:
        self.meshes, self.inner, self.options = meshes, inner, options
        self.graphs = 0
        self.results: list = []
        self.agreement = SliceAgreement()  # one round per graph, counted per compiler

    def __repr__(self) -> str:
        inner = (
            self.inner
            if self.inner is None or isinstance(self.inner, str)
            else getattr(self.inner, "__name__", type(self.inner).__name__)
        )
        return f"redist_opt.graph_pass.compiler_fn(groups={self.options.groups!r}, inner={inner!r})"

    def __call__(self, gm: fx.GraphModule, example_inputs, **kwargs) -> Callable:
        result = run_graph_pass(gm, meshes=self.meshes, options=self.options, agreement=self.agreement)
        self.results.append(result)
        self.graphs += 1
        if self.inner is None:
            return gm.forward
        compile_one = graph_compiler(self.inner)
        if isinstance(self.inner, str):
            return compile_one(gm, example_inputs)
        return compile_one(gm, example_inputs, **kwargs)
