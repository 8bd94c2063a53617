"""``redist_opt.graph_pass.compiler_fn`` as aot_autograd's ``fw_compiler`` / ``bw_compiler``.

DTensor programs are traced on this process's fake rank (rank 0 of the session's
fake process group) by aot_autograd, which hands each forward / backward graph
to the compiler. Collective counts are read before and after the pass; then
the graph as traced and the graph the pass rewrote are both run on 8 simulated
ranks (LocalTensorMode) and their outputs compared. A traced graph is rank 0's
program (its block indices are rank 0's), so where an output depends on the
rank's block, rank 0's output is compared.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.fx as fx
from functorch.compile import aot_function, make_boxed_func
from torch._dynamo.backends.common import aot_autograd
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

import redist_opt
from redist_opt.api import errors
from redist_opt.graph import optimize as optimize_module
from redist_opt.graph_pass import compiler_fn, count_collectives


@pytest.fixture(scope="module")
def mesh24():
    mesh = DeviceMesh("cpu", torch.arange(8).view(2, 4), mesh_dim_names=("dp", "tp"))
    return mesh


@pytest.fixture(scope="module")
def mesh24_flat():
    mesh = DeviceMesh("cpu", torch.arange(8).view(2, 4), mesh_dim_names=("dp", "tp"))
    mesh["dp", "tp"]._flatten("dp_tp")
    return mesh


def replicate_then_shard(mesh):
    tp = mesh["tp"]

    def f(x):
        d = DTensor.from_local(x, tp, [Partial()], run_check=False)
        d = d.redistribute(tp, [Replicate()]) * 2 + 1
        return d.redistribute(tp, [Shard(0)]).to_local()

    return f


def reduce_everywhere(mesh):
    """P,P -> R,P -> R,R in two redistributions: two all_reduces as traced."""

    def f(x):
        d = DTensor.from_local(x, mesh, [Partial(), Partial()], run_check=False)
        d = d.redistribute(mesh, [Replicate(), Partial()])
        return d.redistribute(mesh, [Replicate(), Replicate()]).to_local() * 3

    return f


class Captured:
    """A fw/bw compiler around ``compiler_fn``: keeps each graph as traced and as rewritten."""

    def __init__(self, inner_compiler):
        self.inner_compiler = inner_compiler
        self.graphs: list[tuple[fx.GraphModule, fx.GraphModule, dict, dict]] = []

    def __call__(self, gm, example_inputs, **kwargs):
        traced = copy.deepcopy(gm)
        before = count_collectives(gm)
        compiled = self.inner_compiler(gm, example_inputs, **kwargs)
        self.graphs.append((traced, gm, before, count_collectives(gm)))
        return compiled


def _int_input(lm, shape):
    return lm.rank_map(lambda r: (torch.arange(torch.Size(shape).numel()).view(shape) % 5 + r).float())


def _run_on_ranks(gm, shape):
    """Run ``gm``'s graph on 8 simulated ranks; {rank: output}. The first input is
    the program's tensor; Dynamo's graphs may take more (an opaque process-group
    object the graph does not use): None for those. Run by an Interpreter, node by
    node, whatever calling convention an inner compiler gave the module."""
    n = sum(1 for node in gm.graph.nodes if node.op == "placeholder")
    with LocalTensorMode(8) as lm:
        out = fx.Interpreter(gm).run(_int_input(lm, shape), *[None] * (n - 1))
        out = out[0] if isinstance(out, (tuple, list)) else out
        return {r: t.clone() for r, t in out._local_tensors.items()}


def _compile(fn, fw_compiler, x):
    """``torch.compile`` with an aot_autograd backend: Dynamo records the
    redistributions (their graphs carry the metadata the pass reads), aot_autograd
    hands the forward graph to ``fw_compiler``."""
    import torch._dynamo

    torch._dynamo.reset()
    try:
        return torch.compile(fn, backend=aot_autograd(fw_compiler=fw_compiler), fullgraph=True)(x)
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("inner", [None, "aot_eager"])
def test_fw_compiler_rewrites_and_outputs_equal(mesh24, inner):
    # P -> R, ops, -> S(0) on tp: DTensor traces all_reduce + a slice of this rank's
    # block; the pass makes it one reduce_scatter (the ops move after it).
    fw = Captured(compiler_fn(meshes=mesh24, inner=inner))
    out = _compile(replicate_then_shard(mesh24), fw, torch.ones(8, 4))  # runs on the fake rank
    assert out.shape == (2, 4)
    ((traced, rewritten, before, after),) = fw.graphs
    assert before == {"all_reduce": 1}
    assert after == {"reduce_scatter": 1}
    ref, got = _run_on_ranks(traced, (8, 4)), _run_on_ranks(rewritten, (8, 4))
    assert torch.equal(ref[0], got[0])


def test_merged_group_all_ranks_equal(mesh24_flat):
    # P,P -> R,P -> R,R on 2x4 with a dp+tp group: DTensor traces two all_reduces, the
    # pass makes them one over dp+tp; no rank-dependent block, so every rank compares.
    # aot_function (no Dynamo) hands the graph over directly.
    fw = Captured(compiler_fn(meshes=mesh24_flat, prefer="consistency"))
    aot_function(reduce_everywhere(mesh24_flat), fw_compiler=fw)(torch.ones(4, 4))
    ((traced, rewritten, before, after),) = fw.graphs
    assert before == {"all_reduce": 2} and after == {"all_reduce": 1}
    ref, got = _run_on_ranks(traced, (4, 4)), _run_on_ranks(rewritten, (4, 4))
    assert ref.keys() == got.keys() and all(torch.equal(ref[r], got[r]) for r in ref)


def test_backward_graph_and_inner_callable_gets_keywords(mesh24_flat):
    seen = []

    def inner(gm, example_inputs, **kwargs):
        seen.append(kwargs)
        return make_boxed_func(gm.forward)

    cf = compiler_fn(meshes=mesh24_flat, inner=inner, prefer="consistency")
    fw, bw = Captured(cf), Captured(cf)

    def fw_tagged(gm, inputs):  # autoparallel calls its fw compiler with tag_forward=True
        return fw(gm, inputs, tag_forward=True)

    x = torch.ones(4, 4, requires_grad=True)
    y = aot_function(reduce_everywhere(mesh24_flat), fw_compiler=fw_tagged, bw_compiler=bw)(x)
    y.sum().backward()
    assert seen[0] == {"tag_forward": True}
    assert fw.graphs[0][2] == {"all_reduce": 2} and fw.graphs[0][3] == {"all_reduce": 1}
    assert len(bw.graphs) == 1 and cf.graphs == 2


def test_failed_pass_restores_graph_and_warns_once(mesh24, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(optimize_module, "optimize_graph", broken)
    errors._warned.discard(("graph-pass", "RuntimeError", "injected failure"))
    fw = Captured(compiler_fn(meshes=mesh24))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        aot_function(replicate_then_shard(mesh24), fw_compiler=fw)(torch.ones(8, 4))
        aot_function(replicate_then_shard(mesh24), fw_compiler=fw)(torch.ones(8, 4))
    messages = [str(w.message) for w in caught if "compiled-graph pass failed" in str(w.message)]
    assert len(messages) == 1 and "injected failure" in messages[0]
    for traced, rewritten, before, after in fw.graphs:
        assert before == after == {"all_reduce": 1}
        assert rewritten.code == traced.code


@pytest.mark.parametrize("error", ["TorchAPIError", "AttributeError"])
def test_a_pass_error_not_the_planners_own_propagates(mesh24, monkeypatch, error):
    # Only the errors the planner and the pass raise themselves are compiled around; a
    # private torch name that moved (TorchAPIError) or a bug is never a one-time warning.
    from redist_opt.torch_api.version import TorchAPIError

    kind = TorchAPIError if error == "TorchAPIError" else AttributeError

    def broken(*args, **kwargs):
        raise kind("redist_opt needs torch's private name torch.x._y")

    monkeypatch.setattr(optimize_module, "optimize_graph", broken)
    fw = Captured(compiler_fn(meshes=mesh24))
    with pytest.raises(kind, match="torch.x._y"):
        aot_function(replicate_then_shard(mesh24), fw_compiler=fw)(torch.ones(8, 4))


def test_a_moved_private_name_is_never_a_missing_label_or_an_unresolved_group(mesh24, monkeypatch):
    # The dumps' group labels and the graph pass's group-name resolution turn other failures
    # into "no label" and a reason; a private torch name that moved propagates from both.
    from redist_opt.graph import backend, mesh_groups
    from redist_opt.torch_api.version import TorchAPIError

    def moved(*args, **kwargs):
        raise TorchAPIError("redist_opt needs torch's private name torch.x._y")

    assert backend._group_labels()  # mesh24's dims are labelled
    monkeypatch.setattr(backend.L, "group_name", moved)
    with pytest.raises(TorchAPIError, match="torch.x._y"):
        backend._group_labels()
    monkeypatch.setattr(mesh_groups, "process_group_ranks", moved)
    with pytest.raises(TorchAPIError, match="torch.x._y"):
        mesh_groups.resolve_group_name("some group", [], {})


def test_bad_arguments(mesh24):
    with pytest.raises(ValueError, match="inner='jit'"):
        compiler_fn(inner="jit")
    with pytest.raises(TypeError, match="inner must be"):
        compiler_fn(inner=3)
    with pytest.raises(redist_opt.RedistributeError, match="groups='sometimes'"):
        compiler_fn(groups="sometimes")
    with pytest.raises(redist_opt.RedistributeError, match="unknown options.*'inner_compiler'"):
        compiler_fn(inner_compiler="inductor")
    with pytest.raises(redist_opt.RedistributeError, match=r"groups=\['dp\+ep'\]"):
        compiler_fn(meshes=mesh24, groups=["dp+ep"])  # no such dims: refused here, not per graph
    assert compiler_fn(passes=[]).options.passes == ()
    assert "inner=None" in repr(compiler_fn())
