"""Agreement across ranks on the mesh dims of rank slices (legality 5 of
:mod:`redist_opt.graph.raise_chains`), bounded in time and the same on every rank.

A constant-index slice in a graph records only ``n`` and this rank's index. Each
rank knows which ordered dim sets of ``n`` ranks give its index (its *candidates*);
the ranks intersect their candidates and a slice is raised when exactly one set is
common to all: then on every rank it selects that rank's own block over that set.
For a slice of unknown origin only dim sets whose coordinates vary among the ranks
asked are candidates (a constant the same on every rank then matches on no set
everywhere); a slice DTensor put there (known from its metadata to select the
caller's block) needs no round when one dim set of the root mesh has its size.

Protocol: one round of :mod:`redist_opt.runtime.store_round` per compiled graph, through
the default process group's store (a store key is no collective, so it cannot interleave
with collectives the program still has in flight)::

    subject = the graph's op sequence, its chains, the root mesh, the ranks asked
              (counted per compiler: its n-th round of that subject)
    ranks   = this rank's group over the dims the program's meshes span and the
              chains' collectives touch             (a pipeline stage, not the world)
    value   = my candidates, one list per slice
    bound   = AGREEMENT_TIMEOUT_S, or the group's timeout where that is shorter
    verdict = commit (every rank's facts)
            | abort  (per chain: the answer of an earlier committed round, or none)

The bound is shorter than the run-time rounds' (the group's timeout): an aborted round
here is safe (a chain keeps its traced collectives, or runs what an earlier round
agreed), and a rank compiling alone is a normal event (a recompile), which must not
stall that rank for the group's timeout.

Every rank of the round uses the one verdict, so the decision is the same on every
rank of it. Rank sets compiling different programs (pipeline stages) never wait
for each other. The count makes rounds of equal hashes (the same function traced
for two placements: the graphs differ only in a slice's rank-local index) agree
each on its own program, when ranks compile them in the same order; in different
orders, a round may hold one program on some ranks and the other on the rest, which
is still right: the candidates each rank gave are for the graph it runs.

A rank that compiles a graph alone (a recompile, a rank-dependent guard) gets no
answer: its round aborts after the timeout. The other ranks run what an earlier
committed round decided, so the verdict of an aborted round reuses, chain by chain,
the answer of the one earlier committed round of the same chain text whose facts
equal those of every rank present (*records*, written by every committed round);
then this rank rewrites the chain exactly as the others did, and the explain output
says so. Without such a record the chain keeps its traced collectives on every rank
of the round. Where two earlier rounds of the same text fit with different answers
(two programs that are one graph on this rank), no choice is safe: the chain is kept
and a warning names it.

Store keys: the round's (see :mod:`~redist_opt.runtime.store_round`: an aborted round
keeps its verdict, one key per lone compile); records are one key per distinct (chain
text, facts, answer).
"""

from __future__ import annotations

import dataclasses
import pickle
import warnings
from collections.abc import Sequence

import torch.distributed as dist
import torch.fx as fx

from redist_opt.graph.chain import Chain, ChainOp
from redist_opt.runtime import store_round
from redist_opt.runtime.consensus import check_compiled_profile, needs_agreement
from redist_opt.runtime.store_round import digest
from redist_opt.torch_api import c10d
from redist_opt.torch_api.c10d import default_store

__all__ = ["AGREEMENT_TIMEOUT_S", "SliceAgreement", "Agreed", "slice_candidates"]

# How long a rank waits for the others of its round before the verdict is "abort"
# (at most: the group's timeout where that is shorter).
AGREEMENT_TIMEOUT_S = 5.0
_KEY_PREFIX = "redist_opt/graph_pass/agree"
_RECORDS = "redist_opt/graph_pass/record"


