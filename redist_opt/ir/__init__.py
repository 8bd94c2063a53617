"""The IR: collectives and local ops over mesh layouts, and what builds on it.

The package namespace is the graph IR itself (``ir.StepInfo``, ``ir.verify``,
``ir.ir_name``; defined in ``ops``), as ``torch.fx`` is its graph. The modules
beside it, bottom to top: ``layout`` (torch's layout algebra, wrapped),
``placements``, ``symbolic``, ``mesh``, ``ops``, ``local_ops`` (what each local op
does, run eagerly or emitted into a graph), ``lower``, ``steps``, ``plan``,
``cost``.
"""

from redist_opt.ir.ops import (
    COLLECTIVES,
    OPS,
    GraphBuilder,
    IRVerificationError,
    StepInfo,
    collective_nodes,
    from_nodes,
    ir_name,
    is_collective,
    local_shape,
    max_numel,
    verify,
)

__all__ = [
    "OPS",
    "COLLECTIVES",
    "StepInfo",
    "GraphBuilder",
    "IRVerificationError",
    "collective_nodes",
    "from_nodes",
    "ir_name",
    "is_collective",
    "local_shape",
    "max_numel",
    "verify",
]
