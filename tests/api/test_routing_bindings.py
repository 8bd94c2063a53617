"""enabled() reaches torch's ``redistribute_local_tensor`` wherever a module bound it by
name (found by identity, in modules loaded before the block or while it runs), and
restores every binding exactly on exit, nested and threaded blocks included; entering
a block reads no module again while none was imported."""

from __future__ import annotations

import importlib
import sys
import textwrap
import types

import pytest
import torch
from test_api import _assert_same, _partial_input
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Partial, Replicate
from torch.distributed.tensor.debug import CommDebugMode

import redist_opt
from redist_opt.api import routing
from redist_opt.torch_api import dtensor as tdt

TORCH_FN = tdt.TORCH_REDISTRIBUTE_LOCAL
ROUTED = routing.routed_redistribute_local_tensor

SOURCE = """
from torch.distributed.tensor._redistribute import redistribute_local_tensor
from torch.distributed.tensor._redistribute import redistribute_local_tensor as rlt


def run(dt, placements):
    # what autoparallel's ordered_sharding does: call the name it imported
    from torch.distributed.tensor import DTensor
    from redist_opt.torch_api import dtensor as tdt

    target = tdt.respec(tdt.spec_of_dtensor(dt), placements=placements)
    local = redistribute_local_tensor(tdt.local_tensor_of(dt), tdt.spec_of_dtensor(dt), target)
    return DTensor.from_local(local, dt.device_mesh, placements, run_check=False,
                              shape=dt.shape, stride=dt.stride())
"""


def _load(name: str, tmp_path) -> types.ModuleType:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(SOURCE))
    sys.path.insert(0, str(tmp_path))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))


@pytest.fixture
def user_module(tmp_path):
    mod = _load("user_binds_rlt_before", tmp_path)
    yield mod
    sys.modules.pop(mod.__name__, None)


def _flattened_mesh(lm):
    mesh = DeviceMesh("cpu", torch.arange(8).reshape(2, 2, 2), mesh_dim_names=("a", "b", "c"))
    mesh["a", "c"]._flatten("a_c")
    return mesh, _partial_input(lm, mesh, [Partial()] * 3, (4, 6))


def test_module_bound_before_entry_is_routed_and_restored(user_module):
    assert user_module.redistribute_local_tensor is TORCH_FN and user_module.rlt is TORCH_FN
    with LocalTensorMode(8) as lm:
        mesh, dt = _flattened_mesh(lm)
        with CommDebugMode() as plain:
            expected = user_module.run(dt, [Replicate()] * 3)
        with redist_opt.enabled():
            assert user_module.redistribute_local_tensor is ROUTED and user_module.rlt is ROUTED
            with CommDebugMode() as routed:
                out = user_module.run(dt, [Replicate()] * 3)
        # torch: 3 all_reduces (its merge needs all three dims flattened); ours: 2
        assert plain.get_total_counts() == 3 and routed.get_total_counts() == 2
        _assert_same(out, expected)
    assert user_module.redistribute_local_tensor is TORCH_FN and user_module.rlt is TORCH_FN


def test_nested_blocks_restore_exactly(user_module):
    torch_names = {
        n: importlib.import_module(n).redistribute_local_tensor for n in tdt.REDISTRIBUTE_LOCAL_PATCH_POINTS
    }
    with redist_opt.enabled():
        with redist_opt.enabled(groups="create"):
            assert user_module.rlt is ROUTED
        assert user_module.rlt is ROUTED  # the outer block still routes
    assert user_module.rlt is TORCH_FN and user_module.redistribute_local_tensor is TORCH_FN
    assert {n: importlib.import_module(n).redistribute_local_tensor for n in torch_names} == torch_names
    # redist_opt's own fallback stays torch's function throughout
    assert tdt.TORCH_REDISTRIBUTE_LOCAL is TORCH_FN


