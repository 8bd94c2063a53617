"""Differential test harness for ``redist_opt``.

The oracle is torch's own ``DTensor.redistribute`` with its transform-merge
pass disabled (``disable_redistribute_transform_optimization``), executed under
``LocalTensorMode`` on the ``fake`` process-group backend, so that every rank
of a mesh is simulated inside this one process.

``check_case`` builds one input DTensor, runs the oracle and
``redist_opt.redistribute(..., groups="existing")`` on it and asserts that

* both raise, or neither does (redist_opt must then raise RedistributeError or
  RuntimeError with a non-empty message);
* every rank's local result is bitwise equal (``torch.equal``), with the same
  shape and dtype;
* the output DTensor has the same placements, global shape, stride, dtype and
  mesh;
* the number of collectives recorded by ``CommDebugMode`` is equal, and so is
  the number of each kind (all_reduce, all_gather, reduce_scatter, all_to_all:
  see ``collective_kind``);
* the input DTensor's local tensors were not modified by either call.

It also cross-checks the oracle against an independent reference computed in
plain Python (``global_reference``), so that a harness bug (a malformed input,
a mesh the simulation cannot represent) shows up as an ORACLE SANITY failure
rather than silently passing. Where torch fails *inside* the simulation (not a
rejection of the request, see ``is_rejection``), redist_opt is checked against
that reference instead; such cases are listed at the end of the pytest run.
"""

from __future__ import annotations

import dataclasses
import re
import traceback
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed._local_tensor import LocalTensor, LocalTensorMode, _int_on_rank
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import (
    DTensor,
    Partial,
    Placement,
    Replicate,
    Shard,
    distribute_tensor,
)
from torch.distributed.tensor._redistribute import (
    disable_redistribute_transform_optimization,
)
from torch.distributed.tensor.debug import CommDebugMode

import redist_opt
from support.run_report import REPORT

# Size of the fake default process group. It has to cover the largest mesh a
# test builds (2x2x2x2 = 16 ranks in test_rank_free); smaller meshes are
# simulated with a LocalTensorMode over exactly their own ranks.
WORLD_SIZE = 16


def ensure_fake_pg(world_size: int = WORLD_SIZE) -> None:
    if dist.is_initialized():
        ws = dist.get_world_size()
        if ws < world_size:
            raise RuntimeError(
                f"default process group already initialised with world size {ws} "
                f"< {world_size}"
            )
        return
    dist.init_process_group("fake", rank=0, world_size=world_size)


# --------------------------------------------------------------------------
# Placements
# --------------------------------------------------------------------------

_SHARD_RE = re.compile(r"^S\((-?\d+)\)$")
_PARTIAL_RE = re.compile(r"^P(?:\((sum|avg|max|min)\))?$")


def parse_placement(s: str | Placement) -> Placement:
    """Harness-local (independent of redist_opt) parser for the short strings."""
    if isinstance(s, Placement):
        return s
    s = s.strip()
    if s == "R":
        return Replicate()
    m = _SHARD_RE.match(s)
    if m:
        return Shard(int(m.group(1)))
    m = _PARTIAL_RE.match(s)
    if m:
        return Partial(m.group(1) or "sum")
    raise ValueError(f"harness cannot parse placement {s!r}")


def pstr(p: str | Placement) -> str:
    """Short string for a placement: R, S(0), S(-1), P, P(avg)..."""
    if isinstance(p, str):
        return p
    if isinstance(p, Replicate):
        return "R"
    if isinstance(p, Partial):
        return "P" if p.reduce_op == "sum" else f"P({p.reduce_op})"
    if type(p) is Shard:
        return f"S({p.dim})"
    return repr(p)


def normalize(p: Placement, ndim: int) -> Placement:
    if type(p) is Shard and p.dim < 0:
        return Shard(p.dim + ndim)
    return p


# --------------------------------------------------------------------------
# Meshes
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MeshFactory:
    """A named recipe for a DeviceMesh.

    nranks: number of simulated ranks = size of the *root* mesh (a submesh of a
        2x2x2 mesh is simulated with 8 ranks).
    global_check: whether the LocalTensor simulation gives globally meaningful
        results on this mesh (each dim's groups list their ranks in increasing
        order along the mesh dim; c10d sorts the ranks of a new group, so on a
        mesh that walks a dim in decreasing rank order the collectives see a
        different order than the DTensor coordinates). On such meshes only the
        differential comparison is done.
    """

    name: str
    nranks: int
    build: Callable[[], DeviceMesh] = dataclasses.field(compare=False, repr=False)
    global_check: bool = True

    def __str__(self) -> str:
        return self.name


