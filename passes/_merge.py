"""Shared machinery of the merge passes: finding runs, choosing a partition by cost,
rewriting runs.

Each merge pass states its own rule and legality; this module only finds the
maximal runs of adjacent steps with one ``merge_key``, searches the ways to
split a run into merged blocks, taking the one ``PassContext.best`` picks under
the profitability rule, and emits the merged blocks through the
``StepRewriter``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from redist_opt import ir
from redist_opt.ir import steps as S

from ._rewriter import StepRewriter
from .context import Cost, GroupChoice, RedistPass


@dataclasses.dataclass
class Block:
    members: tuple[int, ...]  # indices into the run
    dims: tuple[int, ...]  # merged mesh dims, in group order
    choice: GroupChoice | None  # None: no group (the block cannot be formed)
    why: str
    cost: Cost


@dataclasses.dataclass
class Option:
    """One partition of a run into blocks."""

    blocks: list[Block]
    cost: Cost


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


def choose(p: RedistPass, partitions, block: Callable[[tuple[int, ...]], Block], *, trades_bytes=False):
    """The partition ``PassContext.best`` picks among those whose blocks all can be
    formed, and every block tried (by members)."""
    cache: dict[tuple[int, ...], Block] = {}
    options = []
    for part in partitions:
        blocks = []
        for members in part:
            members = tuple(sorted(members))
            if members not in cache:
                cache[members] = block(members)
            blocks.append(cache[members])
        if all(b.choice is not None for b in blocks):
            cost = Cost(sum(b.cost.time for b in blocks), len(blocks), sum(b.cost.nbytes for b in blocks))
            options.append(Option(blocks, cost))
    return p.ctx.best(options, trades_bytes=trades_bytes).blocks, cache


class MergeRunPass(RedistPass):
    """Base of the merge passes: for each run of adjacent mergeable steps, pick the
    partition into blocks that have groups (``choose``), and re-lower.

    Subclasses set ``kind`` and ``any_order`` and say how a block's mesh dims,
    input bytes and merged step are formed; a pass with its own runs or legality
    overrides ``find_runs`` / ``refuse`` / ``partitions``.
    """

    kind: str = ""
    any_order: bool = False

    def chain_ok(self, first: ir.StepInfo, second: ir.StepInfo) -> bool:
        return True

    def find_runs(self, regs: Sequence[S.Region]) -> list[tuple[int, int]]:
        return runs(regs, self.kind, self.chain_ok, self.ctx.dtype)

    def refuse(self, run: list[S.Region], state: S.ShardState) -> str | None:
        """Why no block of ``run`` may merge (checked once per run), or None."""
        return None

    def partitions(self, run: list[S.Region]):
        return contiguous_partitions(len(run))

    def block_dims(self, run: list[S.Region], members: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(d for m in members for d in run[m].step.mesh_dims)

    def block_bytes(self, run: list[S.Region], members: tuple[int, ...], state: S.ShardState) -> int:
        """Bytes each rank feeds the block's collective (padding included); ``state``
        is the shard state before the run."""
        return self.ctx.bytes_of(run[members[0]].collective.args[0].meta["shape"])

    def merged(self, run, members, dims, state: S.ShardState) -> ir.StepInfo:
        return S.merged_step(
            [run[m].step for m in members], dims, run[members[0]].step.index, self.ctx.mesh.sizes
        )

    def made_reason(self, block: Block) -> str:
        return block.why

    def _block(self, run, members, state) -> Block:
        ctx = self.ctx
        dims = self.block_dims(run, members)
        choice, why = ctx.choose_group(dims, any_order=self.any_order)
        nbytes = self.block_bytes(run, members, state)
        time = ctx.collective_time(self.kind, choice, nbytes) if choice else float("inf")
        return Block(members, choice.group.dims if choice else dims, choice, why, Cost(time, 1, nbytes))

    def call(self, graph_module):
        rw = StepRewriter(graph_module, self.ctx)
        found = dict(self.find_runs(rw.regions))
        if not found:
            return rw.finish()
        return rw.scan(lambda i: self._rewrite(rw, i, found[i]) if i in found else 0)

    def _rewrite(self, rw: StepRewriter, start: int, end: int) -> int:
        mesh = self.ctx.mesh
        run, state = rw.regions[start:end], rw.states[start]
        labels = " + ".join(S.step_label(r.step, mesh) for r in run)
        refused = self.refuse(run, state)
        if refused is not None:
            self.note(False, labels, refused)
            return 0
        best, tried = choose(self, self.partitions(run), lambda members: self._block(run, members, state))
        whole = tried.get(tuple(range(len(run))))
        if all(len(b.members) == 1 for b in best):
            why = "separate collectives are cheaper under the cost model"
            self.note(False, labels, whole.why if whole is not None and whole.choice is None else why)
            return 0
        if len(best) > 1 and whole is not None:
            self.note(False, labels + " as one", whole.why if whole.choice is None else "cost")
        for b in sorted(best, key=lambda b: b.members):
            members = [run[m] for m in b.members]
            if len(members) == 1:
                rw.keep(members[0])
                continue
            step = self.merged(run, b.members, b.dims, rw.states[start + b.members[0]])
            what = " + ".join(S.step_label(m.step, mesh) for m in members)
            self.note(True, f"{what} -> {S.step_label(step, mesh)}", self.made_reason(b))
            rw.emit([step], members)
        return end - start
