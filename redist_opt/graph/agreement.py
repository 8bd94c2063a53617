"""Agreement across ranks on the mesh dims of rank slices (legality 5 of
:mod:`redist_opt.graph.raise_chains`), bounded in time and consistent across ranks.

A constant-index slice in a graph records only ``n`` and this rank's index. Each
rank knows which ordered dim sets of ``n`` ranks give its index (its *candidates*);
the ranks intersect their candidates and the slice is raised when exactly one set
is common to all: then on every rank it selects that rank's own block over that
set. For a slice of unknown origin only dim sets whose coordinates vary among the
ranks asked are candidates (a constant the same on every rank then matches on no
set everywhere); a slice DTensor put there (known from its metadata to select the
caller's block) needs no round when one dim set of the root mesh has its size.

Protocol (one round per chain, all rounds of a graph in parallel), through the
default process group's store: a store key is no collective, so it cannot
interleave with collectives the program still has in flight::

    key    = hash(the chain's ops, its input's shape and dtype, the root mesh,
              the ranks asked)                     same on every rank asked
    ranks  = this rank's group over the dims the program's meshes span and the
             chain's collectives touch             (a pipeline stage, not the world)
    set  <prefix>/<key>/<rank> = my candidates
    wait until every rank's key is there, for at most AGREEMENT_TIMEOUT_S
    verdict = compare_set(<prefix>/<key>/decision, "", "commit" | "abort")

The first rank to decide fixes the verdict for everyone, at once and for the rest
of the job: every rank of the round either uses the intersection ("commit": all
candidates were in the store when it was decided) or leaves the chain as it was
from the slice on ("abort", with the reason recorded). Rank sets compiling
different programs (pipeline stages) never wait for each other.

Which compiles share a round depends on where the slices come from:

* Every slice of the chain was put there by DTensor (its metadata says it selects
  the caller's block): the same chain text means the same candidates on every
  rank, so the key is the chain alone and a rank that compiles one more graph than
  the others (a recompile) finds the answers already in the store.
* Some slice is of unknown origin: the same text can mean different programs on
  different ranks. A user's ``chunk(2)[0]`` on the rank of coordinate 0 reads
  exactly like the rank-dependent slice compiled before it, while on the other
  ranks it does not, so an answer found in the store could be right on one rank
  and wrong on the others. Such a chain is agreed afresh on every compile: its key
  also holds how many rounds of the same text this process has asked before,
  which is the same on ranks compiling the same graphs in the same order. A lone
  recompile of it gives up after the timeout and keeps the traced chain; when an
  earlier round of the same text was committed (so the other ranks may run that
  rewrite) it warns, since its collectives may then not match theirs.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import pickle
import time
import warnings
from collections.abc import Sequence

import torch.distributed as dist

from redist_opt.graph.chain import Chain, ChainOp
from redist_opt.runtime.torch_dtensor import default_store

__all__ = ["AGREEMENT_TIMEOUT_S", "Agreement", "agree_slice_dims", "store_exchange"]

# How long a rank waits for the others of its round before leaving the chain as it was.
AGREEMENT_TIMEOUT_S = 5.0
_POLL_S = 0.01
_KEY_PREFIX = "redist_opt/graph_pass/agree"


# Rounds asked so far per chain text, for chains agreed afresh on every compile.
_rounds_asked: collections.Counter = collections.Counter()


@dataclasses.dataclass(frozen=True)
class Agreement:
    """One round: ``facts`` (this rank's candidates, one list per slice of a chain) to
    intersect with those of ``ranks``; ``key`` names what is agreed; ``earlier`` is
    the key of the previous round of the same chain text, for chains agreed afresh
    on every compile."""

    key: str
    ranks: tuple[int, ...]
    facts: list
    earlier: str | None = None


def _op_fingerprint(op: ChainOp) -> tuple:
    """What an op means, without node names or this rank's block index."""
    if op.kind in ("pointwise", "view"):
        node = op.nodes[0]
        return (op.kind, str(node.target), repr(node.args[1:]), repr(sorted(node.kwargs.items())))
    return (op.kind, op.dims, op.tensor_dim, op.reduce_op, op.n)


def agreement_scope(chain: Chain) -> list[int]:
    """The mesh dims whose coordinates vary among the ranks asked: the dims the
    program's meshes span and the chain's collectives touch."""
    return sorted(set(chain.ctx.scope_dims) | {d for op in chain.collectives for d in op.dims})


def agreement_for(chain: Chain, facts: list) -> Agreement:
    """The round that agrees ``chain``'s slices: its key and the ranks asked."""
    ctx = chain.ctx
    val = chain.input.meta.get("val")
    ranks = tuple(ctx.ranks_of(agreement_scope(chain)))
    what = (
        tuple(_op_fingerprint(op) for op in chain.ops),
        tuple(val.shape) if val is not None else None,
        str(getattr(val, "dtype", None)),
        (ctx.spec.sizes, ctx.spec.names, repr(ctx.rank_map)),
        ranks,
    )
    if all(op.trusted for op in chain.ops if op.kind == "slice"):
        return Agreement(_digest(what), ranks, facts)
    text = repr(what)
    _rounds_asked[text] += 1
    n = _rounds_asked[text]
    return Agreement(_digest((what, n)), ranks, facts, _digest((what, n - 1)) if n > 1 else None)


def _digest(what) -> str:
    return hashlib.sha256(repr(what).encode()).hexdigest()[:32]


def slice_candidates(chain: Chain, op: ChainOp) -> tuple[list, list]:
    """(every dim set a slice could select over, those giving this rank's block index).

    A slice DTensor put there (``op.trusted``) selects over some dim set of the root
    mesh. Any other slice is this rank's own block only if, on every rank asked, its
    constant index is that rank's block index over one common dim set: a set of dims
    whose coordinates vary among those ranks (the agreement scope), so a constant the
    same on every rank (user code) can never match it everywhere."""
    all_dims = chain.ctx.candidate_dims(op.n)
    if not op.trusted:
        scope = set(agreement_scope(chain))
        all_dims = [d for d in all_dims if scope.issuperset(d)]
    return all_dims, sorted(d for d in all_dims if chain.ctx.block_index(d) == op.index)


def _slice_facts(chain: Chain, ci: int, fail) -> list[tuple[int, list]]:
    """(position, candidates) of each slice needing agreement; a trusted slice of one
    possible dim set gets its dims here."""
    out = []
    for pos, op in enumerate(chain.ops):
        if op.kind != "slice":
            continue
        all_dims, cands = slice_candidates(chain, op)
        if not all_dims:
            # the same on every rank (no coordinate enters it): no round needed
            fail(ci, pos, f"{op.nodes[0].name}: a slice with a constant index cannot be proven to select "
                          f"this rank's block (no mesh dims of {op.n} ranks vary among the ranks compiling it)")
        elif len(all_dims) == 1 and op.trusted:
            if cands:
                object.__setattr__(op, "dims", cands[0])
            else:
                fail(ci, pos, f"{op.nodes[0].name}: block {op.index} is not this rank's")
        else:
            out.append((pos, cands))
    return out


def agree_slice_dims(chains: Sequence[Chain], all_gather=None) -> dict[int, tuple[int, str]]:
    """Give every slice its mesh dims, the same on every rank asked (legality 5).

    A slice whose size matches exactly one ordered dim set of the root mesh needs no
    communication. Otherwise each chain with such slices is one round of
    :func:`store_exchange` (or, given ``all_gather(facts) -> every rank's facts or a
    reason``, one call of it per round); a slice is resolved when exactly one
    candidate is common to all ranks asked. Returns {chain index: (position in
    chain.ops, reason)} for the first unresolved slice of each chain.
    """
    failed: dict[int, tuple[int, str]] = {}

    def fail(ci, pos, reason):
        if ci not in failed or failed[ci][0] > pos:
            failed[ci] = (pos, reason)

    pending = []  # (chain index, [(position, candidates)])
    for ci, chain in enumerate(chains):
        facts = _slice_facts(chain, ci, fail)
        if facts:
            pending.append((ci, facts))
    if not pending:
        return failed
    requests = [agreement_for(chains[ci], [c for _, c in facts]) for ci, facts in pending]
    if all_gather is not None:
        answers = [all_gather(req.facts) for req in requests]
    else:
        answers = store_exchange(requests)
    for (ci, facts), req, gathered in zip(pending, requests, answers):
        for j, (pos, mine) in enumerate(facts):
            op = chains[ci].ops[pos]
            what = (f"{op.nodes[0].name}: " if op.trusted else
                    f"{op.nodes[0].name}: a slice with a constant index cannot be proven to select this "
                    "rank's block: ")
            if isinstance(gathered, str):
                fail(ci, pos, what + gathered)
                continue
            common = set(map(tuple, mine))
            for other in gathered:
                common &= set(map(tuple, other[j])) if len(other) == len(req.facts) else set()
            if len(common) != 1:
                fail(ci, pos, what + (
                    "the mesh dims this slice selects over are not determined "
                    f"(candidates common to all ranks: {sorted(common)})"
                ))
            else:
                object.__setattr__(op, "dims", next(iter(common)))
    return failed


def _store_or_reason():
    if not dist.is_initialized():
        return "no process group to agree on slice dims across ranks"
    if dist.get_backend() == "fake":
        return "its mesh dims need agreement across ranks, which the fake backend cannot give"
    return default_store()


def store_exchange(requests: Sequence[Agreement], timeout_s: float = AGREEMENT_TIMEOUT_S) -> list:
    """Every round of ``requests`` through the default group's store (see the module
    docstring): per round, the facts of every rank asked, or why not. All rounds
    share one deadline, so a graph waits at most ``timeout_s`` in all."""
    store = _store_or_reason()
    if isinstance(store, str):
        return [store] * len(requests)
    me = dist.get_rank()
    for req in requests:
        store.set(f"{_KEY_PREFIX}/{req.key}/{me}", pickle.dumps(req.facts))
    deadline = time.monotonic() + timeout_s
    return [_decide(store, req, deadline, timeout_s) for req in requests]


def _decide(store, req: Agreement, deadline: float, timeout_s: float):
    base = f"{_KEY_PREFIX}/{req.key}"
    keys = [f"{base}/{r}" for r in req.ranks]
    decision = f"{base}/decision"
    answered = store.check(keys)
    while not answered and not store.check([decision]) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
        answered = store.check(keys)
    verdict = store.compare_set(decision, "", "commit" if answered else "abort")
    if verdict != b"commit":
        reason = (f"not every rank of {list(req.ranks)} gave its slice facts within {timeout_s:g} s "
                  "(the chain is left as it was from here on every one of them)")
        if req.earlier is not None and _committed(store, req.earlier):
            warnings.warn(
                f"redist_opt graph pass: rank {dist.get_rank()} compiled again a chain the ranks "
                f"{list(req.ranks)} rewrote before, and the others did not join its agreement "
                f"within {timeout_s:g} s; this graph keeps the traced collectives, which may not "
                "match the rewritten ones the other ranks run", stacklevel=2)
        return reason
    return [pickle.loads(store.get(k)) for k in keys]


def _committed(store, key: str) -> bool:
    decision = f"{_KEY_PREFIX}/{key}/decision"
    return store.check([decision]) and store.get(decision) == b"commit"
