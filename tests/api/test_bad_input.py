"""Bad input: every malformed request raises redist_opt.RedistributeError (a
ValueError subclass) whose message names the offending item, before any
collective is issued.

Messages are checked for content (the offending placement / dim / mesh shape
appears in one of its usual spellings), not for exact wording.
"""

from __future__ import annotations

import contextlib
import re

import pytest
import torch
from support.inputs import build_input, parse_placement
from support.meshes import MESHES, get_mesh
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor.debug import CommDebugMode

import redist_opt

RE = redist_opt.RedistributeError


def test_redistribute_error_is_value_error():
    assert issubclass(RE, ValueError)


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def mesh_spellings(sizes, names=None):
    """The usual ways a message can name a mesh's shape."""
    sizes = tuple(sizes)
    out = {
        "x".join(map(str, sizes)),
        " x ".join(map(str, sizes)),
        str(sizes),
        str(list(sizes)),
        f"torch.Size({list(sizes)})",
    }
    if names:
        for sep in (",", ", "):
            out.add(sep.join(f"{n}={s}" for n, s in zip(names, sizes)))
            out.add(sep.join(f"{n}: {s}" for n, s in zip(names, sizes)))
            out.add(sep.join(f"'{n}': {s}" for n, s in zip(names, sizes)))
    return out


def assert_mentions_mesh(msg, sizes, names=None):
    sp = mesh_spellings(sizes, names)
    assert any(s in msg for s in sp), f"message does not name the mesh shape {sizes}: {msg!r}"


def assert_mentions_any(msg, *needles):
    assert any(n in msg for n in needles), f"message names none of {needles}: {msg!r}"


@contextlib.contextmanager
def dtensor_on(mesh_name, src, shape=(4, 6), dtype=torch.float32):
    """A valid DTensor on a named harness mesh, inside its LocalTensorMode."""
    f = MESHES[mesh_name]
    with LocalTensorMode(f.nranks) as lm:
        mesh = get_mesh(f, lm)
        inp = build_input(mesh, lm, [parse_placement(p) for p in src], shape, dtype, 1234)
        yield inp.dt, mesh, lm


@contextlib.contextmanager
def raises_re_without_comms():
    """RedistributeError is raised, and no collective ran before it."""
    with CommDebugMode() as cdm, pytest.raises(RE) as ei:
        yield ei
    assert cdm.get_total_counts() == 0, (
        f"{cdm.get_total_counts()} collective(s) issued before the error {ei.value}"
    )


def msg(ei) -> str:
    return str(ei.value)


# ---------------------------------------------------------------------------
# wrong number of placements
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dst",
    [["S(0)"], ["S(0)", "R", "R"], [Shard(0), Replicate(), Replicate()]],
    ids=["too_few", "too_many", "too_many_objects"],
)
def test_wrong_number_of_target_placements(dst):
    with dtensor_on("2x2", ["S(0)", "R"]) as (dt, mesh, lm):
        with raises_re_without_comms() as ei:
            redist_opt.redistribute(dt, dst, groups="existing")
    m = msg(ei)
    assert_mentions_mesh(m, (2, 2), ("a", "b"))
    assert_mentions_any(m, str(len(dst)))


def test_wrong_number_of_placements_through_enabled():
    with dtensor_on("2x2", ["S(0)", "R"]) as (dt, mesh, lm):
        with raises_re_without_comms() as ei, redist_opt.enabled(groups="existing"):
            dt.redistribute(mesh, [Replicate()])
    assert_mentions_mesh(msg(ei), (2, 2), ("a", "b"))


def test_wrong_number_of_placements_1d_mesh_torch_accepts():
    # torch's DTensor.redistribute silently accepts [R, R] on a 1-D mesh; redist_opt must not.
    with dtensor_on("1d4", ["S(0)"]) as (dt, mesh, lm):
        with raises_re_without_comms() as ei:
            redist_opt.redistribute(dt, ["R", "R"], groups="existing")
    assert_mentions_mesh(msg(ei), (4,))


