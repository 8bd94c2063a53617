"""All-reduce reassociation in compiled graphs (XLA's AllReduceReassociate).

The backward of tensor-parallel colwise projections that read one input (q, k, v;
gate, up) all_reduces each input gradient over the tp group and then sums them.
Summing first and reducing once is the same value, with one collective instead
of one per projection.

Rewrite, on each tree of adds and subtracts (its interior sums used only inside
it, as autograd accumulates an input grad: ``((g + AR(a)) + AR(b)) + AR(c)``)::

    before                                         after
    ar_a = all_reduce(a, "sum", G)                 # (ar_a, ar_b, w_a, w_b, s1 erased)
    w_a = wait_tensor(ar_a)
    s1 = add(g, w_a)
    ar_b = all_reduce(b, "sum", G)
    w_b = wait_tensor(ar_b)
    s = sub(s1, w_b)                               t = sub(a, b)
                                                   ar = all_reduce(t, "sum", G)
                                                   w = wait_tensor(ar)
                                                   s = add(g, w)

so ``add(all_reduce(a, G), all_reduce(b, G))`` becomes ``all_reduce(add(a, b), G)``,
``sub`` gives ``all_reduce(a - b)``, and ``"avg"`` works too: avg(a) + avg(b) =
avg(a + b). Other terms of the tree (``g``) stay, added to the one reduced sum.

Legality (every condition is checked; a failing one leaves the term or the tree
as it was):

1. a tree's root is an ``aten.add.Tensor`` / ``aten.sub.Tensor`` (``alpha``
   absent or 1); an interior node is one of those whose only user is its parent
   (used once there), with the root's shape and dtype;
2. reduced terms are ``wait_tensor(all_reduce(x, op, G))``; they are folded per
   (``G``, ``op``), ``op`` being ``"sum"``, or ``"avg"`` on a floating dtype
   (integer avg rounds per reduction); a class of one term is left alone;
3. the reduced values have no other users: each wait_tensor is used only by its
   parent in the tree (once) and each all_reduce only by its wait;
4. each folded all_reduce input has the root's dtype and shape (no broadcasting,
   no type promotion: then every add is elementwise on equal tensors);
5. the new adds, the all_reduce and the rebuilt tree are placed at the root's
   position, which comes after every term and so after every all_reduce input (fx
   graphs are in topological order): the inputs dominate the new add, and the new
   all_reduce follows it.

Values: the sum is regrouped (``a + b`` is added before the reduction, and
the tree's terms in another order), exact for integer-valued data and equal within rounding otherwise, the
freedom the chain pass takes too. The decision uses graph structure, shapes and
dtypes only, so every rank rewrites the same adds the same way.

Not done: reduced values with other users (keeping them and reducing the sum
again would add a collective); ops other than add/sub (``mul`` by a scalar,
``sum`` over a list); ``all_reduce_coalesced`` and in-place ``all_reduce_``;
max/min reductions; all_reduces over different groups that could be combined
through a larger one. Moving the collective to the add delays it: a scheduler
that overlapped the first all_reduce with compute loses that overlap.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx

from redist_opt.graph.chain import C10D, WAIT

__all__ = ["Reassociation", "reassociate_all_reduces"]

aten = torch.ops.aten
ALL_REDUCE = C10D.all_reduce.default
ADD_SUB = (aten.add.Tensor, aten.sub.Tensor)


@dataclasses.dataclass(frozen=True)
class Reassociation:
    """One class of reduced terms of one add/sub tree folded into one all_reduce."""

    node: str  # the tree's root node
    terms: int  # reduced terms folded (all_reduces before: ``terms``, after: 1)
    reduce_op: str
    group: str

    @property
    def removed(self) -> int:
        """All_reduces removed."""
        return self.terms - 1

    def __str__(self) -> str:
        return (
            f"reassociated {self.node}: {self.terms} all_reduce({self.reduce_op}) over group "
            f"{self.group!r} summed -> 1 all_reduce of the sum"
        )


def reassociate_all_reduces(graph: fx.Graph) -> list[Reassociation]:
    """Fold the reduced terms of every add/sub tree of ``graph`` in place (see the
    module docstring); return what was folded. The caller lints and recompiles."""
    done: list[Reassociation] = []
    for node in list(graph.nodes):
        if node.graph is not graph or not _is_add_sub(node) or _interior(node, _val(node)):
            continue  # only roots: an interior node is folded with its root
        done += _fold_tree(graph, node)
    return done


def _is_add_sub(n) -> bool:
    return (
        isinstance(n, fx.Node)
        and n.op == "call_function"
        and n.target in ADD_SUB
        and len(n.args) == 2
        and n.kwargs.get("alpha", 1) == 1
    )


def _same(a, b) -> bool:
    return a is not None and b is not None and tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype


def _used_once_by_parent(n: fx.Node) -> bool:
    users = list(n.users)
    return len(users) == 1 and sum(1 for a in users[0].args if a is n) == 1


def _interior(n: fx.Node, root_val) -> bool:
    """Legality 1: an add/sub whose only user is an add/sub using it once, of equal shape/dtype."""
    if not (_is_add_sub(n) and _used_once_by_parent(n)):
        return False
    parent = next(iter(n.users))
    return _is_add_sub(parent) and _same(_val(n), root_val) and _same(_val(parent), root_val)


def _terms(root: fx.Node):
    """(leaves as (node, sign), interior nodes) of the add/sub tree at ``root``."""
    root_val, leaves, interior = _val(root), [], []

    def walk(n, sign, is_root=False):
        if is_root or _interior(n, root_val):
            if not is_root:
                interior.append(n)
            a, b = n.args
            walk(a, sign)
            walk(b, sign if n.target is aten.add.Tensor else -sign)
        else:
            leaves.append((n, sign))

    walk(root, 1, is_root=True)
    return leaves, interior


def _reduced(value, root_val):
    """(all_reduce input, op, group) when ``value = wait_tensor(all_reduce(x, op, group))``
    may be folded (legalities 2-4), else None."""
    if not (isinstance(value, fx.Node) and value.op == "call_function" and value.target is WAIT):
        return None
    ar = value.args[0]
    if not (isinstance(ar, fx.Node) and ar.op == "call_function" and ar.target is ALL_REDUCE):
        return None
    if not _used_once_by_parent(value) or list(ar.users) != [value]:  # legality 3
        return None
    x, op, group = _all_reduce_args(ar)
    if op not in ("sum", "avg") or not _same(_val(x), root_val):  # legalities 2, 4
        return None
    if op == "avg" and not root_val.dtype.is_floating_point:
        return None
    return x, op, group


def _fold_tree(graph: fx.Graph, root: fx.Node) -> list[Reassociation]:
    root_val = _val(root)
    if root_val is None:
        return []
    leaves, interior = _terms(root)
    classes: dict[tuple, list[int]] = {}
    for i, (leaf, _) in enumerate(leaves):
        r = _reduced(leaf, root_val)
        if r is not None:
            classes.setdefault((r[1], r[2]), []).append(i)
    classes = {k: v for k, v in classes.items() if len(v) > 1}
    if not classes:
        return []
    terms: list[tuple[fx.Node, int]] = []
    folded = {i for idx in classes.values() for i in idx}
    with graph.inserting_before(root):  # legality 5
        for i, (leaf, sign) in enumerate(leaves):
            if i not in folded:
                terms.append((leaf, sign))
            for (op, group), idx in classes.items():
                if idx[0] == i:
                    terms.append(
                        (
                            _reduce_sum(
                                [(leaves[j][0].args[0].args[0], leaves[j][1]) for j in idx], op, group, root
                            ),
                            sign,
                        )
                    )
        new_root = _sum(terms, root)
    root.replace_all_uses_with(new_root)
    dead = [root, *interior] + [n for i in sorted(folded) for n in (leaves[i][0], leaves[i][0].args[0])]
    for n in sorted(dead, key=_position(graph), reverse=True):
        graph.erase_node(n)
    return [Reassociation(root.name, len(idx), op, group) for (op, group), idx in classes.items()]


def _position(graph: fx.Graph):
    order = {n: i for i, n in enumerate(graph.nodes)}
    return order.__getitem__


def _new(target, args, like: fx.Node) -> fx.Node:
    n = like.graph.call_function(target, args)
    n.meta["val"] = like.meta.get("val")
    if "stack_trace" in like.meta:
        n.meta["stack_trace"] = like.meta["stack_trace"]
    return n


def _sum(terms, like: fx.Node) -> fx.Node:
    """``t0 ± t1 ± ...`` as a left fold, starting from a positive term (``neg`` if none)."""
    first = next((k for k, (_, s) in enumerate(terms) if s > 0), None)
    if first is None:
        acc, rest = _new(aten.neg.default, (terms[0][0],), like), terms[1:]
    else:
        acc, rest = terms[first][0], terms[:first] + terms[first + 1 :]
    for node, sign in rest:
        acc = _new(aten.add.Tensor if sign > 0 else aten.sub.Tensor, (acc, node), like)
    return acc


def _reduce_sum(inputs, op, group, like: fx.Node) -> fx.Node:
    """``wait_tensor(all_reduce(x0 ± x1 ± ..., op, group))``, signs relative to ``x0``."""
    s0 = inputs[0][1]
    acc = inputs[0][0]
    for x, sign in inputs[1:]:
        acc = _new(aten.add.Tensor if sign == s0 else aten.sub.Tensor, (acc, x), like)
    return _new(WAIT, (_new(ALL_REDUCE, (acc, op, group), like),), like)


def _all_reduce_args(ar: fx.Node):
    args = list(ar.args) + [None] * 3
    x = args[0]
    op = ar.kwargs.get("reduceOp", args[1])
    group = ar.kwargs.get("group_name", args[2])
    return x, op, group


def _val(n):
    v = n.meta.get("val") if isinstance(n, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None
