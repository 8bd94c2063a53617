"""Programs whose compiled graphs carry no DTensor metadata, for the raising-by-semantics
tests (4 gloo ranks, a 2x2 (dp, tp) mesh). Kept free of pytest so spawned children
import it cheaply.

* Graphs as autoparallel emits them: it calls torch's ``redistribute_local_tensor``
  with its own shard orders from an interpreter that copies the *user* op's
  metadata, so nothing says "redistribute". ``S(0),S(0) -> R,S(0)`` for a weight
  on CPU (gloo has no all_to_all; torch falls back to all_gather + chunk) is
  all_gather(tp), this rank's block on dim 1, all_gather(dp), all_gather(tp) on
  dim 1 (funcol's split + cat), this rank's block on dim 0. Written here with
  funcol and Python slices whose index is this rank's coordinate, a constant in
  each rank's graph.
* DTensor's own programs (``graph_pass_programs``, ``compile_models``) compiled
  with every node's metadata but its value stripped.
* Chains through a value with several users.

Each program runs eagerly and compiled with the graph pass; outputs (and gradients)
must be equal on every rank (integer-valued inputs).
"""

from __future__ import annotations

import torch
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from redist_opt.torch_api import c10d  # all_gather_single on every torch (funcol has it from 2.13)
from support import compile_models as CM
from support import graph_pass_programs as P


def ap_weight_gather(mesh, index=None):
    """``S(0),S(0) -> R,S(0)`` of an (8, 8) weight as autoparallel traces it on CPU;
    ``index`` pins the slices' block index (a user constant) instead of this rank's."""
    dp, tp = mesh.get_group(0), mesh.get_group(1)
    t = mesh.get_coordinate()[1] if index is None else index

    def f(x):  # (2, 8): rows sharded over dp, then tp
        y = c10d.all_gather_single(x, 0, tp)  # (4, 8)
        y = y.split(4, dim=1)[t].clone()  # this rank's columns: S(1) on tp
        y = c10d.all_gather_single(y, 0, dp)  # (8, 4)
        y = c10d.all_gather_single(y, 1, tp)  # (8, 8): split + cat on dim 1
        return y.split(4)[t] * 2  # this rank's rows: S(0) on tp

    return f


def ap_grad_reduce(mesh):
    """``P,S(0) -> S(0),S(0)`` of a gradient in autoparallel's other order: an
    all_reduce over dp, then this rank's block over dp of the tp shard."""
    dp = mesh.get_group(0)
    d = mesh.get_coordinate()[0]

    def f(x):  # (4, 8): P on dp, rows sharded over tp
        return funcol.all_reduce(x, "sum", dp).split(2)[d] + 1

    return f


def shared_gather_back(mesh):
    """An all_reduce whose value has two users; one takes this rank's block, gathers
    it back (the identity) and all_reduces over dp: through the shared value that is
    one all_reduce over dp+tp, cheaper even counting the kept all_reduce (3 -> 2)."""
    dp, tp = mesh.get_group(0), mesh.get_group(1)
    t = mesh.get_coordinate()[1]

    def f(x):  # (8, 4): P on dp and tp
        y = funcol.all_reduce(x, "sum", tp)
        z = c10d.all_gather_single(y.split(4)[t].clone(), 0, tp)
        z = funcol.all_reduce(z, "sum", dp)
        return torch.cat([z.reshape(-1), y.sum(0)])

    return f


def shared_not_cheaper(mesh):
    """An all_reduce over dp whose value has two users, one all_reduced over tp: through
    the shared value that is an all_reduce over dp+tp next to the kept one, not
    cheaper, so the graph is left as traced."""
    dp, tp = mesh.get_group(0), mesh.get_group(1)

    def f(x):  # (8, 4): P on dp and tp
        y = funcol.all_reduce(x, "sum", dp)
        z = funcol.all_reduce(y, "sum", tp)
        return torch.cat([z.reshape(-1), y.sum(0)])

    return f


def dtensor_grad2(mesh):
    """Differentiable ``[P, P] -> [R, R]``, an op, then ``-> [R, S(0)]``."""

    def f(x):
        d = DTensor.from_local(x, mesh, [Partial(), Partial()], run_check=False)
        d = d.redistribute(mesh, [Replicate(), Replicate()]) * 3
        return d.redistribute(mesh, [Replicate(), Shard(0)]).to_local()

    return f


def tp_mlp_loss(mesh):
    """compile_models' tensor-parallel MLP and its dp x tp loss."""
    model = CM.build_tp_mlp(mesh, seed=3)
    target = P.local_input("target", (4, CM.D_IN), 100 + mesh.get_coordinate()[0])

    def f(x):
        return CM.dp_tp_loss(model, x, target, mesh).reshape(1)

    return f


# name -> (program, local input shape, requires grad)
AUTOPARALLEL = {
    "ap_weight_gather": (ap_weight_gather, (2, 8), False),
    "ap_grad_reduce": (ap_grad_reduce, (4, 8), False),
}
USER_CONSTANT = {"ap_weight_gather@index0": (lambda m: ap_weight_gather(m, index=0), (2, 8), False)}
DTENSOR = {
    "gather_then_own_block": (P.gather_then_own_block, (4, 4), False),
    "replicate_then_shard": (P.replicate_then_shard, (8, 4), False),
    "dtensor_grad2": (dtensor_grad2, (8, 4), True),
    "tp_mlp_loss": (tp_mlp_loss, (4, CM.D_IN), True),
}
SHARED = {
    "shared_gather_back": (shared_gather_back, (8, 4), False),
    "shared_not_cheaper": (shared_not_cheaper, (8, 4), False),
}


def _input(name, shape, rank, grad):
    # replicas hold equal data: the MLP's input is replicated over tp (DTensor's
    # ColwiseParallel declares it so), so it depends on the dp coordinate only
    key = rank // 2 if name == "tp_mlp_loss" else rank
    return P.local_input(name, shape, key, requires_grad=grad)


def _run(fn, x, grad, **options) -> dict:
    ref = fn(x)
    ref_grad = None
    if grad:
        ref.sum().backward()
        ref_grad, x.grad = x.grad.clone(), None
    rec = P.Recorder(**options)
    got, got_grad = P.compile_program(fn, x, rec)
    assert torch.equal(got, ref.detach()), f"outputs differ: {options}"
    if grad:
        assert torch.equal(got_grad, ref_grad), f"gradients differ: {options}"
    return {
        "before": P.total(g["before"] for g in rec.graphs),
        "after": P.total(g["after"] for g in rec.graphs),
        "modified": any(g.get("modified") for g in rec.graphs),
        "explain": "\n".join(g.get("explain", "") for g in rec.graphs),
    }


def gloo_semantics(rank: int, world: int) -> dict:
    """Every program eagerly and compiled with the pass on stripped graphs (DTensor's
    programs also with their metadata); outputs compared on this rank. (On the 2x2
    mesh of 4 ranks the dp+tp group exists: it is the world group, in rank order.)"""
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    out = {}
    for name, (make, shape, grad) in {**AUTOPARALLEL, **USER_CONSTANT, **SHARED, **DTENSOR}.items():
        fn = make(mesh)
        x = _input(name, shape, rank, grad)
        out[name] = _run(fn, x, grad, meshes=mesh, strip_meta=True)
        if name in DTENSOR:
            out[f"{name}+meta"] = _run(fn, x, grad, meshes=mesh)
    return out
