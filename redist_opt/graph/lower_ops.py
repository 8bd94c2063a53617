"""The graph emitter: each IR op as the aten / ``_c10d_functional`` nodes one rank runs.

The IR is rank-free; a compiled graph is one rank's. Every size, start and index
of an op is evaluated at this rank's mesh coordinate first
(:func:`redist_opt.ir.local_ops.rank_params`), so the nodes take plain ints (as
DTensor's own traced graphs do).

No op is written here: the one definition of every op, local ops and the layout around
each collective alike, is in :mod:`redist_opt.ir.local_ops`, which the rank programs run
eagerly and which :class:`Emitter` turns into graph nodes (so a compiled graph equals the
eager plan bitwise).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from redist_opt.ir.local_ops import COLLECTIVE_OPS, LOCAL_OPS
from redist_opt.ir.ops import OPS
from redist_opt.torch_api.tracing import detect_fake_mode, tree_leaves

__all__ = ["Emitter", "LOWERED_OPS"]

aten = torch.ops.aten


def _fake_val(target, args, kwargs):
    def val(a):
        if isinstance(a, fx.Node):
            return a.meta.get("val")
        if isinstance(a, (list, tuple)):
            return type(a)(val(x) for x in a)
        return a

    vargs, vkwargs = val(args), {k: val(v) for k, v in kwargs.items()}
    flat = [a for a in tree_leaves((vargs, vkwargs)) if isinstance(a, torch.Tensor)]
    if not flat:
        return None
    mode = detect_fake_mode(flat)
    if mode is None:
        return None
    with mode:
        return target(*vargs, **vkwargs)


class Emitter:
    """The graph emitter of :mod:`redist_opt.ir.local_ops`: appends each aten / funcol call at
    the graph's insertion point, with a fake ``meta["val"]`` where the inputs carry one (so
    later passes and Inductor see shapes and strides)."""

    def __init__(self, graph: fx.Graph) -> None:
        self.graph = graph

    def __call__(self, target, *args, **kwargs) -> fx.Node:
        node = self.graph.call_function(target, args, kwargs)
        v = _fake_val(target, args, kwargs)
        if v is not None:
            node.meta["val"] = v
        return node

    @staticmethod
    def is_contiguous(x: fx.Node) -> bool:
        # Without a fake value the layout is unknown: say no, so a copy is made (a
        # contiguous copy is what eager's .contiguous() returns for a strided view).
        v = x.meta.get("val")
        return isinstance(v, torch.Tensor) and v.is_contiguous()


LOWERED_OPS = frozenset(LOCAL_OPS) | COLLECTIVE_OPS
assert all(OPS[name].is_collective for name in COLLECTIVE_OPS), "collective table mismatch"
