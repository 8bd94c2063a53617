"""The meshes the differential tests simulate, each built once per process.

``ensure_fake_pg`` initialises the ``fake`` default process group (every
simulated rank lives in this one process); ``MESHES`` names every mesh the
cases use (1-D to 4-D, size-1 dims, explicit, permuted and reversed rank
tensors, submeshes, ``_unflatten`` views, flattened groups); ``get_mesh`` and
``mesh_coordinates`` build a mesh and its ranks' coordinates once and hand them
to every new ``LocalTensorMode``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed._local_tensor import LocalTensorMode, _int_on_rank
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

# Size of the fake default process group. It has to cover the largest mesh a
# test builds (2x2x2x2 = 16 ranks in test_rank_free); smaller meshes are
# simulated with a LocalTensorMode over exactly their own ranks.
WORLD_SIZE = 16


def ensure_fake_pg(world_size: int = WORLD_SIZE) -> None:
    if dist.is_initialized():
        ws = dist.get_world_size()
        if ws < world_size:
            raise RuntimeError(
                f"default process group already initialised with world size {ws} < {world_size}"
            )
        return
    dist.init_process_group("fake", rank=0, world_size=world_size)


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
        MeshFactory("explicit2x2", 4, _explicit(lambda: torch.arange(4).reshape(2, 2))),
        MeshFactory("explicit3x2", 6, _explicit(lambda: torch.arange(6).reshape(3, 2), ("r", "c"))),
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
        MeshFactory("flat_ac_of_2x2x2", 8, _flattened((2, 2, 2), ("a", "b", "c"), ("a", "c"), "ac")),
        # roots with flattened meshes, so groups="existing" plans merge collectives
        MeshFactory("2x2_ab", 4, _init_flattened((2, 2), ("a", "b"), ["ab"])),
        MeshFactory("3x2_ab", 6, _init_flattened((3, 2), ("a", "b"), ["ab"])),
        MeshFactory(
            "2x2x2_ab_ac_bc_abc",
            8,
            _init_flattened((2, 2, 2), ("a", "b", "c"), ["ab", "ac", "bc", "abc"]),
        ),
        MeshFactory("2x2x2x2_bcd_cd", 16, _init_flattened((2, 2, 2, 2), ("a", "b", "c", "d"), ["bcd", "cd"])),
        MeshFactory(
            "2x2x2x2_ab_cd_abcd",
            16,
            _init_flattened((2, 2, 2, 2), ("a", "b", "c", "d"), ["ab", "cd", "abcd"]),
        ),
    ]
}


def rank_coordinates(mesh: DeviceMesh, lm: LocalTensorMode) -> dict[int, tuple[int, ...]]:
    """Each simulated rank's coordinate in ``mesh`` (must run inside ``lm``)."""
    coords = mesh.get_coordinate()
    assert coords is not None
    return {
        r: tuple(_int_on_rank(c.node if isinstance(c, torch.SymInt) else c, r) for c in coords)
        for r in lm.ranks
    }