@pytest.mark.parametrize("which", ["src", "dst"])
def test_plan_wrong_number_of_placements(which):
    spec = redist_opt.MeshSpec(sizes=(2, 4), names=("dp", "tp"))
    src, dst = ["S(0)", "R"], ["R", "R"]
    if which == "src":
        src = ["S(0)", "R", "P"]
    else:
        dst = ["R"]
    with pytest.raises(RE) as ei:
        redist_opt.plan(spec, src, dst, shape=(8, 8))
    assert_mentions_mesh(msg(ei), (2, 4), ("dp", "tp"))


# ---------------------------------------------------------------------------
# shard dim out of range
# ---------------------------------------------------------------------------

SHARD_SPELLINGS = {
    2: ("S(2)", "Shard(2)", "Shard(dim=2)", "dim 2"),
    -3: ("S(-3)", "Shard(-3)", "Shard(dim=-3)", "dim -3"),
    3: ("S(3)", "Shard(3)", "Shard(dim=3)", "dim 3"),
}


@pytest.mark.parametrize("bad", [2, -3, 3])
@pytest.mark.parametrize("as_string", [True, False], ids=["str", "obj"])
def test_shard_dim_out_of_range_target(bad, as_string):
    p = f"S({bad})" if as_string else Shard(bad)
    with dtensor_on("2x2", ["S(0)", "R"]) as (dt, mesh, lm):
        with raises_re_without_comms() as ei:
            redist_opt.redistribute(dt, ["R", p], groups="existing")
    m = msg(ei)
    assert_mentions_any(m, *SHARD_SPELLINGS[bad])


@pytest.mark.parametrize("bad", [2, -3])
@pytest.mark.parametrize("which", ["src", "dst"])
def test_plan_shard_dim_out_of_range(bad, which):
    spec = redist_opt.MeshSpec(sizes=(2, 2), names=("a", "b"))
    src, dst = ["S(0)", "R"], ["R", "S(1)"]
    if which == "src":
        src = [f"S({bad})", "R"]
    else:
        dst = ["R", f"S({bad})"]
    with pytest.raises(RE) as ei:
        redist_opt.plan(spec, src, dst, shape=(4, 6))
    assert_mentions_any(msg(ei), *SHARD_SPELLINGS[bad])


def test_shard_dim_out_of_range_1d_tensor():
    with dtensor_on("1d2", ["S(0)"], shape=(7,)) as (dt, mesh, lm):
        with raises_re_without_comms() as ei:
            redist_opt.redistribute(dt, ["S(1)"], groups="existing")
    assert_mentions_any(msg(ei), "S(1)", "Shard(1)", "Shard(dim=1)", "dim 1")


# ---------------------------------------------------------------------------
# mixed partial reduce ops
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "src,dst",
    [
        (["P", "P(max)"], ["R", "R"]),
        (["P(avg)", "P(min)"], ["R", "S(0)"]),
        (["R", "R"], ["P", "P(max)"]),
        ([Partial("sum"), Partial("max")], [Replicate(), Replicate()]),
    ],
    ids=["src_sum_max", "src_avg_min", "dst_sum_max", "src_objects"],
)
def test_plan_mixed_partial_ops(src, dst):
    spec = redist_opt.MeshSpec(sizes=(2, 2), names=("a", "b"))
    with pytest.raises(RE) as ei:
        redist_opt.plan(spec, src, dst, shape=(4, 4))
    ops = {p.reduce_op for p in map(parse_placement, [*src, *dst]) if isinstance(p, Partial)}
    m = msg(ei)
    for op in ops:
        assert op in m, f"message does not name reduce op {op!r}: {m!r}"


def test_redistribute_mixed_partial_target():
    with dtensor_on("2x2", ["P", "P"]) as (dt, mesh, lm):
        with raises_re_without_comms() as ei:
            redist_opt.redistribute(dt, ["P", "P(max)"], groups="existing")
    assert_mentions_any(msg(ei), "max")


