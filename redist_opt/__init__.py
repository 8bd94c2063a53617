"""redist_opt: a compiler pass for PyTorch DTensor redistribution.

Lower a redistribution into an FX-graph IR of collectives over mesh layouts,
optimize it with a pass pipeline, and run it over the mesh's process groups.
"""

from .api import enabled, optimize, plan, redistribute, redistribute_local_tensor
from .compile import backend
from .mesh import MeshGroup, MeshSpec
from .placements import RedistributeError, parse_placement, parse_placements
from .plan import Plan
from .runtime import execute

__all__ = [
    "plan",
    "optimize",
    "redistribute",
    "redistribute_local_tensor",
    "enabled",
    "backend",
    "execute",
    "MeshSpec",
    "MeshGroup",
    "Plan",
    "RedistributeError",
    "parse_placement",
    "parse_placements",
]
