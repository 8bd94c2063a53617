"""The public cases of ../shared/DESIGN.md, "What torch 2.13 does today" items 1-5
(plus HSDP gradients), each against torch 2.13 itself.

Every case runs under ``LocalTensorMode`` on the ``fake`` backend (the session
fixture in conftest.py initialises it) on a *fresh* root mesh with exactly the
flattened meshes the case names (``mesh[("a", "c")]._flatten()``), and checks:

* ``redist_opt.redistribute(dt, dst, groups="existing")`` issues FEWER
  collectives (``CommDebugMode().get_total_counts()``) than torch 2.13's own
  ``DTensor.redistribute`` with its merge pass ON and the same flattened meshes,
  or is correct where torch is wrong (the uneven all_gather);
* every rank's output equals the oracle (torch with
  ``disable_redistribute_transform_optimization()``): inputs are small integers
  in float64, so sums are exact and the comparison is ``torch.equal``;
* replicated outputs are bitwise equal across every replica group;
* the torch-2.13 model of ``support/torch_merge_model.py`` predicts torch's count.

``test_torch_merge_model_matches_torch`` validates that model on more cases.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.distributed as dist
from support.exact_runs import (
    assert_fewer,
    assert_replicas_equal,
    assert_same_locals,
    fresh_mesh,
    int_input,
    placements,
    run_oracle,
    run_ours,
    run_three,
    run_torch_merged,
)
from support.inputs import local_tensors
from support.paths import ROOT
from support.torch_merge_model import signature, torch_flattened_layouts, torch_model
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard
from torch.utils._python_dispatch import TorchDispatchMode

import redist_opt
import redist_opt.api.errors

# eager against torch's merge pass; .ci/run runs it on every torch of the range
pytestmark = pytest.mark.differential

F64 = torch.float64


# ----------------------------------------------------------------------------
# Item 1: torch merges only consecutive same-kind steps; we reorder
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(8, 4), (5, 3)], ids=["even", "uneven"])
def test_nonconsecutive_reductions_reorder_then_merge(shape):
    """P,P,P -> R,S(0),R on 2x2x2, a+c flattened: torch AR(a), RS(b), AR(c) = 3;
    we issue RS(b) + AR(a+c) = 2 (the all_reduce on the scattered tensor)."""
    o = run_three((2, 2, 2), "abc", [("a", "c")], "P,P,P", "R,S(0),R", shape)
    assert o.torch.total == 3
    assert o.ours.total == 2 and o.ours.kinds == {"reduce_scatter": 1, "all_reduce": 1}
    assert signature(o.plan) == ["reduce_scatter[sum](b)", "all_reduce[sum](a+c)"]
    assert_fewer(o)


# ----------------------------------------------------------------------------
# Item 2: torch's merge is all-or-nothing
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["sum", "max"])
def test_reductions_merge_where_only_some_groups_exist(op):
    """P,P,P -> R,R,R with only a+b flattened: torch 3, we AR(a+b) + AR(c) = 2."""
    p = "P" if op == "sum" else f"P({op})"
    o = run_three((2, 2, 2), "abc", [("a", "b")], f"{p},{p},{p}", "R,R,R", (6, 5))
    assert o.torch.total == 3
    assert o.ours.total == 2 and o.ours.kinds == {"all_reduce": 2}
    assert sorted(signature(o.plan)) == sorted([f"all_reduce[{op}](a+b)", f"all_reduce[{op}](c)"])
    assert_fewer(o)


# ----------------------------------------------------------------------------
# Item 3: torch's uneven all_gather merge returns padding in place of data
# ----------------------------------------------------------------------------


def test_uneven_all_gather_torch_wrong_ours_right():
    """(5,3) S(0),S(0) -> R,R on 2x2 with a+b flattened (pytorch PR 194457)."""
    truth = torch.arange(1, 16, dtype=F64).reshape(5, 3)  # no zeros: padding is visible
    o = run_three((2, 2), "ab", [("a", "b")], "S(0),S(0)", "R,R", (5, 3), data=truth)
    torch_locals = local_tensors(o.torch.out)
    wrong = [r for r, t in torch_locals.items() if not torch.equal(t, truth)]
    assert wrong == sorted(torch_locals), "torch 2.13's merged all_gather is expected to be wrong here"
    # ... with a padding row (zeros) where row 3 of the data belongs
    assert torch.equal(torch_locals[0][3], torch.zeros(3, dtype=F64))
    assert not any(torch.equal(torch_locals[0][i], truth[4]) for i in range(5))
    for r, t in local_tensors(o.ours.out).items():
        assert torch.equal(t, truth), f"rank {r}: redist_opt\n{t}\n!= the true tensor\n{truth}"
    for t in local_tensors(o.oracle.out).values():
        assert torch.equal(t, truth)
    # and we do it with one all_gather too (torch: 1, wrong; oracle: 2)
    assert o.ours.total == 1 == o.torch.total and o.ours.kinds == {"all_gather": 1}
    assert o.oracle.total == 2


# ----------------------------------------------------------------------------
# Item 4: uneven reduce_scatter merge refused, all_to_all never merged,
#         non-ascending shard orders refused
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sizes,names,shape",
    [((2, 2), "ab", (5, 3)), ((2, 2), "ab", (3, 4)), ((2, 3), "ab", (7, 2)), ((3, 2), "ab", (4, 1))],
    ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else v,
)
def test_uneven_reduce_scatter_merged(sizes, names, shape):
    """P,P -> S(0),S(0) with a+b flattened, dim 0 not divisible by the group:
    torch refuses the merge (2 reduce_scatters), we issue one."""
    o = run_three(sizes, names, [("a", "b")], "P,P", "S(0),S(0)", shape)
    assert o.torch.total == 2 and o.torch.kinds == {"reduce_scatter": 2}
    assert o.ours.total == 1 and o.ours.kinds == {"reduce_scatter": 1}
    assert_fewer(o)


@pytest.mark.parametrize("shape", [(8, 8), (5, 7), (4, 3)], ids=lambda s: "x".join(map(str, s)))
def test_all_to_all_merged(shape):
    """S(0),S(0) -> S(1),S(1) on 2x2 with a+b flattened: torch all_gather(b) +
    all_to_all(a) (+ a local chunk); we issue one all_to_all over a+b."""
    o = run_three((2, 2), "ab", [("a", "b")], "S(0),S(0)", "S(1),S(1)", shape)
    assert o.torch.total == 2 and o.torch.kinds == {"all_gather": 1, "all_to_all": 1}
    assert o.ours.total == 1 and o.ours.kinds == {"all_to_all": 1}
    assert signature(o.plan) == ["all_to_all(a+b)"]
    assert_fewer(o)


NON_ASCENDING = [
    # into a _StridedShard (tensor dim 0 sharded by mesh dim b first, then a)
    ([Partial(), Partial()], [_StridedShard(0, split_factor=2), Shard(0)], (8, 4)),
]


@pytest.mark.parametrize("shape", [(8, 4), (7, 3)], ids=["8x4", "7x3"])
def test_non_ascending_gather_is_one_all_gather_with_permuted_blocks(shape):
    """_S(0),S(0) -> R,R (FSDP2 + TP's checkpoint gather) on 2x2 with a+b flattened:
    torch 2 all_gathers (its merge pass refuses non-ascending order); we gather once
    over a+b and put the blocks back in shard order locally."""
    o = run_three(
        (2, 2),
        "ab",
        [("a", "b")],
        [_StridedShard(0, split_factor=2), Shard(0)],
        [Replicate(), Replicate()],
        shape,
    )
    assert o.torch.total == 2 and o.ours.total == 1 and o.ours.kinds == {"all_gather": 1}
    assert_fewer(o)


@pytest.mark.parametrize("src,dst,shape", NON_ASCENDING, ids=["PP_to_SS"])
def test_non_ascending_shard_order_falls_back(monkeypatch, src, dst, shape):
    """Non-default shard orders go through torch (merge disabled): same output
    as the oracle, torch's count, and a warning that says so."""
    monkeypatch.setattr(redist_opt.api.errors, "_warned", set())  # warned once per process
    with LocalTensorMode(4) as lm:
        mesh = fresh_mesh((2, 2), "ab", [("a", "b")])
        dt, coords = int_input(mesh, lm, src, shape, F64, seed=3)
        torch_run = run_torch_merged(dt, dst)
        with pytest.warns(UserWarning, match="using torch's redistribute"):
            ours = run_ours(dt, dst, groups="existing")
        oracle = run_oracle(dt, dst)
    for who, r in (("torch", torch_run), ("redist_opt", ours), ("oracle", oracle)):
        assert r.error is None, f"{who} raised {r.describe_error()}"
    assert_same_locals(ours.out, oracle.out, exact=True)
    assert_replicas_equal(ours.out, coords, (2, 2))
    # torch refuses to merge non-ascending orders too: nobody saves a collective here
    assert ours.total == oracle.total == torch_run.total == 2


# ----------------------------------------------------------------------------
# Item 5: torch never creates a flattened group, never uses the world group
# ----------------------------------------------------------------------------


def test_groups_create_creates_once_and_caches():
    """P,P,P -> R,R,R on 2x2x2 with nothing flattened: torch 3 all_reduces; with
    groups="create" we flatten a+b+c on first use (one all_reduce) and reuse it."""
    src, dst, shape = placements("P,P,P"), placements("R,R,R"), (6, 5)
    with LocalTensorMode(8) as lm:
        mesh = fresh_mesh((2, 2, 2), "abc")
        assert mesh._flatten_mapping == {}
        dt, coords = int_input(mesh, lm, src, shape, F64, seed=5)
        torch_run = run_torch_merged(dt, dst)
        oracle = run_oracle(dt, dst)
        existing = run_ours(dt, dst, groups="existing")
        assert mesh._flatten_mapping == {}, "groups='existing' must not create groups"
        first = run_ours(dt, dst, groups="create")
        created = dict(mesh._flatten_mapping)
        second = run_ours(dt, dst, groups="create")
        after = dict(mesh._flatten_mapping)
    for who, r in (
        ("torch", torch_run),
        ("existing", existing),
        ("first", first),
        ("second", second),
        ("oracle", oracle),
    ):
        assert r.error is None, f"{who} raised {r.describe_error()}"
    assert torch_run.total == 3 and existing.total == 3
    assert first.total == 1 and first.kinds == {"all_reduce": 1}
    assert second.total == 1
    assert len(created) == 1, f"expected one flattened group, got {list(created)}"
    (flat,) = created.values()
    assert tuple(flat.shape) == (8,)
    assert after.keys() == created.keys() and all(after[k] is created[k] for k in created), (
        "the second call created another group instead of reusing the first"
    )
    for r in (existing, first, second):
        assert_same_locals(r.out, oracle.out, exact=True)
        assert_replicas_equal(r.out, coords, (2, 2, 2))


_WORLD_SCRIPT = textwrap.dedent(
    """
    import json, math, sys
    import torch, torch.distributed as dist
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor._redistribute import disable_redistribute_transform_optimization
    import redist_opt

    sizes = tuple(json.loads(sys.argv[1]))
    n = math.prod(sizes)
    dist.init_process_group("fake", rank=0, world_size=n)
    names = tuple("abcdefgh"[: len(sizes)])
    with LocalTensorMode(n) as lm:
        mesh = init_device_mesh("cpu", sizes, mesh_dim_names=names)
        local = lm.rank_map(lambda r: torch.arange(12, dtype=torch.float64).reshape(4, 3) * (r + 1))
        dt = DTensor.from_local(local, mesh, [Partial()] * len(sizes), run_check=False)
        dst = [Replicate()] * len(sizes)
        out = {}
        with CommDebugMode() as c:
            torch_out = dt.redistribute(mesh, dst)
        out["torch"] = c.get_total_counts()
        with CommDebugMode() as c:
            ours = redist_opt.redistribute(dt, dst, groups="existing")
        out["ours"] = c.get_total_counts()
        out["ours_kinds"] = sorted(str(k) for k, v in c.get_comm_counts().items() if v)
        with disable_redistribute_transform_optimization():
            ref = dt.redistribute(mesh, dst)
        out["flattened"] = list(mesh._flatten_mapping)
        truth = torch.arange(12, dtype=torch.float64).reshape(4, 3) * (n * (n + 1) // 2)
        out["equal_oracle"] = all(
            torch.equal(ours._local_tensor._local_tensors[r], ref._local_tensor._local_tensors[r])
            for r in range(n))
        out["equal_truth"] = all(
            torch.equal(ours._local_tensor._local_tensors[r], truth) for r in range(n))
    print(json.dumps(out))
    """
)


def _world_case(sizes) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MASTER_", "RANK", "WORLD_SIZE", "LOCAL_RANK"))
    }
    proc = subprocess.run(
        [sys.executable, "-c", _WORLD_SCRIPT, json.dumps(list(sizes))],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, f"subprocess failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_world_group_used_when_dims_cover_the_world_2x2x2():
    """P,P,P -> R,R,R on a full-world 2x2x2 mesh (its own process: world size 8):
    one all_reduce over the default group, nothing flattened; torch issues 3."""
    out = _world_case((2, 2, 2))
    assert out["torch"] == 3
    assert out["ours"] == 1 and len(out["ours_kinds"]) == 1 and "all_reduce" in out["ours_kinds"][0]
    assert out["flattened"] == []
    assert out["equal_oracle"] and out["equal_truth"]


def _factor(n: int) -> tuple[int, ...]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return tuple(out)


def test_world_group_in_process():
    """The same in this pytest process, on a mesh covering its whole fake world."""
    world = dist.get_world_size()
    sizes = _factor(world)
    assert len(sizes) >= 2, f"world size {world} has no multi-dim full-world mesh"
    names = "abcdefgh"[: len(sizes)]
    src, dst = ",".join(["P"] * len(sizes)), ",".join(["R"] * len(sizes))
    o = run_three(sizes, names, [], src, dst, (4, 3))
    assert o.torch.total == len(sizes)
    assert o.ours.total == 1 and o.ours.kinds == {"all_reduce": 1}
    assert o.mesh._flatten_mapping == {}
    assert_fewer(o)


# ----------------------------------------------------------------------------
# HSDP gradients: reduce_scatter(dp_shard) first, then all_reduce(dp_replicate)
# on the scattered (smaller) tensor
# ----------------------------------------------------------------------------


class CollectiveLog(TorchDispatchMode):
    """Records (collective, input numel, group name) in issue order."""

    COLLECTIVES = ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "all_to_all_single")

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, int, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if name.startswith("_c10d_functional.") and name.split(".")[1] in self.COLLECTIVES:
            group = next((a for a in reversed(args) if isinstance(a, str)), "")
            self.calls.append((name.split(".")[1], args[0].numel(), group))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("shape", [(8, 6), (7, 3)], ids=["even", "uneven"])
