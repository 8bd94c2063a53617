"""redist_opt under torch.compile, on the fake backend (rank 0 traces; nothing runs
collectives for real): the backend hook and enabled() around torch.compile trace
our plans into the forward and backward graphs; graphs without DTensor
collectives are unchanged; dynamic shapes fall back to torch; graph dumps.
"""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
import torch.distributed._functional_collectives as funcol
from support import compile_models
from torch._dynamo.backends.common import aot_autograd
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

import redist_opt
from redist_opt.graph.backend import collectives
from redist_opt.graph_pass import GraphRewrites

# compiled against torch's traces; .ci/run runs it on every torch of the range
pytestmark = pytest.mark.differential


class GraphCapture:
    """An aot_autograd fw/bw compiler that keeps each graph it is given (forward first)."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm

    def counts(self) -> list[int]:
        return [len(collectives(g)) for g in self.graphs]


def _compile_and_run(fn, args, which: str, *, backward: bool = True, **backend_options):
    """Trace ``fn`` with torch's aot_autograd ("torch"), our backend ("ours") or
    torch's aot_autograd inside enabled() ("enabled"); return (capture, output)."""
    torch._dynamo.reset()
    capture = GraphCapture()
    if which == "ours":
        backend, ctx = redist_opt.backend(capture, **backend_options), contextlib.nullcontext()
    else:
        backend = aot_autograd(fw_compiler=capture, bw_compiler=capture)
        ctx = redist_opt.enabled(**backend_options) if which == "enabled" else contextlib.nullcontext()
    with ctx, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*boxed arguments.*")
        out = torch.compile(fn, backend=backend, fullgraph=True)(*args)
        if backward:
            (out.to_local() if isinstance(out, DTensor) else out).sum().backward()
    return capture, out


_meshes: dict = {}


def _mesh_2x2x2_dp_tp_flat():
    # One mesh per process: torch treats equal DeviceMeshes as interchangeable (its
    # spec caches are keyed by equality), so a second equal mesh could be traced
    # with the first one's groups.
    if "3d" not in _meshes:
        mesh = DeviceMesh("cpu", torch.arange(8).reshape(2, 2, 2), mesh_dim_names=("dp", "cp", "tp"))
        # kept: torch 2.11's DeviceMesh cannot slice a non-contiguous flattened dim back
        # out by name (mesh["dp_tp"] raises NotImplementedError there; 2.13 can)
        _meshes["3d/dp_tp"] = mesh["dp", "tp"]._flatten("dp_tp")
        _meshes["3d"] = mesh
    return _meshes["3d"]


@pytest.mark.parametrize("which", ["ours", "enabled"])
def test_ppp_to_r_s0_r_traces_fewer_collectives(which):
    mesh = _mesh_2x2x2_dp_tp_flat()

    def f(x):
        return x.redistribute(mesh, [Replicate(), Shard(0), Replicate()]).to_local() * 2

    def make_input():
        return DTensor.from_local(
            torch.randn(8, 4, requires_grad=True), mesh, [Partial()] * 3, run_check=False
        )

    torch_cap, _ = _compile_and_run(f, (make_input(),), "torch")
    our_cap, _ = _compile_and_run(f, (make_input(),), which)
    assert len(torch_cap.graphs) == len(our_cap.graphs) == 2  # forward, backward
    assert torch_cap.counts()[0] == 3  # torch 2.13: AR(dp), RS(cp), AR(tp)
    assert our_cap.counts()[0] == 2  # RS(cp), AR(dp+tp)
    fw_ops = [op for op, _ in collectives(our_cap.graphs[0])]
    assert fw_ops == ["reduce_scatter_tensor", "all_reduce"]
    dp_tp_group = _meshes["3d/dp_tp"].get_group(0).group_name
    assert collectives(our_cap.graphs[0])[1][1] == dp_tp_group
    for ours, theirs in zip(our_cap.counts(), torch_cap.counts()):
        assert ours <= theirs


def _mlp_inputs(mesh2d, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-2, 3, (4, compile_models.D_IN), generator=g).float().requires_grad_()
    target = torch.randint(-2, 3, (4, compile_models.D_IN), generator=g).float()
    return x, target


# Distinct (unequal) 2x2 meshes per policy, so "create" cannot leave a group for "existing".
_MLP_RANKS = {"existing": [[0, 1], [2, 3]], "create": [[0, 2], [1, 3]]}


