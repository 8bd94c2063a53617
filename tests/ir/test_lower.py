"""Our replay of DTensor's greedy planner against torch's own, step by step.

``redist_opt.ir.lower.greedy_steps`` replays ``generate_greedy_transform_infos``
(torch/distributed/tensor/_redistribute.py) on a rank-free ``MeshSpec``, with
sizes as expressions in the mesh coordinates. Torch's planner is reached through
``redist_opt.torch_api.dtensor.torch_plan_steps`` (``_gen_transform_infos``
without its cache), run under ``LocalTensorMode`` so that its logical shapes
hold every simulated rank's value.

For every differential case (``support.cases.all_cases``, the case list of
test_differential.py; dtype and API route do not reach the planner, and both
planners are given normalized placements, so each (mesh, src, dst, shape) is
planned once, S(-1) and the dim it names being one request), both planners must

* emit the same steps in the same order: mesh dim, source and destination
  placement of each;
* agree on each step's logical shape on every rank: our expression evaluated
  at the rank's mesh coordinate equals torch's number for that rank;
* or both refuse the request.

One test per case group and mesh; a failure lists every case that differs.
"""

from __future__ import annotations

import pytest
import torch
from support.cases import all_cases
from support.inputs import normalize, parse_placement, pstr
from support.meshes import MESHES, get_mesh, mesh_coordinates
from torch.distributed._local_tensor import LocalTensorMode, _int_on_rank

from redist_opt.ir import symbolic as sym
from redist_opt.ir.lower import greedy_steps
from redist_opt.ir.mesh import MeshSpec
from redist_opt.torch_api.dtensor import torch_plan_steps


def _planner_cases() -> dict[tuple[str, str], list[tuple]]:
    """(group, mesh) -> the distinct normalized (src, dst, shape) of its differential
    cases: both planners are given normalized placements, so S(-1) and the dim it
    names are one request."""
    out: dict[tuple[str, str], list[tuple]] = {}
    for group, cases in all_cases().items():
        for c in cases:
            key = (_normalized(c.src, c.shape), _normalized(c.dst, c.shape), c.shape)
            bucket = out.setdefault((group, c.mesh), {})
            bucket.setdefault(key)
    return {k: list(v) for k, v in out.items()}


def _normalized(placements, shape) -> tuple[str, ...]:
    return tuple(pstr(normalize(parse_placement(p), len(shape))) for p in placements)


CASES = _planner_cases()


def _on_rank(x, rank: int) -> int:
    return _int_on_rank(x.node, rank) if isinstance(x, torch.SymInt) else int(x)


def _ours(spec: MeshSpec, src, dst, shape, coords: dict) -> list | str:
    try:
        steps = greedy_steps(spec, src, dst, shape)
    except Exception as e:  # noqa: BLE001 - compared with torch's refusal
        return f"refused ({type(e).__name__})"
    return [
        (
            s.mesh_dims,
            pstr(s.src),
            pstr(s.dst),
            {r: tuple(sym.evaluate(x, c) for x in s.logical_shape) for r, c in coords.items()},
        )
        for s in steps
    ]


def _torch(mesh, src, dst, shape, coords: dict) -> list | str:
    try:
        steps = torch_plan_steps(mesh, src, dst, shape)
    except Exception as e:  # noqa: BLE001
        return f"refused ({type(e).__name__})"
    return [
        ((d,), pstr(a), pstr(b), {r: tuple(_on_rank(x, r) for x in logical) for r in coords})
        for d, a, b, logical in steps
    ]


def _describe(steps) -> str:
    if isinstance(steps, str):
        return steps
    return "; ".join(
        f"{dims}: {a} -> {b} logical {sorted(set(per_rank.values()))}" for dims, a, b, per_rank in steps
    )


@pytest.mark.parametrize(
    "group,mesh_name",
    [pytest.param(g, m, id=f"{g}-{m}", marks=() if g == "chains" else pytest.mark.slow) for g, m in CASES],
)
def test_greedy_steps_match_torchs_planner(group, mesh_name):
    factory = MESHES[mesh_name]
    differ = []
    with LocalTensorMode(factory.nranks) as lm:
        mesh = get_mesh(factory, lm)
        coords = mesh_coordinates(factory, lm)
        spec = MeshSpec.from_device_mesh(mesh)
        for src, dst, shape in CASES[group, mesh_name]:
            src_p = [parse_placement(p) for p in src]
            dst_p = [parse_placement(p) for p in dst]
            ours = _ours(spec, src_p, dst_p, shape, coords)
            theirs = _torch(mesh, src_p, dst_p, shape, coords)
            if ours != theirs and not (isinstance(ours, str) and isinstance(theirs, str)):
                differ.append(
                    f"{','.join(src)} -> {','.join(dst)} shape {shape}:\n"
                    f"    ours  {_describe(ours)}\n    torch {_describe(theirs)}"
                )
    assert not differ, f"{len(differ)} of {len(CASES[group, mesh_name])} cases differ:\n" + "\n".join(differ)


# -- _StridedShard: our steps (redist_opt.ir.strided) against torch's graph-based planner --

_STRIDED_PLANS = [
    ((2, 2), "_S(0, 2),S(0)", "R,R"),
    ((2, 2), "_S(1, 2),S(1)", "R,R"),
    ((2, 2), "_S(0, 2),S(0)", "R,S(0)"),
    ((2, 4), "_S(0, 4),S(0)", "R,R"),
    ((4, 2), "_S(0, 2),S(0)", "R,R"),
    ((2, 2, 2), "R,_S(0, 2),S(0)", "R,R,R"),
    ((2, 2, 2), "R,_S(1, 2),S(1)", "R,R,R"),
    ((2, 2, 2), "P,_S(0, 2),S(0)", "P,R,R"),
    ((2, 2, 2), "_S(0, 4),_S(0, 2),S(0)", "R,R,R"),
]


@pytest.mark.parametrize("sizes,src,dst", _STRIDED_PLANS, ids=lambda v: str(v))
@pytest.mark.parametrize("length", [8, 16, 7, 13])
def test_strided_steps_match_torchs_graph_based_planner(sizes, src, dst, length):
    import itertools
    import math

    from support.meshes import ensure_fake_pg
    from torch.distributed.device_mesh import init_device_mesh

    from redist_opt.ir.placements import parse_placements
    from redist_opt.ir.strided import strided_reason, strided_steps

    ensure_fake_pg()
    src_p, dst_p = list(parse_placements(src)), list(parse_placements(dst))
    shape = (length, 3) if "(0" in src else (3, length)
    spec = MeshSpec(sizes)
    if strided_reason(spec, src_p, dst_p, shape) is not None:
        pytest.skip(strided_reason(spec, src_p, dst_p, shape))
    coords = dict(enumerate(itertools.product(*(range(n) for n in sizes))))
    with LocalTensorMode(math.prod(sizes)):
        mesh = init_device_mesh("cpu", sizes)
        theirs = _torch(mesh, src_p, dst_p, shape, coords)
    ours = [
        (
            s.mesh_dims,
            pstr(s.src),
            pstr(s.dst),
            {r: tuple(sym.evaluate(x, c) for x in s.logical_shape) for r, c in coords.items()},
        )
        for s in strided_steps(spec, src_p, dst_p, shape)
    ]
    assert ours == theirs, f"\n    ours  {_describe(ours)}\n    torch {_describe(theirs)}"