_MESH_CACHE: dict[str, DeviceMesh] = {}
_COORDS_CACHE: dict[str, dict[int, tuple[int, ...]]] = {}
_COORD_SYMINTS: dict[str, list] = {}  # get_coordinate() under LocalTensorMode, per mesh


def get_mesh(factory: MeshFactory, lm: LocalTensorMode) -> DeviceMesh:
    """Build (once per process) the mesh for a factory; must run inside ``lm``."""
    mesh = _MESH_CACHE.get(factory.name)
    if mesh is None:
        ensure_fake_pg()
        # Built with the mode disabled: a mesh built inside LocalTensorMode
        # keeps a LocalTensor rank map, which makes every get_coordinate()
        # (once per case and mode) ~5x slower.
        with lm.disable():
            mesh = factory.build()
        _MESH_CACHE[factory.name] = mesh
    return mesh


def mesh_coordinates(factory: MeshFactory, lm: LocalTensorMode) -> dict[int, tuple[int, ...]]:
    """Every simulated rank's coordinate in the factory's mesh (must run inside ``lm``).

    Computed once per process. Under LocalTensorMode, ``DeviceMesh.get_coordinate``
    walks the mesh layout once per simulated rank and caches the result in the
    mode, so every case's new LocalTensorMode paid for it again (about a tenth
    of a differential case); the cached meshes live as long as the process, so
    their coordinates are handed to each new mode instead."""
    mesh = get_mesh(factory, lm)
    symbolic = _COORD_SYMINTS.get(factory.name)
    cache = getattr(lm, "_coordinate_cache", None)
    if symbolic is None:
        _COORD_SYMINTS[factory.name] = mesh.get_coordinate()
    elif cache is not None:
        cache.setdefault(id(mesh), symbolic)
    coords = _COORDS_CACHE.get(factory.name)
    if coords is None:
        coords = _COORDS_CACHE[factory.name] = rank_coordinates(mesh, lm)
    return coords


def _init(shape, names=None):
    return lambda: init_device_mesh("cpu", tuple(shape), mesh_dim_names=names)


def _explicit(tensor_fn, names=None):
    return lambda: DeviceMesh("cpu", tensor_fn(), mesh_dim_names=names)


def _sub(root_shape, root_names, sub_names):
    def build():
        root = init_device_mesh("cpu", root_shape, mesh_dim_names=root_names)
        return root[sub_names]

    return build


def _unflat(n, sizes, names):
    def build():
        flat = init_device_mesh("cpu", (n,), mesh_dim_names=("world",))
        return flat._unflatten(0, sizes, names)

    return build


def _flattened(root_shape, root_names, flat_dims, flat_name):
    def build():
        root = init_device_mesh("cpu", root_shape, mesh_dim_names=root_names)
        return root[flat_dims]._flatten(flat_name)

    return build


def _init_flattened(shape, names, groups):
    """A root mesh with the flattened meshes ``groups`` (tuples of dim names)."""
    def build():
        root = init_device_mesh("cpu", tuple(shape), mesh_dim_names=names)
        for g in groups:
            root[tuple(g)]._flatten()
        return root

    return build


