"""The collective cap: by default no plan issues more collectives than torch 2.13's
shipped redistribute (merge pass on) given the same existing groups, under every
cost profile; ``max_collectives="any"`` lets the cost model trade launches for bytes.

* the library's rank-free model of torch's count (``redist_opt.ir.torch_merge``)
  against the tests' model (``support.torch_merge_model``) on random cases, and against
  torch's own ``CommDebugMode`` counts;
* the case of the loss reduction that motivated the cap (``P,P,R -> R,R,R`` on
  2x2x2 with a flattened 4-rank group, gloo profile);
* a property over random meshes, placements, flattened groups and profiles
  (nccl, gloo, nccl with 2 and 4 devices per host).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support.exact_runs import int_input, run_torch_merged
from support.inputs import parse_placement
from support.torch_merge_model import torch_model
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial, Replicate, Shard

import redist_opt
from redist_opt.ir.cost import CostModel
from redist_opt.ir.placements import RedistributeError
from redist_opt.ir.torch_merge import torch_collective_count, torch_merged_plan

PROFILES = {
    "nccl": CostModel.profile("nccl"),
    "gloo": CostModel.profile("gloo"),
    "gloo-ring": CostModel.profile("gloo-ring"),
    "nccl-2-per-host": dataclasses.replace(CostModel.profile("nccl"), devices_per_host=2),
    "nccl-4-per-host": dataclasses.replace(CostModel.profile("nccl"), devices_per_host=4),
}


def P(xs: str):
    return [parse_placement(x) for x in xs.split(",")]


def _plan(sizes, flattened, src, dst, shape, dtype=torch.float32):
    names = tuple("abcd"[: len(sizes)])
    spec = redist_opt.MeshSpec(tuple(sizes), names, flattened=list(flattened))
    return redist_opt.plan(spec, src, dst, shape=shape, dtype=dtype)


# ----------------------------------------------------------------------------
# The motivating case and the opt-in
# ----------------------------------------------------------------------------


def test_loss_reduction_under_a_ring_profile_is_one_all_reduce():
    """full_dtensor's loss reduction with torchtitan's flattened batch group: torch
    issues one all_reduce over the 4-rank group; so do we under a ring profile whose
    per-step latency would split it (gloo-ring, the pre-calibration gloo profile)."""
    p = _plan((2, 2, 2), [("a", "b")], "P,P,R", "R,R,R", (1,))
    assert torch_collective_count(p) == 1
    ours = redist_opt.optimize(p, cost=PROFILES["gloo-ring"])
    assert ours.num_collectives == 1
    (c,) = ours.collectives()
    assert c.kind == "all_reduce" and c.group.size == 4
    assert any(n.pass_name == "collective-cap" for n in ours.notes)


def test_loss_reduction_under_measured_gloo_is_one_all_reduce_uncapped():
    """The measured gloo profile prices one all_reduce over 4 ranks below two over 2
    (as measured on 8 gloo ranks): no cap needed, even with max_collectives="any"."""
    p = _plan((2, 2, 2), [("a", "b")], "P,P,R", "R,R,R", (1,))
    ours = redist_opt.optimize(p, cost=PROFILES["gloo"], max_collectives="any")
    assert [(c.kind, c.group.size) for c in ours.collectives()] == [("all_reduce", 4)]


def test_opt_in_restores_the_cost_models_choice():
    p = _plan((2, 2, 2), [("a", "b")], "P,P,R", "R,R,R", (1,))
    traded = redist_opt.optimize(p, cost=PROFILES["gloo-ring"], max_collectives="any")
    assert traded.num_collectives == 2  # two 2-rank rings, modelled faster under gloo-ring
    assert all(c.group.size == 2 for c in traded.collectives())
    assert not any(n.pass_name == "collective-cap" for n in traded.notes)


def test_devices_per_host_keeps_torchs_merged_gather():
    p = _plan((4, 2), [("a", "b")], "S(0),S(0)", "R,R", (4096, 4096))
    assert torch_collective_count(p) == 1
    assert redist_opt.optimize(p, cost=PROFILES["nccl-4-per-host"]).num_collectives == 1
    # opting in, the model splits the 8-rank gather at the host boundary
    split = redist_opt.optimize(p, cost=PROFILES["nccl-4-per-host"], max_collectives="any")
    assert split.num_collectives == 2


def test_bad_value_is_refused():
    p = _plan((2, 2), [("a", "b")], "P,P", "R,R", (4,))
    with pytest.raises(RedistributeError, match="max_collectives"):
        redist_opt.optimize(p, max_collectives="fewest")
    with pytest.raises(RedistributeError, match="max_collectives"):
        with redist_opt.enabled(max_collectives="any", bogus=1):
            pass


def test_custom_pass_list_runs_as_given():
    p = _plan((2, 2, 2), [("a", "b")], "P,P,R", "R,R,R", (1,))
    assert redist_opt.optimize(p, passes=()).num_collectives == 2  # DTensor's own steps


# ----------------------------------------------------------------------------
# Random cases
# ----------------------------------------------------------------------------

SIZES = st.sampled_from([1, 2, 3, 4, 5, 6, 8, 12])
OPS = ("sum", "avg", "max", "sum|avg")


def _placement(draw, kinds: str, tnd: int, op: str):
    kind = draw(st.sampled_from(kinds))
    if kind == "R":
        return Replicate()
    if kind == "S":
        return Shard(draw(st.integers(0, tnd - 1)))
    return Partial(draw(st.sampled_from(("sum", "avg"))) if op == "sum|avg" else op)


@st.composite
def cases(draw, max_ranks: int = 64):
    ndim = draw(st.integers(1, 4))
    sizes, prod = [], 1
    for _ in range(ndim):
        s = draw(st.integers(1, max(1, min(4, max_ranks // prod))))
        sizes.append(s)
        prod *= s
    combos = [c for k in range(2, ndim + 1) for c in itertools.combinations(range(ndim), k)]
    flattened = [c for c in combos if draw(st.booleans())]
    tnd = draw(st.integers(1, 3))
    shape = tuple(draw(SIZES) for _ in range(tnd))
    op = draw(st.sampled_from(OPS))
    src = [_placement(draw, "RSP", tnd, op) for _ in range(ndim)]
    dst = [
        s if s.is_partial() and d.is_partial() else d
        for s, d in ((s, _placement(draw, "RSP" if s.is_partial() else "RS", tnd, op)) for s in src)
    ]
    return tuple(sizes), flattened, src, dst, shape


def _describe(case) -> str:
    sizes, flattened, src, dst, shape = case
    return f"{sizes} flattened {flattened} {src} -> {dst} shape {shape}"


@settings(max_examples=200, deadline=None)
@given(case=cases())
def test_model_matches_the_oracle(case):
    p = _plan(*case)
    if p.fallback:
        return
    oracle = torch_model(p)
    assert torch_collective_count(p) == oracle.min_collectives, (
        f"{_describe(case)}: model {torch_merged_plan(p).num_collectives}, oracle {oracle.describe()}"
    )


@settings(max_examples=300, deadline=None)
@given(
    case=cases(), profile=st.sampled_from(sorted(PROFILES)), policy=st.sampled_from(["existing", "create"])
)
def test_never_more_collectives_than_torch(case, profile, policy):
    p = _plan(*case)
    if p.fallback:
        return
    ours = redist_opt.optimize(p, groups=policy, cost=PROFILES[profile])
    cap = torch_collective_count(p)
    assert ours.num_collectives <= cap, (
        f"{_describe(case)} {profile} groups={policy}: {ours.num_collectives} > {cap}"
    )
    assert ours.num_collectives <= torch_model(p).min_collectives
    if policy == "existing":
        assert all(p.mesh.group_exists(g) for g in ours.groups_needed())


# ----------------------------------------------------------------------------
# The model against torch's own counts
# ----------------------------------------------------------------------------

TORCH_CASES = [
    # sizes, flattened, src, dst, shape
    ((2, 2, 2), [("a", "b")], "P,P,R", "R,R,R", (1,)),
    ((2, 2, 2), [("a", "b")], "P(avg),P(avg),R", "R,R,R", (4,)),
    ((2, 2, 2), [("a", "b", "c")], "P,P,P", "R,R,R", (8, 4)),
    ((2, 2, 2), [("b", "c")], "S(0),S(0),S(0)", "R,R,R", (8, 4)),
    ((2, 2, 2), [("a", "c")], "P,P,P", "R,S(0),R", (8, 4)),
    ((2, 2, 2), [("a", "b", "c")], "P,P,P", "S(0),S(0),S(0)", (6, 4)),
    ((2, 2, 2), [("a", "b"), ("b", "c")], "P,P,S(1)", "R,R,S(1)", (4, 4)),
    ((4, 2), [("a", "b")], "S(0),S(0)", "R,R", (8, 8)),
    ((4, 2), [("a", "b")], "S(0),S(1)", "R,R", (8, 8)),
    ((2, 4), [("a", "b")], "P,P", "S(0),S(0)", (8, 3)),
    ((2, 2), [("a", "b")], "P,P", "S(0),S(0)", (5, 3)),
    ((2, 2), [("a", "b")], "P(avg),P", "R,R", (3,)),
    ((2, 2), [("a", "b")], "S(0),S(0)", "R,R", (5, 3)),
    ((2, 2), [], "P,P", "R,R", (4, 4)),
    ((3, 2), [("a", "b")], "P(max),P(max)", "R,R", (5, 2)),
    ((2, 1, 2), [("a", "c")], "P,P,P", "R,R,R", (4, 4)),
]


@pytest.mark.parametrize(
    "sizes,flattened,src,dst,shape",
    TORCH_CASES,
    ids=[f"{'x'.join(map(str, c[0]))}-{c[2]}_to_{c[3]}-{'x'.join(map(str, c[4]))}" for c in TORCH_CASES],
)
def test_model_matches_torch(sizes, flattened, src, dst, shape):
    names = tuple("abcd"[: len(sizes)])
    with LocalTensorMode(math.prod(sizes)) as lm:
        mesh = init_device_mesh("cpu", sizes, mesh_dim_names=names)
        for group in flattened:
            mesh[tuple(group)]._flatten()
        dt, _ = int_input(mesh, lm, P(src), shape, torch.float64, seed=1)
        run = run_torch_merged(dt, P(dst))
    assert run.error is None, run.describe_error()
    p = _plan(sizes, flattened, P(src), P(dst), shape, torch.float64)
    assert torch_collective_count(p) == run.total, f"model {torch_merged_plan(p)} vs torch {run.kinds}"
    for profile in PROFILES.values():
        assert redist_opt.optimize(p, cost=profile).num_collectives <= run.total


LIVE_MESH_CASES = [
    # how the mesh is built, flattened groups, src, dst
    ("root", [], "P,P,P", "R,R,R"),
    ("root", [("a", "b")], "P,P,R", "R,R,R"),
    ("unflatten", [], "P,P,P", "R,R,R"),
    ("unflatten", [("a", "b")], "P,P,P", "R,R,R"),
    ("unflatten", [], "S(0),S(0),S(0)", "R,R,R"),
]


def _live_mesh(kind):
    names = ("a", "b", "c")
    if kind == "root":
        return init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=names)
    # torchtitan's ParallelDims.build_mesh: views of a 1-D world mesh
    world = init_device_mesh("cpu", (8,), mesh_dim_names=("world",))
    return world._unflatten(0, (2, 2, 2), names)


@pytest.mark.parametrize(
    "kind,flattened,src,dst",
    LIVE_MESH_CASES,
    ids=[f"{c[0]}-{'+'.join(''.join(g) for g in c[1]) or 'none'}-{c[2]}_to_{c[3]}" for c in LIVE_MESH_CASES],
)
def test_cap_on_live_meshes_is_torchs_count(kind, flattened, src, dst):
    """A MeshSpec read off a live mesh lists groups torch's merge pass never finds
    (the world group, an ``_unflatten`` view's root dim): the cap is torch's real
    count all the same, so the cost model keeps its choice up to that count."""
    with LocalTensorMode(8) as lm:
        mesh = _live_mesh(kind)
        for group in flattened:
            mesh[tuple(group)]._flatten()
        dt, _ = int_input(mesh, lm, P(src), (8, 4), torch.float64, seed=1)
        run = run_torch_merged(dt, P(dst))
        spec = redist_opt.MeshSpec.from_device_mesh(mesh)
    assert run.error is None, run.describe_error()
    p = redist_opt.plan(spec, P(src), P(dst), shape=(8, 4), dtype=torch.float64)
    assert torch_collective_count(p) == run.total, f"model {torch_merged_plan(p)} vs torch {run.kinds}"
    for profile in PROFILES.values():
        capped = redist_opt.optimize(p, cost=profile)
        free = redist_opt.optimize(p, cost=profile, max_collectives="any")
        assert capped.num_collectives <= run.total
        if free.num_collectives <= run.total:  # within torch's count: the cap leaves the choice alone
            assert capped.num_collectives == free.num_collectives


# ----------------------------------------------------------------------------
# Left-out passes stay out: the cap's rerun, ``without``, unknown names
# ----------------------------------------------------------------------------


def _capped_loss_reduction():
    """``P,P,R -> R,R,R`` on 2x2x2 with a+b flattened: under the ring profile the passes
    split torch's one all_reduce in two, the cap fires, and its rerun merges the
    reductions with merge-reductions."""
    spec = redist_opt.MeshSpec((2, 2, 2), ("a", "b", "c"), flattened=[("a", "b")])
    return redist_opt.plan(spec, "P,P,R", "R,R,R", shape=(4096,)), CostModel.profile("gloo-ring")


def test_the_caps_rerun_keeps_the_passes_the_profile_leaves_out():
    p, ring = _capped_loss_reduction()
    capped = redist_opt.optimize(p, cost=ring)
    assert any(n.pass_name == "collective-cap" for n in capped.notes)
    assert capped.applied_passes == ("merge-reductions",)  # the rerun's plan
    leaves_it_out = dataclasses.replace(ring, slower_in_steps=("merge-reductions",))
    kept = redist_opt.optimize(p, cost=leaves_it_out)
    assert "merge-reductions" not in kept.applied_passes
    assert kept.num_collectives <= torch_collective_count(p)


def test_the_caps_rerun_keeps_the_passes_without_leaves_out():
    p, ring = _capped_loss_reduction()
    kept = redist_opt.optimize(p, cost=ring, without=["merge-reductions"])
    assert "merge-reductions" not in kept.applied_passes
    assert kept.num_collectives <= torch_collective_count(p)


def test_without_turns_one_pass_off_and_keeps_the_cap_where_a_pass_list_does_not():
    p, ring = _capped_loss_reduction()
    from redist_opt.passes import DEFAULT_PIPELINE

    others = [c for c in DEFAULT_PIPELINE if c.name != "merge-reductions"]
    as_list = redist_opt.optimize(p, cost=ring, passes=others)  # a caller's list: no cap
    assert as_list.num_collectives > torch_collective_count(p)
    without = redist_opt.optimize(p, cost=ring, without=["merge-reductions"])
    assert without.num_collectives <= torch_collective_count(p)
    # pass classes are read by name: the same options value
    assert redist_opt.PlanOptions(without=[DEFAULT_PIPELINE[0]]) == redist_opt.PlanOptions(
        without=[DEFAULT_PIPELINE[0].name]
    )


def test_unknown_pass_names_raise_naming_the_profile_or_the_option():
    p, ring = _capped_loss_reduction()
    typo = dataclasses.replace(ring, name="my-profile", slower_in_steps=("merge-reduction",))
    with pytest.raises(RedistributeError, match=r"cost profile 'my-profile'.*'merge-reduction'"):
        redist_opt.optimize(p, cost=typo)
    with pytest.raises(RedistributeError, match=r"without=.*'fuse'"):
        redist_opt.optimize(p, cost=ring, without=["fuse"])
    with pytest.raises(RedistributeError, match="without="):
        redist_opt.PlanOptions(without="merge-reductions")  # a string, not a list
