"""Public entry to the compiled-graph pass: ``redist_opt.graph_pass.optimize_graph``.

The pass lives in ``redist_opt.graph``; this module keeps its public name.
"""

from redist_opt.graph.graph_pass import GraphPassResult, RedistGraphPass, count_collectives, optimize_graph

__all__ = ["optimize_graph", "RedistGraphPass", "GraphPassResult", "count_collectives"]