def test_module_imported_inside_the_block(tmp_path):
    name = "user_binds_rlt_inside"
    try:
        with redist_opt.enabled():
            mod = _load(name, tmp_path)
            assert mod.redistribute_local_tensor is ROUTED  # torch's own name holds ours
            with redist_opt.enabled():  # nested: no rescan needed, still routed
                assert mod.rlt is ROUTED
        assert mod.redistribute_local_tensor is TORCH_FN and mod.rlt is TORCH_FN
    finally:
        sys.modules.pop(name, None)


def test_module_loaded_after_a_first_block_is_found(tmp_path):
    # a module new since the last block's scan is scanned at the next entry
    with redist_opt.enabled():
        pass
    mod = types.ModuleType("user_late_binding")
    exec("from torch.distributed.tensor._redistribute import redistribute_local_tensor as late", mod.__dict__)
    sys.modules[mod.__name__] = mod
    try:
        with redist_opt.enabled():
            assert mod.late is ROUTED
        assert mod.late is TORCH_FN
    finally:
        sys.modules.pop(mod.__name__, None)


class _CountingModule(types.ModuleType):
    """A module that counts how often its namespace is read."""

    reads = 0

    def __getattribute__(self, name):
        if name == "__dict__":
            type(self).reads += 1
        return super().__getattribute__(name)


def test_entering_a_block_reads_no_module_again_while_none_is_imported():
    probe = _CountingModule("user_counting_probe")
    sys.modules[probe.__name__] = probe
    try:
        with redist_opt.enabled():
            pass
        scanned = _CountingModule.reads
        assert scanned >= 1  # the first block after it was loaded scanned it once
        for _ in range(5):
            with redist_opt.enabled():
                with redist_opt.enabled(groups="create"):
                    pass
        assert _CountingModule.reads == scanned
    finally:
        sys.modules.pop(probe.__name__, None)


def test_outside_blocks_every_binding_is_torchs_function_after_threaded_nested_blocks(user_module):
    import threading

    from torch.distributed.tensor import _redistribute

    patch_points = [importlib.import_module(n) for n in tdt.REDISTRIBUTE_LOCAL_PATCH_POINTS]
    entered, main_left = threading.Barrier(3), threading.Event()

    seen = []

    def worker():
        with redist_opt.enabled():
            entered.wait(10)
            with redist_opt.enabled(groups="create"):
                seen.append(user_module.rlt is ROUTED and routing.active_options().groups == "create")
            main_left.wait(10)  # leave only after the main thread checked

    threads = [threading.Thread(target=worker) for _ in range(2)]
    with redist_opt.enabled():
        for t in threads:
            t.start()
        entered.wait(10)
        assert all(m.redistribute_local_tensor is ROUTED for m in patch_points)
    # the main block left first; the workers' blocks still route
    assert _redistribute.redistribute_local_tensor is ROUTED
    main_left.set()
    for t in threads:
        t.join(10)
    assert seen == [True, True]
    assert routing.active_options() is None
    assert all(m.redistribute_local_tensor is TORCH_FN for m in patch_points)
    assert user_module.redistribute_local_tensor is TORCH_FN and user_module.rlt is TORCH_FN
    # torch's behaviour exactly: the name called outside is torch's own function
    with LocalTensorMode(8) as lm:
        mesh, dt = _flattened_mesh(lm)
        target = tdt.respec(tdt.spec_of_dtensor(dt), placements=[Replicate()] * 3)
        with CommDebugMode() as counts:
            out = _redistribute.redistribute_local_tensor(
                tdt.local_tensor_of(dt), tdt.spec_of_dtensor(dt), target
            )
        assert counts.get_total_counts() == 3
        expected = TORCH_FN(tdt.local_tensor_of(dt), tdt.spec_of_dtensor(dt), target)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_someone_elses_later_patch_is_left_in_place(user_module):
    def theirs(*args, **kwargs):
        return TORCH_FN(*args, **kwargs)

    with redist_opt.enabled():
        user_module.rlt = theirs
    assert user_module.rlt is theirs
    assert user_module.redistribute_local_tensor is TORCH_FN
