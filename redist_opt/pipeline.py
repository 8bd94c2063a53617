"""Runs the pass pipeline over a plan: PassManager, verifier after every pass, cache.

Results are cached by (plan key, groups policy, pass list), so the eager hot
path pays one dictionary lookup per redistribute after the first.
"""

from __future__ import annotations

import functools
import itertools
from pathlib import Path

from torch.fx.passes.infra.pass_manager import PassManager

from redist_opt import ir
from redist_opt.ir.cost import resolve as resolve_cost
from redist_opt.debug.dump import dump_dir_from_env, plan_tag, write_pass_dump
from redist_opt.ir.placements import RedistributeError
from redist_opt.ir.plan import Plan

__all__ = ["run_pipeline", "clear_cache"]


def run_pipeline(p: Plan, *, groups="existing", passes=None, cost=None, prefer="time", dump_dir=None) -> Plan:
    groups_key = groups if isinstance(groups, str) else tuple(groups)
    pass_key = None if passes is None else tuple(passes)
    if cost is None:  # $REDIST_OPT_COST_PROFILE, else the mesh backend's profile
        cost, source = resolve_cost(p.mesh)
    else:
        source = "passed as cost="
    if dump_dir is None:
        dump_dir = dump_dir_from_env()
    else:
        dump_dir = Path(dump_dir)
    if dump_dir is not None:  # dumping: run uncached, so every run writes its files
        return _run_cached.__wrapped__(p, groups_key, pass_key, cost, prefer, source, dump_dir)
    return _run_cached(p, groups_key, pass_key, cost, prefer, source)


class _Tracked:
    """Wraps a pass: records whether it changed the IR and verifies the IR if so."""

    def __init__(self, inner, changed: list, check, on_change=None) -> None:
        self.inner, self.changed, self.check, self.on_change = inner, changed, check, on_change
        self.__name__ = inner.name

    def __call__(self, gm):
        result = self.inner(gm)
        if result.modified:
            self.changed.append(self.inner.name)
            self.check(result.graph_module)
            if self.on_change is not None:
                self.on_change(self.inner.name, result.graph_module)
        return result


@functools.lru_cache(maxsize=4096)
def _run_cached(p: Plan, groups, passes, cost, prefer, source, dump_dir=None) -> Plan:
    from redist_opt.passes import DEFAULT_PIPELINE, PassContext

    pass_classes = DEFAULT_PIPELINE if passes is None else list(passes)
    if not pass_classes:
        return p
    ctx = PassContext(
        mesh=p.mesh,
        shape=p.shape,
        src=p.src,
        dtype=p.dtype,
        groups=groups,
        cost=cost,
        prefer=prefer,
        pipeline=tuple(pass_classes),
    )
    profile = f"{cost.name} ({source})"
    changed: list[str] = []
    expected = ir.local_shape(p.shape, p.dst, p.mesh.sizes)

    def check(gm):
        ir.verify(gm, p.mesh.sizes, expected)

    # The verifier runs after every pass that changed the IR (the input was
    # verified when it was lowered).
    on_change = None
    if dump_dir is not None:
        seq = itertools.count()
        pipeline_name = f"default_{plan_tag(p)}"

        def on_change(pass_name, gm):
            snapshot = p.replace(
                graph=gm, applied_passes=tuple(changed), notes=tuple(ctx.notes), cost_profile=profile
            )
            write_pass_dump(dump_dir, next(seq), pipeline_name, pass_name, snapshot)

        on_change(None, p.graph)  # NNNN.<pipeline>.before_pipeline
    instances = [_Tracked(cls(ctx), changed, check, on_change) for cls in pass_classes]
    manager = PassManager(passes=instances)
    # Passes build new graphs (steps.relower) and never mutate their input.
    try:
        result = manager(p.graph)
    except Exception as e:
        # PassManager wraps pass errors; a RedistributeError is the user's, surface it.
        if isinstance(e.__cause__, RedistributeError):
            raise e.__cause__ from None
        raise
    return p.replace(
        graph=result.graph_module, applied_passes=tuple(changed), notes=tuple(ctx.notes), cost_profile=profile
    )


def clear_cache() -> None:
    """Forget every pipeline result (``redist_opt.clear_caches``)."""
    _run_cached.cache_clear()
