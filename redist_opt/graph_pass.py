"""Public entry to the compiled-graph pass: ``redist_opt.graph_pass.optimize_graph``,
and ``redist_opt.graph_pass.compiler_fn`` (the pass as a graph compiler for
aot_autograd, autoparallel and other tracers).

The pass lives in ``redist_opt.graph``; this module keeps its public name.
"""

from redist_opt.graph.compiler import compiler_fn
from redist_opt.graph.inductor_pass import RedistGraphPass
from redist_opt.graph.optimize import GraphRewrites, optimize_graph
from redist_opt.graph.results import GraphPassResult, count_collectives

__all__ = [
    "optimize_graph",
    "compiler_fn",
    "RedistGraphPass",
    "GraphPassResult",
    "GraphRewrites",
    "count_collectives",
]
