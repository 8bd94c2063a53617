"""Shared machinery of the merge passes: finding runs, choosing a partition by cost,
rewriting runs.

Each merge pass states its own rule and legality; this module only finds the
maximal runs of adjacent steps with one ``merge_key``, searches the ways to
split a run into merged blocks, keeping the cheapest under the cost model, and
re-lowers a plan with some runs replaced (:func:`rewrite_runs`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from torch.fx.passes.infra.pass_base import PassResult

from .context import GroupChoice, RedistPass
from redist_opt import ir
from redist_opt.ir import steps as S


def rewrite_runs(graph_module, mesh, regs: Sequence[S.Region], found, rewrite) -> PassResult:
    """Re-lower ``regs`` with each run ``regs[start:end]`` of ``found`` rewritten.

    ``rewrite(start, end)`` returns ``None`` to keep the run as it is, or its
    replacement in order: each item a region kept as it is, or ``(steps, regions)``:
    new steps that stand for ``regions`` (their provenance). The result is
    unmodified when every run was kept.
    """
    new_steps: list[ir.StepInfo] = []
    provenance: list[tuple[str, ...]] = []

    def keep(rs):
        for r in rs:
            new_steps.append(r.step)
            provenance.append(r.inherited)

    changed, cursor = False, 0
    for start, end in found:
        keep(regs[cursor:start])
        cursor = end
        blocks = rewrite(start, end)
        if blocks is None:
            keep(regs[start:end])
            continue
        changed = True
        for block in blocks:
            if isinstance(block, S.Region):
                keep([block])
                continue
            steps, members = block
            origin = tuple(n for r in members for n in r.origin)
            for step in steps:
                new_steps.append(step)
                provenance.append(origin)
    keep(regs[cursor:])
    if not changed:
        return PassResult(graph_module, False)
    return PassResult(S.relower(graph_module, mesh, new_steps, provenance), True)


def accept_one(p: RedistPass, label: str, regions, choice: GroupChoice, kind: str, merged_bytes: int) -> bool:
    """Whether one ``kind`` over ``choice`` feeding ``merged_bytes`` per rank replaces the
    collectives of ``regions``: never more bytes (padding of uneven pieces), and no more
    modelled time unless ``prefer="consistency"``. The verdict is noted either way."""
    ctx, mesh = p.ctx, p.ctx.mesh
    sep_bytes, sep_time = 0, 0.0
    for r in regions:
        node = r.collective
        nbytes = ctx.bytes_of(node.args[0].meta["shape"])
        sep_bytes += nbytes
        sep_time += ctx.cost.collective_time(r.step.kind, node.args[1], nbytes, mesh)
    if merged_bytes > sep_bytes:
        p.note(False, label, f"padding: one {kind} moves {merged_bytes} B vs {sep_bytes} B")
        return False
    merged_time = ctx.collective_time(kind, choice, merged_bytes)
    if merged_time > sep_time and ctx.prefer != "consistency":
        p.note(False, label, f"cost: one {kind} {merged_time * 1e6:.1f}us vs {sep_time * 1e6:.1f}us")
        return False
    return True


@dataclasses.dataclass
class Block:
    members: tuple[int, ...]  # indices into the run
    dims: tuple[int, ...]  # merged mesh dims, in group order
    choice: GroupChoice | None
    why: str
    time: float
    nbytes: int


def runs(
    regs: Sequence[S.Region],
    kind: str,
    chain_ok: Callable[[ir.StepInfo, ir.StepInfo], bool],
    dtype=None,
):
    """Maximal runs (start, end) of adjacent regions of ``kind`` with one merge key."""
    out, i = [], 0
    while i < len(regs):
        if regs[i].step.kind != kind:
            i += 1
            continue
        j = i + 1
        key = S.merge_key(regs[i].step, dtype)
        while (
            j < len(regs)
            and S.merge_key(regs[j].step, dtype) == key
            and chain_ok(regs[j - 1].step, regs[j].step)
            and not set(regs[j].step.mesh_dims) & {d for r in regs[i:j] for d in r.step.mesh_dims}
        ):
            j += 1
        if j - i >= 2:
            out.append((i, j))
        i = j
    return out


def contiguous_partitions(n: int):
    """Ways to cut 0..n-1 into contiguous segments (2^(n-1) of them)."""
    for mask in range(1 << (n - 1)):
        parts, cur = [], [0]
        for k in range(1, n):
            if mask >> (k - 1) & 1:
                parts.append(tuple(cur))
                cur = [k]
            else:
                cur.append(k)
        parts.append(tuple(cur))
        yield parts


def set_partitions(items: Sequence[int]):
    """All set partitions of ``items`` (Bell(n); n is at most the mesh rank)."""
    items = list(items)
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in set_partitions(rest):
        for k in range(len(part)):
            yield part[:k] + [(first,) + part[k]] + part[k + 1 :]
        yield [(first,)] + part


def choose(
    p: RedistPass,
    partitions,
    block_dims: Callable[[tuple[int, ...]], tuple[int, ...]],
    block_bytes: Callable[[tuple[int, ...]], int],
    kind: str,
    any_order: bool,
):
    """The cheapest partition whose blocks all have a group; and the all-in-one verdict."""
    ctx = p.ctx
    cache: dict[tuple[int, ...], Block] = {}

    def block(members):
        members = tuple(sorted(members))
        if members not in cache:
            dims = block_dims(members)
            choice, why = ctx.choose_group(dims, any_order=any_order)
            nbytes = block_bytes(members)
            t = ctx.collective_time(kind, choice, nbytes) if choice else float("inf")
            cache[members] = Block(members, choice.group.dims if choice else dims, choice, why, t, nbytes)
        return cache[members]

    options = []
    for part in partitions:
        blocks = [block(tuple(m)) for m in part]
        if all(b.choice is not None for b in blocks):
            options.append((sum(b.time for b in blocks), len(blocks), blocks))
    # Never trade bytes for launches: padding a merged uneven scatter can move more
    # than the separate collectives did (e.g. 1 row over 6 ranks).
    unmerged = max(options, key=lambda o: o[1])
    budget = sum(b.nbytes for b in unmerged[2])
    options = [o for o in options if sum(b.nbytes for b in o[2]) <= budget] or [unmerged]
    if ctx.prefer == "consistency":
        return min(options, key=lambda o: (o[1], o[0]))[2], cache
    # Fewest collectives among the options within MARGIN of the fastest: a model
    # calibrated on a noisy machine should not flip a merge on a 1% difference,
    # and one collective also gives bitwise-equal replicas.
    fastest = min(o[0] for o in options)
    near = [o for o in options if o[0] <= fastest * (1 + MARGIN)]
    return min(near, key=lambda o: (o[1], o[0]))[2], cache


# Relative modelled-time slack within which the partition with fewer collectives wins.
MARGIN = 0.05


class MergeRunPass(RedistPass):
    """Base of the merge passes: for each run of adjacent mergeable steps, pick the
    cheapest partition into blocks that have groups, and re-lower.

    Subclasses set ``kind`` and ``any_order`` and say how a block's mesh dims,
    input bytes and merged step are formed.
    """

    kind: str = ""
    any_order: bool = False

    def chain_ok(self, first: ir.StepInfo, second: ir.StepInfo) -> bool:
        return True

    def partitions(self, n: int):
        return contiguous_partitions(n)

    def block_dims(self, run: list[S.Region], members: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(d for m in members for d in run[m].step.mesh_dims)

    def block_bytes(self, run: list[S.Region], members: tuple[int, ...]) -> int:
        """Bytes each rank feeds the block's collective (padding included)."""
        return self.ctx.bytes_of(run[members[0]].collective.args[0].meta["shape"])

    def merged(self, run, members, dims, state: S.ShardState) -> ir.StepInfo:
        return S.merged_step([run[m].step for m in members], dims, run[members[0]].step.index, self.ctx.mesh.sizes)

    def call(self, graph_module):
        regs = S.regions(graph_module)
        found = runs(regs, self.kind, self.chain_ok, self.ctx.dtype)
        if not found:
            return PassResult(graph_module, False)
        mesh = self.ctx.mesh
        states = S.states_before(regs, self.ctx.src, mesh)

        def rewrite(start, end):
            run = regs[start:end]
            best, tried = choose(
                self,
                self.partitions(len(run)),
                lambda members: self.block_dims(run, members),
                lambda members: self.block_bytes(run, members),
                self.kind,
                self.any_order,
            )
            labels = " + ".join(S.step_label(r.step, mesh) for r in run)
            whole = tried.get(tuple(range(len(run))))
            if all(len(b.members) == 1 for b in best):
                why = whole.why if whole.choice is None else "separate collectives are cheaper under the cost model"
                self.note(False, labels, why)
                return None
            if len(best) > 1:
                self.note(False, labels + " as one", whole.why if whole.choice is None else "cost")
            blocks = []
            for b in sorted(best, key=lambda b: b.members):
                members = [run[m] for m in b.members]
                if len(members) == 1:
                    blocks.append(members[0])
                    continue
                step = self.merged(run, b.members, b.dims, states[start + b.members[0]])
                self.note(
                    True,
                    " + ".join(S.step_label(m.step, mesh) for m in members) + f" -> {S.step_label(step, mesh)}",
                    b.why,
                )
                blocks.append(([step], members))
            return blocks

        return rewrite_runs(graph_module, mesh, regs, found, rewrite)
