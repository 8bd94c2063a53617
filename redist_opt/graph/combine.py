"""Collective combining in compiled graphs (XLA's AllGatherCombiner, ReduceScatterCombiner
and AllReduceCombiner).

A block compiled under SimpleFSDP gathers each parameter with its own all_gather
over the same group, and reduce-scatters each gradient with its own
reduce_scatter: small ones (norm weights, narrow layers) move a few KiB each and
cost a collective's fixed latency, which on gloo is milliseconds. One collective
of the concatenation, split after, is the same values with one collective where
there were several.

Rewrite, for a set of combinable collectives ``c_0 .. c_k`` (in graph order) of
one kind over one group::

    before                                         after (all_gather)
    ag_0 = all_gather_into_tensor(x_0, n, G)       flat = cat([x_0.view(-1), .., x_k.view(-1)])
    w_0 = wait_tensor(ag_0)                        ag = all_gather_into_tensor(flat, n, G)
    ... (w_0 used)                                 w = wait_tensor(ag)
    ag_1 = all_gather_into_tensor(x_1, n, G)       w_0, .., w_k = the blocks of w.view(n, -1),
    w_1 = wait_tensor(ag_1)                            split by numel, each viewed as before
    ...                                            ... (w_0 used) ... (w_1 used)

A reduce_scatter set reduce-scatters the concatenation of each input's ``n``
blocks (block ``r`` of every input goes to rank ``r``), an all_reduce set the
concatenation itself; each member's value is its slice of the result.

Where the new collective goes:

* **all_gather** (its inputs are parameters, ready early): issued where the
  first member was; no member is issued later than before.
* **reduce_scatter, all_reduce** (their inputs are gradients, computed one by
  one): issued where the last member was; no member's result is needed before
  that (legality 3), so no user waits longer, but the earlier members' transfer
  no longer overlaps the compute between them and the last.

The wait and the split sit where the earliest of the members' waits was (gathers)
or where the first member's value is first used (reductions). The
graph stays functional and rank-independent (no rank is read), so it holds under
``compile_on_one_rank`` too; the insertion and the trace of the new nodes are
torch's (``torch._inductor.fx_passes.bucketing``: ``process_collective_bucket``,
and its functional reduce_scatter and all_reduce merge functions, what Inductor's
own bucketing passes use).

Legality (a collective that fails one stays as it was):

1. a member is a ``_c10d_functional`` ``all_gather_into_tensor(x, n, G)``,
   ``reduce_scatter_tensor(x, op, n, G)`` or ``all_reduce(x, op, G)`` whose only
   user is its ``wait_tensor``, ``G`` a group name (a string), ``x`` a tensor of
   at least one dim, of static sizes, and not a dtype cast used only by a gather
   (Inductor's bucketing folds those casts itself);
2. members have the same kind, ``G``, ``n``, reduce op and dtype;
3. all_gather: every member's input is defined before the first member, or is a
   view (a chain of at most ``MAX_HOISTED`` views or clones) of values that are,
   and those nodes move up to just before the first member; reduce_scatter and
   all_reduce: every member's value is first used after the last member (its wait
   may sit earlier: waits sink to the first use, which changes no value). Either
   way no member can depend on another member's result (fx graphs are in
   topological order; views and clones are pure);
4. the combined collective stays latency-bound under the cost model of its mesh:
   its modelled time is at most twice the time of the same collective of 0 bytes.
   Bigger sets gain little from one launch fewer and pay the copies in and out
   (and, for gathers, an earlier wait; for reductions, less overlap); a group that
   is no set of a known mesh's dims is not priced and not combined;
5. no member is an uneven shard's collective: a gather whose result is narrowed, or
   a reduction whose input is padded. Their graphs differ by rank (the pad or the
   narrow is on some ranks only), so legality 3 could decide differently on
   different ranks; the marks checked here are on every rank's graph.

Values: gathers are exact; a combined reduction adds the same terms per element,
possibly in another order inside the backend's algorithm (a ring chunks the
larger buffer differently), so values are equal within rounding, as with merged
reductions; every rank still gets the same reduced value.

The decision reads only graph structure, shapes, dtypes, group names and the
cost model, so every rank combines the same collectives and issues the same
collectives in the same order on every group, as long as the graphs of the ranks
have the same structure: true of DTensor's graphs for even shards, and legality 5
keeps uneven ones out. The cost model is the one chain planning resolves for the
mesh; it is agreed across ranks when DTensor planning reaches the mesh while
tracing, not for a graph of hand-written collectives only (docs/faults.md).

Not done: gathers whose input is computed after the first member; reductions
whose result is used before the last member (a view right after a wait counts as
a use); uneven shards; casts before a gather; all_to_all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.fx as fx

from redist_opt.graph.chain import WAIT
from redist_opt.graph.mesh_groups import resolve_group_name
from redist_opt.ir.cost import CostModel
from redist_opt.ir.cost import resolve as resolve_cost
from redist_opt.torch_api import inductor
from redist_opt.torch_api.c10d import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER

__all__ = ["Combination", "collective_time_on", "combine_collectives"]

aten = torch.ops.aten
KIND = {ALL_GATHER: "all_gather", REDUCE_SCATTER: "reduce_scatter", ALL_REDUCE: "all_reduce"}
# Legality 4: the combined collective's modelled time over the time of 0 bytes.
LATENCY_BOUND = 2.0
# Legality 3: pure ops a gather's input may be computed by after the first member (moved up).
HOISTABLE = frozenset(
    {
        aten.view.default,
        aten._unsafe_view.default,
        aten.reshape.default,
        aten.slice.Tensor,
        aten.select.int,
        aten.permute.default,
        aten.t.default,
        aten.expand.default,
        aten.squeeze.dim,
        aten.unsqueeze.default,
        aten.alias.default,
        aten.clone.default,
    }
)
MAX_HOISTED = 4
# Legality 5: how an uneven shard is padded before its collective and narrowed after.
PADS = frozenset({aten.constant_pad_nd.default, aten.pad.default})
NARROWS = frozenset({aten.slice.Tensor, aten.narrow.default})


@dataclasses.dataclass(frozen=True)
class Combination:
    """Collectives of one kind over one group combined into one."""

    kind: str
    nodes: tuple[str, ...]  # the combined collectives, in graph order
    group: str
    nbytes: int  # bytes each rank feeds into the combined collective

    @property
    def removed(self) -> int:
        return len(self.nodes) - 1

    def __str__(self) -> str:
        return (
            f"combined {len(self.nodes)} {self.kind}s over group {self.group!r} into one "
            f"({self.nbytes} B in per rank): {', '.join(self.nodes)}"
        )


# (kind, group name, bytes each rank feeds in) -> the cost model's time of one such
# collective over that group, or None when the group cannot be priced.
CollectiveTime = Callable[[str, str, int], "float | None"]


def collective_time_on(contexts, cost: CostModel | None) -> CollectiveTime:
    """The price of a collective over a named group: the cost model the graph pass plans
    chains on that group's mesh with (``cost``, else the mesh's profile); None for a
    group that is no set of dims of one of ``contexts`` (the graph pass's meshes)."""
    names: dict = {}

    def collective_time(kind: str, group: str, nbytes: int) -> float | None:
        found = resolve_group_name(group, contexts, names)
        if isinstance(found, str):
            return None
        ctx, dims = found
        model = cost if cost is not None else resolve_cost(ctx.spec)[0]
        return model.collective_time(kind, ctx.spec.group(dims), nbytes, ctx.spec)

    return collective_time


def combine_collectives(graph: fx.Graph, collective_time: CollectiveTime) -> list[Combination]:
    """Combine the combinable collectives of ``graph`` in place (see the module
    docstring); return what was combined. The caller lints and recompiles."""
    position = {n: i for i, n in enumerate(graph.nodes)}
    sets: dict[tuple, list[list[fx.Node]]] = {}  # per key, in graph order of their first member
    for node in list(graph.nodes):
        key = _member_key(node)
        if key is None:
            continue
        # a gather joins the earliest set it may (issued as early as it can be); a
        # reduction the latest (the fewest members wait for it)
        same = sets.setdefault(key, [])
        order = same if node.target is ALL_GATHER else reversed(same)
        target = next((m for m in order if _joins(node, m, position, collective_time)), None)
        if target is None:
            same.append([node])
        else:
            target.append(node)
    done = [m for same in sets.values() for m in same if len(m) > 1]
    return [_combine(graph, members) for members in sorted(done, key=lambda m: position[m[0]])]


def _member_key(node: fx.Node):
    """(kind, op, group size, group, dtype) of a collective that may be combined
    (legalities 1-2), else None."""
    if node.op != "call_function" or node.target not in KIND or node.kwargs:
        return None
    if len(node.args) != (4 if node.target is REDUCE_SCATTER else 3):
        return None
    x, group = node.args[0], node.args[-1]
    n = None if node.target is ALL_REDUCE else node.args[-2]
    op = None if node.target is ALL_GATHER else node.args[1]
    users = list(node.users)
    if not (isinstance(group, str) and isinstance(x, fx.Node) and (n is None or isinstance(n, int))):
        return None
    if (
        len(users) != 1
        or users[0].target is not WAIT
        or (node.target is ALL_GATHER and _is_cast_for(x, node))
    ):
        return None
    val = x.meta.get("val")
    if (
        not isinstance(val, torch.Tensor)
        or val.ndim == 0
        or not isinstance(node.meta.get("val"), torch.Tensor)
    ):
        return None
    if not all(isinstance(d, int) for d in val.shape):  # symbolic (dynamic) sizes: left alone
        return None
    if _uneven(node, x, users[0]):
        return None
    return node.target, op, n, group, val.dtype


def _uneven(collective: fx.Node, x: fx.Node, wait: fx.Node) -> bool:
    """Legality 5: the marks of an uneven shard that every rank's graph carries. An
    uneven gather pads its input on some ranks only (so whether that input is ready
    early differs by rank) and narrows its result on every rank; an uneven scatter pads
    its input on every rank and narrows its result on some (so where the result is
    first used differs by rank)."""
    if collective.target is ALL_GATHER:
        return any(u.op == "call_function" and u.target in NARROWS for u in wait.users)
    return x.op == "call_function" and x.target in PADS


def _is_cast_for(x: fx.Node, gather: fx.Node) -> bool:
    # process_collective_bucket would fold such a cast into the bucket (mixed-precision FSDP)
    casts = (torch.ops.prims.convert_element_type.default, torch.ops.aten._to_copy.default)
    return x.op == "call_function" and x.target in casts and list(x.users) == [gather]


def _in_bytes(node: fx.Node) -> int:
    v = node.args[0].meta["val"]
    return v.numel() * v.element_size()


def _joins(node: fx.Node, members: list[fx.Node], position: dict, collective_time: CollectiveTime) -> bool:
    """Whether ``node`` may join ``members`` (legalities 3-4); when a gather may, the
    views computing its input are moved up before the first member."""
    if node.target is ALL_GATHER:
        hoist = _to_hoist(node.args[0], position[members[0]], position)
        if hoist is None:  # legality 3
            return False
    else:
        hoist = set()
        if any(position[_first_use(m, position)] <= position[node] for m in members):  # legality 3
            return False
    kind, group = KIND[node.target], node.args[-1]
    total = sum(_in_bytes(m) for m in members) + _in_bytes(node)
    t, t0 = collective_time(kind, group, total), collective_time(kind, group, 0)
    if t is None or t0 is None or t > LATENCY_BOUND * t0:  # legality 4
        return False
    first = members[0]
    for v in sorted(hoist, key=position.__getitem__):
        first.prepend(v)
    if hoist:
        position.update({v: i for i, v in enumerate(first.graph.nodes)})
    return True


def _first_use(collective: fx.Node, position: dict) -> fx.Node:
    """The first node that uses the value of ``collective``'s wait (the graph's output
    node at the latest)."""
    wait = next(iter(collective.users))
    return min(wait.users, key=position.__getitem__) if wait.users else wait


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
    first, group = members[0], members[0].args[-1]
    order = {node: i for i, node in enumerate(graph.nodes)}
    if first.target is ALL_GATHER:  # where the first member's value was waited for
        wait_at = min((next(iter(m.users)) for m in members), key=order.__getitem__)
    else:  # where the first member's value is used: the waits sink past the last member
        wait_at = min((_first_use(m, order) for m in members), key=order.__getitem__)
    combination = Combination(
        KIND[first.target], tuple(m.name for m in members), group, sum(_in_bytes(m) for m in members)
    )
    if first.target is ALL_GATHER:
        n = first.args[1]
        merge, args, before = _gather_concatenated, (lambda vals: (vals, group, n)), first
    else:
        op = first.args[1]
        dtype, device = first.meta["val"].dtype, first.meta["val"].device
        if first.target is REDUCE_SCATTER:
            n = first.args[2]
            merge, args = (
                inductor.reduce_scatter_merge_fn,
                (lambda vals: (vals, group, n, op, dtype, device)),
            )
        else:
            merge, args = (
                inductor.all_reduce_merge_fn,
                (lambda vals: (vals, group, op, dtype, device)),
            )
        before = members[-1].next
    inductor.process_collective_bucket(
        graph,
        members,
        merge,
        lambda ins: args([i.meta["val"] for i in ins]),
        insert_before=before,
        wait_at=wait_at,
    )
    return combination


def _gather_concatenated(ins: list[torch.Tensor], group: str, n: int) -> list[torch.Tensor]:
    """Traced into the graph: one gather of the flattened inputs, split into what each
    gather returned (rank-major blocks of each input, dim 0 grown ``n`` times)."""
    flat = torch.cat([x.reshape(-1) for x in ins])
    out = WAIT(ALL_GATHER(flat, n, group))
    blocks = out.reshape(n, -1).split_with_sizes([x.numel() for x in ins], dim=1)
    # Each block is copied as (n, *x.shape) and then viewed with dim 0 grown: the copy's
    # index is then affine (offset + row stride * rank + x's strides), which Inductor
    # vectorizes. Reshaped at once, the copy indexes by a floor division and a modulo
    # of the flat position: scalar code, and slower to generate.
    return [b.view(n, *x.shape).contiguous().view(x.shape[0] * n, *x.shape[1:]) for b, x in zip(blocks, ins)]