@pytest.mark.parametrize("groups, fewer", [("existing", False), ("create", True)])
def test_tp_mlp_loss_over_both_dims(groups, fewer):
    results = {}
    key = f"2d-{groups}"
    if key not in _meshes:
        _meshes[key] = DeviceMesh("cpu", torch.tensor(_MLP_RANKS[groups]), mesh_dim_names=("dp", "tp"))
    mesh2d = _meshes[key]
    for which in ("torch", "ours"):
        model = compile_models.build_tp_mlp(mesh2d)
        x, target = _mlp_inputs(mesh2d)
        cap, _ = _compile_and_run(
            lambda x, t, model=model: compile_models.dp_tp_loss(model, x, t, mesh2d),
            (x, target),
            which,
            **({"groups": groups} if which == "ours" else {}),
        )
        results[which] = cap.counts()
    torch_counts, our_counts = results["torch"], results["ours"]
    assert len(our_counts) == len(torch_counts) == 2
    assert all(o <= t for o, t in zip(our_counts, torch_counts)), results
    if fewer:
        # the loss's [P, P] -> [R, R]: torch issues AR(dp), AR(tp); ours one AR(dp+tp)
        assert our_counts[0] == torch_counts[0] - 1, results
    else:
        assert our_counts == torch_counts, results


def test_graph_without_dtensor_collectives_is_unchanged():
    group = DeviceMesh("cpu", torch.arange(4), mesh_dim_names=("w",)).get_group(0)

    def f(x, y):
        # a hand-written funcol collective is not a DTensor redistribution: left alone
        z = funcol.all_reduce(x * 2, "sum", group)
        return torch.relu(z + y).sum(dim=0)

    graphs = {}
    for which in ("torch", "ours"):
        cap, _ = _compile_and_run(f, (torch.randn(4, 3, requires_grad=True), torch.randn(4, 3)), which)
        graphs[which] = [str(g.graph) for g in cap.graphs]
    assert graphs["ours"] == graphs["torch"]
    assert "all_reduce" in graphs["ours"][0]


def test_dynamic_shapes_fall_back_to_torch_with_a_warning():
    mesh = _mesh_2x2x2_dp_tp_flat()

    def f(x):
        return x.redistribute(mesh, [Replicate(), Shard(0), Replicate()]).to_local() + 1

    def make_input(n):
        dt = DTensor.from_local(torch.randn(n, 4), mesh, [Partial()] * 3, run_check=False)
        torch._dynamo.mark_dynamic(dt, 0)  # the sharded dim arrives as a SymInt
        return dt

    redist_opt.api.errors._warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cap, out = _compile_and_run(f, (make_input(8),), "ours", backward=False)
    assert out.shape == (4, 4)
    # torch's plan (3 collectives) rather than a wrong or crashing one
    assert cap.counts()[0] == 3
    assert any("symbolic" in str(w.message) for w in caught), [str(w.message) for w in caught]


def test_dump_dir_receives_forward_and_backward_graphs(tmp_path, monkeypatch):
    monkeypatch.setenv("REDIST_OPT_DUMP_DIR", str(tmp_path))
    mesh = _mesh_2x2x2_dp_tp_flat()

    def f(x):
        return x.redistribute(mesh, [Replicate(), Shard(0), Replicate()]).to_local() * 2

    x = DTensor.from_local(torch.randn(8, 4, requires_grad=True), mesh, [Partial()] * 3, run_check=False)
    _compile_and_run(f, (x,), "ours")
    forward = sorted(tmp_path.glob("*.compile*.forward.txt"))
    backward = sorted(tmp_path.glob("*.compile*.backward.txt"))
    assert len(forward) == 1 and len(backward) == 1
    text = forward[0].read_text()
    assert "# 2 collective(s)" in text
    assert "reduce_scatter_tensor" in text and "mesh dim cp of mesh 2x2x2" in text
    assert "mesh dims dp+tp of mesh 2x2x2" in text
    assert "all_gather_into_tensor" in backward[0].read_text()


def test_backend_rejects_unknown_inner_compiler():
    with pytest.raises(ValueError, match="inner='tvm'"):
        redist_opt.backend("tvm")
    with pytest.raises(redist_opt.RedistributeError, match="rewrites='combine'"):
        redist_opt.backend(rewrites="combine")


def test_backend_passes_its_rewrites_to_the_graph_pass(monkeypatch):
    import redist_opt.graph.optimize

    seen = []
    optimize_graph = redist_opt.graph.optimize.optimize_graph

    def recording(gm, **kwargs):
        seen.append(kwargs["rewrites"])
        return optimize_graph(gm, **kwargs)

    monkeypatch.setattr(redist_opt.graph.optimize, "optimize_graph", recording)
    mesh = _mesh_2x2x2_dp_tp_flat()

    def f(x):
        return x.redistribute(mesh, [Replicate(), Shard(0), Replicate()]).to_local() * 2

    x = DTensor.from_local(torch.randn(8, 4), mesh, [Partial()] * 3, run_check=False)
    no_combining = GraphRewrites(combine=False)
    _compile_and_run(f, (x,), "ours", backward=False, rewrites=no_combining)
    _compile_and_run(f, (x,), "ours", backward=False)
    assert seen == [no_combining, GraphRewrites()]


