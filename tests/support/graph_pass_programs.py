"""Compiled programs for the graph-pass tests, runnable on one fake rank or on gloo ranks.

Each program takes this rank's local tensor and returns a local tensor; inputs
are integer-valued so regrouped sums compare exactly. ``compile_program``
compiles one with a small AOTAutograd backend that records the collectives of
the forward/backward graphs before and after ``redist_opt.graph_pass`` and then
runs the graphs eagerly (``aot_eager`` plus the pass). Kept free of pytest so
spawned children import it cheaply.

Usage as a script (one fake rank, prints JSON): ``python graph_pass_programs.py fake RANK``.
"""

from __future__ import annotations

import os
import random
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._redistribute import disable_redistribute_transform_optimization

# Run as a script, this file's folder is on sys.path; the tests folder (for
# ``support``) must be too.
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

from redist_opt.graph_pass import GraphRewrites, count_collectives, optimize_graph  # noqa: E402
from support.program_report import emit  # noqa: E402

# -- programs -------------------------------------------------------------------------------


def simplefsdp(mesh):
    """A SimpleFSDP-style gradient: funcol all_reduce over tp, then DTensor
    [P, P] -> [R, S(0)] over (dp_replicate, dp_shard)."""
    m2 = mesh["dpr", "dps"]
    tp = mesh["tp"].get_group()

    def f(x):
        y = funcol.all_reduce(x, "sum", tp)
        d = DTensor.from_local(y, m2, [Partial(), Partial()], run_check=False)
        return d.redistribute(m2, [Replicate(), Shard(0)]).to_local()

    return f


def gathered_params(mesh):
    """SimpleFSDP's forward: two parameters gathered over dps (DTensor S(0) -> R), both
    ready before the first gather: the combining pass makes one gather of the two."""
    dps = mesh["dps"]

    def f(x):
        w1, w2 = x[:2].contiguous(), x[2:].contiguous()
        g1 = (
            DTensor.from_local(w1, dps, [Shard(0)], run_check=False)
            .redistribute(dps, [Replicate()])
            .to_local()
        )
        g2 = (
            DTensor.from_local(w2, dps, [Shard(0)], run_check=False)
            .redistribute(dps, [Replicate()])
            .to_local()
        )
        return g1.sum(0) * 10 + g2.sum(0)

    return f