def test_hsdp_reduce_scatter_before_all_reduce(shape):
    sizes, names = (2, 4), ("dp_replicate", "dp_shard")
    src, dst = placements("P,P"), placements("R,S(0)")
    with LocalTensorMode(8) as lm:
        mesh = fresh_mesh(sizes, names)
        dt, coords = int_input(mesh, lm, src, shape, F64, seed=11)
        g_rep = mesh.get_group("dp_replicate").group_name
        g_shard = mesh.get_group("dp_shard").group_name
        with CollectiveLog() as torch_log:
            torch_run = run_torch_merged(dt, dst)
        with CollectiveLog() as ours_log:
            ours = run_ours(dt, dst, groups="existing")
        oracle = run_oracle(dt, dst)
        spec = redist_opt.MeshSpec.from_device_mesh(mesh)
    assert ours.error is None and torch_run.error is None and oracle.error is None
    assert_same_locals(ours.out, oracle.out, exact=True)
    assert_replicas_equal(ours.out, coords, sizes)
    full = math.prod(shape)
    chunk = math.ceil(shape[0] / 4) * shape[1]
    # torch: all_reduce the full gradient over dp_replicate, then reduce_scatter over dp_shard
    assert [(c[0], c[2]) for c in torch_log.calls] == [
        ("all_reduce", g_rep),
        ("reduce_scatter_tensor", g_shard),
    ]
    assert torch_log.calls[0][1] == full
    # ours: reduce_scatter over dp_shard first, then all_reduce the 1/4-size shard
    assert [(c[0], c[2]) for c in ours_log.calls] == [
        ("reduce_scatter_tensor", g_shard),
        ("all_reduce", g_rep),
    ]
    assert ours_log.calls[1][1] <= chunk < full
    p = redist_opt.plan(spec, src, dst, shape=shape, dtype=F64)
    opt = redist_opt.optimize(p)
    model = torch_model(p, ()).plan
    assert signature(opt) == ["reduce_scatter[sum](dp_shard)", "all_reduce[sum](dp_replicate)"]
    assert signature(model) == ["all_reduce[sum](dp_replicate)", "reduce_scatter[sum](dp_shard)"]
    assert opt.bytes_per_rank < model.bytes_per_rank
    assert ours.total == torch_run.total == 2


