"""Plans holding every IR op, lowered into FX graphs, checked against the eager runtime and torch.

* ``CASES``: redistributions on a 2x2 mesh whose optimized plans hold, between
  them, every op of ``redist_opt.ir.ops.OPS`` and every step variant of
  ``STEP_VARIANTS`` (the test asserts the coverage, so a new op needs a case);
* :func:`gloo_lowered_plans` (a gloo rank): each case's plan lowered into an FX
  graph with ``lower_chains.lower_plan`` and run, against ``runtime.execute`` of
  the same plan and torch's ``redistribute`` with its merge pass off, bitwise;
* :func:`gloo_compiled_gathers` (a gloo rank): DTensor programs whose chains become
  one all_gather + ``unpack_blocks``, compiled (``aot_eager`` + the graph pass)
  against the uncompiled program, bitwise;
* ``python lowering_programs.py fake RANK``: ``S(0),S(1) -> R,R`` on a fake 2x4
  mesh compiled with ``groups="create"``, with the graph's node metadata kept,
  stripped down to ``val``, and stripped entirely; prints JSON.

Inputs are integer-valued so regrouped reductions compare exactly. Kept free of
pytest so spawned ranks import it cheaply.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.fx as fx
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._redistribute import disable_redistribute_transform_optimization

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if TESTS not in sys.path:  # run as a script, this file's folder is on sys.path, not the tests folder
    sys.path.insert(0, TESTS)

from redist_opt import ir  # noqa: E402
from redist_opt.ir.cost import CostModel  # noqa: E402
from redist_opt.ir.mesh import MeshSpec  # noqa: E402
from redist_opt.ir.placements import normalize_placements  # noqa: E402
from redist_opt.ir.plan import make_plan  # noqa: E402
from redist_opt.pipeline import run_pipeline  # noqa: E402
from support.program_report import emit  # noqa: E402

# (name, src, dst, global shape, groups, IR ops and step variants its plan must hold)
CASES = [
    ("all_reduce", "P,P", "R,R", (4, 6), "existing", {"all_reduce"}),
    ("all_reduce_merged", "P,P", "R,R", (4, 6), "create", {"all_reduce"}),
    ("reduce_scatter_dim1", "R,P", "R,S(1)", (4, 6), "existing", {"reduce_scatter"}),
    ("all_gather_dim1", "R,S(1)", "R,R", (4, 6), "existing", {"all_gather"}),
    ("all_to_all", "R,S(0)", "R,S(1)", (4, 4, 2), "existing", {"all_to_all"}),
    ("split_all_to_all", "S(0),S(0)", "S(1),S(2)", (4, 4, 4), "create", {"all_to_all", "split_all_to_all"}),
    ("gather_blocks", "S(0),S(1)", "R,R", (4, 6), "create", {"all_gather", "unpack_blocks", "gather_blocks"}),
    ("gather_blocks_dim1", "S(1),S(2)", "R,R", (2, 4, 6), "create", {"gather_blocks", "unpack_blocks"}),
    ("gather_blocks_swapped", "S(1),S(0)", "R,R", (4, 6, 2), "create", {"gather_blocks", "unpack_blocks"}),
    (
        "gather_blocks_uneven",
        "S(0),S(1)",
        "R,R",
        (3, 5),
        "create",
        {"gather_blocks", "pad_to", "unpack_blocks"},
    ),
    ("pad_to_narrow", "R,S(0)", "R,R", (3, 5), "existing", {"pad_to", "narrow"}),
    ("pad_nested", "R,P", "R,S(0)", (3, 5), "existing", {"pad_nested", "narrow"}),
    ("unpad_nested", "S(0),S(0)", "R,R", (3, 5), "create", {"unpad_nested"}),
    ("all_to_all_uneven", "R,S(0)", "R,S(1)", (3, 5), "existing", {"all_to_all", "pad_to", "narrow"}),
    ("select_chunk", "R,R", "S(1),S(0)", (4, 6), "existing", {"select_chunk"}),
    ("divide", "R,R", "R,P", (4, 6), "existing", {"divide"}),
    ("norm", "P(norm2),R", "R,R", (4, 6), "existing", {"power", "all_reduce", "root"}),
]
MESH = (2, 2)
# (case, dtype): the dtypes beyond float32 that torch's redistribute accepts, on the cases that
# lay data out around a collective (complex moves as real pairs in gathers and all_to_all)
DTYPE_TWINS = [
    ("all_to_all", torch.complex64),
    ("split_all_to_all", torch.complex64),
    ("all_gather_dim1", torch.complex64),
    ("reduce_scatter_dim1", torch.complex64),
    ("all_to_all_uneven", torch.int64),
    ("gather_blocks_uneven", torch.bfloat16),
    ("reduce_scatter_dim1", torch.float16),
    ("all_reduce", torch.bool),
]
# One cost model on every rank and in the rank-free coverage check (a gloo mesh would
# otherwise pick the gloo profile, whose plans may merge less).
COST = CostModel.profile("nccl")


def placements(text: str, ndim: int):
    return normalize_placements(text.split(","), mesh_shape=MESH, tensor_ndim=ndim, role="source")


def plan_of(spec: MeshSpec, case, dtype: torch.dtype = torch.float32):
    _, src, dst, shape, groups, _ = case
    naive = make_plan(spec, src.split(","), dst.split(","), shape, dtype)
    return run_pipeline(naive, groups=groups, cost=COST)


def plan_contents(plan) -> set[str]:
    """IR op names and step variants in ``plan``."""
    out = set()
    for n in plan.graph.graph.nodes:
        if ir.ir_name(n) is not None:
            out.add(ir.ir_name(n))
            step = n.meta.get("step")
            if step is not None and step.variant:
                out.add(step.variant)
    return out


# -- gloo: lowered plans against eager and torch ----------------------------------------------------------


def _local_input(mesh, src, shape, seed: int) -> torch.Tensor:
    """This rank's block of a seeded global tensor; a partial dim adds data that depends on
    its coordinate (replicas stay equal), all integer-valued."""
    coord = mesh.get_coordinate()
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-4, 5, shape, generator=g).to(torch.float32)
    noise_key = 0
    for d, p in enumerate(src):
        if p.is_shard():
            parts = torch.chunk(x, mesh.size(d), dim=p.dim)  # trailing chunks may be missing: empty
            x = parts[coord[d]] if coord[d] < len(parts) else x.narrow(p.dim, 0, 0)
        elif p.is_partial():
            noise_key = noise_key * 10 + coord[d] + 1
    if noise_key:
        g = torch.Generator().manual_seed(seed + 7919 * noise_key)
        x = x + torch.randint(-2, 3, x.shape, generator=g).to(torch.float32)
    return x.contiguous()


def _torch_redistribute(dt, mesh, dst_p) -> torch.Tensor:
    # The function DTensor.redistribute runs, called directly: it also takes R -> P,
    # which the public method refuses.
    from torch.distributed.tensor._dtensor_spec import DTensorSpec
    from torch.distributed.tensor._redistribute import redistribute_local_tensor

    target = DTensorSpec(mesh, tuple(dst_p), tensor_meta=dt._spec.tensor_meta)
    out = redistribute_local_tensor(dt.to_local(), dt._spec, target)
    return out.wait() if hasattr(out, "wait") else out


def _lowered_graph(plan, mesh, groups: str) -> fx.GraphModule:
    from redist_opt.graph.lower_chains import lower_plan
    from redist_opt.graph.mesh_groups import mesh_contexts

    ctx = next(c for c in mesh_contexts(mesh) if c.device_mesh is mesh)
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output(lower_plan(graph, plan, x, ctx, groups))
    graph.lint()
    return fx.GraphModule(torch.nn.Module(), graph)


def runs() -> list[tuple]:
    """(case, dtype, id): every case in float32, then the dtype twins."""
    by_name = {c[0]: c for c in CASES}
    out = [(c, torch.float32, c[0]) for c in CASES]
    return out + [(by_name[n], dt, f"{n}-{str(dt).removeprefix('torch.')}") for n, dt in DTYPE_TWINS]


def _as_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype.is_complex:  # an imaginary part unlike the real one, so a swap of the two shows
        return torch.complex(x, 1 - 2 * x).to(dtype)
    return x.to(dtype)


def gloo_lowered_plans(rank: int, world: int, names=None) -> dict:
    """Every case: lowered graph == runtime.execute == torch (merge off), bitwise, on this rank."""
    from redist_opt.runtime.execute import execute

    mesh = init_device_mesh("cpu", MESH, mesh_dim_names=("a", "b"))
    spec = MeshSpec.from_device_mesh(mesh)
    out = {}
    for i, (case, dtype, run_id) in enumerate(runs()):
        name, src, dst, shape, groups, expected = case
        if names is not None and name not in names:
            continue
        plan = plan_of(spec, case, dtype)
        contents = plan_contents(plan)
        assert expected <= contents, f"{name}: plan holds {sorted(contents)}, expected {sorted(expected)}"
        src_p, dst_p = placements(src, len(shape)), placements(dst, len(shape))
        local = _as_dtype(_local_input(mesh, src_p, shape, 100 + i), dtype)
        stride = torch.empty(shape).stride()
        dt = DTensor.from_local(local, mesh, src_p, run_check=False, shape=torch.Size(shape), stride=stride)
        with disable_redistribute_transform_optimization():
            ref = _torch_redistribute(dt, mesh, dst_p)
        eager = execute(plan.graph, local, mesh, groups=groups)
        lowered = _lowered_graph(plan, mesh, groups)(local)
        for who, got in (("eager runtime", eager), ("lowered graph", lowered)):
            assert got.shape == ref.shape and torch.equal(got, ref), (
                f"rank {rank} {run_id}: {who} differs from torch:\n{got}\n{ref}"
            )
        out[run_id] = sorted(contents)
    return out


# -- compiled programs: chains that become one all_gather + unpack_blocks -----------------------------------


def gather_program(mesh, src, dst):
    def f(x):
        d = DTensor.from_local(x, mesh, src, run_check=False)
        return d.redistribute(mesh, dst).to_local() * 2

    return f


# name -> (src, dst, local shape)
GATHER_PROGRAMS = {
    "s0s1": ([Shard(0), Shard(1)], [Replicate(), Replicate()], (2, 3)),
    "s1s0": ([Shard(1), Shard(0)], [Replicate(), Replicate()], (2, 3, 2)),
    "s2s1": ([Shard(2), Shard(1)], [Replicate(), Replicate()], (2, 3, 2)),
}


def gloo_compiled_gathers(rank: int, world: int) -> dict:
    """Each program compiled with the pass (groups="create") against the uncompiled one, bitwise."""
    from support.graph_pass_programs import Recorder, compile_program

    mesh = init_device_mesh("cpu", MESH, mesh_dim_names=("a", "b"))
    out = {}
    for name, (src, dst, shape) in GATHER_PROGRAMS.items():
        fn = gather_program(mesh, src, dst)
        g = torch.Generator().manual_seed(rank * 31 + len(name))
        x = torch.randint(-4, 5, shape, generator=g).to(torch.float32)
        ref = fn(x)
        rec = Recorder(meshes=mesh, groups="create", cost=COST)
        got, _ = compile_program(fn, x, rec)
        assert torch.equal(got, ref), f"rank {rank} {name}: compiled output differs"
        (graph,) = rec.graphs
        out[name] = {
            "before": graph["before"],
            "after": graph["after"],
            "explain": graph["explain"],
            "unpacked": "aten.permute" in graph["code_after"],
        }
    return out


# -- one fake rank: the 2x4 acceptance, with and without node metadata ---------------------------------------


def _stripping_backend(keep: tuple[str, ...], graphs: list):
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    from redist_opt.graph_pass import count_collectives, optimize_graph

    def compiler(gm, example_inputs):
        for n in gm.graph.nodes:
            for k in [k for k in n.meta if k not in keep]:
                del n.meta[k]
        before = count_collectives(gm)
        result = optimize_graph(gm, groups="create", meshes=_MESHES[0])
        graphs.append(
            {
                "before": before,
                "after": count_collectives(gm),
                "explain": result.explain(),
                "code_after": gm.code,
            }
        )
        return make_boxed_func(gm.forward)

    return aot_autograd(fw_compiler=compiler)


_MESHES: list = []


def fake_main(rank: int) -> dict:
    import torch._dynamo

    dist.init_process_group("fake", rank=rank, world_size=8)
    mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    _MESHES.append(mesh)
    fn = gather_program(mesh, [Shard(0), Shard(1)], [Replicate(), Replicate()])
    report = {}
    for label, keep in (("meta", None), ("val_only", ("val",)), ("no_meta", ())):
        graphs: list = []
        torch._dynamo.reset()
        backend = _stripping_backend(keep if keep is not None else _ALL, graphs)
        torch.compile(fn, backend=backend, fullgraph=True)(torch.zeros(4, 2))
        report[label] = graphs
    return report


class _All(tuple):
    def __contains__(self, item) -> bool:  # keep every key
        return True


_ALL = _All()


if __name__ == "__main__" and sys.argv[1] == "fake":
    emit(fake_main(int(sys.argv[2])))
