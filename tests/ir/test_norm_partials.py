"""Partial p-norms (torch's ``_NormPartial``) and the vocab-parallel embedding's
``_MaskPartial``, lowered instead of handed back to torch.

Checked against torch's own redistribute with its merge pass disabled, on every
simulated rank (LocalTensorMode over the fake backend): the unmerged plan
(``passes=()``) bitwise (NaN where torch has NaN) with the same collectives, the
optimized plan within rounding with at most as many collectives.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support.meshes import ensure_fake_pg
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor._ops._math_ops import _NormPartial
from torch.distributed.tensor._redistribute import disable_redistribute_transform_optimization
from torch.distributed.tensor.debug import CommDebugMode

import redist_opt
from redist_opt.ir.parse import parse_ir
from redist_opt.ir.placements import normalize_norm_partial, parse_placement, placement_str
from redist_opt.ir.text import format_ir

PS = (1, 2, 3, 0.5, 0, math.inf, -math.inf)


def _mesh(shape, flatten):
    names = tuple("abc"[: len(shape)])
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    if flatten and len(shape) > 1:
        mesh[names]._flatten("_".join(names))
    return mesh


def _locals(dt):
    return {r: t for r, t in dt.to_local()._local_tensors.items()}


def _norm_input(lm, mesh, p, shape, placements, seed):
    """A DTensor of per-rank partial norms: nonnegative, as vector_norm makes them,
    sharded as ``placements`` say and different on every partial rank."""
    gen = torch.Generator().manual_seed(seed)
    with lm.disable():
        g = torch.rand(shape, generator=gen) * 3
        noise = {r: torch.rand(shape, generator=gen) for r in lm.ranks}
    base = [Replicate() if q.is_partial() else q for q in placements]
    local = distribute_tensor(lm.rank_map(lambda r: g.clone()), mesh, base, src_data_rank=None).to_local()
    per_rank = local._local_tensors
    lt = lm.rank_map(lambda r: per_rank[r] + noise[r][tuple(slice(0, n) for n in per_rank[r].shape)])
    return DTensor.from_local(
        lt, mesh, placements, run_check=False, shape=torch.Size(shape), stride=g.stride()
    )


def _redistribute(dt, dst):
    if any(q.is_partial() and not s.is_partial() for s, q in zip(dt.placements, dst)):
        # R -> P is internal to DTensor (its public redistribute refuses it): call the
        # local function, which enabled() routes, as DTensor's op dispatch does.
        from torch.distributed.tensor import _redistribute as torch_redistribute
        from torch.distributed.tensor._dtensor_spec import DTensorSpec

        spec = dt._spec
        target = DTensorSpec(spec.mesh, tuple(dst), tensor_meta=spec.tensor_meta)
        local = torch_redistribute.redistribute_local_tensor(dt._local_tensor, spec, target)
        return DTensor.from_local(
            local, dt.device_mesh, dst, run_check=False, shape=dt.shape, stride=dt.stride()
        )
    return dt.redistribute(dt.device_mesh, dst)


def _run(dt, dst, **opts):
    with CommDebugMode() as cdm:
        if opts.pop("torch", False):
            with disable_redistribute_transform_optimization():
                out = _redistribute(dt, dst)
        else:
            with redist_opt.enabled(**opts):
                out = _redistribute(dt, dst)
        lt = _locals(out)
    return out, lt, cdm.get_total_counts()


def check_norm(mesh_shape, flatten, p, src, dst, shape, seed=0):
    ensure_fake_pg()
    n = math.prod(mesh_shape)
    with LocalTensorMode(n) as lm, warnings.catch_warnings():
        warnings.filterwarnings("error", message="redist_opt")  # no hand-back warning
        mesh = _mesh(mesh_shape, flatten)
        dt = _norm_input(lm, mesh, p, shape, [parse_placement(s) for s in src], seed)
        dst_p = [parse_placement(s) for s in dst]
        ref, lr, cr = _run(dt, dst_p, torch=True)
        naive, ln, cn = _run(dt, dst_p, passes=())
        opt, lo, co = _run(dt, dst_p)
    assert tuple(naive.placements) == tuple(ref.placements) == tuple(opt.placements)
    assert cn == cr and co <= cr, (cn, co, cr)
    for r in lr:
        torch.testing.assert_close(ln[r], lr[r], rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(lo[r], lr[r], rtol=1e-5, atol=1e-6, equal_nan=True)
    return cr, co


def _norm(p):
    return (
        placement_str(_NormPartial(p))
        if p not in (0, math.inf, -math.inf)
        else {0: "P", math.inf: "P(max)", -math.inf: "P(min)"}[p]
    )


# -- text form and normalisation ----------------------------------------------------


@pytest.mark.parametrize("p", PS)
def test_norm_placement_text_round_trips(p):
    q = normalize_norm_partial(_NormPartial(p))
    assert parse_placement(placement_str(q)) == q
    assert placement_str(q) == _norm(p)


def test_norm_plan_text_round_trips_and_merges_one_pre_and_post_step():
    mesh = redist_opt.MeshSpec(sizes=(2, 2), names=("a", "b"), flattened=("a+b",))
    plan = redist_opt.plan(mesh, "P(norm3),P(norm3)", "S(0),S(0)", shape=(7,))
    opt = redist_opt.optimize(plan)
    for q in (plan, opt):
        text = format_ir(q)
        assert format_ir(parse_ir(text)) == text
    ops = [line.split("=")[1].split("(")[0].strip() for line in format_ir(opt).splitlines() if " = " in line]
    assert ops == ["power", "pad_nested", "reduce_scatter", "narrow", "root"]


def test_norm_never_merges_with_sum():
    mesh = redist_opt.MeshSpec(sizes=(2, 2), names=("a", "b"), flattened=("a+b",))
    plan = redist_opt.plan(mesh, "P(norm2),P(norm2)", "R,R", shape=(4,))
    assert redist_opt.optimize(plan).num_collectives == 1
    mixed = redist_opt.plan(mesh, "P(norm2),P", "R,R", shape=(4,))
    assert mixed.fallback and "mix" in mixed.fallback_reason


# -- differential: every p, 1-D / 2-D / 3-D meshes, flattened groups, uneven shapes --

_CASES = [
    ((4,), False, ("{n}",), ("R",), (5, 3)),
    ((4,), False, ("{n}",), ("S(0)",), (7, 2)),
    ((4,), False, ("R",), ("{n}",), (6,)),
    ((2, 2), False, ("{n}", "{n}"), ("R", "R"), (5,)),
    ((2, 2), True, ("{n}", "{n}"), ("R", "R"), (5,)),
    ((2, 2), True, ("{n}", "{n}"), ("S(0)", "S(0)"), (7, 3)),
    ((2, 2), True, ("{n}", "{n}"), ("S(0)", "R"), (5, 3)),
    ((2, 2), True, ("S(1)", "{n}"), ("S(1)", "R"), (3, 5)),
    ((2, 1, 2), True, ("{n}", "R", "{n}"), ("R", "R", "R"), (3,)),
    ((2, 2, 2), False, ("{n}", "{n}", "{n}"), ("R", "S(0)", "R"), (5, 2)),
    ((2, 2, 2), True, ("{n}", "{n}", "{n}"), ("R", "R", "R"), (3, 3)),
]


@pytest.mark.parametrize("p", PS, ids=lambda p: f"p={p}")
@pytest.mark.parametrize(
    "case",
    _CASES,
    ids=lambda c: (
        f"{'x'.join(map(str, c[0]))}{'-flat' if c[1] else ''}-"
        f"{','.join(c[2])}_to_{','.join(c[3])}-{'x'.join(map(str, c[4]))}"
    ),
)
def test_norm_partial_against_torch(case, p):
    mesh_shape, flatten, src, dst, shape = case
    n = _norm(p)
    if src == ("R",) and p in (0, math.inf, -math.inf):
        pytest.skip("R -> P(max/min) needs no norm: covered by the plain partial cases")
    check_norm(mesh_shape, flatten, p, [s.format(n=n) for s in src], [s.format(n=n) for s in dst], shape)


def test_merged_norm_issues_one_all_reduce_on_flattened_group():
    cr, co = check_norm((2, 2), True, 2, ["P(norm2)", "P(norm2)"], ["R", "R"], (4,))
    assert (cr, co) == (2, 1)


@settings(max_examples=8, deadline=None, derandomize=True, database=None)
@given(
    p=st.sampled_from(PS),
    shape=st.tuples(st.integers(1, 7), st.integers(1, 4)),
    dst=st.tuples(
        st.sampled_from(["R", "S(0)", "S(1)", "{n}"]), st.sampled_from(["R", "S(0)", "S(1)", "{n}"])
    ),
    flatten=st.booleans(),
)
def test_norm_partial_property(p, shape, dst, flatten):
    n = _norm(p)
    check_norm((2, 2), flatten, p, [n, n], [d.format(n=n) for d in dst], shape, seed=sum(shape))


# -- the grad-norm-clip path -----------------------------------------------------------


def _grad_norm(enabled):
    ensure_fake_pg()
    with LocalTensorMode(4), warnings.catch_warnings():
        warnings.filterwarnings("error", message="redist_opt")
        mesh = _mesh((2, 2), True)
        g = torch.arange(35, dtype=torch.float32).reshape(7, 5) / 10
        dt = distribute_tensor(g, mesh, [Shard(0), Shard(1)])
        norm = torch.linalg.vector_norm(dt, 2)
        assert isinstance(norm.placements[0], _NormPartial)
        with CommDebugMode() as cdm:
            if enabled:
                with redist_opt.enabled():
                    full = norm.full_tensor()
            else:
                full = norm.full_tensor()
        vals = {r: t.clone() for r, t in full._local_tensors.items()}
    return cdm.get_comm_counts(), cdm.get_total_counts(), vals, torch.linalg.vector_norm(g, 2)


def test_grad_norm_full_tensor_one_all_reduce():
    _, torch_total, torch_vals, exact = _grad_norm(False)
    counts, total, vals, _ = _grad_norm(True)
    assert torch_total == 1
    assert total <= 1, counts
    for r in vals:
        torch.testing.assert_close(vals[r], torch_vals[r])
        torch.testing.assert_close(vals[r], exact)


def _clip(enabled):
    ensure_fake_pg()
    with LocalTensorMode(4), warnings.catch_warnings():
        warnings.filterwarnings("error", message="redist_opt")
        mesh = _mesh((2, 2), True)
        torch.manual_seed(0)
        lin = torch.nn.Linear(6, 4)
        w = distribute_tensor(lin.weight.detach(), mesh, [Shard(0), Shard(1)])
        b = distribute_tensor(lin.bias.detach(), mesh, [Shard(0), Replicate()])
        params = [torch.nn.Parameter(w), torch.nn.Parameter(b)]
        for q in params:
            q.grad = q.detach() * 3 + 1
        if enabled:
            with redist_opt.enabled():
                total = torch.nn.utils.clip_grad_norm_(params, 1.0)
        else:
            total = torch.nn.utils.clip_grad_norm_(params, 1.0)
        total = total.full_tensor() if isinstance(total, DTensor) else total
        grads = [_locals(q.grad) for q in params]
        total_vals = {r: t.clone() for r, t in total._local_tensors.items()}
    return total_vals, grads


def test_clip_grad_norm_equal_to_torch():
    t0, g0 = _clip(False)
    t1, g1 = _clip(True)
    for r in t0:
        torch.testing.assert_close(t1[r], t0[r])
    for a, b in zip(g0, g1):
        for r in a:
            torch.testing.assert_close(b[r], a[r])


# -- _MaskPartial: vocab-parallel embedding ----------------------------------------------


def _embedding(enabled, output=None):
    from torch.distributed.tensor.parallel import RowwiseParallel, parallelize_module

    ensure_fake_pg()
    with LocalTensorMode(4) as lm, warnings.catch_warnings():
        warnings.filterwarnings("error", message="redist_opt")
        mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("tp",))
        torch.manual_seed(0)
        emb = torch.nn.Embedding(10, 3)
        with lm.disable():
            weight = torch.randn(10, 3, generator=torch.Generator().manual_seed(1))
        emb.weight = torch.nn.Parameter(lm.rank_map(lambda r: weight.clone()))
        parallelize_module(
            emb, mesh, RowwiseParallel(input_layouts=Replicate(), output_layouts=output or Replicate())
        )
        idx = lm.rank_map(lambda r: torch.tensor([[0, 3, 9, 4, 1], [5, 7, 2, 8, 6]]))
        with CommDebugMode() as cdm, warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Full backward hook")
            if enabled:
                with redist_opt.enabled():
                    out = emb(idx)
                    out.sum().backward()
            else:
                out = emb(idx)
                out.sum().backward()
        if isinstance(out, DTensor):
            out = out.to_local()
        out = out.wait() if hasattr(out, "wait") else out
        vals = {r: t.clone() for r, t in out._local_tensors.items()}
        grad = _locals(emb.weight.grad)
    return vals, grad, cdm.get_total_counts(), weight


@pytest.mark.parametrize("output", [Replicate(), Shard(1)], ids=["R", "S(1)"])
def test_mask_partial_embedding_equal_to_torch_without_hand_back(output):
    v0, g0, c0, weight = _embedding(False, output)
    v1, g1, c1, _ = _embedding(True, output)  # redist_opt warnings are errors: no hand-back
    assert c1 <= c0
    full = weight[torch.tensor([[0, 3, 9, 4, 1], [5, 7, 2, 8, 6]])]
    for r in v0:
        assert torch.equal(v1[r], v0[r])
        if output == Replicate():
            assert torch.equal(v1[r], full)
    for r in g0:
        assert torch.equal(g1[r], g0[r])


# -- hand-backs: torch's merge pass stays on unless the input hits its uneven all_gather bug --


@pytest.mark.parametrize(
    "flatten, shape, hits", [(True, (5, 2), True), (True, (8, 2), False), (False, (5, 2), False)]
)
def test_uneven_all_gather_merge_detection(flatten, shape, hits):
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    from redist_opt.torch_api import dtensor as tdt

    ensure_fake_pg()
    with LocalTensorMode(4):
        mesh = _mesh((2, 2), flatten)
        meta = TensorMeta(torch.Size(shape), (shape[1], 1), torch.float32)
        src = DTensorSpec(mesh, (Shard(0), Shard(0)), tensor_meta=meta)
        dst = DTensorSpec(mesh, (Replicate(), Replicate()), tensor_meta=meta)
        assert tdt.hits_uneven_all_gather_merge(src, dst) is hits
        assert tdt.hits_uneven_all_gather_merge(dst, dst) is False


@pytest.mark.parametrize("size, hits", [(9, True), (8, False), (3, True)])
def test_uneven_all_gather_merge_detection_with_per_rank_sizes(size, hits):
    # S(1),S(1),S(1) -> S(1),R,R on 2x2x2 with b+c flattened: the gathers over c and b
    # merge over b_c, padded by dim 1's size after a's split, one value per simulated
    # rank: (5, 4) for 9 (uneven on the a=0 ranks: a hit), (4, 4) for 8 (even), (2, 1)
    # for 3, where the sizes of c and b do not order the same way on every rank.
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    from redist_opt.torch_api import dtensor as tdt

    ensure_fake_pg()
    with LocalTensorMode(8):
        mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("a", "b", "c"))
        mesh["b", "c"]._flatten("b_c")
        meta = TensorMeta(torch.Size((4, size)), (size, 1), torch.float32)
        src = DTensorSpec(mesh, (Shard(1),) * 3, tensor_meta=meta)
        dst = DTensorSpec(mesh, (Shard(1), Replicate(), Replicate()), tensor_meta=meta)
        for graph_based in (None, True):
            assert tdt.hits_uneven_all_gather_merge(src, dst, graph_based) is hits


def test_sizes_on_every_rank():
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from redist_opt.torch_api import dtensor as tdt

    ensure_fake_pg()
    assert tdt.ints_on_every_rank(6) == (6,)
    with LocalTensorMode(4) as lm:
        per_rank = lm.rank_map(lambda r: torch.zeros(r + 1)).shape[0]
        assert tdt.ints_on_every_rank(per_rank) == (1, 2, 3, 4)
    assert tdt.ints_on_every_rank(ShapeEnv().create_unbacked_symint()) is None


def test_hand_back_warns_once_per_reason_naming_the_planner():
    # A _StridedShard whose shard order is reordered (not a gather out of it) is
    # still handed back: torch's min-cost planner picks that path.
    from torch.distributed.tensor.placement_types import _StridedShard

    from redist_opt.api import errors

    ensure_fake_pg()
    errors._warned.clear()
    src, dst = [_StridedShard(0, split_factor=2), Shard(0)], [Shard(0), Replicate()]
    with LocalTensorMode(4), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mesh = _mesh((2, 2), True)
        outs = []
        for shape in ((8, 3), (12, 2)):
            g = torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape)
            dt = distribute_tensor(g, mesh, src)
            with disable_redistribute_transform_optimization():
                ref = dt.redistribute(mesh, dst).to_local()
            with redist_opt.enabled():
                outs.append((dt.redistribute(mesh, dst).to_local(), ref))
        for out, ref in outs:
            for r, t in out._local_tensors.items():
                assert torch.equal(t, ref._local_tensors[r])
    ours = [str(w.message) for w in caught if "redist_opt" in str(w.message)]
    assert len(ours) == 1, ours
    assert "_S(0, 2)" in ours[0] and "min-cost planner" in ours[0], ours[0]
