"""Self-tests of the differential harness (independent of redist_opt's code).

* The oracle agrees with the harness's independent reference on every mesh
  kind (so inputs are well formed and the meshes are simulated correctly).
* check_case detects a wrong candidate: wrong values, wrong local shape, wrong
  placements, an extra collective, a mutated input, returning where torch
  raises, raising where torch succeeds, and raising a non-RedistributeError.
The fake candidates stand in for redist_opt.redistribute via monkeypatch.
"""

from __future__ import annotations

import pytest
import torch
from support.harness import Case, check_case, oracle_only
from support.inputs import build_input, local_tensors, parse_placement, random_tensor
from support.meshes import MESHES, get_mesh
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor._redistribute import (
    disable_redistribute_transform_optimization,
)

import redist_opt

SANITY = [
    Case(m, s, d, shape)
    for m, pairs in {
        "1d3": [(("P",), ("S(0)",)), (("S(1)",), ("S(0)",))],
        "3x2": [(("S(0)", "S(0)"), ("R", "S(1)")), (("P", "S(1)"), ("S(0)", "R"))],
        "2x2x2": [(("S(0)", "P", "S(0)"), ("R", "R", "S(1)")), (("P", "P", "P"), ("S(1)", "R", "S(0)"))],
        "2x1x2": [(("S(0)", "P", "S(1)"), ("R", "R", "R"))],
        "colmajor2x4": [(("S(0)", "S(1)"), ("S(1)", "S(0)")), (("P", "S(0)"), ("R", "R"))],
        "colmajor2x2x2": [(("S(1)", "S(0)", "P"), ("R", "S(0)", "S(0)"))],
        "sub_ac_of_2x2x2": [(("P", "S(0)"), ("S(1)", "R"))],
        "sub_b_of_2x2x2": [(("S(0)",), ("S(1)",))],
        "unflat8_2x2x2": [(("S(0)", "S(0)", "P"), ("R", "S(1)", "R"))],
        "unflat8_4x2": [(("P", "S(1)"), ("S(0)", "S(0)"))],
        "flat_ac_of_2x2x2": [(("P",), ("S(1)",))],
        "explicit3x2": [(("S(1)", "P"), ("R", "S(0)"))],
        "2x2x2x2": [(("P", "P", "S(0)", "R"), ("R", "S(0)", "R", "R"))],
    }.items()
    for s, d in pairs
    for shape in [(7, 5), (24, 24), (0, 4)]
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in SANITY])
def test_oracle_matches_independent_reference(case):
    assert MESHES[case.mesh].global_check
    ref = oracle_only(case)  # runs oracle_sanity
    assert ref.error is None, ref.describe_error()


@pytest.mark.parametrize("op", ["avg", "max", "min"])
def test_oracle_matches_reference_partial_ops(op):
    ref = oracle_only(Case("2x2x2", (f"P({op})", "S(0)", f"P({op})"), ("R", "S(1)", "S(0)"), (7, 5)))
    assert ref.error is None, ref.describe_error()


@pytest.mark.parametrize(
    "mesh_name,placements,shape",
    [
        ("1d3", ("S(0)",), (7, 5)),
        ("1d4", ("S(1)",), (3, 7)),
        ("3x2", ("S(0)", "S(0)"), (7, 5)),
        ("2x4", ("S(1)", "S(0)"), (5, 3)),
        ("2x2x2", ("S(0)", "S(1)", "S(0)"), (7, 5)),
        ("2x2x2", ("S(0)", "S(0)", "S(0)"), (5, 3)),
        ("2x2x2", ("R", "S(1)", "S(1)"), (3, 7)),
        ("2x1x2", ("S(0)", "S(0)", "S(0)"), (3, 2)),
        ("colmajor2x4", ("S(0)", "S(1)"), (7, 5)),
        ("reversed2x2", ("S(0)", "S(0)"), (3, 7)),
        ("sub_ac_of_2x2x2", ("S(1)", "S(0)"), (5, 3)),
        ("unflat8_4x2", ("S(0)", "S(0)"), (7, 5)),
        ("flat_ac_of_2x2x2", ("S(0)",), (5, 3)),
        ("2x2x2x2", ("S(0)", "S(0)", "S(1)", "S(0)"), (7, 5)),
        ("2x4", ("S(0)", "S(1)"), (0, 4)),
        ("2x4", ("S(1)", "S(1)"), (4, 0)),
    ],
)
def test_input_slicing_matches_distribute_tensor(mesh_name, placements, shape):
    """build_input's own slicing gives exactly distribute_tensor's local shards."""
    f = MESHES[mesh_name]
    pl = [parse_placement(p) for p in placements]
    with LocalTensorMode(f.nranks) as lm:
        mesh = get_mesh(f, lm)
        inp = build_input(mesh, lm, pl, shape, torch.float32, 11)
        with lm.disable():
            g = random_tensor(shape, torch.float32, 11)
        g_all = lm.rank_map(lambda r: g.clone())
        want = local_tensors(distribute_tensor(g_all, mesh, pl, src_data_rank=None))
    got = local_tensors(inp.dt)
    for r in want:
        assert got[r].shape == want[r].shape and torch.equal(got[r], want[r]), f"rank {r}"