@pytest.mark.slow  # about 20 s: Inductor's C++ compile
def test_inductor_inner_and_default_backend_inside_enabled(tmp_path, monkeypatch):
    # The routing must never turn a working compile into a failing one: Inductor
    # as inner compiler (graphs dumped before Inductor lowers them), and
    # torch.compile's default backend inside enabled().
    monkeypatch.setenv("REDIST_OPT_DUMP_DIR", str(tmp_path))
    mesh = _mesh_2x2x2_dp_tp_flat()

    def f(x):
        return x.redistribute(mesh, [Replicate(), Shard(0), Replicate()]).to_local() * 2

    def make_input():
        return DTensor.from_local(
            torch.ones(8, 4, requires_grad=True), mesh, [Partial()] * 3, run_check=False
        )

    torch._dynamo.reset()
    out = torch.compile(f, backend=redist_opt.backend("inductor"), fullgraph=True)(make_input())
    out.sum().backward()
    assert out.shape == (4, 4)
    forward = sorted(tmp_path.glob("*.compile*.forward.txt"))
    assert len(forward) == 1 and "# 2 collective(s)" in forward[0].read_text()
    torch._dynamo.reset()
    with redist_opt.enabled():
        out = torch.compile(f, fullgraph=True)(make_input())
        out.sum().backward()
    assert out.shape == (4, 4)


def test_backend_runs_the_graph_pass_across_redistributions():
    # SimpleFSDP-style gradient: a hand-written all_reduce over tp, then DTensor
    # [P, P] -> [R, S(0)] over (dp, cp). Trace-time routing optimizes the
    # redistribution alone (reduce_scatter(cp) + all_reduce(dp)) and cannot see the
    # hand-written all_reduce; the compiled-graph pass raises the whole chain and
    # merges all_reduce(dp) + all_reduce(tp) over the existing dp_tp group.
    mesh = _mesh_2x2x2_dp_tp_flat()
    m2, tp = mesh["dp", "cp"], mesh["tp"].get_group()

    def f(x):
        y = funcol.all_reduce(x, "sum", tp)
        d = DTensor.from_local(y, m2, [Partial(), Partial()], run_check=False)
        return d.redistribute(m2, [Replicate(), Shard(0)]).to_local()

    routed_only, _ = _compile_and_run(f, (torch.ones(8, 4),), "ours", backward=False, graph_pass=False)
    with_pass, _ = _compile_and_run(f, (torch.ones(8, 4),), "ours", backward=False)
    assert routed_only.counts() == [3]
    assert with_pass.counts() == [2]
    assert [op for op, _ in collectives(with_pass.graphs[0])] == ["reduce_scatter_tensor", "all_reduce"]
    # passes= reaches the graph pass too: with no passes it re-plans nothing, as the trace
    naive_only, _ = _compile_and_run(
        f, (torch.ones(8, 4),), "ours", backward=False, passes=[], graph_pass=False
    )
    naive_pass, _ = _compile_and_run(f, (torch.ones(8, 4),), "ours", backward=False, passes=[])
    assert naive_pass.counts() == naive_only.counts() != [2]


def test_backend_compiles_the_traced_graph_when_the_graph_pass_fails(monkeypatch):
    import redist_opt.graph.optimize

    def broken(gm, **kwargs):
        gm.graph.erase_node(next(iter(gm.graph.nodes)).next)  # leave the graph half-rewritten
        raise RuntimeError("boom")

    monkeypatch.setattr(redist_opt.graph.optimize, "optimize_graph", broken)
    mesh = _mesh_2x2x2_dp_tp_flat()

    def f(x):
        d = DTensor.from_local(x, mesh, [Partial(), Partial(), Partial()], run_check=False)
        return d.redistribute(mesh, [Replicate(), Shard(0), Replicate()]).to_local()

    with pytest.warns(UserWarning, match="compiled-graph pass failed"):
        capture, _ = _compile_and_run(f, (torch.ones(8, 4),), "ours", backward=False)
    assert capture.counts() == [2]  # the routed trace, intact


@pytest.mark.parametrize("which", ["enabled", "ours"])
@pytest.mark.parametrize("dtype", [torch.complex64, torch.float32])
def test_complex_all_to_all_moves_real_pairs_in_the_compiled_graph(dtype, which):
    # A backend's all_to_all may refuse complex tensors (gloo's does): the traced plan sends
    # the real view, and only complex data takes it.
    mesh = _mesh_2x2x2_dp_tp_flat()

    def f(x):
        return x.redistribute(mesh, [Shard(1), Replicate(), Replicate()]).to_local()

    x = DTensor.from_local(torch.randn(4, 8, dtype=dtype), mesh, [Shard(0), Replicate(), Replicate()])
    capture, _ = _compile_and_run(f, (x,), which, backward=False)
    (a2a,) = [n for n in capture.graphs[0].graph.nodes if "all_to_all_single" in str(n.target)]
    sent_as_real = "view_as_real" in str(a2a.args[0].target)
    assert sent_as_real == dtype.is_complex, capture.graphs[0].code
    assert (
        capture.graphs[0].graph.find_nodes(op="call_function", target=torch.ops.aten.view_as_complex.default)
        or not dtype.is_complex
    )
