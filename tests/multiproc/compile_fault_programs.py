"""Compile-time fault programs for test_compile_faults.py (4 gloo ranks, 2x2 mesh).

Each is ``program(ctx) -> {name: tensor}`` for ``fault_harness.run_program``: with
``ctx.reference`` the program is compiled with torch's ``aot_eager`` backend, else
with ``redist_opt.backend("aot_eager")``; faults are injected in both runs alike (a
fault is a property of the job, not of redist_opt), so the outputs compare (keys
starting with "_" hold texts, not outputs). Every
compile of the optimized run is timed as a ``ctx.section`` (the agreement's wait),
and the explain output of each graph pass is returned (as bytes) for the test to read.

On a 2x2 mesh both dims have size 2, so every rank slice needs agreement across
ranks on the mesh dim it selects over. Inputs are integer-valued. Kept free of
pytest imports: spawned children import this module.
"""

from __future__ import annotations

import torch
import torch._dynamo
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

# Read by the compiled functions: changed on one rank only, it makes Dynamo recompile
# there only (a rank-dependent guard).
EXTRA = 0


def _mesh():
    return init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))


def _input(shape, salt=0):
    rank = dist.get_rank()
    n = shape[0] * shape[1]
    return (torch.arange(n, dtype=torch.float32).reshape(shape) * (rank + 1) + salt) % 97


class _Compiler:
    """torch.compile with aot_eager (reference) or redist_opt.backend (optimized); keeps
    the explain text of every graph the pass saw."""

    def __init__(self, ctx, **options):
        import redist_opt
        from redist_opt.graph import backend as backend_module

        self.ctx, self.explains = ctx, []
        if ctx.reference:
            self.backend = "aot_eager"
            return
        self.backend = redist_opt.backend("aot_eager", **options)
        real = backend_module.run_graph_pass

        def recording(gm, **kw):  # keep each graph's explain text (the backend calls it per graph)
            result = real(gm, **kw)
            self.explains.append(result.explain() if result is not None else "pass failed")
            return result

        self._patch = (backend_module, real)
        backend_module.run_graph_pass = recording

    def compile(self, fn):
        return torch.compile(fn, backend=self.backend, fullgraph=True)

    def close(self) -> dict:
        if not self.ctx.reference:
            module, real = self._patch
            module.run_graph_pass = real
        return {"_explain": torch.tensor(list("\n----\n".join(self.explains).encode()), dtype=torch.uint8)}


def text_of(outputs: dict, key: str = "_explain") -> str:
    """A text a program returned as bytes (keys starting with "_" are not outputs to compare)."""
    return bytes(outputs[key].tolist()).decode()


def _gather_then_block(mesh, over: str, shift: float | None = None):
    """``S(0) on tp -> R -> S(0) on <over>`` (an all_gather, then a rank slice DTensor put
    there), plus ``EXTRA``: guarded, and after the chain; ``shift``: a ``sub`` after
    that, which makes another graph structure."""

    def f(x):
        d = DTensor.from_local(x, mesh, [Replicate(), Shard(0)], run_check=False)
        d = d.redistribute(mesh, [Replicate(), Replicate()])
        dst = [Shard(0), Replicate()] if over == "dp" else [Replicate(), Shard(0)]
        y = d.redistribute(mesh, dst).to_local() + EXTRA
        return y - shift if shift is not None else y

    return f


def _reduce_then_own_chunk(mesh):
    """A hand-written chain of unknown origin: ``all_reduce`` over tp, then the chunk of
    this rank's tp coordinate (a constant in the graph, no DTensor metadata)."""
    tp = mesh["tp"].get_group()
    k = mesh.get_coordinate()[1]

    def f(x):
        return funcol.all_reduce(x, "sum", tp).chunk(2)[k] + EXTRA

    return f


def _steps(ctx, fn, x, steps: int = 3) -> dict:
    """Compile ``fn`` and run it ``steps`` times; rank 0 sets ``EXTRA`` after the first
    step, so it alone recompiles at the second (the others reuse their graph)."""
    global EXTRA
    EXTRA = 0
    torch._dynamo.reset()
    comp = _Compiler(ctx)
    compiled = comp.compile(fn)
    out = {}
    for step in range(steps):
        with ctx.section(f"step{step}"):
            out[f"step{step}"] = compiled(x).clone()
        if step == 0 and ctx.rank == 0:
            EXTRA = 1
    EXTRA = 0
    return {**out, **comp.close()}


def lone_recompile_dtensor(ctx) -> dict:
    """(a) One rank recompiles alone, a chain from DTensor."""
    mesh = _mesh()
    return _steps(ctx, _gather_then_block(mesh, "tp"), _input((4, 4)))


def lone_recompile_unknown_origin(ctx) -> dict:
    """(a) One rank recompiles alone, a chain of unknown origin."""
    mesh = _mesh()
    return _steps(ctx, _reduce_then_own_chunk(mesh), _input((8, 4)))


