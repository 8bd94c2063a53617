"""Per-rank body of test_gloo.py: real processes, gloo over loopback.

Each rank builds the same inputs (same seeds), runs torch's
DTensor.redistribute (merge pass disabled) and redist_opt.redistribute on them,
and raises AssertionError naming the case on any difference. Kept free of
pytest imports so that spawned children import it cheaply (they find this folder
on the parent's ``sys.path``, which spawn hands down).
"""

from __future__ import annotations

import datetime
import os
import traceback
import zlib

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor
from torch.distributed.tensor._redistribute import disable_redistribute_transform_optimization
from torch.distributed.tensor.debug import CommDebugMode

import redist_opt
from support.inputs import parse_placement, pstr
from support.runs import collective_kind

WORLD = 4
COLLECTIVE_TIMEOUT_S = 60

# (mesh, src, dst, shape, dtype name)   mesh: "2x2" or "b" (the 1-D submesh)
CASES = [
    ("2x2", ["S(0)", "R"], ["S(1)", "R"], (4, 6), "f32"),  # all_to_all
    ("2x2", ["S(0)", "R"], ["S(1)", "R"], (5, 3), "f32"),  # all_to_all, uneven
    ("2x2", ["R", "S(1)"], ["R", "S(0)"], (3, 7), "f32"),  # all_to_all, uneven
    ("2x2", ["P", "R"], ["R", "R"], (4, 4), "f32"),  # all_reduce sum
    ("2x2", ["P", "P"], ["S(0)", "S(1)"], (5, 3), "f32"),  # reduce_scatter, uneven
    ("2x2", ["P(avg)", "P(avg)"], ["R", "S(0)"], (5, 3), "f32"),  # avg
    ("2x2", ["P(avg)", "R"], ["S(1)", "R"], (4, 6), "f64"),  # avg reduce_scatter
    ("2x2", ["P(max)", "R"], ["S(1)", "R"], (3, 5), "f32"),
    ("2x2", ["S(0)", "S(1)"], ["R", "R"], (7, 5), "f32"),  # all_gather, uneven
    ("2x2", ["S(0)", "S(0)"], ["R", "S(0)"], (7, 5), "f32"),  # nested shard
    ("2x2", ["R", "S(0)"], ["S(0)", "S(0)"], (3, 7), "bf16"),
    ("2x2", ["S(1)", "P"], ["S(0)", "R"], (5, 3), "f32"),
    ("2x2", ["P", "S(0)"], ["S(1)", "S(1)"], (6, 4), "c64"),
    ("2x2", ["S(0)", "R"], ["R", "R"], (0, 4), "f32"),  # zero-size
    ("2x2", ["P(avg)", "P"], ["R", "R"], (5, 3), "f32"),  # mixed sum/avg: one sum + scale
    ("2x2", ["S(0)", "S(0)"], ["S(1)", "S(2)"], (5, 3, 7), "f32"),  # two all_to_alls -> one, 2-dim split
    ("b", ["S(0)"], ["S(1)"], (5, 3), "f32"),  # 1-D submesh
    ("b", ["P"], ["S(0)"], (3, 2), "f32"),
    # torch 2.13 refuses it (so must redist_opt); torch 2.15 zero-fills it: handed back to torch
    ("2x2", ["S(0)", "R"], ["P", "R"], (4, 4), "f32"),
    # dtypes beyond float: gloo's all_to_all refuses complex (it moves as real pairs)
    ("2x2", ["S(0)", "R"], ["S(1)", "R"], (5, 3), "c64"),
    ("2x2", ["S(0)", "S(0)"], ["S(1)", "S(2)"], (4, 3, 5), "c64"),
    ("2x2", ["S(0)", "S(1)"], ["R", "R"], (7, 5), "c64"),
    ("2x2", ["P", "P"], ["S(0)", "S(1)"], (5, 3), "f16"),
    ("2x2", ["R", "S(1)"], ["R", "S(0)"], (3, 7), "i64"),
    ("2x2", ["P(max)", "R"], ["S(1)", "R"], (4, 6), "i64"),
    ("2x2", ["P", "R"], ["S(1)", "R"], (4, 6), "bool"),
]
# Through enabled() (DTensor.redistribute routed), compared with torch's own call as above.
ROUTED_CASES = [
    ("2x2", ["P", "S(1)"], ["S(0)", "R"], (5, 3), "f32"),
    ("2x2", ["S(0)", "R"], ["P", "R"], (5, 3), "f32"),  # torch 2.15's zero-fill, handed back
]


