"""The boundary's release-dependent behaviour, checked on whichever torch runs the tests.

Each release-specific branch of ``redist_opt.torch_api`` is exercised on every
release where it can be: 2.11's ``tensor_map`` and post-grad pass chain are plain
code over names every release has, so they run (and are compared with the newer
release's own function) everywhere.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import types
import warnings

import pytest
import torch
import torch.distributed as dist
from support.meshes import ensure_fake_pg
from torch._inductor import config as inductor_config
from torch.distributed._local_tensor import LocalTensor, LocalTensorMode

from redist_opt.torch_api import c10d, dtensor, inductor, local_tensor, mesh, tracing
from redist_opt.torch_api.version import TorchAPIError, at_least, has_private


@pytest.fixture(scope="module", autouse=True)
def _fake_pg():
    ensure_fake_pg()


# -- every private name bound at import, loudly ----------------------------------------------


def test_each_required_private_name_removed_fails_the_import_naming_it_and_the_version():
    """Each name the installed release should have, taken out of torch before the
    boundary is imported (tests/support/removed_private_names.py, one process for all):
    the import raises TorchAPIError naming it and the torch version. With
    ``_gen_transform_infos`` gone, ``import redist_opt`` itself raises."""
    from support.removed_private_names import WHOLE_PACKAGE

    root = pathlib.Path(__file__).resolve().parent.parent
    script = root / "tests" / "support" / "removed_private_names.py"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr[-4000:]
    outcomes = json.loads(run.stdout.strip().splitlines()[-1])
    # what cannot be taken out of torch: ops (their namespace makes them again) and config entries
    kept = [p for p, (outcome, _) in outcomes.items() if outcome == "kept"]
    assert all(p.startswith("torch.ops.") or p.rsplit(".", 1)[0].endswith("config") for p in kept), kept
    assert len(outcomes) - len(kept) > 50
    wrong = {
        path: outcome
        for path, (outcome, message) in outcomes.items()
        if outcome != "kept"
        and not (
            outcome == "TorchAPIError"
            and path.rpartition(": ")[2] in message
            and torch.__version__ in message
        )
    }
    assert not wrong, wrong
    for path in WHOLE_PACKAGE:
        assert outcomes[f"import redist_opt: {path}"][0] == "TorchAPIError"


def test_version_gates_are_their_declarations_release_ranges():
    """A boundary's release switch is its declaration's ``since`` / ``until``, never the
    presence of the name (tests/test_package_structure.py checks each declaration
    against presence on the installed torch)."""
    gates = [
        (dtensor.ZERO_FILLS_SHARD_TO_PARTIAL, dtensor._SHARD_TO_PARTIAL),
        (mesh.FLAT_LAYOUTS, mesh._FLAT_LAYOUT),
        (mesh.PRESERVE_RANK_ORDER, mesh._PRESERVE_RANK_ORDER),
        (c10d.all_gather_single.__name__ == "all_gather_single", c10d._ALL_GATHER_SINGLE),
        (c10d.reduce_scatter_single.__name__ == "reduce_scatter_single", c10d._REDUCE_SCATTER_SINGLE),
        (local_tensor._tensor_map is not local_tensor._tensor_map_2_11, local_tensor._TENSOR_MAP),
    ]
    for gate, declaration in gates:
        assert declaration.since is not None or declaration.until is not None, declaration.path
        assert gate == declaration.expected, declaration.path


# -- LocalTensorMode ---------------------------------------------------------------------------


def _per_rank(values: dict) -> LocalTensor:
    return LocalTensor({r: torch.tensor([float(v)]) for r, v in values.items()})


@pytest.mark.parametrize("tensor_map", [local_tensor.map_per_rank, local_tensor._tensor_map_2_11])
def test_map_per_rank_calls_fn_on_each_simulated_rank(tensor_map):
    with LocalTensorMode(4):
        x = _per_rank({0: 1, 1: 2, 2: 3, 3: 4})
        y = tensor_map(x, lambda rank, t: t * 10 + rank)
        assert local_tensor.is_per_rank(y)
        got = {r: t.item() for r, t in local_tensor.per_rank_tensors(y).items()}
    assert got == {0: 10.0, 1: 21.0, 2: 32.0, 3: 43.0}


def test_2_11_tensor_map_is_the_newer_releases_own():
    if not has_private("torch.distributed._local_tensor", "tensor_map"):
        pytest.skip("this torch has no _local_tensor.tensor_map to compare with (2.11)")
    from torch.distributed._local_tensor import tensor_map

    def fn(rank, t):
        return t + rank

    with LocalTensorMode(2):
        x = _per_rank({0: 5, 1: 7})
        ours, theirs = local_tensor._tensor_map_2_11(x, fn), tensor_map(x, fn)
        assert local_tensor.per_rank_tensors(ours).keys() == local_tensor.per_rank_tensors(theirs).keys()
        for r, t in local_tensor.per_rank_tensors(ours).items():
            assert torch.equal(t, local_tensor.per_rank_tensors(theirs)[r])
    # outside the mode: this rank's value
    assert local_tensor._tensor_map_2_11(torch.ones(1), fn).item() == 1 + dist.get_rank()


def test_per_rank_ints_of_a_coordinate():
    with LocalTensorMode(4):
        mesh = torch.distributed.device_mesh.init_device_mesh("cpu", (2, 2))
        c0 = mesh.get_coordinate()[0]
        assert local_tensor.ints_on_every_rank(c0) == (0, 0, 1, 1)
        assert [local_tensor.int_on_rank(c0, r) for r in range(4)] == [0, 0, 1, 1]
    assert local_tensor.ints_on_every_rank(3) == (3,)
    assert local_tensor.per_rank_tensors(torch.ones(1)) is None


# -- Inductor's post-grad pass hook --------------------------------------------------------------


class _Pass(inductor.CustomGraphPass):
    def __init__(self, name, log, uuid="u"):
        self.name, self.log, self._uuid = name, log, uuid

    def __call__(self, graph) -> None:
        self.log.append(self.name)

    def uuid(self):
        return self._uuid


def test_our_pass_alone_when_the_user_set_none():
    mark = _Pass("ours", [])
    with inductor_config.patch(post_grad_custom_post_pass=None):
        assert inductor.post_grad_passes_with(mark) is mark


def test_our_pass_runs_after_the_users():
    log = []
    user, mark = _Pass("user", log, "user-uuid"), _Pass("ours", log, "our-uuid")
    with inductor_config.patch(post_grad_custom_post_pass=user):
        value = inductor.post_grad_passes_with(mark)
    if at_least(2, 13):  # a list of passes, run in order
        assert value == [user, mark]
    else:  # one pass standing for both
        assert isinstance(value, inductor._Chain)
        value(torch.fx.Graph())
        assert log == ["user", "ours"]
        assert value.uuid() == ("redist_opt.chain", "user-uuid", "our-uuid")


def test_the_2_11_chain_keys_both_passes_or_keeps_out_of_the_cache():
    log = []
    chain = inductor._Chain(_Pass("user", log, "a"), _Pass("ours", log, "b"))
    chain(torch.fx.Graph())
    assert log == ["user", "ours"]
    assert chain.uuid() == ("redist_opt.chain", "a", "b")
    # a user's pass without a uuid (a plain callable, or uuid() None): no key, so
    # Inductor keeps the compile out of its FX graph cache, as it does for that pass alone
    assert inductor._Chain(lambda graph: None, _Pass("ours", log)).uuid() is None
    assert inductor._Chain(_Pass("user", log, None), _Pass("ours", log)).uuid() is None


# -- Inductor's bucketing ------------------------------------------------------------------------


def test_reduce_scatter_merge_argument_order_is_read_off_the_signature():
    def older(rs_ins, group_size, group_name, reduce_op, reduce_dtype, device): ...

    def newer(rs_ins, group_name, group_size, reduce_op, reduce_dtype, device): ...

    def unknown(rs_ins, group, size, reduce_op, reduce_dtype, device): ...

    assert inductor._reduce_scatter_takes_size_first(older)
    assert not inductor._reduce_scatter_takes_size_first(newer)
    with pytest.raises(TorchAPIError, match="unknown parameters"):
        inductor._reduce_scatter_takes_size_first(unknown)
    installed = inductor._RS_MERGE.get()
    assert inductor._reduce_scatter_takes_size_first(installed) == (not at_least(2, 13))


# -- compile_on_one_rank -------------------------------------------------------------------------


def test_compile_on_one_rank_is_read_where_this_torch_keeps_it_without_a_warning():
    if at_least(2, 14):
        import torch.compiler.config as config
    else:
        import torch.distributed.config as config
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert inductor.compile_on_one_rank() is False
        with config.patch(compile_on_one_rank=True):
            assert inductor.compile_on_one_rank() is True
    assert inductor.compile_on_one_rank_config() is config


def test_separate_compiles_turns_the_caches_off_and_restores_them():
    import torch._dynamo.config as dynamo_config
    import torch._functorch.config as functorch_config

    before = (
        inductor_config.fx_graph_cache,
        inductor_config.compile_threads,
        functorch_config.enable_autograd_cache,
        dynamo_config.recompile_limit,
    )
    with inductor.separate_compiles(compile_threads=1):
        assert (inductor_config.fx_graph_cache, functorch_config.enable_autograd_cache) == (False, False)
        assert (inductor_config.compile_threads, dynamo_config.recompile_limit) == (1, 64)
        assert dynamo_config.accumulated_recompile_limit >= 64 * 16
    with inductor.separate_compiles():  # Inductor's own compile workers
        assert inductor_config.compile_threads == before[1]
    after = (
        inductor_config.fx_graph_cache,
        inductor_config.compile_threads,
        functorch_config.enable_autograd_cache,
        dynamo_config.recompile_limit,
    )
    assert after == before


# -- patch points and dispatch modes -------------------------------------------------------------


def test_patch_points_are_loud():
    assert (
        len(dtensor.patch_point_modules(dtensor.REDISTRIBUTE_LOCAL_PATCH_POINTS, "redistribute_local_tensor"))
        == 4
    )
    with pytest.raises(TorchAPIError, match="redistribute_local_tensor"):
        dtensor.patch_point_modules(["torch.distributed.tensor._ops.utils"], "redistribute_local_tensor")
    with pytest.raises(TorchAPIError, match="torch.distributed.tensor._no_such_module"):
        dtensor.patch_point_modules(["torch.distributed.tensor._no_such_module"], "redistribute_cost")


def test_an_infra_dispatch_mode_is_one_dynamo_leaves_compiled_frames_to():
    from torch.utils._python_dispatch import any_torch_dispatch_mode_on_stack

    class Seen(tracing.InfraDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Seen():
        torch.ones(1) + 1
        assert not any_torch_dispatch_mode_on_stack()


def test_op_names_of_traced_targets():
    assert tracing.op_name(c10d.ALL_REDUCE) == "all_reduce"
    assert c10d.ALL_REDUCE.namespace in c10d.FUNCTIONAL_NAMESPACES
    assert tracing.op_name(torch.add) is None
    assert tracing.op_name(types.SimpleNamespace(_opname="x")) is None


def test_dynamo_records_a_redistribute_as_a_source_the_boundary_recognises():
    """2.11's Dynamo records ``DTensor.redistribute`` as a closure named
    ``prim_redistribute``, 2.12 on as the method name: the slice DTensor traces for
    ``R -> S(0)`` carries one of them in ``source_fn_stack`` (what the graph pass trusts)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    sources = []

    def capture(gm, example_inputs):
        sources.extend(t for n in gm.graph.nodes for _, t in n.meta.get("source_fn_stack", ()) or ())
        return gm

    def f(x):
        return (
            DTensor.from_local(x, mesh, [Replicate()], run_check=False)
            .redistribute(mesh, [Shard(0)])
            .to_local()
        )

    torch._dynamo.reset()
    try:
        torch.compile(f, backend=aot_autograd(fw_compiler=capture), fullgraph=True)(
            torch.ones(2 * mesh.size(), 2)
        )
    finally:
        torch._dynamo.reset()
    assert any(tracing.is_redistribute_source(t) for t in sources), sources
    assert not tracing.is_redistribute_source("split") and not tracing.is_redistribute_source(torch.add)