@dataclasses.dataclass
class Agreed:
    """What a round gave: mesh dims per slice (by its first node), why a slice was not
    agreed, and a note per chain whose dims came from an earlier round."""

    dims: dict[fx.Node, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    failed: dict[fx.Node, str] = dataclasses.field(default_factory=dict)
    notes: dict[fx.Node, str] = dataclasses.field(default_factory=dict)  # slice -> note
    aborted_ranks: tuple | None = None  # the ranks of the round, when it aborted


class SliceAgreement:
    """The agreement state of one compiler (a backend, a pass instance): how many
    rounds of each graph it asked (``rounds``, restarted by ``redist_opt.clear_caches()``).

    ``all_gather(facts) -> every rank's facts, or a reason string`` replaces the store
    (one call per graph); ``timeout_s`` bounds the wait of a round."""

    def __init__(
        self, all_gather=None, timeout_s: float = AGREEMENT_TIMEOUT_S, *, store=None, rank: int | None = None
    ) -> None:
        self.all_gather = all_gather
        self.timeout_s = timeout_s
        self.store, self.rank = (
            store,
            rank,
        )  # a store and this rank's id (tests; default: the default group's)
        self.rounds = store_round.Rounds()

    @property
    def rounds_asked(self) -> int:
        """How many store rounds this compiler asked since the caches were last cleared."""
        return self.rounds.asked

    def check_profile(self, contexts, cost, aborted_ranks: tuple | None = None) -> None:
        """Raise :class:`~redist_opt.runtime.consensus.AgreementError` on every rank that
        compiles this program when they would price it with different cost profiles:
        chain planning and combining would then differ by rank
        (:func:`~redist_opt.runtime.consensus.check_compiled_profile`, once per ranks and
        ``cost``). Not with facts given by the caller (``all_gather``, ``store``).
        ``aborted_ranks``: the ranks of this graph's slice round, if it aborted."""
        given = [c for c in contexts if c.given] or contexts  # not a sibling view's whole root
        if self.all_gather is not None or self.store is not None or not needs_agreement(given[0].device_mesh):
            return
        ranks = {r for c in given for r in c.ranks_of(c.scope_dims)}
        # After a slice round of these ranks that not all joined, theirs is not waited for again
        bound = store_round.bound_s(self.timeout_s)
        timeout_s = 0.0 if aborted_ranks == tuple(sorted(ranks)) else bound
        if not check_compiled_profile(given[0].device_mesh, given[0].spec, cost, ranks, timeout_s):
            warnings.warn(
                f"redist_opt graph pass: not every rank of {sorted(ranks)} compiled this program within "
                f"{bound:g} s of this one, so its cost profile is not checked against theirs",
                stacklevel=3,
            )

    def agree(self, graph: fx.Graph, chains: Sequence[Chain]) -> Agreed:
        """Mesh dims for every slice of ``chains`` (one round for all of them)."""
        out = Agreed()
        pending = _pending(chains, out)
        if not pending:
            return out
        ranks = tuple(sorted({r for c, _ in pending for r in c.ctx.ranks_of(_scope(c, chains))}))
        mine = [[cands for _, cands in slices] for _, slices in pending]
        texts = [_chain_text(c, ranks) for c, _ in pending]
        me = self.rank if self.rank is not None else c10d.process_rank() if dist.is_initialized() else None
        if self.all_gather is not None:
            gathered = self.all_gather(mine)
            verdict = ("commit", gathered) if not isinstance(gathered, str) else ("abort", gathered, {})
        else:
            store = self.store if self.store is not None else _store_or_reason()
            if isinstance(store, str):
                verdict = ("abort", store, {})
            else:
                key = self.rounds.next_key((_structure(graph), texts, ranks))
                timeout_s = self.timeout_s if self.store is not None else store_round.bound_s(self.timeout_s)
                verdict = _Round(store, key, ranks, timeout_s, me).run(mine, texts)
        out.aborted_ranks = ranks if verdict[0] == "abort" else None
        _resolve(pending, mine, verdict, ranks, self.timeout_s, me, out)
        return out


def _pending(chains, out: Agreed) -> list[tuple[Chain, list[tuple[ChainOp, list]]]]:
    """(chain, [(slice, this rank's candidates)]) for every chain with slices needing
    a round; slices of one possible dim set (or none) are settled into ``out`` here.
    A slice shared by several chains (a chain and the part after its cut) is asked once."""
    seen: set[fx.Node] = set()
    pending = []
    for chain in chains:
        slices = []
        for op in chain.ops:
            first = op.nodes[0]
            if op.kind != "slice" or first in seen:
                continue
            seen.add(first)
            all_dims, cands = slice_candidates(chain, op, _scope(chain, chains))
            if not all_dims:
                # the same on every rank (no coordinate enters it): no round needed
                out.failed[first] = (
                    f"{first.name}: a slice with a constant index cannot be proven to select "
                    f"this rank's block (no mesh dims of {op.n} ranks vary among the ranks "
                    "compiling it)"
                )
            elif len(all_dims) == 1 and op.trusted:
                if cands:
                    out.dims[first] = cands[0]
                else:
                    out.failed[first] = f"{first.name}: block {op.index} is not this rank's"
            else:
                slices.append((op, cands))
        if slices:
            pending.append((chain, slices))
    return pending


def _scope(chain: Chain, chains) -> list[int]:
    """The mesh dims whose coordinates vary among the ranks asked: the dims the
    program's meshes span and the collectives of the graph's chains on this mesh touch."""
    dims = set(chain.ctx.scope_dims)
    for c in chains:
        if c.ctx is chain.ctx:
            dims |= {d for op in c.collectives for d in op.dims}
    return sorted(dims)


def slice_candidates(chain: Chain, op: ChainOp, scope: Sequence[int]) -> tuple[list, list]:
    """(every dim set a slice could select over, those giving this rank's block index).

    A slice DTensor put there (``op.trusted``) selects over some dim set of the root
    mesh. Any other slice is this rank's own block only if, on every rank asked, its
    constant index is that rank's block index over one common dim set: a set of dims
    whose coordinates vary among those ranks (``scope``), so a constant the same on
    every rank (user code) can never match it everywhere."""
    all_dims = chain.ctx.candidate_dims(op.n)
    if not op.trusted:
        all_dims = [d for d in all_dims if set(scope).issuperset(d)]
    return all_dims, sorted(d for d in all_dims if chain.ctx.block_index(d) == op.index)


def _op_fingerprint(op: ChainOp) -> tuple:
    """What an op means, without node names or this rank's block index."""
    if op.kind in ("pointwise", "view"):
        node = op.nodes[0]
        return (op.kind, str(node.target), repr(node.args[1:]), repr(sorted(node.kwargs.items())))
    return (op.kind, op.dims, op.tensor_dim, op.reduce_op, op.n, op.trusted)


def _chain_text(chain: Chain, ranks) -> str:
    """A chain's meaning on its mesh, the same on every rank asked (a record's key)."""
    ctx = chain.ctx
    val = chain.input.meta.get("val")
    return digest(
        (
            tuple(_op_fingerprint(op) for op in chain.ops),
            tuple(val.shape) if val is not None else None,
            str(getattr(val, "dtype", None)),
            (ctx.spec.sizes, ctx.spec.names, repr(ctx.rank_map)),
            ranks,
        )
    )


def _structure(graph: fx.Graph) -> tuple:
    """The graph's op sequence: no constants, group names or shapes, which may differ
    by rank (a slice's index, a rank's group); the chains' texts pin the rest."""
    return tuple((n.op, str(n.target)) for n in graph.nodes if n.op == "call_function")


def _store_or_reason():
    if not dist.is_initialized():
        return "no process group to agree on slice dims across ranks"
    if dist.get_backend() == "fake":
        return "its mesh dims need agreement across ranks, which the fake backend cannot give"
    return default_store()


# -- one round through the store -------------------------------------------------------------


class _Round:
    """One round of slice facts: the store round, and from its verdict the records a
    committed round leaves and the earlier answers an aborted one reuses."""

    def __init__(self, store, key: str, ranks, timeout_s: float, me: int) -> None:
        self.store, self.key, self.ranks, self.timeout_s, self.me = store, key, ranks, timeout_s, me

    def run(self, mine: list, texts: list[str]):
        """The verdict of this round: ("commit", every rank's facts) or ("abort", reason,
        {chain position: (facts of every rank, dims per slice) of an earlier round})."""

        def on_abort(present: dict) -> tuple:
            reason = (
                f"not every rank of {list(self.ranks)} gave its slice facts within {self.timeout_s:g} s "
                "(the chain is left as it was from here on every one of them)"
            )
            return (reason, _earlier_answers(self.store, texts, present))

        verdict = store_round.run_round(
            self.store,
            f"{_KEY_PREFIX}/{self.key}",
            self.ranks,
            self.me,
            mine,
            timeout_s=self.timeout_s,
            topic="the mesh dims of rank slices",
            on_abort=on_abort,
        )
        if verdict.committed:
            gathered = [verdict.values[r] for r in self.ranks]
            _record(self.store, texts, self.ranks, gathered)
            return ("commit", gathered)
        if verdict.silent_decider is not None:
            return (
                "abort",
                f"rank {verdict.silent_decider} took the agreement's decision and never wrote it",
                {},
            )
        return ("abort", *verdict.on_abort)


def _record(store, texts, ranks, gathered) -> None:
    """Remember, per chain text, every rank's facts and the dims agreed, for ranks that
    compile the chain again alone (written once per distinct record)."""
    for j, text in enumerate(texts):
        facts = {r: g[j] for r, g in zip(ranks, gathered)}
        entry = pickle.dumps((facts, _common(list(facts.values()))), protocol=4)
        if store.add(f"{_RECORDS}/{text}/seen/{digest(entry)}", 1) == 1:
            i = store.add(f"{_RECORDS}/{text}/n", 1)
            store.set(f"{_RECORDS}/{text}/{i}", entry)


def _earlier_answers(store, texts, present: dict) -> dict:
    """{chain position: (facts, dims)} of the one earlier record of each chain text whose
    facts equal those of every rank present; a string where several fit differently."""
    out = {}
    for j, text in enumerate(texts):
        n = store.add(f"{_RECORDS}/{text}/n", 0)
        fits = []
        for i in range(1, n + 1):
            k = f"{_RECORDS}/{text}/{i}"
            if store.check([k]):
                facts, dims = pickle.loads(store.get(k))
                if all(r in facts and facts[r] == p[j] for r, p in present.items()):
                    fits.append((facts, dims))
        if len({repr(d) for _, d in fits}) == 1 and all(d is not None for d in fits[0][1]):
            out[j] = fits[0]
        elif len(fits) > 1:
            out[j] = (
                f"{len(fits)} earlier rounds of this chain agreed on different mesh dims for the facts "
                "of this rank; the chain keeps its traced collectives, which may not match the other ranks'"
            )
    return out


def _common(facts: list) -> list:
    """Per slice, the one dim set common to every rank's candidates, or None."""
    out = []
    for j in range(len(facts[0])):
        common = set(map(tuple, facts[0][j]))
        for other in facts[1:]:
            common &= set(map(tuple, other[j])) if j < len(other) else set()
        out.append(next(iter(common)) if len(common) == 1 else None)
    return out


# -- from a verdict to dims per slice ----------------------------------------------------------


def _resolve(pending, mine, verdict, ranks, timeout_s, me, out: Agreed) -> None:
    for j, (chain, slices) in enumerate(pending):
        if verdict[0] == "commit":
            per_rank = [
                g[j] if len(g) > j and len(g[j]) == len(slices) else [[]] * len(slices) for g in verdict[1]
            ]
            dims, note = _common(per_rank), None
        else:
            earlier = verdict[2].get(j)
            if isinstance(earlier, tuple) and earlier[0].get(me) == mine[j]:
                dims = earlier[1]
                note = (
                    f"this rank compiled the graph without the others of {list(ranks)} (timed out after "
                    f"{timeout_s:g} s); the slice dims are those an earlier round of the same chain agreed, "
                    "so its collectives are the ones the others run"
                )
            else:
                if isinstance(earlier, str) or isinstance(earlier, tuple):
                    warnings.warn(
                        f"redist_opt graph pass: rank {me}: {chain.names[0]}...: "
                        + (
                            earlier if isinstance(earlier, str) else "an earlier round does not fit this rank"
                        ),
                        stacklevel=3,
                    )
                dims, note = [None] * len(slices), None
        for (op, _), d in zip(slices, dims):
            first = op.nodes[0]
            what = (
                f"{first.name}: "
                if op.trusted
                else f"{first.name}: a slice with a constant index cannot be proven "
                "to select this rank's block: "
            )
            if verdict[0] == "abort" and d is None:
                out.failed[first] = what + verdict[1]
            elif d is None:
                out.failed[first] = what + "the mesh dims this slice selects over are not determined"
            else:
                out.dims[first] = tuple(d)
                if note:
                    out.notes[first] = note
