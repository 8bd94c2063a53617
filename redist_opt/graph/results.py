"""What the compiled-graph pass did to one graph: :class:`ChainResult` per raised chain,
:class:`GraphPassResult` per graph, and :func:`count_collectives`, the count they are
checked against.

These are the pass's answer to its callers (``redist_opt.backend``, ``compiler_fn``,
``RedistGraphPass``) and the text of its ``explain`` dumps: every line of
:meth:`GraphPassResult.explain` is one chain, one chain left as it was
(:class:`~redist_opt.graph.chain.NotRaised`), one reassociation or one combination.
"""

from __future__ import annotations

import dataclasses

import torch.fx as fx

from redist_opt.graph.chain import COLLECTIVES, NotRaised
from redist_opt.graph.combine import Combination
from redist_opt.graph.reassociate import Reassociation

__all__ = ["ChainResult", "GraphPassResult", "count_collectives"]


@dataclasses.dataclass
class ChainResult:
    """One raised chain: what it meant, what it was, and what it became."""

    nodes: tuple[str, ...]
    mesh: str
    src: str
    dst: str
    shape: tuple[int, ...]
    before: list[tuple[str, str, int]]  # (kind, mesh dims, bytes in) of the original collectives
    after: list[tuple[str, str, int]]
    rewritten: bool
    reason: str
    # collectives before a shared value, kept for its other users (counted on both sides)
    kept: list[tuple[str, str, int]] = dataclasses.field(default_factory=list)

    def __str__(self) -> str:
        def fmt(cs):
            return " ; ".join(f"{k}({g})" for k, g, _ in cs) or "nothing"

        verdict = "rewritten" if self.rewritten else "kept"
        shared = f"[{fmt(self.kept)} kept] " if self.kept else ""
        return (
            f"{self.src} -> {self.dst} {self.shape} on {self.mesh}: {shared}{fmt(self.before)} => "
            f"{shared}{fmt(self.after)}: {verdict}: {self.reason}"
        )


@dataclasses.dataclass
class GraphPassResult:
    """One graph: whether it changed, each raised chain, what was not raised, then the
    graph-only rewrites that ran after the chains."""

    modified: bool
    chains: list[ChainResult]
    not_raised: list[NotRaised]
    # adds/subs of all_reduced values rewritten by the reassociation pass (after the chains)
    reassociated: list[Reassociation] = dataclasses.field(default_factory=list)
    # collectives combined by the combining pass (last)
    combined: list[Combination] = dataclasses.field(default_factory=list)

    @property
    def all_reduces_reassociated(self) -> int:
        """All_reduces the reassociation pass removed."""
        return sum(r.removed for r in self.reassociated)

    @property
    def collectives_combined(self) -> int:
        """Collectives the combining pass removed."""
        return sum(c.removed for c in self.combined)

    def _counted(self) -> list[ChainResult]:
        # a chain through a shared value that was not rewritten overlaps the chains
        # before and after that value, which are counted themselves
        return [c for c in self.chains if c.rewritten or not c.kept]

    @property
    def collectives_before(self) -> int:
        return sum(len(c.before) for c in self._counted())

    @property
    def collectives_after(self) -> int:
        return sum(len(c.after if c.rewritten else c.before) for c in self._counted())

    def explain(self) -> str:
        lines = [str(c) for c in self.chains] + [str(n) for n in self.not_raised]
        lines += [str(r) for r in self.reassociated] + [str(c) for c in self.combined]
        return "\n".join(lines)


def count_collectives(graph) -> dict[str, int]:
    """``{kind: count}`` of ``_c10d_functional`` collectives in a graph (waits excluded)."""
    g = graph.graph if isinstance(graph, fx.GraphModule) else graph
    out: dict[str, int] = {}
    for n in g.nodes:
        if n.op == "call_function" and n.target in COLLECTIVES:
            k = COLLECTIVES[n.target]
            out[k] = out.get(k, 0) + 1
    return out
