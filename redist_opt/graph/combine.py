"""All-gather combining in compiled graphs (XLA's AllGatherCombiner).

A block compiled under SimpleFSDP gathers each parameter with its own all_gather
over the same group: the norm weights' gathers move a few KiB each and cost a
collective's fixed latency, which on gloo is milliseconds. Gathering the
concatenation once and splitting it after is the same values, with one collective
where there were several.

Rewrite, for a set of combinable gathers ``ag_0 .. ag_k`` (in graph order)::

    before                                         after
    ag_0 = all_gather_into_tensor(x_0, n, G)       flat = cat([x_0.view(-1), .., x_k.view(-1)])
    w_0 = wait_tensor(ag_0)                        ag = all_gather_into_tensor(flat, n, G)
    ... (w_0 used)                                 w = wait_tensor(ag)
    ag_1 = all_gather_into_tensor(x_1, n, G)       w_0, .., w_k = the blocks of w.view(n, -1),
    w_1 = wait_tensor(ag_1)                            split by numel, each viewed as before
    ...                                            ... (w_0 used) ... (w_1 used)

The new gather is issued where ``ag_0`` was; its wait and the split sit where the
earliest of the members' waits was. The graph stays functional (a plain
``all_gather_into_tensor``, no ``out=``) and rank-independent (no rank is read),
so it holds under ``compile_on_one_rank`` too; the insertion and the trace of the
new nodes are torch's (``torch._inductor.fx_passes.bucketing.process_collective_bucket``,
what Inductor's own bucketing passes use).

Legality (a gather that fails one stays as it was):

1. a member is ``_c10d_functional.all_gather_into_tensor(x, n, G)`` whose only
   user is its ``wait_tensor``, ``G`` a group name (a string), ``x`` not a dtype
   cast used only by the gather (Inductor's bucketing folds those casts itself);
2. members have the same ``G``, ``n`` and dtype;
3. every member's input is defined before the first member, or is a view (a chain
   of at most ``MAX_HOISTED`` views or clones) of values that are, and those nodes
   move up to just before the first member: so the combined gather issues no
   member later than it was, and no member can depend on another member's result
   (fx graphs are in topological order; views and clones are pure);
4. the combined gather stays latency-bound under the cost model of its mesh: its
   modelled time is at most twice the time of the same gather of 0 bytes. Bigger
   gathers gain little from one launch fewer and pay the copies in and out (and
   are waited for earlier); a group that is no set of a known mesh's dims is not
   priced and not combined.

The decision reads only graph structure, shapes, dtypes, group names and the
cost model (agreed across ranks), so every rank combines the same gathers and
issues the same collectives in the same order on every group.

Not done: reduce_scatters and all_reduces (their inputs are gradients that come
one by one; combining them would delay the first); gathers whose input is
computed after the first member; casts before a gather.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.fx as fx

from redist_opt.graph.chain import C10D, WAIT
from redist_opt.ir.cost import CostModel

__all__ = ["Combination", "combine_all_gathers"]

ALL_GATHER = C10D.all_gather_into_tensor.default
# Legality 4: the combined gather's modelled time over the time of 0 bytes.
LATENCY_BOUND = 2.0
# Legality 3: pure ops an input may be computed by after the first member (moved up).
aten = torch.ops.aten
HOISTABLE = frozenset({
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.slice.Tensor, aten.select.int,
    aten.permute.default, aten.t.default, aten.expand.default, aten.squeeze.dim, aten.unsqueeze.default,
    aten.alias.default, aten.clone.default,
})
MAX_HOISTED = 4


@dataclasses.dataclass(frozen=True)
class Combination:
    """Gathers over one group combined into one."""

    nodes: tuple[str, ...]  # the combined all_gathers, in graph order
    group: str
    nbytes: int  # bytes each rank feeds into the combined gather

    @property
    def removed(self) -> int:
        return len(self.nodes) - 1

    def __str__(self) -> str:
        return (f"combined {len(self.nodes)} all_gathers over group {self.group!r} into one "
                f"({self.nbytes} B in per rank): {', '.join(self.nodes)}")


# (group name, group size, bytes each rank feeds in) -> the cost model's time of one
# all_gather over that group, or None when the group cannot be priced.
GatherTime = Callable[[str, int, int], "float | None"]


def combine_all_gathers(graph: fx.Graph, gather_time: GatherTime) -> list[Combination]:
    """Combine the combinable all_gathers of ``graph`` in place (see the module
    docstring); return what was combined. The caller lints and recompiles."""
    position = {n: i for i, n in enumerate(graph.nodes)}
    sets: dict[tuple, list[list[fx.Node]]] = {}  # per key, in graph order of their first member
    for node in list(graph.nodes):
        key = _member_key(node)
        if key is None:
            continue
        # the earliest set it may join: its gather is issued as early as it can be
        same = sets.setdefault(key, [])
        target = next((m for m in same if _joins(node, m, position, gather_time)), None)
        if target is None:
            same.append([node])
        else:
            target.append(node)
    done = [m for same in sets.values() for m in same if len(m) > 1]
    return [_combine(graph, members) for members in sorted(done, key=lambda m: position[m[0]])]


def _member_key(node: fx.Node):
    """(group, group size, dtype) of a gather that may be combined (legalities 1-2), else None."""
    if node.op != "call_function" or node.target is not ALL_GATHER:
        return None
    x, n, group = node.args[:3]
    users = list(node.users)
    if not (isinstance(group, str) and isinstance(n, int) and isinstance(x, fx.Node)):
        return None
    if len(users) != 1 or users[0].target is not WAIT or _is_cast_for(x, node):
        return None
    val = x.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.ndim == 0 or not isinstance(node.meta.get("val"), torch.Tensor):
        return None
    return group, n, val.dtype


def _is_cast_for(x: fx.Node, gather: fx.Node) -> bool:
    # process_collective_bucket would fold such a cast into the bucket (mixed-precision FSDP)
    casts = (torch.ops.prims.convert_element_type.default, torch.ops.aten._to_copy.default)
    return x.op == "call_function" and x.target in casts and list(x.users) == [gather]


def _in_bytes(node: fx.Node) -> int:
    v = node.args[0].meta["val"]
    return v.numel() * v.element_size()


def _joins(node: fx.Node, members: list[fx.Node], position: dict, gather_time: GatherTime) -> bool:
    """Whether ``node`` may join ``members`` (legalities 3-4); when it may, the views
    computing its input are moved up before the first member."""
    first = members[0]
    hoist = _to_hoist(node.args[0], position[first], position)
    if hoist is None:  # legality 3
        return False
    group, n = node.args[2], node.args[1]
    total = sum(_in_bytes(m) for m in members) + _in_bytes(node)
    t, t0 = gather_time(group, n, total), gather_time(group, n, 0)
    if t is None or t0 is None or t > LATENCY_BOUND * t0:  # legality 4
        return False
    for v in sorted(hoist, key=position.__getitem__):
        first.prepend(v)
    if hoist:
        position.update({v: i for i, v in enumerate(first.graph.nodes)})
    return True


def _to_hoist(x: fx.Node, limit: int, position: dict) -> set[fx.Node] | None:
    """The nodes at or after position ``limit`` that compute ``x``, when they are at
    most ``MAX_HOISTED`` pure views or clones of values before it; else None."""
    todo, found = [x], set()
    while todo:
        v = todo.pop()
        if position[v] < limit or v in found:
            continue
        if v.op != "call_function" or v.target not in HOISTABLE or len(found) == MAX_HOISTED:
            return None
        found.add(v)
        todo += v.all_input_nodes
    return found


def _combine(graph: fx.Graph, members: list[fx.Node]) -> Combination:
    from torch._inductor.fx_passes.bucketing import process_collective_bucket

    first = members[0]
    _, n, group = first.args[:3]
    waits = [next(iter(m.users)) for m in members]
    earliest_wait = min(waits, key=_order(graph))
    nbytes = sum(_in_bytes(m) for m in members)
    names = tuple(m.name for m in members)
    process_collective_bucket(
        graph, members, _gather_concatenated, lambda ins: ([i.meta["val"] for i in ins], group, n),
        insert_before=first, wait_insertion_point=earliest_wait,
    )
    return Combination(names, group, nbytes)


def _order(graph: fx.Graph):
    order = {node: i for i, node in enumerate(graph.nodes)}
    return order.__getitem__


def _gather_concatenated(ins: list[torch.Tensor], group: str, n: int) -> list[torch.Tensor]:
    """Traced into the graph: one gather of the flattened inputs, split into what each
    gather returned (rank-major blocks of each input, dim 0 grown ``n`` times)."""
    flat = torch.cat([x.reshape(-1) for x in ins])
    out = torch.ops._c10d_functional.wait_tensor(torch.ops._c10d_functional.all_gather_into_tensor(flat, n, group))
    blocks = out.reshape(n, -1).split_with_sizes([x.numel() for x in ins], dim=1)
    return [b.reshape((x.shape[0] * n, *x.shape[1:])) for b, x in zip(blocks, ins)]