def gathered_params_uneven(mesh):
    """gathered_params with 3 and 5 rows over dps (2 ranks): DTensor pads the smaller
    block before its gather (on dps rank 1 only) and narrows after it (on every rank);
    the combining pass leaves uneven gathers apart, since its decision would differ by rank."""
    dps = mesh["dps"]
    c = dps.get_local_rank()

    def shard(w):  # this rank's block of torch.chunk(w, 2): 2 + 1 rows, 3 + 2 rows
        rows = -(-w.shape[0] // 2)
        local = w[c * rows : (c + 1) * rows].contiguous()
        return DTensor.from_local(local, dps, [Shard(0)], run_check=False, shape=w.shape, stride=w.stride())

    def f(x):
        w1, w2 = x[:3], x[3:]  # 3 and 5 rows
        g1 = shard(w1).redistribute(dps, [Replicate()]).to_local()
        g2 = shard(w2).redistribute(dps, [Replicate()]).to_local()
        return g1.sum(0) * 10 + g2.sum(0)

    return f


def scattered_grads(mesh):
    """Two gradients reduce-scattered over dps one after the other (hand-written funcol,
    as SimpleFSDP's backward issues them), both used only at the end: the combining
    pass makes one reduce_scatter of the two."""
    dps = mesh["dps"].get_group()

    def f(x):
        ra = funcol.reduce_scatter_tensor(x[:4] * 2, "sum", 0, dps)
        rb = funcol.reduce_scatter_tensor(x[4:] * 3, "sum", 0, dps)
        return torch.cat([ra, rb])

    return f


def replicate_then_shard(mesh):
    """``redistribute(R)``, a few ops, then a reshard to ``Shard(0)`` (DTensor on tp)."""
    tp = mesh["tp"]

    def f(x):
        d = DTensor.from_local(x, tp, [Partial()], run_check=False)
        d = d.redistribute(tp, [Replicate()])
        d = d * 2 + 1
        return d.redistribute(tp, [Shard(0)]).to_local()

    return f


def gather_then_own_block(mesh):
    """``S(0) -> R -> S(0)``: an all_gather whose result is only sliced back."""
    tp = mesh["tp"]

    def f(x):
        d = DTensor.from_local(x, tp, [Shard(0)], run_check=False)
        d = d.redistribute(tp, [Replicate()])
        return d.redistribute(tp, [Shard(0)]).to_local()

    return f


def dtensor_grad(mesh):
    """Differentiable: [P, P, P] -> [R, S(0), R] with an op between (forward and backward graphs)."""

    def f(x):
        d = DTensor.from_local(x, mesh, [Partial(), Partial(), Partial()], run_check=False)
        d = d.redistribute(mesh, [Replicate(), Replicate(), Replicate()])
        d = d * 3
        return d.redistribute(mesh, [Replicate(), Shard(0), Replicate()]).to_local()

    return f


# Not raisable: each must come out of the pass unchanged.
def user_chunk(mesh):
    """A hand-written constant block after an all_reduce: not provably rank-dependent."""
    tp = mesh["tp"].get_group()

    def f(x):
        return funcol.all_reduce(x, "sum", tp).chunk(2)[1] + 1

    return f


def uneven(mesh):
    """An uneven all_gather (pad / narrow): not raised."""
    tp = mesh["tp"]

    def f(x):
        d = DTensor.from_local(x, tp, [Shard(0)], run_check=False, shape=torch.Size([3, 4]), stride=(4, 1))
        return d.redistribute(tp, [Replicate()]).to_local() * 2

    return f


def two_users(mesh):
    """The all_reduced value is used twice: no chain to rewrite."""
    tp = mesh["tp"]

    def f(x):
        d = DTensor.from_local(x, tp, [Partial()], run_check=False)
        r = d.redistribute(tp, [Replicate()]).to_local()
        return r.chunk(2)[0] + r.sum()

    return f


# name -> (program, local input shape, mesh): "m3" is (dpr, dps, tp) = 2x2x2, "m24" is
# (dp, tp) = 2x4, whose tp dim is the only one of its size (slices need no agreement).
PROGRAMS = {
    "simplefsdp": (simplefsdp, (8, 4), "m3"),
    "replicate_then_shard": (replicate_then_shard, (8, 4), "m24"),
    "gather_then_own_block": (gather_then_own_block, (4, 4), "m24"),
    "dtensor_grad": (dtensor_grad, (8, 4), "m3"),
    "gathered_params": (gathered_params, (8, 4), "m3"),
    "gathered_params_uneven": (gathered_params_uneven, (8, 4), "m3"),
    "scattered_grads": (scattered_grads, (8, 4), "m3"),
}
# On the 2x2x2 mesh every dim has size 2: the slice's dims need agreement across ranks.
AGREEMENT = {
    "replicate_then_shard@m3": (replicate_then_shard, (8, 4), "m3"),
    "gather_then_own_block@m3": (gather_then_own_block, (4, 4), "m3"),
}
UNCHANGED = {
    "user_chunk": (user_chunk, (8, 4), "m3"),
    "uneven": (uneven, None, "m3"),
    "two_users": (two_users, (8, 4), "m3"),
}
GRAD = {"dtensor_grad"}
# What the SimpleFSDP gradient becomes depends on its size and the cost model: the mesh
# is the whole world, so one all_reduce over it plus a local chunk is always possible,
# and it is the fastest for small tensors. Each variant pins one case:
# with a dpr x tp group, a 4 MiB gradient under the default (NCCL) model becomes
# reduce_scatter(dps) + one all_reduce(dpr+tp); without that group, under the
# textbook ring model of gloo ("gloo-ring", where one all_reduce over 8 ranks is
# never the cheapest and bytes count), the reduce_scatter moves first and both
# all_reduces carry half the bytes.
VARIANTS = {"flat/simplefsdp": ((16384, 64), "nccl"), "noflat/simplefsdp": ((8, 4), "gloo-ring")}


def variant(key: str, shape):
    """(local input shape, optimize_graph options) of program ``key`` ("flat/name")."""
    from redist_opt.ir.cost import CostModel

    shape, profile = VARIANTS.get(key, (shape, None))
    return shape, ({"cost": CostModel.profile(profile)} if profile else {})


def make_meshes() -> dict:
    return {
        "m3": init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dpr", "dps", "tp")),
        "m24": init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp")),
    }


def local_input(name: str, shape, rank: int, requires_grad=False) -> torch.Tensor:
    if shape is None:  # the uneven program: 2 rows on tp coordinate 0, 1 on 1
        shape = (2 if rank % 2 == 0 else 1, 4)
    g = torch.Generator().manual_seed(1000 + 7 * rank + len(name))
    x = torch.randint(-4, 5, shape, generator=g).to(torch.float32)
    return x.requires_grad_(requires_grad)


# -- compiling --------------------------------------------------------------------------------


class PassDone(Exception):
    """Raised by a ``Recorder(stop_after_pass=True)`` backend once the pass has run."""


class Recorder:
    """A small aot_autograd backend: counts collectives, runs the pass (timing it), runs
    graphs eagerly; with ``stop_after_pass`` it raises :class:`PassDone` instead of
    returning a compiled graph, so nothing runs (a compile on one rank only)."""

    def __init__(self, *, apply_pass=True, stop_after_pass=False, strip_meta=False, **options) -> None:
        self.apply_pass, self.stop_after_pass, self.options = apply_pass, stop_after_pass, options
        self.strip_meta = strip_meta
        self.graphs: list[dict] = []

    def backend(self):
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd

        def compiler(gm, example_inputs):
            if self.strip_meta:
                strip_meta(gm)
            entry = {"before": count_collectives(gm), "code_before": gm.code}
            if self.apply_pass:
                start = time.perf_counter()
                result = optimize_graph(gm, **self.options)
                entry["pass_seconds"] = time.perf_counter() - start
                entry["explain"] = result.explain()
                entry["modified"] = result.modified
                entry["moved"] = [(c.rewritten, c.reason) for c in result.chains]
            entry["after"] = count_collectives(gm)
            entry["code_after"] = gm.code
            self.graphs.append(entry)
            if self.stop_after_pass:
                raise PassDone
            return make_boxed_func(gm.forward)

        return aot_autograd(fw_compiler=compiler, bw_compiler=compiler)


def strip_meta(gm) -> None:
    """Drop every node's metadata but its value (what a graph from another tracer
    may carry: no ``source_fn_stack``, no stack traces)."""
    for n in gm.graph.nodes:
        keep = {k: n.meta[k] for k in ("val", "tensor_meta") if k in n.meta}
        n.meta.clear()
        n.meta.update(keep)


def compile_program(fn, x, recorder: Recorder):
    import torch._dynamo

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=recorder.backend(), fullgraph=True)
    out = compiled(x)
    grad = None
    if x.requires_grad:
        out.sum().backward()
        grad = x.grad.clone()
        x.grad = None
    return out.detach(), grad