def test_redistribute_mixed_partial_source_dtensor():
    # torch's from_local refuses mixed partials, so build the DTensor from a spec
    f = MESHES["2x2"]
    with LocalTensorMode(f.nranks) as lm:
        mesh = get_mesh(f, lm)
        lt = lm.rank_map(lambda r: torch.full((2, 3), float(r)))
        spec = DTensorSpec(
            mesh,
            (Partial("sum"), Partial("max")),
            tensor_meta=TensorMeta(torch.Size((2, 3)), (3, 1), torch.float32),
        )
        dt = DTensor(lt, spec, requires_grad=False)
        with raises_re_without_comms() as ei:
            redist_opt.redistribute(dt, ["R", "R"], groups="existing")
    m = msg(ei)
    assert "max" in m and "sum" in m, m


# ---------------------------------------------------------------------------
# unparseable placement strings
# ---------------------------------------------------------------------------

BAD_STRINGS = ["X", "S(a)", "S()", "P(prod)", "S(0", "Shard"]


@pytest.mark.parametrize("bad", BAD_STRINGS)
def test_unparseable_placement_string_redistribute(bad):
    with dtensor_on("2x2", ["S(0)", "R"]) as (dt, mesh, lm):
        with raises_re_without_comms() as ei:
            redist_opt.redistribute(dt, [bad, "R"], groups="existing")
    assert bad in msg(ei), f"message does not quote {bad!r}: {msg(ei)!r}"


@pytest.mark.parametrize("bad", BAD_STRINGS)
@pytest.mark.parametrize("which", ["src", "dst"])
def test_unparseable_placement_string_plan(bad, which):
    spec = redist_opt.MeshSpec(sizes=(2, 2))
    src, dst = ["S(0)", "R"], ["R", "R"]
    if which == "src":
        src = ["R", bad]
    else:
        dst = [bad, "R"]
    with pytest.raises(RE) as ei:
        redist_opt.plan(spec, src, dst, shape=(4, 4))
    assert bad in msg(ei), f"message does not quote {bad!r}: {msg(ei)!r}"


def test_parse_placement_rejects_with_text():
    with pytest.raises(RE) as ei:
        redist_opt.parse_placement("S(a)")
    assert "S(a)" in msg(ei)


def test_non_placement_object():
    with dtensor_on("2x2", ["S(0)", "R"]) as (dt, mesh, lm):
        with raises_re_without_comms() as ei:
            redist_opt.redistribute(dt, [3.5, "R"], groups="existing")
    assert "3.5" in msg(ei) or "float" in msg(ei), msg(ei)


# ---------------------------------------------------------------------------
# MeshSpec problems
# ---------------------------------------------------------------------------


def test_meshspec_without_names_flattened_by_name():
    with pytest.raises(RE) as ei:
        redist_opt.MeshSpec(sizes=(2, 2), flattened=[("a", "b")])
    m = msg(ei)
    assert_mentions_any(m, "'a'", '"a"', "a+b", "('a', 'b')")
    assert_mentions_mesh(m, (2, 2))


def test_meshspec_without_names_optimize_groups_by_name():
    spec = redist_opt.MeshSpec(sizes=(2, 2))
    p = redist_opt.plan(spec, ["P", "P"], ["R", "R"], shape=(4, 4))
    with pytest.raises(RE) as ei:
        redist_opt.optimize(p, groups=[("a", "b")])
    m = msg(ei)
    assert_mentions_any(m, "'a'", '"a"', "a+b", "('a', 'b')")
    assert_mentions_mesh(m, (2, 2))


def test_meshspec_unknown_dim_name():
    with pytest.raises(RE) as ei:
        redist_opt.MeshSpec(sizes=(2, 2), names=("dp", "tp"), flattened=[("dp", "cp")])
    assert "cp" in msg(ei)
    assert_mentions_mesh(msg(ei), (2, 2), ("dp", "tp"))


def test_meshspec_names_length_mismatch():
    with pytest.raises(RE) as ei:
        redist_opt.MeshSpec(sizes=(2, 2, 2), names=("a", "b"))
    assert_mentions_mesh(msg(ei), (2, 2, 2))


