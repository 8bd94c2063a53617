"""The step rewriter: how every pass that rewrites runs of steps builds its result.

A pass scans the plan's regions (``steps.regions``) in order and, at each one,
either keeps it, or emits new steps that stand for some regions, possibly
replacing the last few regions it kept (a pass that matches at an all_to_all may
take the gathers it already kept before it). :meth:`StepRewriter.finish`
re-lowers the new step list (``steps.relower``, so the padding rules live in one
place) and records provenance: each new step's nodes name the collectives of
every region it stands for (``node.meta["from_node"]``); kept regions keep the
provenance they had. Nothing kept and nothing emitted: the input, unmodified.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from torch.fx.passes.infra.pass_base import PassResult

from redist_opt import ir
from redist_opt.ir import steps as S

__all__ = ["StepRewriter"]


class StepRewriter:
    def __init__(self, graph_module, ctx) -> None:
        self.graph_module = graph_module
        self.ctx = ctx
        self.regions: list[S.Region] = S.regions(graph_module)
        # (step, provenance, the region when kept as it was else None), in order
        self._out: list[tuple[ir.StepInfo, tuple[str, ...], S.Region | None]] = []
        self.modified = False

    @functools.cached_property
    def states(self) -> list[S.ShardState]:
        """The shard state before each region of the input."""
        return S.states_before(self.regions, self.ctx.src, self.ctx.mesh)

    def keep(self, region: S.Region) -> None:
        self._out.append((region.step, region.inherited, region))

    def kept_tail(self) -> list[S.Region]:
        """The regions kept as they were at the end of the output so far, oldest first."""
        tail = []
        for _, _, region in reversed(self._out):
            if region is None:
                break
            tail.append(region)
        return tail[::-1]

    def emit(self, steps: Sequence[ir.StepInfo], regions: Sequence[S.Region], *, replace: int = 0) -> None:
        """Emit ``steps`` standing for ``regions`` and for the last ``replace`` kept regions,
        which they replace."""
        replaced: list[S.Region] = []
        for _ in range(replace):
            _, _, region = self._out.pop()
            assert region is not None, "only regions kept as they were can be replaced"
            replaced.insert(0, region)
        origin = tuple(dict.fromkeys(n for r in (*replaced, *regions) for n in r.origin))
        for step in steps:
            self._out.append((step, origin, None))
        self.modified = True

    def scan(self, match: Callable[[int], int]) -> PassResult:
        """Visit the regions in order. ``match(i)`` may emit (and replace) and returns how
        many regions from ``i`` on it consumed; 0 keeps region ``i`` as it is."""
        i = 0
        while i < len(self.regions):
            n = match(i)
            if not n:
                self.keep(self.regions[i])
                n = 1
            i += n
        return self.finish()

    def finish(self) -> PassResult:
        if not self.modified:
            return PassResult(self.graph_module, False)
        steps = [step for step, _, _ in self._out]
        provenance = [origin for _, origin, _ in self._out]
        return PassResult(S.relower(self.graph_module, self.ctx.mesh, steps, provenance), True)
