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


def run_pipeline(p: Plan, *, groups="existing", passes=None, cost=None, prefer="time") -> Plan:
    groups_key = groups if isinstance(groups, str) else tuple(groups)
    pass_key = None if passes is None else tuple(passes)
    return _run_cached(p, groups_key, pass_key, cost, prefer)


class _Tracked:
    """Wraps a pass to record whether it changed the IR (for dumps and the plan)."""

    def __init__(self, inner, changed: list) -> None:
        self.inner, self.changed = inner, changed
        self.__name__ = inner.name

    def __call__(self, gm):
        result = self.inner(gm)
        if result.modified:
            self.changed.append(self.inner.name)
        return result


@functools.lru_cache(maxsize=4096)
def _run_cached(p: Plan, groups, passes, cost, prefer) -> Plan:
    from passes import DEFAULT_PIPELINE, PassContext

    from .cost import CostModel

    pass_classes = DEFAULT_PIPELINE if passes is None else list(passes)
    if not pass_classes:
        return p
    ctx = PassContext(
        mesh=p.mesh,
        shape=p.shape,
        src=p.src,
        dtype=p.dtype,
        groups=groups,
        cost=cost or CostModel.default(),
        prefer=prefer,
    )
    changed: list[str] = []
    instances = [_Tracked(cls(ctx), changed) for cls in pass_classes]
    expected = ir.local_shape(p.shape, p.dst, p.mesh.sizes)
    manager = PassManager(passes=instances, run_checks_after_each_pass=True)
    manager.add_checks(lambda m: ir.verify(m, p.mesh.sizes, expected))
    result = manager(copy.deepcopy(p.graph))
    return p.replace(graph=result.graph_module, applied_passes=tuple(changed), notes=tuple(ctx.notes))
