"""Collective counts: redist_opt issues exactly what torch (merge pass disabled)
issues, and its planner predicts that number without running anything.

For a representative set of redistributions (every mesh kind, every placement
kind, uneven and zero-size shapes) this checks, under CommDebugMode:

* ``redist_opt.redistribute(..., passes=())`` (DTensor's own plan through our
  IR and runtime) issues as many collectives of each kind as
  ``DTensor.redistribute`` with the merge pass disabled, with bitwise-equal
  results, and the optimized default issues at most as many (``check_case``
  does the full differential check of both; a case that is also one of
  test_differential.py's gets that check there, and only torch's counts here);
* ``redist_opt.plan(mesh, src, dst, shape=...)`` reports that same number in
  ``num_collectives`` (and the same kinds in ``collectives()``), whether given the
  DeviceMesh, ``MeshSpec.from_device_mesh(mesh)`` or a rank-free
  ``MeshSpec(sizes, names)``, and is not a fallback plan;
* _StridedShard inputs (lowered, or handed back to torch) match torch.

The quick tier runs a fixed sample of about one case in ``SAMPLE_EVERY``.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest
import torch
from support.cases import all_cases
from support.harness import Case, check_case, oracle_only, run_case
from support.meshes import MESHES, get_mesh
from support.runs import collective_kind
from support.sampling import sampled
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard

import redist_opt
from redist_opt.torch_api import dtensor as tdt

F32, F64, BF16 = torch.float32, torch.float64, torch.bfloat16
SHAPES = [(24, 24), (5, 3), (7, 5), (3, 7), (0, 4), (4, 0)]
V = ["R", "S(0)", "S(1)", "P"]


def _with_op(pl, op):
    return tuple(f"P({op})" if p == "P" else p for p in pl)


def _pool():
    rng = random.Random(31337)
    cases = []
    plan = {
        "1d2": 1,
        "1d3": 1,
        "1d4": 1,
        "2x2": 2,
        "3x2": 2,
        "2x4": 2,
        "2x3": 2,
        "2x2x2": 3,
        "1x4": 2,
        "2x1x2": 3,
        "4x1": 2,
        "colmajor2x4": 2,
        "colmajor2x2x2": 3,
        "reversed2x2": 2,
        "sub_ac_of_2x2x2": 2,
        "sub_b_of_2x2x2": 1,
        "unflat8_2x2x2": 3,
        "unflat4_2x2": 2,
        "flat_ac_of_2x2x2": 1,
        "explicit3x2": 2,
    }
    for m, nd in plan.items():
        lists = [tuple(x) for x in itertools.product(V, repeat=nd)]
        pairs = [(s, d) for s in lists for d in lists]
        k = min(len(pairs), 16 if nd == 1 else 14)
        for s, d in rng.sample(pairs, k):
            cases.append(Case(m, s, d, rng.choice(SHAPES), rng.choice([F32, F32, F64, BF16])))
        # partial reduce ops on the same mesh
        p_pairs = [(s, d) for s, d in pairs if "P" in s]
        for op in ("avg", "max", "min"):
            s, d = rng.choice(p_pairs)
            cases.append(Case(m, _with_op(s, op), _with_op(d, op), rng.choice(SHAPES)))
    # a few hand-picked classics
    cases += [
        Case("2x2x2", ("P", "P", "P"), ("R", "S(0)", "R"), (5, 3)),
        Case("2x2x2", ("S(0)", "S(0)", "S(0)"), ("R", "R", "R"), (7, 5)),
        Case("2x2x2", ("S(0)", "S(0)", "R"), ("R", "S(0)", "R"), (7, 5)),
        Case("2x2x2", ("S(0)", "S(1)", "P"), ("S(1)", "S(0)", "R"), (24, 24)),
        Case("2x4", ("S(0)", "R"), ("S(1)", "R"), (5, 3)),
        Case("2x4", ("P", "P"), ("R", "R"), (0, 4)),
        Case("1d4", ("S(0)",), ("S(1)",), (7, 5)),
    ]
    seen, out = set(), []
    for c in cases:
        if c.id not in seen:
            seen.add(c.id)
            out.append(c)
    return out


CASES = _pool()
# the cases test_differential.py runs through the same full comparison (same input seed)
DIFFERENTIAL = {c.id for cases in all_cases().values() for c in cases}


def _plan_checks(case: Case, ref_total: int, ref_counts: Counter) -> None:
    f = MESHES[case.mesh]
    with LocalTensorMode(f.nranks) as lm:
        mesh = get_mesh(f, lm)
        specs = {
            "DeviceMesh": mesh,
            "MeshSpec.from_device_mesh": redist_opt.MeshSpec.from_device_mesh(mesh),
            "MeshSpec(sizes, names)": redist_opt.MeshSpec(
                sizes=tuple(mesh.shape),
                names=tuple(mesh.mesh_dim_names) if mesh.mesh_dim_names else None,
            ),
        }
        plans = {
            k: redist_opt.plan(m, list(case.src), list(case.dst), shape=case.shape, dtype=case.dtype)
            for k, m in specs.items()
        }
    for k, p in plans.items():
        if _zero_fills(case):  # torch 2.15's Shard -> Partial("sum"): handed back to torch
            assert p.fallback and "zero-fill" in p.fallback_reason, (k, p.fallback_reason)
            continue
        assert not p.fallback, f"plan({k}) is a fallback: {p.fallback_reason}"
        assert p.num_collectives == ref_total, (
            f"plan({k}).num_collectives = {p.num_collectives}, torch (merge disabled) "
            f"issues {ref_total} {dict(ref_counts)}"
        )
        kinds = Counter(collective_kind(c.kind) for c in p.collectives())
        assert kinds == ref_counts, f"plan({k}).collectives() kinds {dict(kinds)} != torch {dict(ref_counts)}"


def _zero_fills(case: Case) -> bool:
    """Whether the case has a Shard -> Partial("sum") step, which torch 2.15 runs."""
    return tdt.ZERO_FILLS_SHARD_TO_PARTIAL and any(
        s.startswith("S(") and d == "P" for s, d in zip(case.src, case.dst)
    )


SAMPLE_EVERY = 8


@pytest.mark.parametrize("case", [sampled(c, c.id, SAMPLE_EVERY) for c in CASES])
def test_counts_match_torch(case):
    # run_case includes the CommDebugMode count comparison
    ref = oracle_only(case) if case.id in DIFFERENTIAL else run_case(case)
    if ref.error is None:
        _plan_checks(case, ref.total, ref.counts)


# (mesh, src, dst, shape, lowered): gathers out of a _StridedShard are lowered
# (redist_opt.ir.strided); the other transitions are handed to torch.
STRIDED = [
    ("2x2", [_StridedShard(0, split_factor=2), Shard(0)], [Replicate(), Replicate()], (8, 4), True),
    ("2x2", [_StridedShard(0, split_factor=2), Shard(0)], [Shard(0), Replicate()], (8, 4), False),
    ("2x2", [Shard(0), _StridedShard(0, split_factor=2)], [Replicate(), Shard(1)], (8, 4), False),
    ("2x2", [_StridedShard(1, split_factor=2), Shard(1)], [Replicate(), Replicate()], (4, 8), True),
    (
        "2x2x2",
        [_StridedShard(0, split_factor=2), Shard(0), Replicate()],
        [Replicate(), Replicate(), Shard(1)],
        (8, 4),
        False,
    ),
]


@pytest.mark.parametrize(
    "mesh_name,src,dst,shape,lowered",
    [pytest.param(*s, id=f"{s[0]}-{i}") for i, s in enumerate(STRIDED)],
)
def test_strided_shard_matches_torch(mesh_name, src, dst, shape, lowered):
    f = MESHES[mesh_name]
    with LocalTensorMode(f.nranks) as lm:
        mesh = get_mesh(f, lm)
        p = redist_opt.plan(mesh, src, dst, shape=shape)
    assert p.fallback is not lowered, p.fallback_reason
    check_case(f, src, dst, shape)