# ----------------------------------------------------------------------------
# Found while testing: two equal meshes with different flattened groups
# ----------------------------------------------------------------------------


def test_equal_meshes_with_different_flattened_groups():
    """Two root meshes that compare equal as DeviceMesh (same shape, names and
    ranks) but have different flattened groups each get plans for their own
    groups: P,P,P -> R,R,R is AR(a+c) + AR(b) on the first and AR(a+b) + AR(c)
    on the second, 2 collectives each, without falling back."""
    src, dst = placements("P,P,P"), placements("R,R,R")
    with LocalTensorMode(8) as lm:
        m1 = fresh_mesh((2, 2, 2), "abc", [("a", "c")])
        m2 = fresh_mesh((2, 2, 2), "abc", [("a", "b")])
        assert m1 == m2 and m1 is not m2
        runs = []
        for mesh in (m1, m2):
            dt, _ = int_input(mesh, lm, src, (4, 3), F64, seed=7)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                ours = run_ours(dt, dst, groups="existing")
            runs.append((ours, run_oracle(dt, dst), [str(w.message) for w in caught]))
    for name, (ours, oracle, caught) in zip(("a+c flattened", "a+b flattened"), runs):
        assert ours.error is None and oracle.error is None
        assert_same_locals(ours.out, oracle.out, exact=True)
        assert ours.total == 2, f"{name}: {ours.total} collectives {ours.kinds}; warnings: {caught}"