# ---------------------------------------------------------------------------
# mutation tests: fake candidates must be caught
# ---------------------------------------------------------------------------


def _torch(dt, placements, **kw):
    kw.pop("groups", None)
    kw.pop("passes", None)
    mesh = kw.pop("device_mesh", None) or dt.device_mesh
    with disable_redistribute_transform_optimization():
        return dt.redistribute(mesh, list(placements), **kw)


def _perturbed(dt, placements, **kw):
    out = _torch(dt, placements, **kw)
    for r, t in local_tensors(out).items():
        if t.numel() and r == max(local_tensors(out)):
            t.view(-1)[0] += 1e-6 if t.dtype.is_floating_point else 1
    return out


def _extra_collective(dt, placements, **kw):
    from torch.distributed._functional_collectives import all_reduce

    out = _torch(dt, placements, **kw)
    all_reduce(out.to_local(), "sum", (dt.device_mesh, 0)).wait()  # a gratuitous one
    return out


def _mutates_input(dt, placements, **kw):
    out = _torch(dt, placements, **kw)
    for t in local_tensors(dt).values():
        if t.numel():
            t.view(-1)[0] = 42.0
    return out


def _returns_input(dt, placements, **kw):
    return dt


def _raises_type_error(dt, placements, **kw):
    raise TypeError("boom")


def _raises_re(dt, placements, **kw):
    raise redist_opt.RedistributeError("refused")


def _swaps_local_shape(dt, placements, **kw):
    out = _torch(dt, placements, **kw)
    return DTensor.from_local(
        out.to_local().flatten(),
        out.device_mesh,
        out.placements,
        run_check=False,
        shape=out.shape,
        stride=out.stride(),
    )


MUTANTS = [
    (_perturbed, ("2x2", ("P", "S(0)"), ("R", "S(1)"), (5, 3)), "local values differ"),
    (_extra_collective, ("2x2", ("S(0)", "R"), ("R", "R"), (4, 4)), "collective"),
    (_mutates_input, ("1d4", ("S(0)",), ("R",), (8, 4)), "modified the input"),
    (_returns_input, ("2x2", ("S(0)", "R"), ("R", "R"), (4, 4)), "placements"),
    # S -> P(avg): refused by every torch (2.15 zero-fills S -> P(sum) only)
    (_returns_input, ("1d2", ("S(0)",), ("P(avg)",), (4, 4)), "torch raises"),
    (_raises_type_error, ("1d2", ("S(0)",), ("P(avg)",), (4, 4)), "neither RedistributeError"),
    (_raises_re, ("1d2", ("S(0)",), ("R",), (4, 4)), "torch succeeds but redist_opt raised"),
    (_swaps_local_shape, ("2x2", ("S(0)", "S(1)"), ("S(0)", "S(1)"), (4, 4)), "local shape"),
]


@pytest.mark.parametrize(
    "fake,args,expected",
    [pytest.param(f, a, e, id=f.__name__.strip("_")) for f, a, e in MUTANTS],
)
def test_harness_catches_wrong_candidate(monkeypatch, fake, args, expected):
    monkeypatch.setattr(redist_opt, "redistribute", fake)
    with pytest.raises(AssertionError, match=expected):
        check_case(*args)


def test_harness_accepts_torch_itself(monkeypatch):
    monkeypatch.setattr(redist_opt, "redistribute", _torch)
    for m, s, d, shape in [
        ("2x2x2", ("P", "S(0)", "P"), ("S(1)", "R", "S(0)"), (7, 5)),
        ("1d3", ("S(0)",), ("P",), (4, 4)),
        ("3x2", ("S(1)", "S(1)"), ("S(0)", "S(0)"), (5, 3)),
    ]:
        check_case(m, s, d, shape, torch.float32)
