"""Live DeviceMesh facts read through the one boundary (redist_opt.torch_api.mesh)
and given meaning by redist_opt.ir.layout, with the flattened meshes redist_opt
builds (redist_opt.runtime.flattened_meshes), on the ``fake`` process group (rank 0):
layouts, flattened meshes (torch's and redist_opt's), group names, and torch
2.15's ``preserve_rank_order``. Every test but the 2.15 ones holds on every torch
of the range (2.11's pycute-based mesh layouts included).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from redist_opt.api import specs
from redist_opt.api.specs import as_spec
from redist_opt.ir import c10d_backends
from redist_opt.ir import layout as L
from redist_opt.ir.layout_algebra import FlatLayout, collapse, row_major
from redist_opt.ir.mesh import MeshSpec
from redist_opt.ir.placements import RedistributeError
from redist_opt.runtime.flattened_meshes import create_flattened_mesh, forget_flattened_mesh
from redist_opt.torch_api import mesh as tm
from redist_opt.torch_api.version import TorchAPIError

needs_preserve_rank_order = pytest.mark.skipif(
    not tm.PRESERVE_RANK_ORDER,
    reason=f"torch {torch.__version__}'s DeviceMesh has no preserve_rank_order (torch 2.15 adds it)",
)


def _mesh(names=("a", "b", "c"), **kwargs) -> DeviceMesh:
    return DeviceMesh("cpu", torch.arange(8).view(2, 2, 2), mesh_dim_names=names, **kwargs)


def test_every_declared_private_name_resolves_on_this_torch():
    for entry in tm.PRIVATE_NAMES:
        if entry.expected:
            entry.get()
        else:
            with pytest.raises(TorchAPIError, match=entry.path):
                entry.get()


def test_a_root_mesh_reads_as_row_major_layouts():
    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("a", "b", "c"))
    assert tm.dim_sizes_strides(mesh) == (((2,), (4,)), ((2,), (2,)), ((2,), (1,)))
    assert L.device_mesh_dim_layouts(mesh) == row_major((2, 2, 2))
    assert tm.rank_map(mesh) == tuple(range(8))
    assert L.root_index_space(tm.internals(mesh)) == 8 and L.ranks_ascending(tm.internals(mesh))
    assert tm.root_mesh(mesh) is mesh and L.is_full_view(tm.internals(mesh))
    assert len(L.dim_group_names(mesh)) == 3 and L.root_group_names(mesh) == L.dim_group_names(mesh)
    assert tm.rank_in_mesh(mesh)
    spec = MeshSpec.from_device_mesh(mesh)
    assert as_spec(mesh) == spec
    with pytest.raises(RedistributeError, match="expected a DeviceMesh or MeshSpec, got object"):
        as_spec(object())
    assert spec.dim_layouts == row_major((2, 2, 2)) and spec.index_space == 8
    assert not spec.preserve_rank_order


def test_a_submesh_is_read_in_its_roots_index_space():
    mesh = _mesh()
    sub = mesh["a", "c"]
    assert L.device_mesh_dim_layouts(sub) == (FlatLayout((2,), (4,)), FlatLayout((2,), (1,)))
    assert tm.root_mesh(sub) is mesh and L.root_index_space(tm.internals(sub)) == 8
    assert L.root_dims_spanned(tm.internals(sub)) == (0, 2) and not L.is_full_view(tm.internals(sub))
    assert L.dims_spanned(mesh["a", "b"], mesh["b"]) == (1,)
    assert (
        L.view_key(tm.internals(sub))
        == L.view_key(tm.internals(mesh["a", "c"]))
        != L.view_key(tm.internals(mesh["a", "b"]))
    )
    assert L.mesh_meaning(sub) == L.mesh_meaning(mesh["a", "c"]) != L.mesh_meaning(mesh["a", "b"])


def test_torchs_flattened_mesh_is_found_by_its_layout():
    mesh = _mesh()
    flat = tm.flatten(mesh["a", "c"], "a_c")  # torch's own _flatten
    ac = FlatLayout((2, 2), (4, 1))
    assert tm.dim_sizes_strides(flat) == (((2, 2), (4, 1)),)  # 2.11 nests it, 2.13 keeps a _FlatLayout
    assert L.flatten_mapping_layouts(tm.internals(mesh)) == frozenset({ac})
    assert L.known_communicators(tm.internals(mesh))[ac] == (flat, 0)
    assert L.flattened_dims(tm.internals(mesh)) == [("a_c", flat, (0, 2))]
    assert tm.flattened_meshes(mesh) == {"a_c": flat} and tm.flattened_count(mesh) == 1
    assert not L.is_full_view(tm.internals(flat))
    assert ac in MeshSpec.from_device_mesh(mesh["a", "b"]).flattened_layouts


def test_known_communicators_hold_the_world_and_the_roots_dims():
    mesh = init_device_mesh("cpu", (2, 2, 2, 2))  # the fake world's 16 ranks, in order
    found = L.known_communicators(tm.internals(mesh))
    assert found[FlatLayout((16,), (1,))] == ("world", None)
    assert [found[lay] for lay in row_major((2, 2, 2, 2))] == [(mesh, d) for d in range(4)]


def test_create_flattened_mesh_builds_what_torchs_flatten_builds():
    mesh = _mesh()
    ac = collapse([L.device_mesh_dim_layouts(mesh)[d] for d in (0, 2)])
    assert ac not in specs.spec_of(mesh).flattened_layouts
    flat = create_flattened_mesh(mesh, ac)
    assert ac in specs.spec_of(mesh).flattened_layouts  # the cached facts are read again
    assert create_flattened_mesh(mesh, ac) is flat  # found again by name and layout
    assert tm.root_mesh(flat) is mesh and L.known_communicators(tm.internals(mesh))[ac] == (flat, 0)
    assert dist.get_process_group_ranks(flat.get_group()) == [0, 1, 4, 5]  # rank 0's tile, ascending
    assert tm.dim_sizes_strides(flat) == tm.dim_sizes_strides(mesh["a", "c"]._flatten("a_c"))
    forget_flattened_mesh(mesh, ac)
    assert [name for name in tm.flattened_meshes(mesh) if name.startswith("redist_opt_")] == []


def test_a_mesh_without_groups_is_told_from_a_missing_name():
    mesh = _mesh()
    bare = tm.new_flattened_mesh(mesh, (4,), (2,), "bare", init_backend=False)
    assert tm.dim_group_names(bare) is None  # never initialized: a state, not a missing name
    assert L.dim_group_names(bare) == ()
    pg = mesh["a", "b"]._flatten("a_b").get_group()
    tm.attach_process_group(mesh, bare, pg)
    assert tm.dim_group_names(bare) == (pg.group_name,)
    assert bare.get_group() is pg


def test_rank_order_sorts_unless_the_mesh_preserves_it():
    spec = MeshSpec((2, 2, 2))
    assert spec.rank_order((2, 0)) == (0, 2)  # c10d sorts: ascending global rank
    assert MeshSpec((2, 2, 2), preserve_rank_order=True).rank_order((2, 0)) == (2, 0)
    assert MeshSpec((2, 1, 2), preserve_rank_order=True).rank_order((2, 1, 0)) == (2, 0)
    assert MeshSpec((2, 2), ranks_ascending=False, preserve_rank_order=True).rank_order((1, 0)) == (1, 0)
    assert hash(spec) != hash(MeshSpec((2, 2, 2), preserve_rank_order=True))


@needs_preserve_rank_order
def test_preserve_rank_order_is_read_and_carried_by_our_flattened_meshes():
    mesh = _mesh(preserve_rank_order=True)
    assert tm.preserves_rank_order(mesh) and MeshSpec.from_device_mesh(mesh["a", "c"]).preserve_rank_order
    spec = MeshSpec.from_device_mesh(mesh)
    assert spec.preserve_rank_order and spec.rank_order((2, 0)) == (2, 0)
    ca = spec.group((2, 0)).layout
    flat = create_flattened_mesh(mesh, ca)
    assert tm.preserves_rank_order(flat)
    # torch 2.15 keeps the layout's order in the group: c slowest, then a.
    assert dist.get_process_group_ranks(flat.get_group()) == [0, 4, 1, 5]
    forget_flattened_mesh(mesh, ca)


@needs_preserve_rank_order
def test_preserve_rank_order_over_a_permuted_rank_map_matches_torchs_own_groups():
    # Rank map [0, 4, 2, 6, 1, 5, 3, 7]: not ascending, so a sorted group's order is
    # unknown in dims, but a preserved one lists the rank map in layout order.
    mesh = DeviceMesh(
        "cpu",
        torch.arange(8).view(2, 2, 2).permute(2, 1, 0),
        mesh_dim_names=("x", "y", "z"),
        preserve_rank_order=True,
    )
    spec = MeshSpec.from_device_mesh(mesh)
    assert not spec.ranks_ascending and spec.rank_order((0, 2)) == (0, 2)
    torch_flat = mesh["x", "z"]._flatten("x_z")
    assert dist.get_process_group_ranks(torch_flat.get_group()) == [0, 4, 1, 5]
    ours = create_flattened_mesh(mesh, spec.group((0, 2)).layout)
    assert dist.get_process_group_ranks(ours.get_group()) == [0, 4, 1, 5]
    assert MeshSpec((2, 2, 2), ranks_ascending=False).rank_order((0, 2)) is None  # sorted: unknown


@needs_preserve_rank_order
def test_without_preserve_rank_order_the_same_group_is_sorted():
    mesh = _mesh()
    assert not tm.preserves_rank_order(mesh)
    ca = MeshSpec.from_device_mesh(mesh).group((2, 0)).layout
    flat = create_flattened_mesh(mesh, ca)
    assert not tm.preserves_rank_order(flat)
    assert dist.get_process_group_ranks(flat.get_group()) == [0, 1, 4, 5]
    forget_flattened_mesh(mesh, ca)


def test_group_names_and_backend_are_read_without_get_group_while_compiling(monkeypatch):
    # While torch.compile traces, torch 2.15's DeviceMesh.get_group looks a group up in the
    # root mesh's registry, which a copy of an unflattened view does not carry ("PG 5 was
    # not found while torch.compile tracing"): Dynamo and AOTAutograd hand the graph pass
    # such copies. redist_opt reads a dim's group name as funcol does and resolves the
    # group by name, so it reads the same facts from the view and from its copy.
    import copy

    from redist_opt.graph.cache_key import _group_names

    world = DeviceMesh("cpu", torch.arange(8), mesh_dim_names=("world",))
    view = world._unflatten(0, (2, 2, 2), ("dp", "cp", "tp"))
    tm.flatten(view["cp", "tp"], "cp_tp")
    facts = [(L.group_name(view, d), c10d_backends.process_group_backend(view)) for d in range(3)]
    key = _group_names(view)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    twin = copy.deepcopy(view)
    assert [(L.group_name(twin, d), c10d_backends.process_group_backend(twin)) for d in range(3)] == facts
    assert _group_names(twin) == key and len(key) > 3  # the dims and the flattened meshes
    assert facts[0] == (tm.dim_group_names(view)[0], dist.get_backend())
    with pytest.raises(RuntimeError, match="no process group for dim 3"):
        L.group_name(view, 3)


def test_a_rank_outside_the_mesh_has_no_backend_to_read():
    # rank 0 is in none of the mesh's groups: it issues none of its collectives, and there is
    # no group whose backend it could read (a member raises rather than guess)
    outside = DeviceMesh("cpu", torch.arange(1, 5), mesh_dim_names=("x",))
    assert not tm.rank_in_mesh(outside)
    assert c10d_backends.process_group_backend(outside) is None
    with pytest.raises(RuntimeError, match="no process group for dim 0 on rank 0"):
        L.group_name(outside, 0)