MESHES: dict[str, MeshFactory] = {
    f.name: f
    for f in [
        # 1-D
        MeshFactory("1d2", 2, _init((2,))),
        MeshFactory("1d3", 3, _init((3,), ("x",))),
        MeshFactory("1d4", 4, _init((4,))),
        # 2-D
        MeshFactory("2x2", 4, _init((2, 2), ("a", "b"))),
        MeshFactory("3x2", 6, _init((3, 2))),
        MeshFactory("2x4", 8, _init((2, 4), ("dp", "tp"))),
        MeshFactory("2x3", 6, _init((2, 3), ("a", "b"))),
        # 3-D
        MeshFactory("2x2x2", 8, _init((2, 2, 2), ("a", "b", "c"))),
        MeshFactory("2x2x2x2", 16, _init((2, 2, 2, 2), ("a", "b", "c", "d"))),
        # used with groups="create" only (created flattened groups stay on the root)
        MeshFactory("2x8", 16, _init((2, 8), ("a", "b"))),
        MeshFactory("2x4x2", 16, _init((2, 4, 2), ("a", "b", "c"))),
        # column-major 2x8: a+b is not the world's rank order, so groups="create" creates it
        MeshFactory(
            "colmajor2x8",
            16,
            _explicit(lambda: torch.arange(16).reshape(8, 2).T.contiguous(), ("a", "b")),
        ),
        # size-1 mesh dims
        MeshFactory("1x4", 4, _init((1, 4), ("a", "b"))),
        MeshFactory("2x1x2", 4, _init((2, 1, 2))),
        MeshFactory("4x1", 4, _init((4, 1), ("a", "b"))),
        # explicit rank tensors
        MeshFactory(
            "explicit2x2", 4, _explicit(lambda: torch.arange(4).reshape(2, 2))
        ),
        MeshFactory(
            "explicit3x2", 6, _explicit(lambda: torch.arange(6).reshape(3, 2), ("r", "c"))
        ),
        # permuted rank tensors: column-major layouts (each dim's groups are
        # still increasing) ...
        MeshFactory(
            "colmajor2x4",
            8,
            _explicit(lambda: torch.arange(8).reshape(4, 2).T.contiguous()),
        ),
        MeshFactory(
            "colmajor2x2x2",
            8,
            _explicit(
                lambda: torch.arange(8).reshape(2, 2, 2).permute(2, 0, 1).contiguous(),
                ("a", "b", "c"),
            ),
        ),
        # ... and reversed layouts, whose groups walk ranks in decreasing order
        # (differential comparison only, see MeshFactory.global_check).
        MeshFactory(
            "reversed2x2",
            4,
            _explicit(lambda: torch.arange(4).flip(0).reshape(2, 2)),
            global_check=False,
        ),
        MeshFactory(
            "reversed1d4",
            4,
            _explicit(lambda: torch.arange(4).flip(0)),
            global_check=False,
        ),
        # submeshes sliced from a larger mesh
        MeshFactory("sub_ac_of_2x2x2", 8, _sub((2, 2, 2), ("a", "b", "c"), ("a", "c"))),
        MeshFactory("sub_b_of_2x2x2", 8, _sub((2, 2, 2), ("a", "b", "c"), "b")),
        MeshFactory("sub_bc_of_2x2x2", 8, _sub((2, 2, 2), ("a", "b", "c"), ("b", "c"))),
        MeshFactory("sub_tp_of_2x4", 8, _sub((2, 4), ("dp", "tp"), "tp")),
        # _unflatten views
        MeshFactory("unflat4_2x2", 4, _unflat(4, (2, 2), ("x", "y"))),
        MeshFactory("unflat8_2x2x2", 8, _unflat(8, (2, 2, 2), ("x", "y", "z"))),
        MeshFactory("unflat8_4x2", 8, _unflat(8, (4, 2), ("x", "y"))),
        # a flattened view of two dims of a 3-D mesh (1-D mesh of 4 ranks with stride)
        MeshFactory(
            "flat_ac_of_2x2x2", 8, _flattened((2, 2, 2), ("a", "b", "c"), ("a", "c"), "ac")
        ),
        # roots with flattened meshes, so groups="existing" plans merge collectives
        MeshFactory("2x2_ab", 4, _init_flattened((2, 2), ("a", "b"), ["ab"])),
        MeshFactory("3x2_ab", 6, _init_flattened((3, 2), ("a", "b"), ["ab"])),
        MeshFactory(
            "2x2x2_ab_ac_bc_abc", 8,
            _init_flattened((2, 2, 2), ("a", "b", "c"), ["ab", "ac", "bc", "abc"]),
        ),
        MeshFactory(
            "2x2x2x2_bcd_cd", 16, _init_flattened((2, 2, 2, 2), ("a", "b", "c", "d"), ["bcd", "cd"])
        ),
        MeshFactory(
            "2x2x2x2_ab_cd_abcd", 16,
            _init_flattened((2, 2, 2, 2), ("a", "b", "c", "d"), ["ab", "cd", "abcd"]),
        ),
    ]
}


def rank_coordinates(mesh: DeviceMesh, lm: LocalTensorMode) -> dict[int, tuple[int, ...]]:
    """Each simulated rank's coordinate in ``mesh`` (must run inside ``lm``)."""
    coords = mesh.get_coordinate()
    assert coords is not None
    return {r: tuple(_int_on_rank(c.node if isinstance(c, torch.SymInt) else c, r)
                     for c in coords) for r in lm.ranks}


# --------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------

DTYPE_NAMES = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.bfloat16: "bf16",
    torch.complex64: "c64",
    torch.float16: "f16",
    torch.int64: "i64",
    torch.int32: "i32",
}


def case_seed(*parts: Any) -> int:
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


def _rand(shape, dtype, seed) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if not (dtype.is_floating_point or dtype.is_complex):  # integers: avg must truncate
        return torch.randint(-50, 51, tuple(shape), generator=g, dtype=dtype)
    if dtype.is_complex:
        return torch.randn(*shape, generator=g, dtype=dtype)
    return torch.randn(*shape, generator=g, dtype=torch.float32).to(dtype)


