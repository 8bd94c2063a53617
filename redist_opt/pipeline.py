"""Runs the pass pipeline over a plan: PassManager, verifier after every pass, cache.

Results are cached by (plan key, groups policy, pass list), so the eager hot
path pays one dictionary lookup per redistribute after the first.
"""

from __future__ import annotations

import copy
import functools

from torch.fx.passes.infra.pass_manager import PassManager

from . import ir
from .plan import Plan

__all__ = ["run_pipeline"]


def run_pipeline(p: Plan, *, groups="existing", passes=None) -> Plan:
    groups_key = groups if isinstance(groups, str) else tuple(groups)
    pass_key = None if passes is None else tuple(passes)
    return _run_cached(p, groups_key, pass_key)


@functools.lru_cache(maxsize=4096)
def _run_cached(p: Plan, groups, passes) -> Plan:
    from passes import DEFAULT_PIPELINE, PassContext

    pass_classes = DEFAULT_PIPELINE if passes is None else list(passes)
    if not pass_classes:
        return p
    ctx = PassContext(mesh=p.mesh, groups=groups)
    instances = [cls(ctx) for cls in pass_classes]
    gm = copy.deepcopy(p.graph)
    expected = ir.local_shape(p.shape, p.dst, p.mesh.sizes)
    manager = PassManager(passes=instances, run_checks_after_each_pass=True)
    manager.add_checks(lambda m: ir.verify(m, p.mesh.sizes, expected))
    result = manager(gm)
    applied = tuple(getattr(i, "applied", ()) for i in instances)
    return p.replace(graph=result.graph_module, applied_passes=tuple(a for a in applied if a))