def total(counts_list) -> int:
    return sum(sum(c.values()) for c in counts_list)


# -- one fake rank (inspection) ------------------------------------------------------------------


def fake_main(rank: int) -> dict:
    dist.init_process_group("fake", rank=rank, world_size=8)
    report = {}
    meshes = make_meshes()
    for flatten in (False, True):
        if flatten:
            meshes["m3"]["dpr", "tp"]._flatten()
        tag = "flat" if flatten else "noflat"
        for name, (make, shape, m) in {**PROGRAMS, **AGREEMENT, **UNCHANGED}.items():
            if flatten and name not in ("simplefsdp", "dtensor_grad"):
                continue
            shape, options = variant(f"{tag}/{name}", shape)
            rec = Recorder(meshes=meshes[m], **options)
            x = local_input(name, shape, rank, requires_grad=name in GRAD)
            compile_program(make(meshes[m]), x, rec)
            report[f"{tag}/{name}"] = rec.graphs
    rec = Recorder(
        meshes=meshes["m3"], rewrites=GraphRewrites(combine=False)
    )  # the twin of noflat/gathered_params
    compile_program(gathered_params(meshes["m3"]), local_input("gathered_params", (8, 4), rank), rec)
    report["nocombine/gathered_params"] = rec.graphs
    return report


