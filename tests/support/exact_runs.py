"""Running torch and redist_opt side by side on small-integer inputs, compared exactly.

Used by the public-case, mixed-partial and property tests, all under
``LocalTensorMode`` on the fake backend:

* ``int_input``: a DTensor holding small integers (sums exact in float32/64);
* ``run_oracle`` (torch, merge pass off), ``run_torch_merged`` (torch 2.13 as
  shipped), ``run_ours`` (``redist_opt.redistribute``), each counted with
  ``CommDebugMode``;
* ``assert_same_locals``, ``assert_replicas_equal``, ``assert_matches_reference``;
* ``fresh_mesh`` and ``run_three`` (torch merged, redist_opt and the oracle on
  one input, with the torch-2.13 model's prediction checked);
* ``MeshPool``: root meshes with a chosen set of flattened meshes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterable, Sequence

import torch
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor
from torch.distributed.tensor._redistribute import (
    disable_redistribute_transform_optimization,
)
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.placement_types import Placement, Shard

import redist_opt
from support.inputs import Input, local_slice, local_tensors, normalize, parse_placement, pstr
from support.meshes import rank_coordinates
from support.reference import global_reference
from support.runs import collective_kind
from support.torch_merge_model import signature, torch_flattened_layouts, torch_model

F64 = torch.float64

# ----------------------------------------------------------------------------
# Inputs and runs (LocalTensorMode on the fake backend)
# ----------------------------------------------------------------------------


def int_input(mesh, lm: LocalTensorMode, src: Sequence[Placement], shape, dtype, seed: int, coords=None):
    """A DTensor with placements ``src`` holding small integers (exact sums in
    float32/float64). Partial ranks hold different integers that depend only on
    their coordinates along the non-Replicate mesh dims (replicas identical).
    Returns (dtensor, {rank: coords}). Must run inside ``lm``; ``coords`` (the
    ranks' mesh coordinates) may be passed to save recomputing them."""
    ndim = len(shape)
    src_n = [normalize(p, ndim) for p in src]
    with lm.disable():
        g = torch.randint(-8, 9, tuple(shape), generator=torch.Generator().manual_seed(seed)).to(dtype)
    base = [Replicate() if p.is_partial() else p for p in src_n]
    if coords is None:
        coords = rank_coordinates(mesh, lm)
    mesh_shape = tuple(mesh.shape)
    if all(type(p) in (Replicate, Shard) for p in base):
        # default-order nested torch.chunk sharding (the harness's local_slice,
        # itself checked against torch by the harness's oracle-sanity tests)
        with lm.disable():
            base_locals = {r: g[local_slice(shape, base, mesh_shape, coords[r])].clone() for r in lm.ranks}
    else:  # e.g. _StridedShard: let torch lay it out
        d0 = distribute_tensor(lm.rank_map(lambda r: g.clone()), mesh, base, src_data_rank=None)
        base_locals = d0._local_tensor._local_tensors
    partial = any(p.is_partial() for p in src_n)

    def make_local(r):
        t = base_locals[r].clone().contiguous()
        if partial:
            key = tuple(c if not isinstance(p, Replicate) else 0 for c, p in zip(coords[r], src_n))
            gen = torch.Generator().manual_seed(hash((seed,) + key) & 0x7FFFFFFF)
            t = t + torch.randint(-8, 9, tuple(t.shape), generator=gen).to(dtype)
        return t

    dt = DTensor.from_local(
        lm.rank_map(make_local),
        mesh,
        list(src),
        run_check=False,
        shape=torch.Size(shape),
        stride=g.stride(),
    )
    return dt, coords


@dataclasses.dataclass
class Run:
    out: DTensor | None = None
    error: BaseException | None = None
    total: int = 0
    kinds: dict = dataclasses.field(default_factory=dict)

    def describe_error(self) -> str:
        return f"{type(self.error).__name__}: {self.error}"


def _counted(fn) -> Run:
    r = Run()
    with CommDebugMode() as cdm:
        try:
            r.out = fn()
        except Exception as e:  # noqa: BLE001
            r.error = e
    for k, v in cdm.get_comm_counts().items():
        if v:
            kind = collective_kind(k)
            r.kinds[kind] = r.kinds.get(kind, 0) + v
    r.total = cdm.get_total_counts()
    return r


def run_oracle(dt: DTensor, dst) -> Run:
    def fn():
        with disable_redistribute_transform_optimization():
            return dt.redistribute(dt.device_mesh, list(dst))

    return _counted(fn)


def run_torch_merged(dt: DTensor, dst) -> Run:
    """torch 2.13 as shipped: merge pass ON."""

    def fn():
        with disable_redistribute_transform_optimization(False):
            return dt.redistribute(dt.device_mesh, list(dst))

    return _counted(fn)


def run_ours(dt: DTensor, dst, **kwargs) -> Run:
    return _counted(lambda: redist_opt.redistribute(dt, list(dst), **kwargs))


def _tol(dtype) -> dict:
    return {
        torch.float64: {"rtol": 1e-12, "atol": 1e-12},
        torch.float32: {"rtol": 1e-6, "atol": 1e-6},
    }.get(dtype, {"rtol": 1e-2, "atol": 1e-2})


def assert_same_locals(got: DTensor, want: DTensor, *, exact: bool, who: str = "redist_opt") -> None:
    """Same placements, shape, stride, dtype; every rank's local tensor equal
    (bitwise when ``exact``, else torch.testing.assert_close with tight tolerances)."""
    assert isinstance(got, DTensor), f"{who} returned {type(got).__name__}"
    assert tuple(got.placements) == tuple(want.placements), (
        f"placements: {who} {tuple(map(pstr, got.placements))} != {tuple(map(pstr, want.placements))}"
    )
    assert got.shape == want.shape and got.stride() == want.stride() and got.dtype == want.dtype
    lg, lw = local_tensors(got), local_tensors(want)
    assert set(lg) == set(lw), f"ranks {sorted(lg)} != {sorted(lw)}"
    for r in sorted(lw):
        a, b = lg[r], lw[r]
        assert a.shape == b.shape, f"rank {r}: local shape {who} {tuple(a.shape)} != {tuple(b.shape)}"
        if exact:
            assert torch.equal(a, b), f"rank {r}: {who} local\n{a}\n!= expected\n{b}"
        else:
            torch.testing.assert_close(a, b, **_tol(a.dtype), msg=lambda m, r=r: f"rank {r}: {who}: {m}")


def assert_replicas_equal(out: DTensor, coords: dict, mesh_shape) -> None:
    """Ranks that hold replicas (same coordinates on every non-Replicate mesh dim
    of the output) hold bitwise-equal local tensors."""
    locs = local_tensors(out)
    keep = [d for d, p in enumerate(out.placements) if not isinstance(p, Replicate)]
    groups: dict[tuple, list[int]] = {}
    for r, c in coords.items():
        groups.setdefault(tuple(c[d] for d in keep), []).append(r)
    for ranks in groups.values():
        first = locs[ranks[0]]
        for r in ranks[1:]:
            assert locs[r].shape == first.shape and torch.equal(locs[r], first), (
                f"replicas differ: rank {r} != rank {ranks[0]} (output "
                f"{tuple(map(pstr, out.placements))}, replica group {ranks})"
            )


def assert_matches_reference(out: DTensor, dt: DTensor, coords: dict, shape, src, exact: bool) -> None:
    """``out`` against the independent reference (the harness's global_reference)."""
    inp = Input(dt, dt.device_mesh, None, coords, tuple(normalize(p, len(shape)) for p in src), {})
    ref = global_reference(inp, shape)
    assert ref is not None
    dst_n = tuple(normalize(p, len(shape)) for p in out.placements)
    for r, c in coords.items():
        got = local_tensors(out)[r]
        want = ref[local_slice(shape, dst_n, tuple(dt.device_mesh.shape), c)].to(got.dtype)
        assert got.shape == want.shape, (
            f"rank {r}: local shape {tuple(got.shape)} != reference {tuple(want.shape)}"
        )
        if exact:
            assert torch.equal(got, want), f"rank {r}: local\n{got}\n!= reference\n{want}"
        else:
            torch.testing.assert_close(got, want, **_tol(got.dtype))


# ----------------------------------------------------------------------------
# Meshes with a chosen set of flattened groups
# ----------------------------------------------------------------------------


class MeshPool:
    """Root meshes by sizes, each created once, and their flattened meshes by
    dim set, each flattened once. ``use(sizes, flattened, lm)`` yields the root with *exactly*
    ``flattened`` in its ``_flatten_mapping`` (what both torch's merge pass and
    redist_opt's ``groups="existing"`` consult) and restores it afterwards;
    groups created meanwhile (``groups="create"``) are kept for later reuse.
    """

    def __init__(self) -> None:
        self.roots: dict[tuple, object] = {}
        self.flats: dict[tuple, dict] = {}  # sizes -> {dims: flattened mesh}
        self.coords: dict[tuple, dict] = {}  # sizes -> {rank: coordinates}

    @staticmethod
    def names(n: int) -> tuple[str, ...]:
        return tuple("abcd"[:n])

    def root(self, sizes: tuple[int, ...], lm: LocalTensorMode):
        if sizes not in self.roots:
            # Built with LocalTensorMode disabled (~100x faster): under the mode
            # DeviceMesh.get_coordinate is patched to compute every simulated
            # rank's coordinate from the layout, whoever built the mesh. (The
            # property test cross-checks the oracle against an independent
            # reference, which would catch a mesh the simulation misreads.)
            with lm.disable():
                self.roots[sizes] = init_device_mesh("cpu", sizes, mesh_dim_names=self.names(len(sizes)))
            self.flats[sizes] = {}
            self.coords[sizes] = rank_coordinates(self.roots[sizes], lm)
        return self.roots[sizes]

    @contextlib.contextmanager
    def use(self, sizes: tuple[int, ...], flattened: Iterable[tuple[int, ...]], lm: LocalTensorMode):
        root = self.root(sizes, lm)
        names = self.names(len(sizes))
        mapping = root._flatten_mapping
        saved = dict(mapping)
        mapping.clear()
        pool = self.flats[sizes]
        for dims in flattened:
            if dims not in pool:
                with lm.disable():
                    pool[dims] = root[tuple(names[d] for d in dims)]._flatten()
            fm = pool[dims]
            mapping[fm.mesh_dim_names[0]] = fm
        wanted = dict(mapping)
        try:
            yield root
        finally:
            for name, fm in mapping.items():
                parts = name.split("_")
                # Created by groups="create" through DeviceMesh._flatten ("a_b"): keep for
                # reuse. Groups redist_opt builds from a layout have other names: not pooled.
                if name not in wanted and all(p in names for p in parts):
                    pool.setdefault(tuple(names.index(x) for x in parts), fm)
            mapping.clear()
            mapping.update(saved)


# ----------------------------------------------------------------------------
# torch 2.13 (merge on), redist_opt and the oracle on one fresh mesh
# ----------------------------------------------------------------------------


def fresh_mesh(sizes, names, flatten=()):
    """A new root mesh (never the harness's cached ones: flattening mutates the
    root) with exactly the flattened meshes ``flatten`` names. Inside LocalTensorMode."""
    mesh = init_device_mesh("cpu", tuple(sizes), mesh_dim_names=tuple(names))
    for group in flatten:
        mesh[tuple(group)]._flatten()
    return mesh


def placements(xs) -> list[Placement]:
    """``"P,S(0)"`` (or a list of placements) as a list of placements."""
    return [parse_placement(x) for x in xs.split(",")] if isinstance(xs, str) else list(xs)


@dataclasses.dataclass
class ThreeRuns:
    torch: Run
    ours: Run
    oracle: Run
    mesh: object
    coords: dict
    plan: object  # redist_opt's optimized plan
    model: object  # the torch-2.13 model's plan
    spec: redist_opt.MeshSpec


def run_three(sizes, names, flatten, src, dst, shape, *, groups="existing", seed=0, data=None) -> ThreeRuns:
    """torch (merge ON), redist_opt and the oracle on one integer-valued input:
    outputs equal the oracle bitwise, replicas are bitwise equal and the
    torch-2.13 model predicts torch's count."""
    src, dst = placements(src), placements(dst)
    n = math.prod(sizes)
    with LocalTensorMode(n) as lm:
        mesh = fresh_mesh(sizes, names, flatten)
        if data is None:
            dt, coords = int_input(mesh, lm, src, shape, F64, seed)
        else:
            dt = distribute_tensor(lm.rank_map(lambda r: data.clone()), mesh, src, src_data_rank=None)
            coords = rank_coordinates(mesh, lm)
        torch_run = run_torch_merged(dt, dst)
        ours = run_ours(dt, dst, groups=groups)
        oracle = run_oracle(dt, dst)
        flat_layouts = torch_flattened_layouts(mesh)
        spec = redist_opt.MeshSpec.from_device_mesh(mesh)
    for who, r in (("torch", torch_run), ("redist_opt", ours), ("oracle", oracle)):
        assert r.error is None, f"{who} raised {r.describe_error()}"
    assert_same_locals(ours.out, oracle.out, exact=True)
    assert_replicas_equal(ours.out, coords, sizes)
    # the torch-2.13 model predicts torch's count for these flattened meshes
    p = redist_opt.plan(spec, src, dst, shape=shape, dtype=F64)
    model = torch_model(p, flat_layouts)
    assert model.uniform and model.plan.num_collectives == torch_run.total, (
        f"torch-2.13 model {model.describe()} != torch's {torch_run.total} {torch_run.kinds}"
    )
    opt = redist_opt.optimize(p, groups=groups)
    return ThreeRuns(
        torch=torch_run,
        ours=ours,
        oracle=oracle,
        mesh=mesh,
        coords=coords,
        plan=opt,
        model=model.plan,
        spec=spec,
    )


def assert_fewer(o: ThreeRuns) -> None:
    """redist_opt issued fewer collectives than torch 2.13, and what its plan listed."""
    assert o.ours.total < o.torch.total, (
        f"redist_opt {o.ours.total} {o.ours.kinds} is not fewer than torch 2.13 "
        f"{o.torch.total} {o.torch.kinds}; plan: {signature(o.plan)}"
    )
    assert o.ours.total == o.plan.num_collectives, "the runtime issued a different count than the plan"
