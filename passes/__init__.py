"""The optimization pipeline, read top to bottom.

Each entry is a ``torch.fx.passes.infra.pass_base.PassBase`` subclass in its own
module of this package, with its rewrite rule and legality conditions in its
docstring and its own test file. ``redist_opt.optimize`` instantiates every
pass with a :class:`PassContext` (the mesh, the groups policy, the cost model)
and runs them under ``torch.fx.passes.infra.PassManager`` with the IR verifier
after each pass.

The pipeline is empty until the merge / reorder passes land (issue 3): the
naive lowering is then the optimized plan, which is what DTensor does with its
merge pass disabled.
"""

from __future__ import annotations

import dataclasses

from redist_opt.mesh import MeshSpec

__all__ = ["PassContext", "DEFAULT_PIPELINE"]


@dataclasses.dataclass(frozen=True)
class PassContext:
    """What every pass may read: rank-independent facts only (same plan on every rank)."""

    mesh: MeshSpec
    groups: str = "existing"


# The default pipeline, in order. Each item is a PassBase subclass taking a PassContext.
DEFAULT_PIPELINE: list[type] = []