DTYPES = {
    "f32": torch.float32,
    "f64": torch.float64,
    "bf16": torch.bfloat16,
    "f16": torch.float16,
    "c64": torch.complex64,
    "i64": torch.int64,
    "bool": torch.bool,
}


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


def _rand(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_complex:
        return torch.randn(*shape, generator=g, dtype=dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if not dtype.is_floating_point:  # integers: a range where avg must truncate and sums stay exact
        return torch.randint(-50, 51, shape, generator=g, dtype=dtype)
    return torch.randn(*shape, generator=g).to(dtype)


def _make_input(mesh, src, shape, dtype, seed):
    src_p = [parse_placement(p) for p in src]
    g = _rand(shape, dtype, seed)
    base = [Replicate() if p.is_partial() else p for p in src_p]
    local = distribute_tensor(g, mesh, base, src_data_rank=None).to_local()
    if any(p.is_partial() for p in src_p):
        coord = mesh.get_coordinate()
        key = tuple(c if not isinstance(p, Replicate) else 0 for c, p in zip(coord, src_p))
        local = (local + _rand(tuple(local.shape), dtype, _seed(seed, key))).to(dtype)
    return DTensor.from_local(
        local.contiguous(),
        mesh,
        src_p,
        run_check=False,
        shape=torch.Size(shape),
        stride=g.stride(),
    )


def _counts(cdm):
    out = {}
    for k, v in cdm.get_comm_counts().items():
        if v:
            out[collective_kind(k)] = out.get(collective_kind(k), 0) + v
    return out


def _redistribute_both(dt, mesh, dst_p, routed):
    """(torch's result or error, its comm counts, ours (passes=()) or error, its comm counts)."""
    ref_err = cand_err = None
    ref = cand = None
    with CommDebugMode() as c1, disable_redistribute_transform_optimization():
        try:
            ref = dt.redistribute(mesh, dst_p)
        except Exception as e:  # noqa: BLE001
            ref_err = e
    with CommDebugMode() as c2:
        try:
            # passes=(): DTensor's own plan through redist_opt's runtime,
            # which must match torch bit for bit, collective for collective.
            if routed:
                with redist_opt.enabled(groups="existing", passes=()):
                    cand = dt.redistribute(mesh, dst_p)
            else:
                cand = redist_opt.redistribute(dt, dst_p, groups="existing", passes=())
        except Exception as e:  # noqa: BLE001
            cand_err = e
    return (ref, ref_err, c1), (cand, cand_err, c2)


def _check_same_as_torch(name, ref, cand, c1, c2):
    """Our unoptimized plan: same placements, shape, values and collectives as torch."""
    assert tuple(cand.placements) == tuple(ref.placements), (
        f"{name}: placements {tuple(map(pstr, cand.placements))} != {tuple(map(pstr, ref.placements))}"
    )
    assert cand.shape == ref.shape, f"{name}: shape {cand.shape} != {ref.shape}"
    a, b = ref.to_local(), cand.to_local()
    assert b.shape == a.shape and b.dtype == a.dtype, (
        f"{name}: local {tuple(b.shape)} {b.dtype} != {tuple(a.shape)} {a.dtype}"
    )
    if not torch.equal(a, b):
        hi = torch.complex128 if a.is_complex() else torch.float64
        d = (a.to(hi) - b.to(hi)).abs()
        raise AssertionError(
            f"{name}: local values differ (max abs diff {d.max().item():.3g}, "
            f"{int((d != 0).sum())}/{d.numel()} elements)"
        )
    k1, k2 = _counts(c1), _counts(c2)
    assert c2.get_total_counts() == c1.get_total_counts(), (
        f"{name}: collective count {c2.get_total_counts()} {k2} != torch (merge "
        f"disabled) {c1.get_total_counts()} {k1}"
    )
    # On CPU outside LocalTensorMode torch runs S(i)->S(j) as all_gather +
    # chunk ("CPU process group does not support alltoall yet"); an
    # all_to_all in its place is the same collective count. Any other
    # difference in kinds is a failure.
    swapped = k2.get("all_to_all", 0) - k1.get("all_to_all", 0)
    if swapped > 0:
        k1 = dict(k1)
        k1["all_gather"] = k1.get("all_gather", 0) - swapped
        k1["all_to_all"] = k1.get("all_to_all", 0) + swapped
        k1 = {k: v for k, v in k1.items() if v}
    assert k2 == k1, f"{name}: collectives {k2} != torch (merge disabled) {_counts(c1)}"


def _check_optimized(name, dt, mesh, dst_p, a, c1):
    """The optimized plan: never more collectives; equal values (within rounding
    where sum/avg reductions were regrouped)."""
    with CommDebugMode() as c3:
        opt = redist_opt.redistribute(dt, dst_p, groups="existing")
    assert c3.get_total_counts() <= c1.get_total_counts(), (
        f"{name}: optimized plan issues {c3.get_total_counts()} collectives > torch {c1.get_total_counts()}"
    )
    o = opt.to_local()
    assert o.shape == a.shape and o.dtype == a.dtype, f"{name}: optimized local {tuple(o.shape)}"
    if not torch.equal(o, a):
        linear = any(p.is_partial() and p.reduce_op in ("sum", "avg") for p in dt.placements)
        assert linear, f"{name}: optimized plan's values differ (no reduction to reorder)"
        tol = {torch.bfloat16: 5e-2, torch.float16: 1e-2}.get(a.dtype, 1e-5)
        torch.testing.assert_close(o, a, rtol=tol, atol=tol, msg=f"{name}: optimized values")


def run_case(rank, meshes, case, routed=False) -> str | None:
    """One case on this rank; raises AssertionError naming it on any difference. Returns what
    torch raised where it raised (and redist_opt did too), else None."""
    mname, src, dst, shape, dtn = case
    name = f"rank {rank}: {mname} {src}->{dst} {shape} {dtn}" + (" via enabled()" if routed else "")
    mesh = meshes[mname]
    dt = _make_input(mesh, src, shape, DTYPES[dtn], _seed(case))
    dst_p = [parse_placement(p) for p in dst]
    before = dt.to_local().clone()
    (ref, ref_err, c1), (cand, cand_err, c2) = _redistribute_both(dt, mesh, dst_p, routed)
    assert torch.equal(dt.to_local(), before), f"{name}: input modified"
    if ref_err is not None:
        assert cand_err is not None, (
            f"{name}: torch raises {type(ref_err).__name__}: {ref_err} but redist_opt returned a DTensor"
        )
        assert isinstance(cand_err, (redist_opt.RedistributeError, RuntimeError)), (
            f"{name}: redist_opt raised {type(cand_err).__name__}: {cand_err}"
        )
        return f"{type(ref_err).__name__}: {str(ref_err).splitlines()[0] if str(ref_err) else ''}"
    if cand_err is not None:
        raise AssertionError(
            f"{name}: torch succeeds but redist_opt raised {type(cand_err).__name__}: {cand_err}"
        ) from cand_err
    _check_same_as_torch(name, ref, cand, c1, c2)
    _check_optimized(name, dt, mesh, dst_p, ref.to_local(), c1)
    return None


def worker(rank: int, port: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group(
        "gloo",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
    )
    try:
        mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "b"))
        meshes = {"2x2": mesh2, "b": mesh2["b"]}
        # Run every case (each one's collectives complete on all ranks before
        # its checks), then fail with all the differences at once.
        failures = []
        for case, routed in [(c, False) for c in CASES] + [(c, True) for c in ROUTED_CASES]:
            try:
                run_case(rank, meshes, case, routed=routed)
            except AssertionError as e:
                failures.append(str(e))
            except Exception:  # noqa: BLE001 - a harness-side error: keep its traceback
                failures.append(f"rank {rank}: {case}: {traceback.format_exc()}")
        dist.barrier()
        if failures:
            raise AssertionError(
                f"{len(failures)} of {len(CASES) + len(ROUTED_CASES)} gloo case(s) failed:\n"
                + "\n".join(failures)
            )
    finally:
        dist.destroy_process_group()