# ----------------------------------------------------------------------------
# The torch-2.13 model (support.torch_merge_model.torch_model) against torch itself
# ----------------------------------------------------------------------------

MODEL_CASES = [
    # sizes, names, flattened, src, dst, shape
    ((2, 2, 2), "abc", [("a", "c")], "P,P,P", "R,S(0),R", (8, 4)),
    ((2, 2, 2), "abc", [("a", "b")], "P,P,P", "R,R,R", (8, 4)),
    ((2, 2, 2), "abc", [("a", "b", "c")], "P,P,P", "R,R,R", (8, 4)),
    ((2, 2, 2), "abc", [("b", "c")], "P(max),P(max),P(max)", "R,R,R", (3, 4)),
    ((2, 2, 2), "abc", [("a", "b", "c")], "S(0),S(0),S(0)", "R,R,R", (8, 4)),
    ((2, 2, 2), "abc", [("a", "b")], "S(0),S(0),S(0)", "R,R,R", (8, 4)),
    ((2, 2, 2), "abc", [("b", "c")], "S(0),S(0),S(0)", "R,R,R", (8, 4)),
    ((2, 2, 2), "abc", [("a", "c")], "S(0),S(1),S(0)", "R,S(1),R", (8, 4)),
    ((2, 2, 2), "abc", [("a", "b", "c")], "P,P,P", "S(0),S(0),S(0)", (8, 4)),
    ((2, 2, 2), "abc", [("a", "b", "c")], "P,P,P", "S(0),S(0),S(0)", (6, 4)),
    ((2, 2, 2), "abc", [("b", "c")], "P,P,P", "R,S(1),S(1)", (4, 4)),
    ((2, 1, 2), "abc", [("a", "c")], "P,P,P", "R,R,R", (4, 4)),
    ((2, 1, 2), "abc", [("a", "b", "c")], "S(0),S(0),S(0)", "R,R,R", (4, 4)),
    ((2, 2), "ab", [("a", "b")], "S(0),S(0)", "R,R", (5, 3)),
    ((2, 2), "ab", [("a", "b")], "P,P", "S(0),S(0)", (5, 3)),
    ((2, 2), "ab", [("a", "b")], "S(0),S(0)", "S(1),S(1)", (8, 8)),
    ((2, 2), "ab", [("a", "b")], "P(avg),P(avg)", "R,S(0)", (4, 4)),
    ((3, 2), "ab", [("a", "b")], "P(min),P(min)", "R,R", (5, 2)),
    ((2, 3), "ab", [("a", "b")], "S(1),S(1)", "R,R", (2, 7)),
    ((2, 2), "ab", [], "P,P", "R,R", (4, 4)),
    # cases the property tests found redist_opt worse on (test_properties.SHRUNK_PLAN)
    ((2, 2, 2), "abc", [("b", "c")], "R,S(1),S(1)", "S(0),R,S(0)", (8, 8)),
    ((2, 2, 2, 2), "abcd", [("b", "c")], "P,P,P,S(1)", "S(0),R,S(0),R", (8, 4)),
    ((2, 3), "ab", [("a", "b")], "P,P", "S(0),S(0)", (1, 2)),
    ((2, 2), "ab", [], "P,S(0)", "R,S(1)", (3, 8)),
]