@pytest.mark.parametrize("sizes", [(2, 0), (-1, 4), ()])
def test_meshspec_bad_sizes(sizes):
    with pytest.raises(RE) as ei:
        redist_opt.MeshSpec(sizes=sizes)
    assert str(tuple(sizes)) in msg(ei) or "x".join(map(str, sizes)) in msg(ei), msg(ei)


def test_bad_groups_policy():
    with dtensor_on("2x2", ["P", "R"]) as (dt, mesh, lm):
        with raises_re_without_comms() as ei:
            redist_opt.redistribute(dt, ["R", "R"], groups="bogus")
    assert "bogus" in msg(ei)


# ---------------------------------------------------------------------------
# DTensors whose spec does not match
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "placements,global_shape,local_shape,needles",
    [
        # one placement for a 2-D mesh
        ((Shard(0),), (4, 3), (2, 3), ("S(0)",)),
        # three placements for a 2-D mesh
        ((Shard(0), Replicate(), Replicate()), (4, 3), (2, 3), ("S(0)",)),
        # shard dim beyond the tensor's rank
        ((Shard(2), Replicate()), (4, 3), (2, 3), ("S(2)", "Shard(2)", "Shard(dim=2)", "dim 2")),
        # local shards that are not the shards of the global shape
        ((Replicate(), Replicate()), (5, 3), (2, 3), ("(5, 3)", "5x3", "[5, 3]", "(2, 3)", "[2, 3]")),
        ((Shard(0), Replicate()), (4, 3), (3, 3), ("(2, 3)", "[2, 3]", "(3, 3)", "[3, 3]")),
    ],
    ids=[
        "too_few_placements",
        "too_many_placements",
        "shard_dim_2",
        "local_shape_vs_replicate",
        "local_shape_vs_shard",
    ],
)
def test_dtensor_spec_mismatch(placements, global_shape, local_shape, needles):
    f = MESHES["2x2"]
    with LocalTensorMode(f.nranks) as lm:
        mesh = get_mesh(f, lm)
        lt = lm.rank_map(lambda r: torch.full(local_shape, float(r)))
        stride = tuple(torch.empty(global_shape).stride())
        spec = DTensorSpec(
            mesh,
            placements,
            tensor_meta=TensorMeta(torch.Size(global_shape), stride, torch.float32),
        )
        dt = DTensor(lt, spec, requires_grad=False)
        with raises_re_without_comms() as ei:
            redist_opt.redistribute(dt, ["R", "R"], groups="existing")
    assert_mentions_any(msg(ei), *needles)
    if len(placements) != 2:
        assert_mentions_mesh(msg(ei), (2, 2), ("a", "b"))


def test_other_mesh_rejected():
    f, g = MESHES["2x2"], MESHES["explicit2x2"]
    with LocalTensorMode(4) as lm:
        mesh = get_mesh(f, lm)
        other = get_mesh(g, lm)
        inp = build_input(mesh, lm, [Shard(0), Replicate()], (4, 4), torch.float32, 7)
        # explicit2x2 has the same shape but other process groups / no names
        if other == mesh:
            pytest.skip("the two meshes compare equal")
        with raises_re_without_comms() as ei:
            redist_opt.redistribute(inp.dt, ["R", "R"], device_mesh=other, groups="existing")
    assert re.search(r"mesh", msg(ei), re.IGNORECASE), msg(ei)


def test_not_a_dtensor():
    with pytest.raises(RE) as ei:
        redist_opt.redistribute(torch.ones(2, 2), ["R"])
    assert "Tensor" in msg(ei)


def test_plan_bad_mesh_argument():
    with pytest.raises(RE) as ei:
        redist_opt.plan((2, 2), ["R", "R"], ["R", "R"], shape=(4, 4))
    assert "tuple" in msg(ei) or "(2, 2)" in msg(ei), msg(ei)


@pytest.mark.parametrize("shape", [(-1, 4), (2.5, 4)], ids=["negative", "float"])
def test_plan_bad_shape(shape):
    with pytest.raises(RE) as ei:
        redist_opt.plan(redist_opt.MeshSpec(sizes=(2,)), ["S(0)"], ["R"], shape=shape)
    assert str(shape[0]) in msg(ei), msg(ei)