def local_slice(
    shape: Sequence[int],
    placements: Sequence[Placement],
    mesh_shape: Sequence[int],
    coord: Sequence[int],
) -> tuple[slice, ...]:
    """Independent re-implementation of DTensor's (default shard order) layout:
    mesh dims applied left to right, each Shard splitting the current extent
    into ``mesh_size`` torch.chunk-style pieces (ceil-sized, trailing ones
    possibly empty)."""
    start = [0] * len(shape)
    size = list(shape)
    for i, p in enumerate(placements):
        if type(p) is Shard:
            d = p.dim
            n = mesh_shape[i]
            full = -(-size[d] // n) if size[d] else 0
            lo = min(coord[i] * full, size[d])
            hi = min((coord[i] + 1) * full, size[d])
            start[d] += lo
            size[d] = hi - lo
    return tuple(slice(s, s + z) for s, z in zip(start, size))


@dataclasses.dataclass
class Input:
    dt: DTensor
    mesh: DeviceMesh
    lm: LocalTensorMode
    coords: dict[int, tuple[int, ...]]
    src: tuple[Placement, ...]  # normalized
    snapshot: dict[int, torch.Tensor]


def build_input(
    mesh: DeviceMesh,
    lm: LocalTensorMode,
    src: Sequence[Placement],
    shape: Sequence[int],
    dtype: torch.dtype,
    seed: int,
    coords: dict[int, tuple[int, ...]] | None = None,
) -> Input:
    """A DTensor with placements ``src`` holding random data; must run in ``lm``.

    Shard dims hold true shards of a random global tensor. Where ``src`` has
    Partial dims, each rank adds a random perturbation that depends only on
    its coordinates along the non-Replicate mesh dims, so partial ranks hold
    *different* data while replicas along Replicate dims stay identical (a
    valid DTensor). ``coords`` (every rank's mesh coordinate) may be passed to
    save recomputing them."""
    ndim = len(shape)
    src_n = tuple(normalize(p, ndim) for p in src)
    with lm.disable():  # random factories are per-rank inside LocalTensorMode
        g = _rand(shape, dtype, seed)
    # Shard dims hold the true shards of g. The slices come from local_slice
    # (torch.chunk semantics, mesh dims left to right), which
    # test_harness.py checks against distribute_tensor; distribute_tensor
    # itself is ~100x slower under LocalTensorMode.
    base = [Replicate() if p.is_partial() else p for p in src_n]
    if coords is None:
        coords = rank_coordinates(mesh, lm)
    mesh_shape = tuple(mesh.shape)
    has_partial = any(p.is_partial() for p in src_n)

    if all(type(p) in (Replicate, Shard) for p in base):
        def base_local(r: int) -> torch.Tensor:
            return g[local_slice(shape, base, mesh_shape, coords[r])]
    else:  # e.g. _StridedShard, which local_slice does not model
        g_all = lm.rank_map(lambda r: g.clone())
        d0 = distribute_tensor(g_all, mesh, base, src_data_rank=None)
        base_local = d0._local_tensor._local_tensors.__getitem__

    def make_local(r: int) -> torch.Tensor:
        t = base_local(r).clone().contiguous()
        if has_partial:
            key = tuple(
                c if not isinstance(p, Replicate) else 0 for c, p in zip(coords[r], src_n)
            )
            t = (t + _rand(tuple(t.shape), dtype, case_seed(seed, key))).to(dtype)
        return t

    lt = lm.rank_map(make_local)
    dt = DTensor.from_local(
        lt, mesh, list(src), run_check=False, shape=torch.Size(shape),
        stride=g.stride(),
    )
    snapshot = {r: t.clone() for r, t in dt._local_tensor._local_tensors.items()}
    return Input(dt, mesh, lm, coords, src_n, snapshot)


# --------------------------------------------------------------------------
# Independent reference (oracle sanity)
# --------------------------------------------------------------------------

_REDUCE = {
    "sum": lambda s: s.sum(0),
    "avg": lambda s: s.mean(0),
    "max": lambda s: s.amax(0),
    "min": lambda s: s.amin(0),
}


def global_reference(inp: Input, shape: Sequence[int]) -> torch.Tensor | None:
    """The global value the input DTensor represents, computed in high precision."""
    mesh_shape = tuple(inp.mesh.shape)
    src = inp.src
    partial_dims = [i for i, p in enumerate(src) if p.is_partial()]
    ops = {src[i].reduce_op for i in partial_dims}
    if len(ops) > 1 and ops != {"sum", "avg"}:
        return None
    locals_ = inp.dt._local_tensor._local_tensors
    sample = next(iter(locals_.values()))
    hi = torch.complex128 if sample.dtype.is_complex else torch.float64
    contribs: dict[tuple[int, ...], torch.Tensor] = {}
    for r, c in inp.coords.items():
        if any(c[i] != 0 for i, p in enumerate(src) if isinstance(p, Replicate)):
            continue
        pkey = tuple(c[i] for i in partial_dims)
        buf = contribs.setdefault(pkey, torch.full(tuple(shape), float("nan"), dtype=hi))
        buf[local_slice(shape, src, mesh_shape, c)] = locals_[r].to(hi)
    stacked = torch.stack(list(contribs.values()))
    if not partial_dims:
        return stacked[0]
    if len(ops) > 1:  # sum and avg mixed: a sum, divided by the sizes of the avg dims
        scale = 1
        for i in partial_dims:
            if src[i].reduce_op == "avg":
                scale *= mesh_shape[i]
        return stacked.sum(0) / scale
    return _REDUCE[ops.pop()](stacked)


def _tolerance(dtype: torch.dtype) -> tuple[float, float]:
    return {
        torch.float64: (1e-12, 1e-12),
        torch.float32: (1e-5, 1e-5),
        torch.complex64: (1e-5, 1e-5),
        torch.bfloat16: (0.05, 0.05),
        torch.float16: (5e-3, 5e-3),
        torch.int64: (0, 0),
        torch.int32: (0, 0),
    }[dtype]


def oracle_sanity(inp: Input, out: DTensor, shape, dst: Sequence[Placement]) -> None:
    """The oracle's result must match the independently computed reference."""
    dst_n = tuple(normalize(p, len(shape)) for p in dst)
    if any(p.is_partial() for p in dst_n):
        return
    if any(type(p) not in (Replicate, Shard, Partial) for p in (*inp.src, *dst_n)):
        return  # e.g. _StridedShard: local_slice models default-order Shard only
    out_dtype = out._local_tensor.dtype
    if not (out_dtype.is_floating_point or out_dtype.is_complex) and any(
        p.is_partial() and p.reduce_op == "avg" for p in inp.src
    ):
        return  # integer avg truncates at every reduction: no exact global reference
    ref = global_reference(inp, shape)
    if ref is None:
        return
    exact = not any(p.is_partial() for p in inp.src)
    mesh_shape = tuple(inp.mesh.shape)
    for r, c in inp.coords.items():
        got = local_tensors(out)[r]
        want = ref[local_slice(shape, dst_n, mesh_shape, c)]
        assert tuple(got.shape) == tuple(want.shape), (
            f"ORACLE SANITY: rank {r} local shape {tuple(got.shape)} != "
            f"reference {tuple(want.shape)}"
        )
        if exact and out_dtype == inp.dt._local_tensor.dtype:
            ok = torch.equal(got, want.to(got.dtype))
        else:
            rtol, atol = _tolerance(out_dtype)
            ok = torch.allclose(got.to(want.dtype), want, rtol=rtol, atol=atol)
        assert ok, f"ORACLE SANITY: rank {r} local value differs from reference"


# --------------------------------------------------------------------------
# Running one side
# --------------------------------------------------------------------------


@dataclasses.dataclass
class Outcome:
    out: DTensor | None = None
    error: BaseException | None = None
    tb: str = ""
    counts: Counter = dataclasses.field(default_factory=Counter)
    total: int = 0
    optimized: "Outcome | None" = None  # check_case: the optimized run's outcome

    def describe_error(self) -> str:
        return f"{type(self.error).__name__}: {self.error}"


def local_tensors(dt: DTensor) -> dict[int, torch.Tensor]:
    """Per-rank locals of a DTensor produced under LocalTensorMode (waits on an
    AsyncCollectiveTensor first, for async_op=True)."""
    t = dt._local_tensor
    if isinstance(t, funcol.AsyncCollectiveTensor):
        t = t.wait()
    if not isinstance(t, LocalTensor):
        raise AssertionError(f"local tensor is a {type(t).__name__}, not a LocalTensor")
    return t._local_tensors


def collective_kind(op: Any) -> str:
    """Collective class of a CommDebugMode key: torch issues an all-to-all as
    ``_dtensor.shard_dim_alltoall``, a reimplementation may use
    ``all_to_all_single``; both are one all_to_all."""
    name = str(op).split(".")[-1].lower()
    for kind, keys in [
        ("all_to_all", ("alltoall", "all_to_all")),
        ("all_gather", ("all_gather", "allgather")),
        ("reduce_scatter", ("reduce_scatter",)),
        ("all_reduce", ("all_reduce", "allreduce")),
        ("broadcast", ("broadcast",)),
        ("scatter", ("scatter",)),
        ("gather", ("gather",)),
    ]:
        if any(k in name for k in keys):
            return kind
    return name


def _count(cdm: CommDebugMode) -> tuple[Counter, int]:
    c: Counter = Counter()
    for k, v in cdm.get_comm_counts().items():
        if v:
            c[collective_kind(k)] += v
    return c, cdm.get_total_counts()


def run_oracle(inp: Input, dst: Sequence[Placement], **kwargs) -> Outcome:
    o = Outcome()
    try:
        with CommDebugMode() as cdm, disable_redistribute_transform_optimization():
            o.out = inp.dt.redistribute(inp.mesh, list(dst), **kwargs)
            local_tensors(o.out)  # waits (async_op=True) inside the mode
    except Exception as e:  # noqa: BLE001 - any error from torch is acceptable
        o.error, o.tb = e, traceback.format_exc()
    o.counts, o.total = _count(cdm)
    return o


def run_candidate(
    inp: Input,
    dst: Sequence[Placement | str],
    *,
    via: str = "function",
    pass_mesh: bool = False,
    passes=None,
    groups: str = "existing",
    **kwargs,
) -> Outcome:
    """redist_opt on the input; ``passes=()`` runs DTensor's own plan (no optimization)."""
    o = Outcome()
    try:
        with CommDebugMode() as cdm:
            if via == "function":
                if pass_mesh:
                    kwargs["device_mesh"] = inp.mesh
                o.out = redist_opt.redistribute(
                    inp.dt, list(dst), groups=groups, passes=passes, **kwargs
                )
            elif via == "enabled":
                extra = {"cost": kwargs.pop("cost")} if "cost" in kwargs else {}
                with redist_opt.enabled(groups=groups, passes=passes, **extra):
                    o.out = inp.dt.redistribute(inp.mesh, list(dst), **kwargs)
            else:
                raise AssertionError(via)
            if isinstance(o.out, DTensor):
                local_tensors(o.out)  # waits (async_op=True) inside the mode
    except Exception as e:  # noqa: BLE001
        o.error, o.tb = e, traceback.format_exc()
    o.counts, o.total = _count(cdm)
    return o


# --------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    mesh: str
    src: tuple[str, ...]
    dst: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32
    via: str = "function"
    pass_mesh: bool = False
    dst_as_strings: bool = False
    kwargs: tuple[tuple[str, Any], ...] = ()

    @property
    def id(self) -> str:
        s = (
            f"{self.mesh}-{','.join(self.src)}_to_{','.join(self.dst)}"
            f"-{'x'.join(map(str, self.shape)) or 'scalar'}-{DTYPE_NAMES[self.dtype]}"
        )
        if self.via != "function":
            s += f"-via_{self.via}"
        if self.pass_mesh:
            s += "-mesh_kw"
        if self.dst_as_strings:
            s += "-str"
        for k, v in self.kwargs:
            s += f"-{k}={DTYPE_NAMES.get(v, v)}"
        return s


def check_case(
    mesh_factory: MeshFactory | str,
    src: Sequence[str | Placement],
    dst: Sequence[str | Placement],
    shape: Sequence[int],
    dtype: torch.dtype = torch.float32,
    *,
    via: str = "function",
    pass_mesh: bool = False,
    dst_as_strings: bool = False,
    redistribute_kwargs: dict[str, Any] | None = None,
    check_counts: bool = True,
    sanity: bool = True,
    seed: int | None = None,
    groups: str = "existing",
    cost=None,
) -> Outcome:
    """Run the oracle and redist_opt on the same input and compare everything.

    ``groups`` and ``cost`` go to the optimized run. Returns the oracle's Outcome
    (for callers that want the counts) with ``.optimized``, the optimized run's."""
    if isinstance(mesh_factory, str):
        mesh_factory = MESHES[mesh_factory]
    ensure_fake_pg()
    kwargs = dict(redistribute_kwargs or {})
    src_p = [parse_placement(p) for p in src]
    dst_p = [parse_placement(p) for p in dst]
    dst_arg = [pstr(p) for p in dst_p] if dst_as_strings else dst_p
    if seed is None:
        seed = case_seed(mesh_factory.name, tuple(map(pstr, src_p)),
                         tuple(map(pstr, dst_p)), tuple(shape), str(dtype))
    # Only input construction and the two redistribute calls run inside
    # LocalTensorMode; every check runs outside it (inside, factory functions
    # would create per-rank data).
    with LocalTensorMode(mesh_factory.nranks) as lm:
        mesh = get_mesh(mesh_factory, lm)
        coords = mesh_coordinates(mesh_factory, lm)
        inp = build_input(mesh, lm, src_p, shape, dtype, seed, coords)
        ref = run_oracle(inp, dst_p, **kwargs)
        cand = run_candidate(inp, dst_arg, via=via, pass_mesh=pass_mesh, passes=(), **kwargs)
        opt_kwargs = dict(kwargs, cost=cost) if cost is not None else kwargs
        opt = run_candidate(inp, dst_arg, via=via, pass_mesh=pass_mesh, groups=groups, **opt_kwargs)
    _assert_input_unchanged(inp, "torch (oracle) or redist_opt")
    if ref.error is None and sanity and mesh_factory.global_check:
        oracle_sanity(inp, ref.out, shape, dst_p)

    if ref.error is not None and not is_rejection(ref.error):
        _check_against_reference(mesh_factory, inp, ref, cand, shape, dst_p)
        _check_against_reference(mesh_factory, inp, ref, opt, shape, dst_p, optimized=True)
        return ref
    compare(ref, cand, check_counts=check_counts)
    linear = any(p.is_partial() and p.reduce_op in ("sum", "avg") for p in src_p)
    compare(ref, opt, check_counts=check_counts, optimized=True, linear_reductions=linear)
    ref.optimized = opt
    return ref


# torch's ways of *rejecting* a redistribution (bad or unsupported request).
# When the oracle fails with one of these, redist_opt must reject it too.
_REJECTION_RE = re.compile(
    r"Can not redistribute from|not supported|does not support complex|"
    r"not implemented for complex|greater than tensor ndim|must be normalized|"
    r"Mixed Partial|out of range",
)


def is_rejection(err: BaseException) -> bool:
    return isinstance(err, IndexError) or bool(_REJECTION_RE.search(str(err)))


# Cases where torch failed *inside* the LocalTensorMode simulation (e.g. a
# reduce_scatter whose per-rank local sizes differ across groups: a real run
# evaluates the padding decision per rank, the simulation evaluates it once for
# all ranks and then fails in torch.cat). The oracle is unavailable there; the
# candidate is checked against the independent reference instead; such cases are
# listed at the end of the run (REPORT.oracle_artifacts).


def _check_against_reference(mesh_factory, inp, ref, cand, shape, dst_p, optimized=False) -> None:
    if not optimized:
        REPORT.oracle_artifacts.append(f"{mesh_factory.name} {tuple(map(pstr, inp.src))}->"
                                f"{tuple(map(pstr, dst_p))} {tuple(shape)}: {ref.describe_error()}")
    if cand.error is not None and optimized:
        raise AssertionError(
            f"torch fails inside the simulation; the optimized plan raised {cand.describe_error()}"
            f"\n{cand.tb}"
        )
    if cand.error is not None:
        # the same simulation failure (redist_opt reuses torch's primitives)
        assert type(cand.error) is type(ref.error) and str(cand.error) == str(ref.error), (
            f"torch fails inside the simulation with {ref.describe_error()}; "
            f"redist_opt raised a different error {cand.describe_error()}\n{cand.tb}"
        )
        return
    if not mesh_factory.global_check:
        import pytest

        pytest.skip(f"torch fails inside the simulation ({ref.describe_error()}) and "
                    f"mesh {mesh_factory.name} has no independent reference")
    dst_n = tuple(normalize(p, len(shape)) for p in dst_p)
    out = cand.out
    assert isinstance(out, DTensor), f"redist_opt returned {type(out).__name__}"
    assert tuple(out.placements) == dst_n, (
        f"placements: redist_opt {tuple(map(pstr, out.placements))} != "
        f"{tuple(map(pstr, dst_n))}"
    )
    assert tuple(out.shape) == tuple(shape)
    try:
        oracle_sanity(inp, out, shape, dst_p)
    except AssertionError as e:
        raise AssertionError(
            "(torch fails inside the simulation here, so redist_opt is checked "
            "against the independent reference) " + str(e).replace("ORACLE SANITY: ", "")
        ) from None


def _assert_input_unchanged(inp: Input, who: str) -> None:
    for r, before in inp.snapshot.items():
        now = inp.dt._local_tensor._local_tensors[r]
        assert now.shape == before.shape and torch.equal(now, before), (
            f"{who} modified the input DTensor's local tensor on rank {r}"
        )


ACCEPTED_ERRORS = (RuntimeError,)


def compare(
    ref: Outcome,
    cand: Outcome,
    *,
    check_counts: bool = True,
    optimized: bool = False,
    linear_reductions: bool = False,
) -> None:
    """``optimized``: the candidate ran the pass pipeline (see the module docstring)."""
    who = "redist_opt (optimized)" if optimized else "redist_opt"

    if ref.error is not None:
        assert cand.error is not None, (
            f"torch raises {ref.describe_error()} but redist_opt returned a "
            f"DTensor with placements "
            f"{None if cand.out is None else tuple(map(pstr, cand.out.placements))}"
        )
        assert isinstance(cand.error, (redist_opt.RedistributeError, *ACCEPTED_ERRORS)), (
            f"torch raises {ref.describe_error()}; redist_opt raised "
            f"{cand.describe_error()} which is neither RedistributeError nor "
            f"RuntimeError\n{cand.tb}"
        )
        assert str(cand.error).strip(), (
            f"redist_opt raised {type(cand.error).__name__} with an empty message"
        )
        return

    if cand.error is not None:
        raise AssertionError(
            f"torch succeeds but redist_opt raised {cand.describe_error()}\n{cand.tb}"
        )
    a, b = ref.out, cand.out
    assert isinstance(b, DTensor), f"redist_opt returned {type(b).__name__}, not DTensor"
    assert tuple(b.placements) == tuple(a.placements), (
        f"placements: redist_opt {tuple(map(pstr, b.placements))} != torch "
        f"{tuple(map(pstr, a.placements))}"
    )
    assert b.shape == a.shape, f"global shape: redist_opt {tuple(b.shape)} != torch {tuple(a.shape)}"
    assert b.stride() == a.stride(), f"global stride: redist_opt {b.stride()} != torch {a.stride()}"
    assert b.dtype == a.dtype, f"dtype: redist_opt {b.dtype} != torch {a.dtype}"
    assert b.device_mesh == a.device_mesh, (
        f"mesh: redist_opt {b.device_mesh} != torch {a.device_mesh}"
    )
    la = local_tensors(a)
    lb = local_tensors(b)
    assert set(lb) == set(la), f"ranks: redist_opt {sorted(lb)} != torch {sorted(la)}"
    for r in sorted(la):
        x, y = la[r], lb[r]
        assert y.shape == x.shape, (
            f"rank {r}: local shape redist_opt {tuple(y.shape)} != torch {tuple(x.shape)}"
        )
        assert y.dtype == x.dtype, f"rank {r}: local dtype redist_opt {y.dtype} != torch {x.dtype}"
        if not torch.equal(y, x):
            if optimized and linear_reductions:
                rtol, atol = _tolerance(x.dtype)
                if torch.allclose(y, x, rtol=rtol, atol=atol):
                    continue
            diff = (y.to(torch.complex128 if y.is_complex() else torch.float64)
                    - x.to(torch.complex128 if x.is_complex() else torch.float64)).abs()
            raise AssertionError(
                f"rank {r}: {who}: local values differ (max abs diff {diff.max().item():.3g}, "
                f"{int((diff != 0).sum())}/{diff.numel()} elements)"
            )
    if check_counts and optimized:
        assert cand.total <= ref.total, (
            f"collective count: {who} {cand.total} {dict(cand.counts)} > torch "
            f"(merge disabled) {ref.total} {dict(ref.counts)}"
        )
    elif check_counts:
        assert cand.total == ref.total, (
            f"collective count: redist_opt {cand.total} {dict(cand.counts)} != torch "
            f"(merge disabled) {ref.total} {dict(ref.counts)}"
        )
        assert cand.counts == ref.counts, (
            f"collective kinds: redist_opt {dict(cand.counts)} != torch (merge "
            f"disabled) {dict(ref.counts)}"
        )


def run_case(case: Case, **extra) -> Outcome:
    return check_case(
        case.mesh,
        case.src,
        case.dst,
        case.shape,
        case.dtype,
        via=case.via,
        pass_mesh=case.pass_mesh,
        dst_as_strings=case.dst_as_strings,
        redistribute_kwargs=dict(case.kwargs),
        **extra,
    )


def oracle_only(case: Case) -> Outcome:
    """Run only the oracle (+ sanity) for a case; used by the harness self-test."""
    f = MESHES[case.mesh]
    ensure_fake_pg()
    src_p = [parse_placement(p) for p in case.src]
    dst_p = [parse_placement(p) for p in case.dst]
    seed = case_seed(f.name, tuple(map(pstr, src_p)), tuple(map(pstr, dst_p)),
                     tuple(case.shape), str(case.dtype))
    with LocalTensorMode(f.nranks) as lm:
        mesh = get_mesh(f, lm)
        inp = build_input(mesh, lm, src_p, case.shape, case.dtype, seed, mesh_coordinates(f, lm))
        ref = run_oracle(inp, dst_p, **dict(case.kwargs))
    _assert_input_unchanged(inp, "torch (oracle)")
    if ref.error is None and f.global_check:
        oracle_sanity(inp, ref.out, case.shape, dst_p)
    return ref
