"""redist_opt: a compiler pass for PyTorch DTensor redistribution.

Lower a redistribution into an FX-graph IR of collectives over mesh layouts,
optimize it with a pass pipeline, and run it over the mesh's process groups.
"""

from redist_opt.api import (
    Recording,
    clear_caches,
    enabled,
    optimize,
    plan,
    profile_steps,
    record,
    redistribute,
    redistribute_cost,
    redistribute_local_tensor,
)
from redist_opt.graph.backend import backend
from redist_opt.ir.mesh import MeshGroup, MeshSpec
from redist_opt.ir.options import PlanOptions
from redist_opt.ir.placements import RedistributeError, parse_placement, parse_placements
from redist_opt.ir.plan import Plan
from redist_opt.measure import tune
from redist_opt.runtime.execute import execute

__all__ = [
    "plan",
    "optimize",
    "redistribute",
    "redistribute_local_tensor",
    "redistribute_cost",
    "enabled",
    "clear_caches",
    "record",
    "Recording",
    "profile_steps",
    "tune",
    "backend",
    "execute",
    "MeshSpec",
    "MeshGroup",
    "Plan",
    "PlanOptions",
    "RedistributeError",
    "parse_placement",
    "parse_placements",
]
