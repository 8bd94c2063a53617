"""A stand-in for the other ranks' slice facts, for graph-pass tests on the fake backend
(one process, rank 0 of a 2x2x2 mesh): the agreement's ``all_gather``."""

from __future__ import annotations

import dataclasses

import torch

from redist_opt.graph.mesh_groups import mesh_contexts


def other_ranks(mesh, index_of):
    """``all_gather`` standing in for the 8 ranks of ``mesh``: rank r's candidates for
    each slice of 2 blocks are the single dims whose coordinate is ``index_of(coord_r)``."""
    ctx = mesh_contexts(mesh)[0]
    coords = [tuple(int(c) for c in (torch.arange(8).view(2, 2, 2) == r).nonzero()[0]) for r in range(8)]

    def all_gather(facts):
        out = []
        for coord in coords:
            other = dataclasses.replace(ctx, coord=coord)
            cands = sorted(d for d in other.candidate_dims(2) if other.block_index(d) == index_of(coord))
            out.append([[cands for _ in chain] for chain in facts])
        return out

    return all_gather