def compile_orders_differ(ctx) -> dict:
    """(b) The same two programs compiled in different orders: even ranks compile A then
    B, odd ranks B then A (each compile runs its graph, whose collectives pair up
    across ranks: both start with the same all_gather). A and B are one function
    traced for two placements (the same graph but for the rank slice's index), then
    two graphs of different structure (A shifted)."""
    mesh = _mesh()
    x = _input((4, 4))
    out = {}
    for pair, shift in (("same", None), ("other", 1.0)):
        torch._dynamo.reset()
        comp = _Compiler(ctx)
        a = comp.compile(_gather_then_block(mesh, "dp", shift))
        b = comp.compile(_gather_then_block(mesh, "tp"))
        order = (("a", a), ("b", b)) if ctx.rank % 2 == 0 else (("b", b), ("a", a))
        for step in range(2):
            for name, fn in order:
                with ctx.section(f"{pair}{step}{name}"):
                    out[f"{pair}{step}{name}"] = fn(x).clone()
        out[f"_explain_{pair}"] = comp.close()["_explain"]
    return out


def pipeline_stages(ctx) -> dict:
    """(c) Pipeline stages compile different programs, each on its tp submesh, with
    ``groups="create"``: stage pp=0 gathers and takes its block, stage pp=1 reduces and
    takes its block; each compiled twice (a new backend, the same graphs). Then stage
    pp=1 alone compiles a hand-written funcol chain, whose meshes the backend cannot
    know (no DTensor was planned on): every rank of the root mesh is asked, the other
    stage never answers, and the chain is kept after the bounded wait."""
    mesh = _mesh()
    stage = mesh.get_coordinate()[0]
    tp = mesh["tp"]
    out = {}
    for step in range(2):
        torch._dynamo.reset()
        comp = _Compiler(ctx, groups="create")
        fn, x = (_gather_on(tp), _input((4, 4))) if stage == 0 else (_reduce_on(tp), _input((8, 4)))
        with ctx.section(f"stage{step}"):
            out[f"step{step}"] = comp.compile(fn)(x).clone()
        out[f"_explain{step}"] = comp.close()["_explain"]
    if stage == 1:
        torch._dynamo.reset()
        comp = _Compiler(ctx, groups="create")
        with ctx.section("funcol"):
            out["funcol"] = comp.compile(_reduce_then_own_chunk(mesh))(_input((8, 4))).clone()
        out["_explain_funcol"] = comp.close()["_explain"]
    return out


def _reduce_on(tp):
    def f(x):
        d = DTensor.from_local(x, tp, [Partial()], run_check=False)
        d = d.redistribute(tp, [Replicate()]) * 2
        return d.redistribute(tp, [Shard(0)]).to_local()

    return f


def _gather_on(tp):
    def f(x):
        d = DTensor.from_local(x, tp, [Shard(0)], run_check=False)
        d = d.redistribute(tp, [Replicate()]) * 2
        return d.redistribute(tp, [Shard(0)]).to_local()

    return f


def compiled_for_any_rank(ctx) -> dict:
    """(g) ``compile_on_one_rank`` (``torch.compiler.config`` from 2.14; the
    ``torch.distributed.config`` name is a deprecated alias there): coordinates are read at run
    time (no rank's index is baked into the graph), so the graph one rank traces runs
    on every rank. The pass must leave such a graph rank-independent: its code is
    returned (as bytes) for the test to compare across ranks."""
    from redist_opt.torch_api.inductor import compile_on_one_rank_config

    mesh = _mesh()
    x = _input((4, 4))
    with compile_on_one_rank_config().patch(compile_on_one_rank=True):
        torch._dynamo.reset()
        comp = _Compiler(ctx)
        codes = []
        if not ctx.reference:
            from redist_opt.graph import backend as backend_module

            real = backend_module.run_graph_pass

            def keep_code(gm, **kw):
                before = gm.code
                result = real(gm, **kw)
                codes.append(before + "\n==== after the pass ====\n" + gm.code)
                return result

            backend_module.run_graph_pass = keep_code
        try:
            with ctx.section("compile"):
                y = comp.compile(_gather_then_block(mesh, "tp"))(x).clone()
        finally:
            if not ctx.reference:
                backend_module.run_graph_pass = real
    code = "\n----\n".join(codes)
    rounds = 0 if ctx.reference else comp.backend.agreement.rounds_asked
    return {
        "y": y,
        "_code": torch.tensor(list(code.encode()), dtype=torch.uint8),
        "_rounds": torch.tensor(list(str(rounds).encode()), dtype=torch.uint8),
        **comp.close(),
    }


def _two_gathers(mesh):
    """Two 1 MiB all_gathers over tp in a hand-written program: under the gloo profile
    their concatenation is past latency-bound and they stay apart; under a profile whose
    launches cost seconds, they are combined into one."""
    tp = mesh["tp"].get_group()

    def f(a, b):
        return funcol.all_gather_tensor(a, 0, tp) + 1, funcol.all_gather_tensor(b, 0, tp) * 2

    return f


def gathers_priced(ctx) -> dict:
    """(f, compiled) ``_two_gathers`` compiled once; the test sets each rank's
    ``REDIST_OPT_COST_PROFILE``."""
    torch._dynamo.reset()
    comp = _Compiler(ctx)
    a, b = _input((512, 512)), _input((512, 512), salt=1)  # 1 MiB each
    mesh = _mesh()  # alive while compiling: the pass finds the groups' mesh among the live ones
    with ctx.section("step0"):
        x, y = comp.compile(_two_gathers(mesh))(a, b)
    return {"x": x.clone(), "y": y.clone(), **comp.close()}
