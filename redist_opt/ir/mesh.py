"""Rank-free mesh model: ``MeshSpec`` and ``MeshGroup``.

A ``MeshSpec`` is what planning needs to know about a DeviceMesh and nothing
more: the size and name of each dim, each dim's layout in the root mesh's rank
index space, and which multi-dim groups already exist as flattened meshes. It
holds no process group and no per-rank structure, so a plan for 131072 ranks is
pure arithmetic.

A ``MeshGroup`` is the identity of a communicator: the collapsed layout of a set
of mesh dims taken in a given order (first dim slowest). Two groups are equal
exactly when their collapsed layouts are equal, i.e. when they contain the same
ranks in the same order, whatever process group or mesh dim they came from.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

from redist_opt.ir import c10d_backends
from redist_opt.ir import layout as L
from redist_opt.ir.layout_algebra import FlatLayout, collapse, row_major
from redist_opt.ir.placements import RedistributeError
from redist_opt.torch_api import mesh as tm

__all__ = ["MeshSpec", "MeshGroup"]


@dataclasses.dataclass(frozen=True)
class MeshGroup:
    """A communicator over ``dims`` of a mesh, identified by its collapsed layout."""

    dims: tuple[int, ...]
    sizes: tuple[int, ...]
    layout: FlatLayout

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MeshGroup) and self.layout == other.layout

    def __hash__(self) -> int:
        return hash(self.layout)

    @property
    def size(self) -> int:
        return math.prod(self.sizes)

    def index_of(self, coords: Sequence[int]) -> int:
        """The executing rank's position in the group (row-major over ``dims``)."""
        idx = 0
        for d, n in zip(self.dims, self.sizes):
            idx = idx * n + coords[d]
        return idx

    def name(self, spec: MeshSpec) -> str:
        return "+".join(spec.dim_name(d) for d in self.dims)

    def __repr__(self) -> str:
        # Valid Python syntax: fx code generation prints node args with repr().
        return f"MeshGroup(dims={self.dims}, layout='{L.format_layout(self.layout)}')"


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    """Sizes, names and layouts of a mesh's dims, and the flattened groups that exist.

    Build one from a live mesh with :meth:`from_device_mesh`, or from sizes alone
    to plan without any process group::

        MeshSpec(sizes=(8, 16, 32, 32), names=("pp", "dp", "cp", "tp"),
                 flattened=[("dp", "cp")])
    """

    sizes: tuple[int, ...]
    names: tuple[str, ...] | None = None
    flattened: tuple = ()
    dim_layouts: tuple | None = None
    index_space: int | None = None
    # The process-group backend of the mesh's groups ("gloo", "nccl", "fake", ...), None
    # when unknown (rank-free specs); picks the cost profile (``redist_opt.ir.cost.resolve``).
    backend: str | None = None
    # Whether the root's rank map lists global ranks in ascending index order (True for
    # init_device_mesh and rank-free specs); see ``rank_order``.
    ranks_ascending: bool = True
    # Whether the mesh's communicators list their ranks in layout order instead of by
    # ascending global rank (torch 2.15's ``DeviceMesh(preserve_rank_order=True)``: c10d
    # then keeps each group's rank order); see ``rank_order``.
    preserve_rank_order: bool = False
    # The groups torch's own merge pass finds (its root's ``_flatten`` meshes; not the
    # world group, not an ``_unflatten`` view's root dims), as ``flattened`` lists them;
    # None: the same as ``flattened``. The collective cap counts torch's plan with these.
    torch_flattened: tuple | None = dataclasses.field(default=None, compare=False)
    # Collapsed layouts of every flattened group that exists, and of those torch's merge
    # pass finds, derived in __post_init__.
    flattened_layouts: frozenset = dataclasses.field(default=frozenset(), compare=False)
    torch_flattened_layouts: frozenset = frozenset()

    def __post_init__(self) -> None:
        sizes = tuple(int(s) for s in self.sizes)
        if not sizes or any(s < 1 for s in sizes):
            raise RedistributeError(f"mesh sizes {self.sizes} must be positive integers")
        object.__setattr__(self, "sizes", sizes)
        if self.names is not None:
            names = tuple(self.names)
            if len(names) != len(sizes):
                raise RedistributeError(
                    f"mesh ({'x'.join(map(str, sizes))}) has {len(sizes)} dims but {len(names)} names {names}"
                )
            if len(set(names)) != len(names):
                raise RedistributeError(f"mesh dim names {names} are not unique")
            object.__setattr__(self, "names", names)
        if self.dim_layouts is None:
            object.__setattr__(self, "dim_layouts", row_major(sizes))
        if self.index_space is None:
            object.__setattr__(self, "index_space", math.prod(sizes))
        object.__setattr__(self, "flattened", tuple(self.flattened))
        object.__setattr__(self, "flattened_layouts", self._layouts_of(self.flattened))
        if self.torch_flattened is not None:
            object.__setattr__(self, "torch_flattened", tuple(self.torch_flattened))
        torch_layouts = (
            self.flattened_layouts if self.torch_flattened is None else self._layouts_of(self.torch_flattened)
        )
        object.__setattr__(self, "torch_flattened_layouts", torch_layouts)
        # Plans are cached by MeshSpec: hash once, not on every lookup.
        object.__setattr__(
            self,
            "_hash",
            hash(
                (
                    self.sizes,
                    self.names,
                    self.dim_layouts,
                    self.index_space,
                    self.flattened_layouts,
                    self.torch_flattened_layouts,
                    self.backend,
                    self.ranks_ascending,
                    self.preserve_rank_order,
                )
            ),
        )

    def _layouts_of(self, groups) -> frozenset:
        """Collapsed layouts of ``groups``: layouts as they are, dim-name groups collapsed."""
        return frozenset(
            g
            if isinstance(g, FlatLayout)
            else collapse([self.dim_layouts[d] for d in sorted(self.dims_of(g))])
            for g in groups
        )

    def __hash__(self) -> int:
        return self._hash

    # -- construction -------------------------------------------------------
    @classmethod
    def from_device_mesh(cls, device_mesh) -> MeshSpec:
        """Read sizes, names, per-dim layouts and existing flattened meshes off a DeviceMesh."""
        return cls.from_internals(tm.internals(device_mesh))

    @classmethod
    def from_internals(cls, internals: tm.MeshInternals) -> MeshSpec:
        """The spec of a DeviceMesh whose internals were read (``torch_api.mesh.internals``)."""
        dim_layouts = L.layouts(internals.dims)
        return cls(
            sizes=tuple(lay.numel() for lay in dim_layouts),
            names=internals.mesh.mesh_dim_names,
            flattened=tuple(L.known_communicators(internals)),
            torch_flattened=tuple(L.flatten_mapping_layouts(internals)),
            dim_layouts=dim_layouts,
            index_space=L.root_index_space(internals),
            backend=c10d_backends.process_group_backend(internals.mesh),
            ranks_ascending=L.ranks_ascending(internals),
            preserve_rank_order=internals.preserves_rank_order,
        )

    # -- queries ------------------------------------------------------------
    def canonical(self) -> tuple[tuple[str, object], ...]:
        """Every field as ``(name, text)``, sets sorted: equal specs give equal values in
        every process and on every rank (a set prints in hash order), so it orders
        meshes deterministically and keys caches."""
        return tuple(
            (f.name, sorted(map(repr, value)) if isinstance(value, (set, frozenset)) else repr(value))
            for f in dataclasses.fields(self)
            for value in [getattr(self, f.name)]
        )

    @property
    def ndim(self) -> int:
        return len(self.sizes)

    @property
    def shape_str(self) -> str:
        if self.names:
            return ",".join(f"{n}={s}" for n, s in zip(self.names, self.sizes))
        return "x".join(str(s) for s in self.sizes)

    @property
    def num_ranks(self) -> int:
        return math.prod(self.sizes)

    def dim_names_by_index(self) -> dict[int, str]:
        """``{dim: name}`` for every dim (its index where the mesh has no names)."""
        return {d: self.dim_name(d) for d in range(self.ndim)}

    def dim_name(self, d: int) -> str:
        return self.names[d] if self.names else str(d)

    def dims_of(self, group: Iterable[int | str] | str) -> tuple[int, ...]:
        """Mesh dim indices of ``("dp", "cp")``, ``"dp+cp"`` or ``(1, 2)``."""
        if isinstance(group, str):
            group = [g for g in group.replace(",", "+").split("+") if g]
        dims = []
        for g in group:
            if isinstance(g, str) and not g.lstrip("-").isdigit():
                if self.names is None:
                    raise RedistributeError(
                        f"mesh dim {g!r} is given by name but the mesh ({self.shape_str}) has no "
                        "dim names: pass names=... or use dim indices"
                    )
                if g not in self.names:
                    raise RedistributeError(f"mesh ({self.shape_str}) has no dim named {g!r}")
                dims.append(self.names.index(g))
            else:
                d = int(g)
                if not 0 <= d < self.ndim:
                    raise RedistributeError(f"mesh ({self.shape_str}) has no dim {d}")
                dims.append(d)
        if len(set(dims)) != len(dims):
            raise RedistributeError(f"mesh dims {tuple(group)} name a dim twice")
        return tuple(dims)

    def group(self, dims: Sequence[int]) -> MeshGroup:
        dims = tuple(dims)
        cache = self.__dict__.setdefault("_groups", {})
        if dims not in cache:
            cache[dims] = MeshGroup(
                dims=dims,
                sizes=tuple(self.sizes[d] for d in dims),
                layout=collapse([self.dim_layouts[d] for d in dims]),
            )
        return cache[dims]

    def rank_order(self, dims: Sequence[int]) -> tuple[int, ...] | None:
        """The order of ``dims`` (size-1 dims dropped) in which a communicator over
        them lists its ranks, or None when no order of whole dims does.

        c10d sorts a new group's ranks, so every communicator (a dim's group, a
        flattened mesh, the world group) ranks its members by ascending global rank:
        as mesh dims, the dims by decreasing stride, when their modes do not
        interleave. On a row-major mesh that is ascending mesh-dim order; on a
        column-major layout the reverse. Layouts index the root's rank map: when that
        map is not ascending (an explicit permuted rank tensor) the order is unknown.

        A mesh that preserves rank order (torch 2.15) creates every group with its
        ranks in the order of its layout over the rank map: the communicator whose
        collapsed layout is that of ``dims`` lists its ranks row-major over ``dims``
        as given, whatever the strides or the rank map.
        """
        real = [d for d in dims if self.sizes[d] > 1]
        if self.preserve_rank_order:
            return tuple(real)
        order = tuple(sorted(real, key=lambda d: (-max(self.dim_layouts[d].stride), d)))
        if len(order) <= 1:
            return order
        if not self.ranks_ascending:
            return None  # layouts index the rank map, whose order we do not model
        layout = self.group(order).layout
        modes = [(s, t) for s, t in zip(layout.shape, layout.stride) if s > 1]
        span = 0  # largest offset the faster modes reach
        for s, t in reversed(modes):
            if t <= span:
                return None
            span += (s - 1) * t
        return order

    def group_exists(self, group: MeshGroup) -> bool:
        """A group exists when it is one mesh dim or some flattened mesh has its layout."""
        if len([d for d in group.dims if self.sizes[d] > 1]) <= 1:
            return True
        return group.layout in self.flattened_layouts

    def with_flattened(self, groups: Iterable) -> MeshSpec:
        """The same mesh with more flattened groups available (created as ``_flatten``
        meshes of the root, so torch's merge pass finds them too)."""
        groups = tuple(groups)
        torch_flattened = None if self.torch_flattened is None else self.torch_flattened + groups
        return dataclasses.replace(self, flattened=self.flattened + groups, torch_flattened=torch_flattened)
