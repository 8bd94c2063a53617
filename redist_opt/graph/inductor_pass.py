"""The graph pass as Inductor sees it: the post-grad custom passes, each with the
``uuid()`` that keys Inductor's FX graph cache.

* :class:`RedistGraphPass`: the compiled-graph pass itself as Inductor's
  ``post_grad_custom_post_pass``, for a user who compiles with plain Inductor;
* :class:`BackendCacheKey`: what ``redist_opt.backend`` sets as that pass while it
  compiles with Inductor: it rewrites nothing (the backend ran the graph pass before
  Inductor) and only gives the compile a cache key of its own.
"""

from __future__ import annotations

import torch.fx as fx

from redist_opt.graph.agreement import SliceAgreement
from redist_opt.graph.cache_key import graph_pass_key, rewritten_graph_key
from redist_opt.graph.optimize import optimize_graph
from redist_opt.graph.results import GraphPassResult
from redist_opt.ir.options import PlanOptions
from redist_opt.ir.placements import RedistributeError
from redist_opt.torch_api.inductor import CustomGraphPass

__all__ = ["RedistGraphPass", "BackendCacheKey"]


class RedistGraphPass(CustomGraphPass):
    """``torch._inductor.config.post_grad_custom_post_pass = RedistGraphPass(...)``.

    ``meshes`` and ``options=PlanOptions(...)`` (or its fields as keywords) as for
    :func:`~redist_opt.graph.optimize.optimize_graph`. ``uuid()`` covers every decision
    (:func:`~redist_opt.graph.cache_key.graph_pass_key`: the package's source, the
    options, the resolved cost profile, the meshes and this rank's place in them), so
    FX graph caching reuses a compiled graph only when this pass would rewrite it the
    same way. The :class:`~redist_opt.graph.results.GraphPassResult` of each graph is
    appended to ``self.results``.

    Two things are deliberately off in this hook, because with FX graph caching
    one rank may load a cached graph (and not run the pass) while another
    compiles: creating groups (any ``groups`` but "existing" is refused: a cached
    graph would name a group the loading process never created), and agreeing across
    ranks on the mesh dims of constant-index slices (a rank that does not run the
    pass would never answer). Slices whose mesh dims are unambiguous are still
    rewritten. ``redist_opt.backend`` runs the pass before Inductor's cache lookup and
    has neither restriction.
    """

    def __init__(self, *, meshes=None, options: PlanOptions | None = None, **fields) -> None:
        options = PlanOptions.of(options, **fields)
        if options.groups != "existing":
            raise RedistributeError(
                f"groups={options.groups!r}: RedistGraphPass takes groups='existing' only: flatten "
                "the mesh dims you want merged before compiling, or use redist_opt.backend(groups='create')"
            )
        self.meshes, self.options = meshes, options
        self.results: list[GraphPassResult] = []

    def __call__(self, graph: fx.Graph) -> None:
        self.results.append(
            optimize_graph(
                graph, meshes=self.meshes, options=self.options, agreement=SliceAgreement(_no_agreement)
            )
        )

    def uuid(self):
        return graph_pass_key(self.options, self.meshes, "RedistGraphPass")


def _no_agreement(facts):
    return "no agreement across ranks inside Inductor's (cacheable) post-grad pass"


class BackendCacheKey(CustomGraphPass):
    """Inductor's post-grad custom pass while ``redist_opt.backend`` compiles with
    Inductor: calling it changes nothing (the rewrite happened before Inductor's
    passes); its ``uuid()`` gives the compile a cache key of its own.

    Inductor's FX graph cache keys a compile on the graph it is given, its inputs and
    Inductor's config, custom passes by their ``uuid()``. That graph is the one the
    backend traced with its plans and rewrote with the compiled-graph pass, on this
    rank, in this process: every decision (plans, the pass, created groups' names,
    the compile-time agreement with the other ranks, this rank's constants) is in it,
    so an entry is served only for the same rewritten graph. The uuid adds the
    package's source, the options and whether the pass runs
    (:func:`~redist_opt.graph.cache_key.rewritten_graph_key`), which also keeps
    torch's compile of the same graph and ours on entries of their own.

    AOTAutograd's cache is off for these compiles (the backend's ``_compile``): it keys
    on the graph Dynamo captured, before the trace, and a hit would skip what decides
    the graphs:

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

    def __call__(self, graph: fx.Graph) -> None:
        """Nothing: Inductor calls every post-grad custom pass; this one only keys the cache."""

    def uuid(self):
        return rewritten_graph_key(self.options, "redist_opt.backend", "inductor", self.graph_pass_on)