# -- gloo ranks (execution) -------------------------------------------------------------------------


def _log(rank, *msg):
    path = os.environ.get("GRAPH_PASS_LOG")
    if path:
        with open(f"{path}.{rank}", "a") as f:
            print(*msg, file=f, flush=True)


def gloo_programs(rank: int, world: int, only=None) -> dict:
    """Every program eagerly and compiled with the pass; outputs/grads compared on this rank."""
    out = {}
    meshes = make_meshes()
    for flatten in (False, True):
        if flatten:
            meshes["m3"]["dpr", "tp"]._flatten()
        for name, (make, shape, m) in {**PROGRAMS, **AGREEMENT, **UNCHANGED}.items():
            if flatten and name not in ("simplefsdp", "dtensor_grad"):
                continue
            if only is not None and name not in only:
                continue
            _log(rank, "program", flatten, name)
            key = f"{'flat' if flatten else 'noflat'}/{name}"
            shape, options = variant(key, shape)
            grad = name in GRAD
            mesh = meshes[m]
            fn = make(mesh)
            x = local_input(name, shape, rank, requires_grad=grad)
            ref_grad = None
            with disable_redistribute_transform_optimization():  # torch's plans, its merge pass off
                ref = fn(x)
                if grad:
                    ref.sum().backward()
                    ref_grad = x.grad.clone()
                    x.grad = None
            rec = Recorder(meshes=mesh, **options)
            _log(rank, "  eager done")
            got, got_grad = compile_program(fn, x, rec)
            _log(rank, "  compiled", [g.get("explain") for g in rec.graphs])
            assert torch.equal(got, ref.detach()), f"rank {rank} {key}: outputs differ"
            if grad:
                assert torch.equal(got_grad, ref_grad), f"rank {rank} {key}: gradients differ"
            out[key] = {
                "before": total(g["before"] for g in rec.graphs),
                "after": total(g["after"] for g in rec.graphs),
                "modified": any(g.get("modified") for g in rec.graphs),
            }
    return out


# -- randomized programs ------------------------------------------------------------------------------

_PLACEMENTS = ["P", "R", "S0", "S1"]


def _pl(s):
    return {"P": Partial(), "R": Replicate(), "S0": Shard(0), "S1": Shard(1)}[s]


def random_program(seed: int):
    """A chain of DTensor redistributions, hand-written funcol all_reduces and pointwise
    ops on a 2x2 mesh, described as data (same on every rank for a seed)."""
    rnd = random.Random(seed)
    # Partial sources are the interesting ones (reductions to merge, reorder, scatter).
    src = [rnd.choice(["P", "P", "R", "S0", "S1"]) for _ in range(2)]
    steps = []
    cur = list(src)
    for _ in range(rnd.randint(2, 4)):
        kind = rnd.random()
        partial_dims = [d for d in range(2) if cur[d] == "P"]
        if kind < 0.25 and partial_dims:
            d = rnd.choice(partial_dims)
            steps.append(("funcol_all_reduce", d))
            cur[d] = "R"
        elif kind < 0.4:
            # a partial times a scalar stays partial in DTensor (linear): allowed anywhere
            steps.append(("scale", rnd.choice([2, -1, 3])))
        else:
            tgt = [
                rnd.choice(["R", "S0", "S1"]) if cur[d] != "P" or rnd.random() < 0.8 else "P"
                for d in range(2)
            ]
            steps.append(("redistribute", tuple(tgt)))
            cur = tgt
    return tuple(src), tuple(steps)


