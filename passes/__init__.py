"""The optimization pipeline, read top to bottom.

Each entry is a ``torch.fx.passes.infra.pass_base.PassBase`` subclass in its own
module of this package, with its rewrite rule and legality conditions in its
docstring and its own test file. ``redist_opt.pipeline.run_pipeline``
instantiates every pass with one :class:`PassContext` (whose ``pipeline`` is the
pass list being run) and runs them under ``torch.fx.passes.infra.PassManager``,
with the IR verifier as its check and the order constraints of
``redist_opt.pipeline.ORDER``.

The framework the passes share: ``_rewriter.StepRewriter`` (keep a step,
replace the last k, emit new ones; provenance and re-lowering),
``PassContext.profitable`` / ``PassContext.best`` (the one profitability rule,
with its one margin ``context.MARGIN``), ``_merge`` (runs, partitions and the
merge-pass base ``MergeRunPass``). Steps a pass makes that DTensor does not
(one all_to_all splitting two dims, one all_gather of blocks) are variants in
the IR's step table, ``redist_opt.ir.ops.STEP_VARIANTS``.
"""

from __future__ import annotations

from .context import PassContext, RedistPass
from .merge_adjacent_all_to_alls import MergeAdjacentAllToAlls
from .merge_all_gathers import MergeAllGathers
from .merge_all_to_alls import MergeAllToAlls
from .merge_gathers_across_dims import MergeGathersAcrossDims
from .merge_reduce_scatters import MergeReduceScatters
from .merge_reductions import MergeReductions
from .merge_reductions_into_all_reduce import MergeReductionsIntoAllReduce
from .reduce_scatter_creator import ReduceScatterCreator
from .reorder_collectives import ReorderCollectives

__all__ = ["PassContext", "RedistPass", "DEFAULT_PIPELINE"]

# The default pipeline, in order.
DEFAULT_PIPELINE: list[type[RedistPass]] = [
    # Move commuting collectives so same-kind ones are adjacent and bytes shrink:
    # local chunking first, then scatters, reductions, all_to_alls, gathers last.
    ReorderCollectives,
    # all_reduce + chunk of its result -> reduce_scatter (folded into the one before it).
    ReduceScatterCreator,
    # Fuse adjacent collectives of one kind over disjoint mesh dims onto product groups.
    MergeReductions,
    MergeReduceScatters,
    # Small tensors: reduce_scatters + all_reduces -> one all_reduce + local chunks,
    # where the cost model says the saved launches outweigh the added bytes.
    MergeReductionsIntoAllReduce,
    MergeAllGathers,
    MergeAllToAlls,
    MergeAdjacentAllToAlls,
    # Gathers of different tensor dims -> one all_gather of blocks + local reassembly.
    MergeGathersAcrossDims,
]