@pytest.mark.parametrize(
    "sizes,names,flattened,src,dst,shape",
    MODEL_CASES,
    ids=[
        f"{'x'.join(map(str, c[0]))}-{'+'.join('_'.join(g) for g in c[2]) or 'none'}-{c[3]}_to_{c[4]}-"
        f"{'x'.join(map(str, c[5]))}"
        for c in MODEL_CASES
    ],
)
def test_torch_merge_model_matches_torch(sizes, names, flattened, src, dst, shape):
    n = math.prod(sizes)
    with LocalTensorMode(n) as lm:
        mesh = fresh_mesh(sizes, names, flattened)
        dt, _ = int_input(mesh, lm, placements(src), shape, F64, seed=1)
        torch_run = run_torch_merged(dt, placements(dst))
        layouts = torch_flattened_layouts(mesh)
    assert torch_run.error is None, torch_run.describe_error()
    # the model on a rank-free MeshSpec with the same flattened dim groups ...
    spec = redist_opt.MeshSpec(sizes, tuple(names), flattened=[tuple(g) for g in flattened])
    model = torch_model(redist_opt.plan(spec, src, dst, shape=shape))
    assert model.uniform
    assert model.plan.num_collectives == torch_run.total, (
        f"model {signature(model.plan)} ({model.why}) vs torch {torch_run.total} {torch_run.kinds}"
    )
    # ... and on the live mesh's layouts agree
    live = torch_model(
        redist_opt.plan(redist_opt.MeshSpec.from_device_mesh(mesh), src, dst, shape=shape), layouts
    )
    assert live.plan.num_collectives == torch_run.total