def build_random(mesh, program):
    src, steps = program

    def f(x):
        d = DTensor.from_local(x, mesh, [_pl(p) for p in src], run_check=False)
        for step in steps:
            if step[0] == "funcol_all_reduce":
                dim = step[1]
                local = funcol.all_reduce(d.to_local(), "sum", mesh.get_group(dim))
                pl = list(d.placements)
                pl[dim] = Replicate()
                d = DTensor.from_local(local, mesh, pl, run_check=False)
            elif step[0] == "scale":
                d = d * step[1]
            else:
                d = d.redistribute(mesh, [_pl(p) for p in step[1]])
        return d.to_local()

    return f


def gloo_random(rank: int, world: int, seeds, groups: str = "existing") -> list:
    """Each random program eagerly and compiled with the pass: equal outputs, never more collectives."""
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "b"))
    results = []
    if os.environ.get("GRAPH_PASS_LOG"):
        import faulthandler

        faulthandler.dump_traceback_later(
            240, exit=False, file=open(f"{os.environ['GRAPH_PASS_LOG']}.tb.{rank}", "w")
        )
    for seed in seeds:
        program = random_program(seed)
        _log(rank, "seed", seed, program)
        fn = build_random(mesh, program)
        src = program[0]
        rows, cols = 8, 8
        shape = [rows, cols]
        for p in src:
            if p == "S0":
                shape[0] //= 2
            if p == "S1":
                shape[1] //= 2
        # Replicas must hold equal data (DTensor's invariant, which rewrites rely on):
        # the input depends only on the coordinates of non-replicated mesh dims.
        coord = mesh.get_coordinate()
        key = sum(c * 10**d for d, (c, p) in enumerate(zip(coord, src)) if p != "R")
        g = torch.Generator().manual_seed(seed * 1000 + key)
        x = torch.randint(-4, 5, tuple(shape), generator=g).to(torch.float32)
        ref = fn(x)
        rec = Recorder(meshes=mesh, groups=groups)
        got, _ = compile_program(fn, x, rec)
        before = total(gr["before"] for gr in rec.graphs)
        after = total(gr["after"] for gr in rec.graphs)
        for gr in rec.graphs:
            _log(rank, gr.get("explain"), gr["code_before"], gr["code_after"])
        assert torch.equal(got, ref), f"rank {rank} seed {seed} {program}: outputs differ"
        assert after <= before, f"rank {rank} seed {seed} {program}: {after} > {before} collectives"
        results.append(
            {
                "seed": seed,
                "program": repr(program),
                "before": before,
                "after": after,
                "modified": any(gr.get("modified") for gr in rec.graphs),
            }
        )
    return results


if __name__ == "__main__":
    if sys.argv[1] == "fake":
        emit(fake_main(int(sys.argv[2])))


def fake_inductor(rank: int) -> dict:
    """simplefsdp (with the dp_replicate x tp group) through Inductor with the pass as
    ``post_grad_custom_post_pass``: what the pass did, and the generated code's collectives."""
    import torch._inductor.config as inductor_config
    from torch._inductor.utils import run_and_get_code

    from redist_opt.graph_pass import RedistGraphPass

    dist.init_process_group("fake", rank=rank, world_size=8)
    meshes = make_meshes()
    meshes["m3"]["dpr", "tp"]._flatten()
    shape, options = variant("flat/simplefsdp", (8, 4))
    pass_ = RedistGraphPass(meshes=meshes["m3"], **options)
    fn = simplefsdp(meshes["m3"])
    x = local_input("simplefsdp", shape, rank)
    import torch._dynamo

    torch._dynamo.reset()
    with inductor_config.patch(post_grad_custom_post_pass=pass_, fx_graph_cache=False):
        _, codes = run_and_get_code(torch.compile(fn, backend="inductor", fullgraph=True), x)
    code = "\n".join(codes)
    return {
        "explain": [r.explain() for r in pass_.results],
        "modified": [r.modified for r in pass_.results],
        "code_all_reduce": code.count("_c10d_functional.all_reduce"),
        "code_reduce_scatter": code.count("_c10d_functional.reduce_scatter_tensor"),
        "uuid": pass_.uuid(),
    }


if __name__ == "__main__" and sys.argv[1] == "inductor":
    emit(fake_inductor(int(sys.argv[2])))