def test_the_docs_table_lists_every_declared_private_name_and_no_other():
    """docs/architecture.md's table of private names is the declarations' table: each
    boundary module's ``PRIVATE_NAMES`` appear there under that module with the
    releases they declare, and the table names nothing no boundary declares."""
    import importlib
    import pathlib
    import pkgutil
    import re

    import redist_opt.torch_api

    declared = set()
    for info in pkgutil.iter_modules(redist_opt.torch_api.__path__):
        module = importlib.import_module(f"redist_opt.torch_api.{info.name}")
        for d in getattr(module, "PRIVATE_NAMES", ()):
            name = d.path + (" (instance attribute)" if d.instance else "")
            declared.add((name, f"torch_api/{info.name}.py", d.releases()))
    doc = (pathlib.Path(__file__).parent.parent / "docs" / "architecture.md").read_text()
    row = re.compile(r"^\| `([^`]+)` \| `(torch_api/[a-z0-9_]+\.py)` \| ([^|]+?) \|", re.MULTILINE)
    listed = {(m.group(1), m.group(2), m.group(3).strip()) for m in row.finditer(doc)}
    assert declared, "no boundary module declares PRIVATE_NAMES"
    assert sorted(declared - listed) == [], "declared but not in docs/architecture.md"
    assert sorted(listed - declared) == [], "in docs/architecture.md but declared by no boundary"
